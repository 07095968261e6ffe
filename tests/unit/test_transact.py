"""``transact``: read, decide, conditional write — against the in-memory API server.

Each test pins one rule of the compare-and-swap step (``joblease.core.transaction``): when it
reads, what it writes and with which precondition, that a 409 means "read and decide
again" (never a blind retry), that a refusal writes nothing, that a refusal decided from
a cached version is confirmed from a fresh read, and that it gives up after
``max_conflicts`` conflicts in a row.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from joblease.core.steps import transact
from joblease.core.transaction import MAX_CONFLICTS, ContentionError, UnconfirmedRefusalError
from joblease.domain.clock import ServerNow
from joblease.domain.errors import LeaseHeldError, StaleLeaseError
from joblease.domain.lease import Claim, Observed, Phase, Transition, decide_claim, decide_renew
from joblease.kube.api import ConflictError, InvalidError
from joblease.kube.leases import LeaseStore
from support.fakekube import T_NOW, FakeKubeApi, lease_object, transact_via_async

MARGIN = timedelta(milliseconds=250)


@pytest.fixture(autouse=True, params=["sync", "async"])
def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs against both drivers of the one loop: blocking and asyncio."""
    if request.param == "async":
        monkeypatch.setitem(globals(), "transact", transact_via_async)
    return str(request.param)
PATCH = ("PATCH", "/apis/joblease.dev/v1alpha1/namespaces/ns/jobleases/job/status")
GET = ("GET", "/apis/joblease.dev/v1alpha1/namespaces/ns/jobleases/job")


def setup(status: dict | None = None) -> tuple[FakeKubeApi, LeaseStore]:
    api = FakeKubeApi()
    api.put_object(lease_object("job", status if status is not None else {"phase": "Available"}))
    return api, LeaseStore(api)  # type: ignore[arg-type]


def claim_by(holder: str):  # type: ignore[no-untyped-def]
    return lambda obs, now: decide_claim(obs, holder, now, MARGIN)


def test_claim_reads_decides_and_writes_with_the_read_resource_version() -> None:
    api, store = setup()
    read_rv = api.stored("ns", "job")["metadata"]["resourceVersion"]  # type: ignore[index]
    seen: list[tuple[Observed, ServerNow]] = []

    def decide(obs: Observed, now: ServerNow) -> Transition:
        seen.append((obs, now))
        return decide_claim(obs, "a", now, MARGIN)

    out = transact(store, "ns", "job", decide)
    assert api.requests == [GET, PATCH]
    assert [o.resource_version for o, _ in seen] == [read_rv]
    assert seen[0][1] == ServerNow.exact(T_NOW)
    assert out.transition is not None and out.transition.kind == "claimed"
    stored = api.stored("ns", "job")
    assert stored is not None
    assert out.observed.resource_version == stored["metadata"]["resourceVersion"] != read_rv
    assert (out.observed.status.holder, out.observed.status.generation) == ("a", 1)
    assert stored["status"]["epoch"] == int(read_rv)
    # ``sent`` is the local monotonic time just before the write went out
    assert out.sent == api.request_clock[1]


def test_nothing_to_do_writes_nothing_and_returns_the_read_version() -> None:
    api, store = setup()
    out = transact(store, "ns", "job", lambda obs, now: None)
    assert api.requests == [GET]
    assert out.transition is None
    assert out.observed.resource_version == api.stored("ns", "job")["metadata"][  # type: ignore[index]
        "resourceVersion"]
    assert out.sent > 0


def test_a_refusal_from_a_fresh_read_raises_and_writes_nothing() -> None:
    api, store = setup()
    transact(store, "ns", "job", claim_by("a"))
    before = api.stored("ns", "job")
    calls = []

    def decide(obs: Observed, now: ServerNow) -> Transition:
        calls.append(obs.resource_version)
        return decide_claim(obs, "b", now, MARGIN)

    with pytest.raises(LeaseHeldError) as err:
        transact(store, "ns", "job", decide)
    assert (err.value.holder, err.value.generation) == ("a", 1)
    assert len(calls) == 1  # not retried
    assert api.stored("ns", "job") == before
    assert api.requests.count(PATCH) == 1


def test_a_refusal_from_a_cached_version_is_confirmed_from_a_fresh_read() -> None:
    """A holder renewing from its own stale version must get the *server's* holder named."""
    api, store = setup()
    mine = transact(store, "ns", "job", claim_by("a")).observed
    api.now = ServerNow.exact(T_NOW + timedelta(seconds=60))  # a's lease ran out
    transact(store, "ns", "job", claim_by("b"))  # b took over at generation 2
    api.requests.clear()
    with pytest.raises(StaleLeaseError) as err:
        transact(store, "ns", "job",
                 renew_by_a(mine), observed=mine)
    assert (err.value.current_holder, err.value.current_generation) == ("b", 2)
    assert api.requests == [GET]


