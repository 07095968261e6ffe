"""The pool bench's pure figures (``bench/pool_figures.py``) and its dispatched rows.

Issue 30's dispatched order, urgent wait and trickle are judged by these: a figure that
errs short would claim a target the pool does not meet. The modules are loaded by their
path (``bench`` is not a package on the tests' ``sys.path``).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import time
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from support.paths import REPO

pytestmark = pytest.mark.unit


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


figures = _load("pool_figures")
report = _load("report")
Span = figures.Span


# -- places late -----------------------------------------------------------------------


def test_a_pool_started_in_its_order_has_no_job_late() -> None:
    assert figures.places_late(["a", "b", "c"], [(1.0, "a"), (2.0, "b"), (3.0, "c")]) == [0, 0, 0]


def test_a_job_started_after_two_later_ones_is_two_places_late() -> None:
    late = figures.places_late(["a", "b", "c"], [(3.0, "a"), (1.0, "b"), (2.0, "c")])
    assert late == [-1, -1, 2]  # b and c one early each, a two late


def test_jobs_started_at_the_same_instant_count_in_the_pools_order() -> None:
    """A tie on the timestamp's resolution is no evidence of disorder."""
    assert figures.places_late(["a", "b"], [(1.0, "b"), (1.0, "a")]) == [0, 0]


def test_places_late_refuses_a_start_of_a_job_outside_the_order() -> None:
    with pytest.raises(KeyError):
        figures.places_late(["a"], [(1.0, "a"), (2.0, "z")])


# -- an urgent job's wait ----------------------------------------------------------------


def _busy(slots: int, until: float) -> list[Any]:
    """``slots`` filler jobs held from 0 s; the k-th completes at ``until + k``."""
    return [Span(0.0, until + k, 0) for k in range(slots)]


def test_the_wait_counts_from_the_first_completion_after_the_creation() -> None:
    others = _busy(3, until=10.3)  # completions at 10.3, 11.3, 12.3
    out = figures.urgent_wait(10.0, 10.35, 9, others, slots=3)
    assert out["busy"] == 3 and not out["slot_free"]
    assert out["wait_s"] == pytest.approx(0.05)
    assert out["freed_after_s"] == pytest.approx(0.3)


def test_a_completion_before_the_creation_does_not_count_as_the_freeing() -> None:
    """Its slot was refilled before the urgent job existed: the next freeing counts."""
    others = [Span(0.0, 9.9, 0), Span(9.95, None, 0), *_busy(2, until=10.5)]
    out = figures.urgent_wait(10.0, 10.52, 9, others, slots=3)
    assert out["busy"] == 3 and out["wait_s"] == pytest.approx(0.02)


def test_a_slot_free_at_the_creation_counts_from_the_creation() -> None:
    """No freeing to wait for: the claim minus the creation, and it is said."""
    others = _busy(2, until=10.5)
    out = figures.urgent_wait(10.0, 10.04, 9, others, slots=3)
    assert out["slot_free"] and out["busy"] == 2
    assert out["wait_s"] == pytest.approx(0.04)


def test_a_slot_refilled_by_a_decision_made_before_the_urgent_job_was_seen_was_busy() -> None:
    """A worker between two jobs at the creation whose next job the dispatcher chose before
    it had the urgent job in view: the slot was given away already, so the wait counts from
    the next freeing, and the excuse is said."""
    others = [Span(0.0, 9.9, 0, "f1", "w1"), Span(10.01, None, 0, "f2", "w1"),
              *_busy(2, until=10.3)]
    out = figures.urgent_wait(10.0, 10.32, 9, others, slots=3, decided_unseen={"f2"})
    assert out["busy"] == 3 and not out["slot_free"] and out["decided_unseen"] == 1
    assert out["wait_s"] == pytest.approx(0.02)
    assert out["lower_claimed_between"] == 0


def test_a_slot_refilled_by_a_decision_that_saw_the_urgent_job_is_not_excused() -> None:
    """The same claim decided with the urgent job in view is a miss: from the creation."""
    others = [Span(0.0, 9.9, 0, "f1", "w1"), Span(10.01, None, 0, "f2", "w1"),
              *_busy(2, until=10.3)]
    out = figures.urgent_wait(10.0, 10.32, 9, others, slots=3, decided_unseen={"other"})
    assert out["slot_free"] and out["busy"] == 2 and out["decided_unseen"] == 0
    assert out["wait_s"] == pytest.approx(0.32)
    assert out["lower_claimed_between"] == 1


