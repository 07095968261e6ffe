"""The fencing rule without servers: TokenGate, decide() and the file-backed store."""

from __future__ import annotations

import functools
import pickle
import random
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joblease.domain.token import FencingToken
from joblease.fencing import (
    Applied,
    Duplicate,
    FencedFileStore,
    FencingError,
    StaleTokenError,
    TokenGate,
)

T7 = FencingToken(4711, 7)
T8 = FencingToken(4711, 8)


def test_first_token_is_applied_with_no_previous() -> None:
    assert TokenGate().accept("job-1", T7, "k") == Applied("job-1", T7, None, None)


def test_equal_and_higher_tokens_are_accepted() -> None:
    gate = TokenGate()
    gate.accept("job-1", T7)
    assert gate.accept("job-1", T7) == Applied("job-1", T7, T7, None)
    assert gate.accept("job-1", T8) == Applied("job-1", T8, T7, None)
    assert gate.highest("job-1") == T8


def test_lower_token_is_refused_naming_both_tokens_and_the_resource() -> None:
    gate = TokenGate()
    gate.accept("job-1", T8)
    with pytest.raises(StaleTokenError) as refused:
        gate.accept("job-1", T7)
    assert str(refused.value) == (
        "stale fencing token 4711/7 for resource 'job-1': target has already accepted 4711/8"
    )
    assert (refused.value.resource, refused.value.presented, refused.value.highest) == (
        "job-1",
        T7,
        T8,
    )
    assert isinstance(refused.value, FencingError)
    assert gate.highest("job-1") == T8


def test_stale_error_survives_pickling_with_its_fields() -> None:
    copy = pickle.loads(pickle.dumps(StaleTokenError("job-1", T7, T8)))
    assert (copy.resource, copy.presented, copy.highest, str(copy)) == (
        "job-1",
        T7,
        T8,
        str(StaleTokenError("job-1", T7, T8)),
    )


def test_repeat_of_token_and_key_is_a_duplicate_without_second_effect() -> None:
    gate = TokenGate()
    effects: list[str] = []

    def write() -> str:
        effects.append("write")
        return "done"

    first = gate.apply("job-1", T7, "step-3", write)
    again = gate.apply("job-1", T7, "step-3", write)
    assert first == Applied("job-1", T7, None, "done")
    assert again == Duplicate("job-1", T7, "step-3")
    assert effects == ["write"]
    assert isinstance(gate.apply("job-1", T7, "step-4", lambda: None), Applied)
    assert isinstance(gate.apply("job-1", T7, None, lambda: None), Applied)


def test_retry_after_takeover_is_stale_not_duplicate() -> None:
    gate = TokenGate()
    gate.accept("job-1", T7, "k")
    gate.accept("job-1", T8, "other")
    with pytest.raises(StaleTokenError):
        gate.accept("job-1", T7, "k")


def test_higher_epoch_beats_any_generation_of_an_older_epoch() -> None:
    gate = TokenGate()
    gate.accept("job-1", FencingToken(4711, 10_000))
    assert isinstance(gate.accept("job-1", FencingToken(4712, 1)), Applied)
    with pytest.raises(StaleTokenError):
        gate.accept("job-1", FencingToken(4711, 10_001))


def test_resources_are_fenced_independently() -> None:
    gate = TokenGate()
    gate.accept("job-1", T8)
    assert isinstance(gate.accept("job-2", T7), Applied)


def test_failed_effect_leaves_the_gate_unchanged() -> None:
    gate = TokenGate()
    gate.accept("job-1", T7, "k")

    def boom() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        gate.apply("job-1", T8, "k", boom)
    assert gate.highest("job-1") == T7
    assert isinstance(gate.apply("job-1", T8, "k", lambda: None), Applied)


def test_empty_resource_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        TokenGate().accept("", T7)


def test_concurrent_writers_never_apply_a_lower_token_after_a_higher_one() -> None:
    gate = TokenGate()
    effects: list[FencingToken] = []  # appended inside apply(), i.e. under the gate's lock
    refusals: list[StaleTokenError] = []
    start = threading.Barrier(16)

    def writer(seed: int) -> None:
        rnd = random.Random(seed)
        start.wait(5)
        for _ in range(500):
            token = FencingToken(rnd.randint(1, 3), rnd.randint(1, 50))
            try:
                gate.apply("job-1", token, None, functools.partial(effects.append, token))
            except StaleTokenError as e:
                refusals.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert len(effects) + len(refusals) == 16 * 500
    assert effects == sorted(effects)
    accepted = set(effects)
    assert all(e.presented < e.highest and e.highest in accepted for e in refusals)
    assert gate.highest("job-1") == effects[-1]


def test_file_store_persists_value_and_token_together(tmp_path: Path) -> None:
    store = FencedFileStore(tmp_path)
    assert store.put("jobs/1", T7, "k", {"out": "A"}) == Applied("jobs/1", T7, None, None)
    reopened = FencedFileStore(tmp_path)
    assert reopened.put("jobs/1", T7, "k", {"out": "ignored"}) == Duplicate("jobs/1", T7, "k")
    assert reopened.put("jobs/1", T8, "k", {"out": "B"}) == Applied("jobs/1", T8, T7, None)
    with pytest.raises(StaleTokenError, match=r"4711/7 .*'jobs/1'.* 4711/8"):
        reopened.put("jobs/1", T7, "late", {"out": "A-late"})
    assert reopened.get("jobs/1") == ({"out": "B"}, T8)
    assert reopened.get("never") is None
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["jobs%2F1.json", "jobs%2F1.lock"]  # no temp files, no path escape


def test_file_store_refuses_unserializable_values_before_writing(tmp_path: Path) -> None:
    store = FencedFileStore(tmp_path)
    with pytest.raises(TypeError):
        store.put("job-1", T7, "k", object())
    assert store.get("job-1") is None


def test_file_store_concurrent_writers_keep_tokens_monotonic(tmp_path: Path) -> None:
    store = FencedFileStore(tmp_path)
    seen: list[FencingToken] = []
    guard = threading.Lock()

    def writer(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(40):
            token = FencingToken(1, rnd.randint(1, 100))
            try:
                store.put("job-1", token, None, str(token))
            except StaleTokenError:
                continue
            with guard:
                seen.append(token)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    value, highest = store.get("job-1") or (None, None)
    assert highest == max(seen)
    assert value == str(highest)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([None, "k1", "k2", "k3"])),
                max_size=40))
def test_the_gate_keeps_exactly_the_pure_rule(writes: list[tuple[int, str | None]]) -> None:
    """TokenGate keeps its key set in place (issue 14: copying it made n keyed writes with
    one token cost O(n²)); it must still answer every write exactly as ``decide`` does."""
    from joblease.fencing.check import FenceState, decide
    gate, state = TokenGate(), None
    for generation, key in writes:
        token = FencingToken(1, generation)
        try:
            expected, after = decide(state, "r", token, key)
        except StaleTokenError:
            with pytest.raises(StaleTokenError):
                gate.accept("r", token, key)
            continue
        got = gate.accept("r", token, key)
        assert type(got) is type(expected) and got.token == expected.token
        state = after if isinstance(expected, Applied) else state
        assert isinstance(state, FenceState) and gate.highest("r") == state.highest
