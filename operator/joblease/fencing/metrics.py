"""Prometheus counters of fenced writes, for the process that runs the fencing check.

Why they exist: a stale-token refusal is the fencing working as designed, but a *rising rate*
of refusals means holders keep losing their leases mid-work (pauses longer than the lease,
durations too short for the work, an overloaded node). Only the process that runs the check
sees refusals, so the helpers count them there; a worker or target publishes them with
``prometheus_client.start_http_server(port)`` (they live on the default registry), and the
chart's ``JobleaseFencingRefusalsRising`` alert and dashboard read them.

Labels are deliberately few and bounded: ``helper`` names the helper that decided
(``gate``: :class:`~joblease.fencing.check.TokenGate` and the HTTP example built on it,
``filestore``, ``postgres``), and accepted writes carry ``result`` (``applied`` or
``duplicate``). There is no per-resource label: resources are job names, unbounded in
number, and a label per resource would grow every scraper's memory with every job.

What is counted is the helper's *decision*. For PostgreSQL, a write is counted once its
transaction (or savepoint, inside a caller's transaction) has been released; a caller's
outer transaction that later rolls back is not uncounted.
"""

from __future__ import annotations

from prometheus_client import Counter

HELPERS = ("gate", "filestore", "postgres")
"""Values of the ``helper`` label (every combination is exported from import on, at 0)."""

ACCEPTED = Counter(
    "joblease_fencing_accepted_total",
    "Fenced writes accepted by a fencing helper (applied now, or a duplicate of one applied "
    "before with the same token and idempotency key)",
    ["helper", "result"])
REFUSED = Counter(
    "joblease_fencing_refused_total",
    "Fenced writes refused by a fencing helper because their token was lower than one the "
    "target had already accepted (StaleTokenError)",
    ["helper"])

# Export every series from the start: a counter that first appears at 1 is invisible to
# rate()/increase() for that first increment, and the alert would miss the first refusals.
for _helper in HELPERS:
    REFUSED.labels(_helper)
    for _result in ("applied", "duplicate"):
        ACCEPTED.labels(_helper, _result)


def count_accepted(helper: str, duplicate: bool) -> None:
    """Count one accepted write by ``helper`` (one of :data:`HELPERS`)."""
    ACCEPTED.labels(helper, "duplicate" if duplicate else "applied").inc()


def count_refused(helper: str) -> None:
    """Count one refused write by ``helper`` (one of :data:`HELPERS`)."""
    REFUSED.labels(helper).inc()
