"""The two holdings, one behaviour: ``sdk.Holding`` and ``aio.AsyncLeaseHolding``, the same tests.

Issue 31, item 4: both drive one engine (``domain.holder.HoldingEngine``, pinned on a scripted
clock in ``test_holding_engine.py``); these tests try to break the drivers — the waiting and
the sending — with a lease whose renewals the test scripts: a hung renewal, a lost answer,
an exception of any type from the transport, a renewer killed by a ``BaseException``, an
error in the watchdog, a hook that raises. The rules of ``docs/safety.md`` ("The holder's
loop"): a refusal is the loss; any other failure is retried; nothing delays the loss past the
deadline; a guard's only exit other than a requested stop is a declared loss; a completion
stops the guards for good; the exit releases only what is still held.

The body is one program for both (:func:`hold_for`): it steps every 50 ms, calls ``check()``
before each step until it completes the lease, and stops at the first loss. The asyncio
holding also cancels it, which it sees as the same ``LeaseLostError``. Real time, in tenths
of a second.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from joblease.aio import AsyncLeaseHolding
from joblease.core.transaction import ContentionError
from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseLostError,
    RenewalStoppedError,
    StaleLeaseError,
)
from joblease.domain.token import FencingToken
from joblease.kube.api import UnavailableError
from joblease.sdk import Holding

pytestmark = pytest.mark.parametrize("kind", ["sync", "async"])
TOKEN = FencingToken(1, 1)
HANG = object()  # a renewal whose answer never comes (until the body ends)
STEP = 0.05


class Unplanned(BaseException):
    """An exception nobody planned for (not an ``Exception``)."""


class ScriptedLease:
    """The surface a holding uses; each renewal does what ``script`` says, then renews.

    ``script`` lists one outcome per renewal (then every renewal succeeds): ``None``
    succeeds, an exception is raised, :data:`HANG` waits until the body ends and then
    succeeds (an answer that comes back late).
    """

    def __init__(self, seconds: float, script: list[Any] | None = None) -> None:
        self.name, self.holder, self.generation, self.token = "job", "a", 1, TOKEN
        self.lease_until: datetime | None = None
        self.loss: LeaseLostError | None = None
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.script = list(script or [])
        self.renews = 0
        self.answered_late = 0
        self.completed: list[str] = []
        self.released: list[bool] = []
        self.release_error: Exception | None = None
        self.body_ended = threading.Event()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def valid(self) -> bool:
        return self.loss is None and self.remaining() > 0

    def _next(self) -> Any:
        self.renews += 1
        return self.script.pop(0) if self.script else None

    def _renewed(self) -> None:
        self.deadline = time.monotonic() + self.seconds

    def _complete(self, result: str) -> None:
        self.completed.append(result)
        self.deadline = time.monotonic()

    def _release(self, failed: bool) -> None:
        self.released.append(failed)
        if self.release_error is not None:
            raise self.release_error


class SyncLease(ScriptedLease):
    def renew(self) -> None:
        outcome = self._next()
        if outcome is HANG:
            self.body_ended.wait(10)
            self.answered_late += 1
        elif isinstance(outcome, BaseException):
            raise outcome
        self._renewed()

    def complete(self, result: str = "") -> None:
        self._complete(result)

    def release(self, failed: bool = False) -> None:
        self._release(failed)


class AsyncLease(ScriptedLease):
    async def renew(self) -> None:
        outcome = self._next()
        if outcome is HANG:
            while not self.body_ended.is_set():  # (the watchdog cancels it first)
                await asyncio.sleep(STEP)
            self.answered_late += 1
        elif isinstance(outcome, BaseException):
            raise outcome
        self._renewed()

    async def complete(self, result: str = "") -> None:
        self._complete(result)

    async def release(self, failed: bool = False) -> None:
        self._release(failed)


def lease_for(kind: str, seconds: float, script: list[Any] | None = None) -> ScriptedLease:
    return (SyncLease if kind == "sync" else AsyncLease)(seconds, script)


@dataclass
class Run:
    """What one held body saw: how it ended, after how long, what the hooks were told."""

    holding: Any
    error: BaseException | None = None
    elapsed: float = 0.0
    steps: int = 0
    lost_calls: int = 0
    renewed_after_loss: int = 0
    returned: Any = None
    hooks: list[str] = field(default_factory=list)


def hold_for(kind: str, lease: ScriptedLease, seconds: float,
             action: Callable[[Any, int], Any] | None = None, *, checks: bool = True,
             on_lost: Callable[[], None] | None = None, **kwargs: Any) -> Run:
    """Hold ``lease`` while a body steps for ``seconds``, calling ``check()`` before each step.

    With ``checks=False`` the body only looks at ``holding.lost`` and leaves the block
    normally once it is set (the asyncio holding cancels it first).

    ``action(holding, step)`` runs at every step (what it returns is awaited for the asyncio
    holding, so ``holding.complete()`` works for both). The hooks ``on_lost`` and
    ``on_renewed`` are recorded (renewals after the loss counted apart).
    """
    cls = Holding if kind == "sync" else AsyncLeaseHolding
    holding = cls(lease, **kwargs)  # type: ignore[arg-type]
    run = Run(holding)

    def lost() -> None:
        run.lost_calls += 1
        if on_lost is not None:
            on_lost()

    def renewed() -> None:
        run.hooks.append("renewed")
        if holding.loss is not None:
            run.renewed_after_loss += 1

    holding.on_lost, holding.on_renewed = lost, renewed
    steps = max(1, round(seconds / STEP))
    started = time.monotonic()
    try:
        if kind == "sync":
            run.returned = _sync_body(holding, lease, steps, action, run, checks)
        else:
            run.returned = asyncio.run(_async_body(holding, lease, steps, action, run, checks))
    except BaseException as err:
        run.error = err
    run.elapsed = time.monotonic() - started
    return run


def _sync_body(holding: Any, lease: ScriptedLease, steps: int, action: Any, run: Run,
               checks: bool) -> Any:
    with holding:
        try:
            for i in range(steps):
                if not checks and holding.lost.is_set():
                    break
                if checks and not holding.completed:  # a completed lease: nothing to check
                    holding.check()
                if action is not None:
                    action(holding, i)
                time.sleep(STEP)
                run.steps += 1
        finally:
            lease.body_ended.set()
    return "done"


async def _async_body(holding: Any, lease: ScriptedLease, steps: int, action: Any,
                      run: Run, checks: bool) -> Any:
    async with holding:
        try:
            for i in range(steps):
                if not checks and holding.lost.is_set():
                    break
                if checks and not holding.completed:  # a completed lease: nothing to check
                    holding.check()
                if action is not None:
                    result = action(holding, i)
                    if inspect.isawaitable(result):
                        await result
                await asyncio.sleep(STEP)
                run.steps += 1
        finally:
            lease.body_ended.set()
    return "done"


def stale() -> StaleLeaseError:
    return StaleLeaseError("job", "a", TOKEN, "b", FencingToken(1, 2), "Held")


# -- the renewer ------------------------------------------------------------------------------

def test_a_hung_renewal_cannot_delay_the_loss_past_the_deadline(kind: str) -> None:
    lease = lease_for(kind, 0.6, [HANG])
    run = hold_for(kind, lease, 10)
    assert isinstance(run.error, LeaseExpiredError)
    assert run.holding.loss is run.error and lease.loss is run.error
    assert run.holding.lost.is_set() and run.lost_calls == 1
    assert run.elapsed < 1.5 and run.steps < 30  # at the deadline (0.6 s), not after 10 s
    assert lease.renews == 1 and lease.released == []  # a lost lease is not released


def test_a_renewal_answered_after_the_loss_is_not_a_renewal(kind: str) -> None:
    """The hung request comes back (the thread holding waits for its renewer on exit; the
    asyncio one abandoned it): the loss stays, ``on_renewed`` is not told (docs/safety.md
    #37: ``joblease run`` then pushed its supervisor's kill time past the stop)."""
    lease = lease_for(kind, 0.6, [HANG])
    run = hold_for(kind, lease, 10)
    assert isinstance(run.error, LeaseExpiredError) and run.holding.loss is run.error
    assert run.renewed_after_loss == 0 and run.hooks == []
    assert lease.answered_late == (1 if kind == "sync" else 0)


def test_a_refused_renewal_is_the_loss_at_the_first_renewal(kind: str) -> None:
    lease = lease_for(kind, 0.9, [stale()])
    run = hold_for(kind, lease, 10)
    assert isinstance(run.error, StaleLeaseError) and run.holding.loss is run.error
    assert run.elapsed < 0.8  # a third of 0.9 s, not the deadline
    assert lease.renews == 1 and lease.released == []


def test_transient_failures_of_any_type_are_retried_and_renewals_keep_the_lease(
        kind: str) -> None:
    # each failure retried (50 ms doubling) with a second left; every type: the engine's test
    failures = [UnavailableError(0, "Unavailable", "reset"), None, ContentionError("409 storm"),
                None, RuntimeError("a bug")]
    lease = lease_for(kind, 1.5, list(failures))
    run = hold_for(kind, lease, 2.5)  # past the lease: only the renewals keep it
    assert run.error is None and run.returned == "done"
    assert run.holding.renew_failures == 3 and run.holding.loss is None
    assert lease.renews >= 6 and "renewed" in run.hooks
    assert lease.released == [False]


def test_a_lost_answer_is_retried_and_a_renewal_that_never_succeeds_ends_at_the_deadline(
        kind: str) -> None:
    lease = lease_for(kind, 0.8, [UnavailableError(0, "Unavailable", "reset")] * 100)
    run = hold_for(kind, lease, 10)
    assert isinstance(run.error, LeaseExpiredError)
    assert lease.renews >= 2 and run.holding.renew_failures == lease.renews
    assert 0.6 < run.elapsed < 1.6  # never early, and not after the body's 10 s


def test_a_renewer_killed_by_an_unplanned_base_exception_is_a_declared_loss(
        kind: str) -> None:
    lease = lease_for(kind, 0.9, [Unplanned("no one caught this")])
    run = hold_for(kind, lease, 10)
    assert isinstance(run.error, RenewalStoppedError) and "Unplanned" in str(run.error)
    assert "renewal of 'job' stopped by an unexpected error: Unplanned(" in str(run.error)
    assert run.elapsed < 0.8 and lease.released == []


# -- the watchdog and the hooks -----------------------------------------------------------------

def test_an_error_in_the_deadline_watchdog_is_a_declared_loss(kind: str) -> None:
    """Building the expiry error raises here: the watchdog's end is judged, not lost
    (for the asyncio timer's callback, docs/safety.md #27)."""
    lease = lease_for(kind, 0.3, [HANG])
    lease.lease_until = "not a time"  # type: ignore[assignment]
    run = hold_for(kind, lease, 10, checks=False)  # (a check() would meet the error first)
    assert isinstance(run.holding.loss, RenewalStoppedError)
    assert "deadline watchdog" in str(run.holding.loss) and run.elapsed < 1.2
    # what ended it, named: the guard and the error (not "ended unexpectedly")
    assert "deadline watchdog of 'job' stopped by an unexpected error: " in str(run.holding.loss)


def test_an_error_in_check_is_a_declared_loss(kind: str) -> None:
    lease = lease_for(kind, 5)
    lease.lease_until = "not a time"  # type: ignore[assignment]
    lease.loss = None

    def overrun(holding: Any, step: int) -> None:
        lease.deadline = time.monotonic()  # the expiry is due; building it raises
        holding.check()  # at once: before either guard can wake to it

    run = hold_for(kind, lease, 1, overrun)
    assert isinstance(run.error, RenewalStoppedError) and run.holding.loss is run.error
    assert "check of 'job'" in str(run.error) and lease.released == []


def test_a_hook_that_raises_neither_undoes_nor_hides_the_loss(kind: str) -> None:
    def explode() -> None:
        raise RuntimeError("on_lost failed")

    lease = lease_for(kind, 0.9, [stale()])
    run = hold_for(kind, lease, 10, on_lost=explode)
    assert isinstance(run.error, StaleLeaseError) and run.holding.loss is run.error
    assert run.elapsed < 0.8 and run.lost_calls == 1


def test_an_expiry_names_the_lease_its_holder_generation_and_end(kind: str) -> None:
    lease = lease_for(kind, 0.3, [HANG])
    lease.lease_until = datetime(2026, 12, 5, 12, tzinfo=UTC)
    run = hold_for(kind, lease, 10)
    err = run.error
    assert isinstance(err, LeaseExpiredError)
    assert (err.name, err.holder, err.generation, err.lease_until) == (
        "job", "a", 1, datetime(2026, 12, 5, 12, tzinfo=UTC))


def test_a_lease_already_past_its_deadline_stops_the_body_at_once(kind: str) -> None:
    lease = lease_for(kind, 5)
    run = hold_for(kind, lease, 10, stop_before=5.0)
    assert isinstance(run.error, LeaseExpiredError) and run.steps <= 1


# -- the body's side: check, completion, exit ---------------------------------------------------

def test_check_declares_a_passed_deadline_and_adopts_the_leases_own_loss(kind: str) -> None:
    lease = lease_for(kind, 5)

    def overrun(holding: Any, step: int) -> None:
        if step == 1:
            time.sleep(0.2)  # the body itself overruns (blocking on purpose)

    run = hold_for(kind, lease, 2, overrun, stop_before=4.85)
    # the thread body's check() sees it; the asyncio body may be cancelled first
    assert isinstance(run.error, LeaseExpiredError) and run.steps in (1, 2)
    assert lease.released == []

    lease = lease_for(kind, 5)
    outside = stale()

    def refused_elsewhere(holding: Any, step: int) -> None:
        if step == 1:
            lease.loss = outside  # a direct lease.renew() was refused

    run = hold_for(kind, lease, 2, refused_elsewhere)
    assert run.error is outside and run.holding.loss is outside and run.holding.lost.is_set()


def test_a_completion_stops_both_guards_for_good(kind: str) -> None:
    lease = lease_for(kind, 0.45)
    renews: list[int] = []

    def complete(holding: Any, step: int) -> Any:
        if step == 4:
            renews.append(lease.renews)
            return holding.complete("done")
        return None

    run = hold_for(kind, lease, 1.2, complete)  # past the old deadline, several renewal times
    assert run.error is None and run.holding.completed and run.holding.loss is None
    assert lease.renews == renews[0] and lease.completed == ["done"]
    assert lease.released == []


def test_a_refused_completion_is_the_loss(kind: str) -> None:
    lease = lease_for(kind, 5)
    refusal = stale()

    def refuse(result: str = "") -> None:
        raise refusal

    async def arefuse(result: str = "") -> None:
        raise refusal

    lease.complete = refuse if kind == "sync" else arefuse  # type: ignore[attr-defined]
    run = hold_for(kind, lease, 1, lambda h, i: h.complete("x") if i == 1 else None)
    assert run.error is refusal and run.holding.loss is refusal and not run.holding.completed
    assert lease.released == []


@pytest.mark.parametrize("how", ["normal", "raised", "fail()"])
def test_the_exit_releases_and_counts_an_attempt_only_for_failed_work(kind: str,
                                                                      how: str) -> None:
    def act(holding: Any, step: int) -> None:
        if how == "raised":
            raise ValueError("work failed")
        if how == "fail()":
            holding.fail()

    lease = lease_for(kind, 5)
    run = hold_for(kind, lease, 0.1, act)
    assert (type(run.error) is ValueError) == (how == "raised")
    assert lease.released == [how != "normal"]


@pytest.mark.parametrize("refusal", [
    UnavailableError(0, "Unavailable", "reset"),
    StaleLeaseError("job", "a", TOKEN, "b", FencingToken(1, 2), "Held")])
def test_a_release_that_fails_on_exit_is_not_the_bodys_error(kind: str,
                                                             refusal: Exception) -> None:
    """The lease then ends at its deadline; the work's own outcome is what the block says."""
    lease = lease_for(kind, 5)
    lease.release_error = refusal
    run = hold_for(kind, lease, 0.1)
    assert run.error is None and run.returned == "done" and lease.released == [False]


# -- asyncio only: cancellations ------------------------------------------------------------------

def test_a_callers_cancellation_stays_a_cancellation(kind: str) -> None:
    if kind == "sync":
        return  # a thread has no cancellation to tell apart (parametrised to keep one list)
    lease = AsyncLease(5)

    async def body() -> None:
        async with AsyncLeaseHolding(lease):  # type: ignore[arg-type]
            await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.ensure_future(body())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert lease.loss is None and lease.released == [True]


def test_a_renewer_cancelled_from_outside_is_a_declared_loss(kind: str) -> None:
    if kind == "sync":
        return  # a thread cannot be cancelled from outside
    lease = AsyncLease(5)

    async def main() -> None:
        with pytest.raises(RenewalStoppedError, match="renewal of 'job' was cancelled"):
            async with AsyncLeaseHolding(lease) as holding:  # type: ignore[arg-type]
                assert holding._renewer is not None
                holding._renewer.cancel()
                await asyncio.sleep(10)

    asyncio.run(main())
    assert lease.released == []


def test_a_loss_the_body_declared_with_check_does_not_cancel_it(kind: str) -> None:
    if kind == "sync":
        return  # the thread holding never cancels its body
    lease = AsyncLease(5)

    async def main() -> None:
        async with AsyncLeaseHolding(lease, stop_before=4.9) as holding:  # type: ignore[arg-type]
            time.sleep(0.15)  # the body itself overruns (blocking on purpose)
            with pytest.raises(LeaseExpiredError):
                holding.check()
            await asyncio.sleep(0)  # not cancelled (the timer is due too): the raise is the signal
            with pytest.raises(LeaseExpiredError):
                holding.check()

    asyncio.run(main())
    assert lease.released == []


def test_a_completion_without_a_result_records_an_empty_one(kind: str) -> None:
    lease = lease_for(kind, 5)
    run = hold_for(kind, lease, STEP, lambda holding, step: holding.complete())  # one step
    assert run.error is None and lease.completed == [""]


def test_the_guards_are_named_after_the_lease_and_never_keep_a_process_alive(kind: str
                                                                          ) -> None:
    """Thread and task names are what a stack dump or ``asyncio.all_tasks()`` shows."""
    seen: dict[str, bool] = {}

    def look(holding: Any, step: int) -> None:
        if kind == "sync":
            seen.update({t.name: t.daemon for t in threading.enumerate()})
        else:
            seen.update({t.get_name(): True for t in asyncio.all_tasks()})

    # a 0.6 s lease renews after 0.2 s: the sync guards start then (GuardStarter)
    run = hold_for(kind, lease_for(kind, 0.6), 0.4, look)
    assert run.error is None
    if kind == "sync":
        assert seen["renew-job"] is True and seen["deadline-job"] is True
    else:
        assert "joblease-renew-job" in seen