def test_an_unseen_decision_for_a_job_already_held_at_the_creation_excuses_nothing() -> None:
    others = [*_busy(3, until=10.3)]
    named = [Span(s.acquired, s.completed, s.priority, f"b{k}", f"w{k}")
             for k, s in enumerate(others)]
    out = figures.urgent_wait(10.0, 10.35, 9, named, slots=3, decided_unseen={"b0", "b1"})
    assert out["decided_unseen"] == 0 and out["busy"] == 3


def test_an_unseen_next_job_of_a_worker_still_busy_at_the_creation_hides_no_free_slot() -> None:
    """w0 is still running at the creation and its next job was chosen unseen; w2 was free
    and took a lower job chosen *with* the urgent one in view: still a free slot, a miss."""
    others = [Span(0.0, 10.1, 0, "a", "w0"), Span(10.12, None, 0, "a2", "w0"),
              Span(0.0, 11.0, 0, "b", "w1"),
              Span(0.0, 9.9, 0, "c", "w2"), Span(10.05, None, 0, "c2", "w2")]
    out = figures.urgent_wait(10.0, 11.02, 9, others, slots=3, decided_unseen={"a2"})
    assert out["slot_free"] and out["busy"] == 2 and out["decided_unseen"] == 0
    assert out["wait_s"] == pytest.approx(1.02)


def test_lower_jobs_claimed_between_the_freeing_and_the_urgent_claim_are_counted() -> None:
    """A pool that gives the freed slot to a queued job first is caught: the urgent job's
    claim then comes at the next freeing, and the lower claim in between is counted."""
    others = [*_busy(2, until=10.2), Span(10.22, None, 0), Span(10.25, None, 9)]
    out = figures.urgent_wait(10.0, 11.25, 9, others, slots=2)
    assert out["lower_claimed_between"] == 1  # the same-priority claim at 10.25 is not lower
    assert out["wait_s"] == pytest.approx(1.05)


def test_an_urgent_job_with_no_freeing_after_it_counts_from_its_creation() -> None:
    out = figures.urgent_wait(10.0, 10.1, 9, [Span(0.0, None, 0)], slots=1)
    assert not out["slot_free"] and math.isnan(out["freed_after_s"])
    assert out["wait_s"] == pytest.approx(0.1)


# -- the table's dispatched rows ----------------------------------------------------------


def _pool(**dispatched: Any) -> dict[str, Any]:
    targets = {"dispatched_max_late": 19, "urgent_wait_s": 0.1, "dispatched_latency_p99": 0.1,
               "dispatched_trickle_events_per_job": 10}
    met = {"dispatched_max_late": True, "urgent_wait": False, "dispatched_latency_p99": True,
           "dispatched_trickle_events": None}
    late = {"p99": 3.0, "mean": 0.5}
    return {"workers": 20, "targets": targets, "met": met, "dispatched": dispatched,
            "order": {"many": {"jobs": 200, "max_late": 31, "late": {"p99": 27.0}}},
            "latency": {"claimed": {"p99": 0.25}, "events_per_job": 63.0},
            "_order": {"jobs": 200, "max_late": 4, "late": late, "displaced": 12,
                       "dispatch": {"claimed_by_dispatcher": 200, "claimed_by_workers": 0}}}


def test_the_dispatched_rows_carry_figures_targets_and_verdicts() -> None:
    pool = _pool()
    pool["dispatched"] = {
        "order": pool.pop("_order"),
        "urgent": {"body": "sleep 1", "rounds": 5, "wait_s": {"p50": 0.03, "max": 0.2},
                   "all_busy_rounds": 5, "lower_claimed_between": 0},
        "trickle": {"jobs": 50, "rate": 5.0, "workers": 20, "claimed": {"p50": 0.01,
                                                                        "p99": 0.05},
                    "created": {"p50": 0.03, "p99": 0.08}, "events_per_job": 9.0,
                    "lease_events_per_job": 1.5,
                    "status_writes_per_job": 3.0, "wasted_per_job": 0.0}}
    rows = report._dispatched_rows(pool)
    assert len(rows) == 4 and all(len(row) == 6 for row in rows)
    order, urgent, claimed, events = rows
    assert order[1] == "4 / 3" and "by turns 31 / 27" in order[2] and order[5] == "yes"
    assert order[4] == "max ≤ 19"
    assert urgent[1] == "0.030 / 0.200" and urgent[4].startswith("≤ 0.1 s")
    assert urgent[5] == "**no**"
    assert claimed[1] == "0.010 / 0.050" and "by turns p99 0.250" in claimed[2]
    assert events[1] == "9.0 + 1.5" and events[5] == "n/a"  # JobLease + Lease events


