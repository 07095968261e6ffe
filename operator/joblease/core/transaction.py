"""One compare-and-swap step of the lease protocol, as a sans-IO loop shared by every writer.

Every transition — a worker's claim, renew, complete or release, and the operator's
expire or initialize — is one :func:`transaction`, so there is exactly one place where
"read, decide, write conditionally" happens, and its rules are the same for everyone.

Why a generator: the loop is written once, without I/O. It yields what it needs —
:class:`Read`, :class:`ServerTime`, :class:`Write` — and receives the answer, or the
exception the request raised. The drivers of ``joblease.core.steps`` (blocking, with a
``LeaseStore``) and ``joblease.core.asteps`` (asyncio, with an ``AsyncLeaseStore``)
perform those steps, as they perform every other step of the clients' operations;
neither decides anything, so the sync and the async client cannot drift apart. The
operator's blocking entry point is ``joblease.core.steps.transact``.

Why in ``core`` (issue 31): the loop is the protocol's client side, not HTTP; it lived in
``kube/transact.py``, the adapter package, with an asyncio path (``atransact``) that only a
test fake used. ``joblease.kube.transact`` re-exports these names for the callers that
still import them from there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from joblease.domain.clock import ServerNow
from joblease.domain.errors import LeaseError
from joblease.domain.lease import LeaseStatus, Observed, Transition
from joblease.kube.api import DEFAULT_TIMEOUT, ConflictError, UnavailableError

Decide = Callable[[Observed, ServerNow], Transition | None]
T = TypeVar("T")
MAX_CONFLICTS = 8


class ContentionError(UnavailableError):
    """Every attempt met a 409: the object changes faster than we can decide.

    An ``UnavailableError`` (so an ``ApiError``): like an unreachable server, it says
    nothing about who holds the lease, and every retry loop treats it as transient.
    """

    def __init__(self, message: str) -> None:
        super().__init__(409, "Contention", message)


class UnconfirmedRefusalError(ContentionError):
    """A cached version refused the transition and no attempt was left to read a fresh one.

    Only with ``max_conflicts=1`` and a cached ``observed`` (a pool's claim from its view):
    nothing was written, and what refused it may already be stale, so it says nothing
    certain about the server's holder. A ``ContentionError`` to its callers (a pool answers
    both by choosing again once its watch brings a newer version); its own type and
    message so that it is not taken for writes that conflicted.
    """


@dataclass(frozen=True)
class Outcome:
    """What happened: the object as now stored, the transition written (if any), when sent."""

    observed: Observed
    transition: Transition | None
    sent: float


@dataclass(frozen=True)
class Read:
    """Step 1's request: read the JobLease, waiting at most ``timeout`` seconds."""

    namespace: str
    name: str
    timeout: float


@dataclass(frozen=True)
class ServerTime:
    """Step 2's question: the API server's time now (asks the server only if unknown)."""


@dataclass(frozen=True)
class Write:
    """Step 4's request: write ``status`` if the object is still at ``observed``'s version."""

    observed: Observed
    status: LeaseStatus
    timeout: float


TransactionStep = Read | ServerTime | Write
Transaction = Generator[TransactionStep, Any, Outcome]


def transaction(namespace: str, name: str, decide: Decide, monotonic: Callable[[], float], *,
                observed: Observed | None = None, max_conflicts: int = MAX_CONFLICTS,
                deadline: float | None = None) -> Transaction:
    """Read, decide and conditionally write one JobLease transition, as a sans-IO loop.

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

    ``deadline`` (local monotonic, on ``monotonic``) bounds every request: none waits past
    it, so a holder never blocks beyond the time its lease has left.

    Yields :class:`Read` (send back the ``Observed``), :class:`ServerTime` (send back a
    ``ServerNow``) and :class:`Write` (send back the written ``Observed``); a request's
    exception is thrown back in. Returns the :class:`Outcome`.

    Raises:
        LeaseError: the protocol refused (from step 3), or the object is gone.
        ApiError: the API server refused the write for another reason (422 CEL, 403);
            ``UnavailableError`` if it could not be reached, or ``deadline`` passed.
        ContentionError: ``max_conflicts`` attempts in a row met 409 (or lost answers);
            ``UnconfirmedRefusalError`` if the last one was refused from ``observed``.
    """
    lost_answer: UnavailableError | None = None
    unconfirmed: LeaseError | None = None
    for _ in range(max_conflicts):
        cached = observed is not None
        current = observed or (yield Read(namespace, name, _timeout(monotonic, deadline)))  # 1
        observed = None
        now = yield ServerTime()  # 2
        try:
            transition = decide(current, now)  # 3
        except LeaseError as refusal:
            if not cached:
                raise
            unconfirmed = refusal
            continue  # confirm the refusal from a fresh read
        unconfirmed = None
        if transition is None:
            return Outcome(current, None, monotonic())
        sent = monotonic()
        try:
            written = yield Write(current, transition.status,
                                  _timeout(monotonic, deadline))  # 4
        except ConflictError:
            lost_answer = None
            continue  # 5
        except UnavailableError as err:
            if deadline is not None and monotonic() >= deadline:
                raise
            lost_answer = err
            continue  # 6
        return Outcome(written, transition, sent)
    if lost_answer is not None:
        raise lost_answer  # the last write may have landed: say "unknown", not "refused"
    if unconfirmed is not None:  # max_conflicts=1 from a cached version: no attempt left
        raise UnconfirmedRefusalError(
            f"JobLease {namespace}/{name}: refused from the caller's cached version "
            f"{current.resource_version} ({unconfirmed}); not confirmed by a fresh read "
            f"within {max_conflicts} attempt(s)")
    raise ContentionError(f"JobLease {namespace}/{name}: {max_conflicts} conflicting writes in a "
                          "row; giving up (is something rewriting it in a loop?)")


def run_steps(steps: Generator[Any, Any, T], perform: Callable[[Any], Any]) -> T:
    """Run a sans-IO operation to its end: ``perform`` each step, send its answer back.

    A step's ``Exception`` is thrown back into the operation, which sees it exactly as it
    would see it from a direct call. The one sync driver loop (``joblease.core.steps.drive``).
    """
    answer: Any = None
    failure: Exception | None = None
    while True:
        try:
            step = steps.send(answer) if failure is None else steps.throw(failure)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            answer, failure = perform(step), None
        except Exception as err:
            answer, failure = None, err


async def arun_steps(steps: Generator[Any, Any, T],
                     perform: Callable[[Any], Awaitable[Any]]) -> T:
    """:func:`run_steps` with an awaited ``perform`` (the one asyncio driver loop).

    ``joblease.core.asteps.adrive`` drives the asyncio client's operations with it.

    A cancellation (a ``BaseException``) is not thrown into the operation: it ends the
    driver at once, as cancelling a direct ``await`` would.
    """
    answer: Any = None
    failure: Exception | None = None
    while True:
        try:
            step = steps.send(answer) if failure is None else steps.throw(failure)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            answer, failure = await perform(step), None
        except Exception as err:
            answer, failure = None, err


def _timeout(monotonic: Callable[[], float], deadline: float | None) -> float:
    """Seconds the next request may take: the client's default, or what is left."""
    if deadline is None:
        return DEFAULT_TIMEOUT
    left = deadline - monotonic()
    if left <= 0:
        raise UnavailableError(0, "DeadlineExceeded",
                               "no time left before the caller's deadline to ask the API server")
    return min(DEFAULT_TIMEOUT, left)
