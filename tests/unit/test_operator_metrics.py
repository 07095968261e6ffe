"""The operator metrics that alerts depend on: overdue leases, Failed transitions, last pass."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from joblease.controller import metrics
from joblease.controller.heartbeat import Heartbeat
from joblease.domain.clock import ServerNow
from joblease.domain.lease import LeaseSpec, LeaseStatus, Observed, Phase

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


def lease(name: str, phase: Phase, until: datetime | None) -> Observed:
    status = LeaseStatus(phase=phase, holder="a", generation=1, epoch=1, acquire_time=T0,
                         renew_time=T0, lease_until=until)
    return Observed("ns", name, f"uid-{name}", "5", 1, LeaseSpec(), status)


def test_overdue_counts_only_held_leases_certainly_past_lease_until() -> None:
    leases = [lease("late-30", Phase.HELD, T0 - timedelta(seconds=30)),
              lease("late-2", Phase.HELD, T0 - timedelta(seconds=2)),
              lease("in-time", Phase.HELD, T0 + timedelta(seconds=5)),
              lease("expired", Phase.EXPIRED, T0 - timedelta(seconds=99)),
              lease("no-until", Phase.AVAILABLE, None)]
    collector = metrics.OverdueCollector()
    assert collector.measure() == (0, 0.0)  # before the operator starts: nothing is known
    # The clock interval is [T0 - 1 s, T0 + 1 s]: only the earliest bound counts as "past".
    collector.watch(lambda: leases,
                    lambda: ServerNow(T0 - timedelta(seconds=1), T0 + timedelta(seconds=1)))
    assert collector.measure() == (2, 29.0)


def test_overdue_gauges_are_on_the_default_registry() -> None:
    assert REGISTRY.get_sample_value("joblease_leases_overdue") is not None
    assert REGISTRY.get_sample_value("joblease_lease_overdue_max_seconds") is not None


def failed_count() -> float:
    value = REGISTRY.get_sample_value("joblease_transitions_total", {"kind": "failed"})
    assert value is not None, "the failed series must be exported from the start"
    return value


def test_failed_is_counted_once_on_the_transition_into_failed() -> None:
    held = lease("job", Phase.HELD, T0)
    failed = replace(held, resource_version="6",
                     status=replace(held.status, phase=Phase.FAILED, lease_until=None))
    before = failed_count()
    metrics.count_failed(None, failed)     # first sight (a restart's list): not a transition
    metrics.count_failed(failed, failed)   # already Failed (e.g. this operator's own write)
    assert failed_count() == before
    metrics.count_failed(held, failed)
    assert failed_count() == before + 1


def test_heartbeat_sets_the_last_pass_gauge_without_a_file() -> None:
    started = time.time()
    Heartbeat(None).beat()
    value = REGISTRY.get_sample_value("joblease_operator_last_pass_timestamp_seconds")
    assert value is not None and started <= value <= time.time()


def test_every_pass_sets_the_phase_gauge_to_the_views_counts() -> None:
    """``joblease_leases{phase}`` (the dashboard's "JobLeases by phase") follows the view."""
    from joblease.controller.reconciler import LeaseView, Reconciler
    from support.memstore import MemoryStore

    view = LeaseView()
    future = datetime.now(UTC) + timedelta(days=1)
    for name, phase in (("h1", Phase.HELD), ("h2", Phase.HELD), ("c", Phase.COMPLETED)):
        view.put(lease(name, phase, future if phase is Phase.HELD else None))
    reconciler = Reconciler(MemoryStore(), view, timedelta(0), writers=1)  # type: ignore[arg-type]
    reconciler.pass_once()

    def gauge(phase: Phase) -> float | None:
        return REGISTRY.get_sample_value("joblease_leases", {"phase": phase.value})

    assert [gauge(p) for p in (Phase.HELD, Phase.COMPLETED, Phase.EXPIRED)] == [2, 1, 0]
    view.drop("ns", "h2", "uid-h2")
    reconciler.pass_once()
    assert gauge(Phase.HELD) == 1


def test_the_scraped_overdue_gauges_are_the_watched_views() -> None:
    """What Prometheus reads, not only ``measure()``: the registered collector's samples."""
    late = [lease("late", Phase.HELD, T0 - timedelta(seconds=7))]

    def source() -> list[Observed]:
        return late

    metrics.OVERDUE.watch(source, lambda: ServerNow(T0, T0))
    try:
        assert REGISTRY.get_sample_value("joblease_leases_overdue") == 1
        assert REGISTRY.get_sample_value("joblease_lease_overdue_max_seconds") == 7
    finally:
        metrics.OVERDUE.unwatch(source)
    assert REGISTRY.get_sample_value("joblease_leases_overdue") == 0


def test_the_watch_counts_each_kind_of_a_workers_transition() -> None:
    """``joblease_transitions_total{kind}``: claimed, renewed, released, completed, each moved
    by the version the watch brings (the dashboard's "Transitions" panel reads them)."""
    from joblease.controller.runtime import Operator
    from joblease.controller.settings import OperatorSettings
    from support.fakekube import lease_object

    def kinds() -> dict[str, float]:
        return {k: REGISTRY.get_sample_value("joblease_transitions_total", {"kind": k}) or 0.0
                for k in ("claimed", "renewed", "released", "completed")}

    op = Operator(OperatorSettings())
    history = [("Available", 1, "2026-12-03T12:00:00Z"), ("Held", 2, "2026-12-03T12:00:00Z"),
               ("Held", 2, "2026-12-03T12:00:05Z"), ("Available", 2, "2026-12-03T12:00:05Z"),
               ("Held", 3, "2026-12-03T12:00:07Z"), ("Completed", 3, "2026-12-03T12:00:07Z")]
    before = kinds()
    for rv, (phase, generation, renewed) in enumerate(history, start=10):
        obj = lease_object("job", {"phase": phase, "generation": generation, "epoch": 9,
                                   "holder": "a", "renewTime": renewed})
        obj["metadata"]["resourceVersion"] = str(rv)
        op.observe_lease({"type": "MODIFIED", "object": obj})
    after = kinds()
    assert {k: after[k] - before[k] for k in after} == {
        "claimed": 2, "renewed": 1, "released": 1, "completed": 1}


def test_every_pass_observes_its_cpu_time() -> None:
    """``joblease_reconcile_pass_cpu_seconds``: one observation per pass, and CPU spent counts.

    The scale bench reads this histogram for the cost of an idle pass at 100,000 leases;
    a pass that stopped observing (or observed nothing) would leave that figure blank.
    """
    from joblease.controller.reconciler import LeaseView, Reconciler
    from support.memstore import MemoryStore

    view = LeaseView()
    future = datetime.now(UTC) + timedelta(days=1)
    for i in range(2000):
        view.put(lease(f"h{i}", Phase.HELD, future))
    reconciler = Reconciler(MemoryStore(), view, timedelta(0), writers=1)  # type: ignore[arg-type]

    def sample(suffix: str) -> float:
        return REGISTRY.get_sample_value(f"joblease_reconcile_pass_cpu_seconds_{suffix}") or 0.0

    count, total = sample("count"), sample("sum")
    reconciler.pass_once()
    reconciler.pass_once()
    assert sample("count") == count + 2
    assert sample("sum") > total
