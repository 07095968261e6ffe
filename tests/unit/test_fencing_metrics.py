"""The fencing helpers' Prometheus counters move exactly on accept, duplicate and refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from joblease.domain.token import FencingToken
from joblease.fencing import FencedFileStore, StaleTokenError, TokenGate
from joblease.fencing.http_example import FencedStore
from joblease.fencing.metrics import HELPERS

pytestmark = pytest.mark.unit

T7 = FencingToken(4711, 7)
T8 = FencingToken(4711, 8)


def counts(helper: str) -> tuple[float, float, float]:
    """(applied, duplicate, refused) as the default registry would be scraped."""
    def value(name: str, labels: dict[str, str]) -> float:
        found = REGISTRY.get_sample_value(name, labels)
        assert found is not None, f"{name}{labels} is not exported"
        return found

    return (value("joblease_fencing_accepted_total", {"helper": helper, "result": "applied"}),
            value("joblease_fencing_accepted_total", {"helper": helper, "result": "duplicate"}),
            value("joblease_fencing_refused_total", {"helper": helper}))


def moved(before: tuple[float, ...], after: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(a - b for a, b in zip(after, before, strict=True))


def test_every_series_is_exported_at_zero_before_any_write() -> None:
    """A series that first appears at 1 hides that increment from rate()/increase()."""
    text = generate_latest(REGISTRY).decode()
    series = {(s.name, tuple(sorted(s.labels.items())))
              for family in text_string_to_metric_families(text) for s in family.samples}
    for helper in HELPERS:
        assert ("joblease_fencing_refused_total", (("helper", helper),)) in series
        for result in ("applied", "duplicate"):
            assert ("joblease_fencing_accepted_total",
                    (("helper", helper), ("result", result))) in series


def test_gate_counts_applied_duplicate_and_refused() -> None:
    gate = TokenGate()
    before = counts("gate")
    gate.accept("metrics-gate", T8, "k")
    gate.accept("metrics-gate", T8, "k")  # the same token and key again: a duplicate
    with pytest.raises(StaleTokenError):
        gate.accept("metrics-gate", T7, "k2")
    assert moved(before, counts("gate")) == (1, 1, 1)


def test_gate_counts_nothing_when_the_write_itself_fails() -> None:
    gate = TokenGate()
    before = counts("gate")

    def boom() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError):
        gate.apply("metrics-gate-fail", T7, None, boom)
    assert moved(before, counts("gate")) == (0, 0, 0)


def test_http_example_refusal_is_counted_as_a_gate_refusal() -> None:
    store = FencedStore()
    before = counts("gate")
    store.put("metrics-http", T8, None, b"new")
    with pytest.raises(StaleTokenError):
        store.put("metrics-http", T7, None, b"late")
    assert moved(before, counts("gate")) == (1, 0, 1)


def test_file_store_counts_applied_duplicate_and_refused(tmp_path: Path) -> None:
    store = FencedFileStore(tmp_path)
    before, gate_before = counts("filestore"), counts("gate")
    store.put("metrics-file", T7, "a", {"v": 1})
    store.put("metrics-file", T8, "b", {"v": 2})
    store.put("metrics-file", T8, "b", {"v": 2})
    with pytest.raises(StaleTokenError):
        store.put("metrics-file", T7, "c", {"v": 3})
    assert moved(before, counts("filestore")) == (2, 1, 1)
    assert counts("gate") == gate_before  # each helper counts under its own label only