def test_a_dispatched_section_that_failed_is_a_row_saying_so() -> None:
    pool = _pool(urgent={"error": "pool: urgent job urgent-0 not claimed in 30 s"})
    (row,) = report._dispatched_rows(pool)
    assert row[1] == "not measured: pool: urgent job urgent-0 not claimed in 30 s"


def test_results_without_dispatched_sections_give_no_rows() -> None:
    assert report._dispatched_rows(_pool()) == []


# -- the host's CPU per job ------------------------------------------------------------


def _window(busy: float, host: float, **processes: float) -> dict[str, Any]:
    return {"seconds": host / 2, "host_busy_cpu_s": busy, "host_cpu_s": host,
            "busy_fraction": busy / host,
            "processes_cpu_s": {k.replace("_", "-"): v for k, v in processes.items()}}


def test_the_cpu_budget_names_each_process_per_job_and_leaves_the_rest_to_the_host() -> None:
    window = _window(18.0, 20.0, kube_apiserver=9.0, etcd=2.0, kube_controller_manager=0.5)
    budget = figures.cpu_budget([window], 1000, clients_s=0.004, dispatcher_s=0.0015)
    assert budget["kube-apiserver"] == pytest.approx(9.0)
    assert budget["etcd"] == pytest.approx(2.0)
    assert budget["other control plane"] == pytest.approx(0.5)
    assert budget["clients"] == pytest.approx(4.0) and budget["dispatcher"] == pytest.approx(1.5)
    assert budget["rest"] == pytest.approx(18.0 - 9.0 - 2.0 - 0.5 - 4.0 - 1.5)
    assert budget["busy"] == pytest.approx(18.0) and budget["capacity"] == pytest.approx(20.0)
    assert budget["busy_fraction"] == pytest.approx(0.9)


def test_the_cpu_budget_adds_the_windows_of_a_phase_measured_twice() -> None:
    """The floor runs before and after the drains: its two windows are one phase."""
    one = _window(10.0, 12.0, kube_apiserver=5.0, etcd=1.0)
    two = _window(6.0, 8.0, kube_apiserver=3.0, etcd=1.0)
    budget = figures.cpu_budget([one, two], 2000, clients_s=0.002)
    assert budget["kube-apiserver"] == pytest.approx(4.0)
    assert budget["busy"] == pytest.approx(8.0) and budget["busy_fraction"] == pytest.approx(0.8)


def test_the_cpu_budget_row_puts_the_drain_beside_the_floor() -> None:
    floor = figures.cpu_budget([_window(20.0, 20.0, kube_apiserver=12.0, etcd=3.0)], 1000,
                               clients_s=0.0045)
    drain = figures.cpu_budget([_window(33.0, 34.0, kube_apiserver=15.0, etcd=3.5)], 1000,
                               clients_s=0.0137, dispatcher_s=0.0024)
    row = report._cpu_budget_row({"floor": floor, "dispatched": drain}, 4)
    assert "its 4 processes" in row[2]  # the run's own count (--quick: 4)
    assert row[1] == "15.0 / 3.5 / 0.0 / 13.7 / 2.4 / -1.6 = 33.0 of 34.0 (97 % busy)"
    assert row[2].endswith("12.0 / 3.0 / 0.0 / 4.5 / 0.0 / 0.5 = 20.0 of 20.0 (100 % busy)")


def test_a_cpu_window_sees_the_host_busy_while_this_process_spins() -> None:
    procstat = _load("procstat")

    cluster = SimpleNamespace(processes=[SimpleNamespace(name="me", pid=os.getpid())])
    window = procstat.CpuWindow(cluster)
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    figures_ = window.close()
    assert figures_["processes_cpu_s"]["me"] >= 0.2  # this process, read from /proc
    assert figures_["host_busy_cpu_s"] >= 0.2  # and the host counted it busy
    assert 0.0 < figures_["busy_fraction"] <= 1.0
    assert figures_["host_cpu_s"] >= figures_["host_busy_cpu_s"]
