"""Prometheus metrics of the operator (served on ``--metrics-port``).

Every metric here is listed, with its alerts and dashboard panels, in ``docs/operations.md``;
the chart's alert rules (``charts/joblease-operator/files/alerts.yaml``) and dashboard read
them, and tests fail when either names a metric a live operator does not expose.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from joblease.domain.lease import Phase

if TYPE_CHECKING:
    from joblease.domain.clock import ServerNow
    from joblease.domain.lease import Observed

LEASES = Gauge("joblease_leases", "JobLeases known to this operator, by phase", ["phase"])
TRANSITIONS = Counter("joblease_transitions_total",
                      "Lease transitions observed on the watch (claimed, renewed, completed, "
                      "released; failed when another writer turned a lease Failed)", ["kind"])
OPERATOR_WRITES = Counter("joblease_operator_writes_total",
                          "Writes this operator made to JobLeases, by transition", ["kind"])
CONFLICTS = Counter("joblease_operator_conflicts_total",
                    "Operator writes lost to a concurrent writer (409, then re-decided)")
EXPIRY_LAG = Histogram("joblease_expiry_lag_seconds",
                       "Server time from leaseUntil to the operator marking the lease Expired",
                       buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30))
EVENTS_DROPPED = Counter("joblease_operator_events_dropped_total",
                         "Kubernetes Events not posted because the posting queue was full")
OBJECT_ERRORS = Counter("joblease_operator_object_errors_total",
                        "Objects the operator could not process in a pass (logged, an Event "
                        "posted; the other objects were still processed), by where",
                        ["stage"])
PASS_CPU = Histogram("joblease_reconcile_pass_cpu_seconds",
                     "CPU time of one reconcile pass in the thread that runs it (writes on the "
                     "writer pool not included): what looking costs when little is due",
                     buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25,
                              1))
LAST_PASS = Gauge("joblease_operator_last_pass_timestamp_seconds",
                  "Unix time (the operator's clock) at which its last reconcile pass finished")

# Export the kinds alerts and panels read from the start: a counter series that first
# appears at 1 is invisible to rate()/increase() for that first increment.
for _kind in ("claimed", "renewed", "completed", "released", "failed"):
    TRANSITIONS.labels(_kind)
for _stage in ("read", "decide", "write", "delete", "delegate"):
    OBJECT_ERRORS.labels(_stage)
for _kind in ("expired", "failed", "deleted",
              "claimed", "renewed", "completed", "released"):
    OPERATOR_WRITES.labels(_kind)


def count_failed(previous: Observed | None, current: Observed) -> None:
    """Count a lease the watch saw turn Failed (``joblease_transitions_total{kind="failed"}``).

    Why here and not in ``observed_transition``: a Failed lease gets no Event of its own from
    the watch, but "jobs failing after maxAttempts" needs a count whoever wrote it — a
    worker's claim or failed release, or another replica's expiry. This operator's own
    Failed writes are already in ``joblease_operator_writes_total{kind="failed"}`` and are
    normally in the view before their watch event arrives (so not counted twice); the very
    first sight of a lease (``previous`` None, e.g. after a restart) is not a transition.
    """
    if (previous is not None and previous.status.phase is not Phase.FAILED
            and current.status.phase is Phase.FAILED):
        TRANSITIONS.labels("failed").inc()


class OverdueCollector:
    """Computes at scrape time how far Held leases are past ``leaseUntil`` (server clock).

    Why at scrape time and not in the reconcile pass: this is the alarm for the operator
    *not* expiring leases (its writes refused by RBAC or the admission policy, its loop
    stuck, its pass too slow). A gauge set by the pass would freeze with the pass; this one
    reads the watch-fed view and the server-clock estimate whenever Prometheus asks.
    ``joblease_expiry_lag_seconds`` cannot show it either: it observes only expiries that
    succeeded.
    """

    def __init__(self) -> None:
        self._leases: Callable[[], list[Observed]] | None = None
        self._now: Callable[[], ServerNow] | None = None

    def watch(self, leases: Callable[[], list[Observed]], now: Callable[[], ServerNow]) -> None:
        """Start reporting over ``leases()`` (the view's Held leases) at server time ``now()``."""
        self._leases, self._now = leases, now

    def unwatch(self, leases: Callable[[], list[Observed]]) -> None:
        """Stop reporting over ``leases`` if it is still the source (an operator run ended).

        Why conditional: two runs in one process share this collector (metrics are
        per process); a run that stops must not silence the run started after it.
        """
        if self._leases == leases:
            self._leases = self._now = None

    def measure(self) -> tuple[int, float]:
        """(Held leases past leaseUntil, seconds the most overdue one is past it)."""
        if self._leases is None or self._now is None:
            return 0, 0.0
        now = self._now().earliest  # certainly this late, whatever the clock error
        count, worst = 0, 0.0
        for obs in self._leases():
            until = obs.status.lease_until
            if obs.status.phase is Phase.HELD and until is not None and until < now:
                count += 1
                worst = max(worst, (now - until).total_seconds())
        return count, worst

    def collect(self) -> Iterator[Metric]:
        """Yield both gauges (prometheus_client calls this on every scrape)."""
        count, worst = self.measure()
        yield GaugeMetricFamily(
            "joblease_leases_overdue",
            "Held JobLeases whose leaseUntil has passed on the server's clock (expired, not "
            "yet marked Expired by any operator)", value=count)
        yield GaugeMetricFamily(
            "joblease_lease_overdue_max_seconds",
            "Seconds the most overdue Held JobLease is past its leaseUntil (0 if none)",
            value=worst)


OVERDUE = OverdueCollector()
REGISTRY.register(OVERDUE)
