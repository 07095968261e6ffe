"""One compare-and-swap step of the lease protocol, shared by every writer.

Every transition — a worker's claim, renew, complete or release, and the operator's
expire or initialize — goes through :func:`transact`, so there is exactly one place where
"read, decide, write conditionally" happens, and its rules are the same for everyone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from joblease.domain.clock import ServerNow
from joblease.domain.errors import LeaseError
from joblease.domain.lease import Observed, Transition
from joblease.kube.api import ConflictError
from joblease.kube.leases import LeaseStore

Decide = Callable[[Observed, ServerNow], Transition | None]
MAX_CONFLICTS = 8


class ContentionError(RuntimeError):
    """Every attempt met a 409: the object changes faster than we can decide."""


@dataclass(frozen=True)
class Outcome:
    """What happened: the object as now stored, the transition written (if any), when sent."""

    observed: Observed
    transition: Transition | None
    sent: float


def transact(store: LeaseStore, namespace: str, name: str, decide: Decide, *,
             observed: Observed | None = None, max_conflicts: int = MAX_CONFLICTS) -> Outcome:
    """Read, decide and conditionally write one JobLease transition.

    1. Read the object — unless the caller passes ``observed``, a version it believes is
       current (a holder renewing from its own last write skips the read).
    2. Estimate the API server's time now, as an interval (never the local wall clock).
    3. Decide with the pure protocol. A refusal raises here and nothing is written —
       but a refusal decided from the caller's cached version is confirmed from a fresh
       read first, so the error names the server's current holder and generation.
       ``None`` means there is nothing to do.
    4. Write the new status with the read ``resourceVersion`` as precondition.
    5. On 409 someone else wrote first: go back to 1 with a fresh read and decide again —
       the new decision may well be a refusal. A conflict is never retried blindly.

    Raises:
        LeaseError: the protocol refused (from step 3).
        ApiError: the API server refused the write for another reason (422 CEL, 403).
        ContentionError: ``max_conflicts`` attempts in a row met 409.
    """
    for _ in range(max_conflicts):
        cached = observed is not None
        current = observed or store.get(namespace, name)  # 1
        observed = None
        now = store.api.server_now()  # 2
        try:
            transition = decide(current, now)  # 3
        except LeaseError:
            if not cached:
                raise
            continue  # confirm the refusal from a fresh read
        if transition is None:
            return Outcome(current, None, store.api.monotonic())
        sent = store.api.monotonic()
        try:
            written = store.write_status(current, transition.status)  # 4
        except ConflictError:
            continue  # 5
        return Outcome(written, transition, sent)
    raise ContentionError(f"JobLease {namespace}/{name}: {max_conflicts} conflicting writes in a "
                          "row; giving up (is something rewriting it in a loop?)")
