"""Prometheus metrics of the operator (served on ``--metrics-port``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LEASES = Gauge("joblease_leases", "JobLeases known to this operator, by phase", ["phase"])
TRANSITIONS = Counter("joblease_transitions_total",
                      "Lease transitions observed (claimed, renewed, completed, released, "
                      "expired, failed, initialized)", ["kind"])
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