def test_a_refusal_from_a_cached_version_with_one_attempt_says_so_not_conflicting_writes(
        ) -> None:
    """A pool's claim from its view (``max_conflicts=1``) refused by that cached version has
    no attempt left to confirm it: the error says what refused it, not "1 conflicting
    writes" (no write was sent), and stays a ``ContentionError`` for the pools."""
    api, store = setup()
    held = transact(store, "ns", "job", claim_by("a")).observed
    api.requests.clear()
    with pytest.raises(UnconfirmedRefusalError) as err:
        transact(store, "ns", "job", claim_by("b"), observed=held, max_conflicts=1)
    assert isinstance(err.value, ContentionError)
    message = str(err.value)
    assert "conflicting writes" not in message
    assert f"cached version {held.resource_version}" in message and "'a'" in message
    assert api.requests == []  # nothing read, nothing written


def test_a_cached_refusal_then_a_conflict_is_still_contention() -> None:
    api, store = setup()
    held = transact(store, "ns", "job", claim_by("a")).observed
    api.put_object(lease_object("job", {"phase": "Available"}))  # released since the cache
    api.refuse_next = [ConflictError(409, "Conflict", "modified")]
    with pytest.raises(ContentionError) as err:  # refused cached, read, written: a 409
        transact(store, "ns", "job", claim_by("b"), observed=held, max_conflicts=2)
    assert api.requests.count(PATCH) == 2  # a's claim, then b's, refused by the 409
    assert not isinstance(err.value, UnconfirmedRefusalError)
    assert "conflicting writes" in str(err.value)


def test_a_cached_version_saves_the_read_when_it_is_current() -> None:
    api, store = setup()
    mine = transact(store, "ns", "job", claim_by("a")).observed
    api.requests.clear()
    out = transact(store, "ns", "job",
                   renew_by_a(mine), observed=mine)
    assert api.requests == [PATCH]
    assert out.transition is not None and out.transition.kind == "renewed"


def test_a_conflict_means_read_and_decide_again() -> None:
    api, store = setup()
    api.refuse_next = [ConflictError(409, "Conflict", "modified")]
    versions: list[str] = []

    def decide(obs: Observed, now: ServerNow) -> Transition:
        versions.append(obs.resource_version)
        return decide_claim(obs, "a", now, MARGIN)

    out = transact(store, "ns", "job", decide)
    assert api.requests == [GET, PATCH, GET, PATCH]
    assert len(versions) == 2
    assert out.transition is not None and out.observed.status.generation == 1


def test_a_conflict_after_a_cached_decision_reads_fresh() -> None:
    api, store = setup()
    mine = transact(store, "ns", "job", claim_by("a")).observed
    api.requests.clear()
    api.refuse_next = [ConflictError(409, "Conflict", "modified")]
    transact(store, "ns", "job",
             renew_by_a(mine), observed=mine)
    assert api.requests == [PATCH, GET, PATCH]


@pytest.mark.parametrize("limit", [1, 3, MAX_CONFLICTS])
def test_gives_up_after_max_conflicts_in_a_row(limit: int) -> None:
    api, store = setup()
    api.refuse_next = [ConflictError(409, "Conflict", "modified") for _ in range(limit)]
    with pytest.raises(ContentionError) as err:
        transact(store, "ns", "job", claim_by("a"), max_conflicts=limit)
    assert api.requests.count(PATCH) == limit
    assert api.requests.count(GET) == limit
    assert f"JobLease ns/job: {limit} conflicting writes" in str(err.value)
    assert api.stored("ns", "job")["status"] == {"phase": "Available"}  # type: ignore[index]


def test_the_default_limit_is_eight_and_the_ninth_attempt_never_happens() -> None:
    api, store = setup()
    api.refuse_next = [ConflictError(409, "Conflict", "m") for _ in range(MAX_CONFLICTS)]
    with pytest.raises(ContentionError):
        transact(store, "ns", "job", claim_by("a"))
    assert MAX_CONFLICTS == 8 and api.requests.count(PATCH) == 8


def test_seven_conflicts_then_success_is_within_the_limit() -> None:
    api, store = setup()
    api.refuse_next = [ConflictError(409, "Conflict", "m") for _ in range(MAX_CONFLICTS - 1)]
    out = transact(store, "ns", "job", claim_by("a"))
    assert out.transition is not None and out.observed.status.phase is Phase.HELD


def test_other_api_errors_are_not_retried() -> None:
    api, store = setup()
    api.refuse_next = [InvalidError(422, "Invalid", "CEL says no")]
    with pytest.raises(InvalidError):
        transact(store, "ns", "job", claim_by("a"))
    assert api.requests == [GET, PATCH]


def renew_by_a(mine: Observed) -> Callable[[Observed, Any], Transition | None]:
    """A renewal by 'a' presenting the whole token of the claim ``mine`` records."""
    claim = Claim("a", mine.status.token())
    return lambda obs, now: decide_renew(obs, claim, now, MARGIN)
