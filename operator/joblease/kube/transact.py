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
from joblease.kube.api import DEFAULT_TIMEOUT, ConflictError, UnavailableError
from joblease.kube.leases import LeaseStore

Decide = Callable[[Observed, ServerNow], Transition | None]
MAX_CONFLICTS = 8


class ContentionError(UnavailableError):
    """Every attempt met a 409: the object changes faster than we can decide.

    An ``UnavailableError`` (so an ``ApiError``): like an unreachable server, it says
    nothing about who holds the lease, and every retry loop treats it as transient.
    """

    def __init__(self, message: str) -> None:
        super().__init__(409, "Contention", message)


@dataclass(frozen=True)
class Outcome:
    """What happened: the object as now stored, the transition written (if any), when sent."""

    observed: Observed
    transition: Transition | None
    sent: float


def transact(store: LeaseStore, namespace: str, name: str, decide: Decide, *,
             observed: Observed | None = None, max_conflicts: int = MAX_CONFLICTS,
             deadline: float | None = None) -> Outcome:
    """Read, decide and conditionally write one JobLease transition.

    1. Read the object — unless the caller passes ``observed``, a version it believes is
       current (a holder renewing from its own last write skips the read).
    2. Estimate the API server's time now, as an interval (never the local wall clock).
    3. Decide with the pure protocol. A refusal raises here and nothing is written —
       but a refusal decided from the caller's cached version is confirmed from a fresh
       read first, so the error names the server's current holder and generation.
       ``None`` means there is nothing to do (or the caller's own earlier write is already
       there: the decisions recognise their own claim, completion and release).
    4. Write the new status with the read ``resourceVersion`` as precondition.
    5. On 409 someone else wrote first: go back to 1 with a fresh read and decide again —
       the new decision may well be a refusal. A conflict is never retried blindly.
    6. If the write's answer was lost (timeout, connection reset, 5xx) it may or may not
       have been applied: go back to 1 with a fresh read and decide again, which finds
       our own write if it landed (step 3) or writes it again conditionally if not.

    ``deadline`` (local monotonic) bounds every request: none waits past it, so a holder
    never blocks beyond the time its lease has left.

    Raises:
        LeaseError: the protocol refused (from step 3), or the object is gone.
        ApiError: the API server refused the write for another reason (422 CEL, 403);
            ``UnavailableError`` if it could not be reached, or ``deadline`` passed.
        ContentionError: ``max_conflicts`` attempts in a row met 409 (or lost answers).
    """
    lost_answer: UnavailableError | None = None
    for _ in range(max_conflicts):
        cached = observed is not None
        current = observed or store.get(namespace, name, _timeout(store, deadline))  # 1
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
            written = store.write_status(current, transition.status,
                                         _timeout(store, deadline))  # 4
        except ConflictError:
            lost_answer = None
            continue  # 5
        except UnavailableError as err:
            if deadline is not None and store.api.monotonic() >= deadline:
                raise
            lost_answer = err
            continue  # 6
        return Outcome(written, transition, sent)
    if lost_answer is not None:
        raise lost_answer  # the last write may have landed: say "unknown", not "refused"
    raise ContentionError(f"JobLease {namespace}/{name}: {max_conflicts} conflicting writes in a "
                          "row; giving up (is something rewriting it in a loop?)")


def _timeout(store: LeaseStore, deadline: float | None) -> float:
    """Seconds the next request may take: the client's default, or what is left."""
    if deadline is None:
        return DEFAULT_TIMEOUT
    left = deadline - store.api.monotonic()
    if left <= 0:
        raise UnavailableError(0, "DeadlineExceeded",
                               "no time left before the caller's deadline to ask the API server")
    return min(DEFAULT_TIMEOUT, left)
