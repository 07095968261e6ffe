"""``HoldingEngine``: the renewal loop's decisions, on a clock the test moves.

Issue 31, item 4: one engine decides for both holdings (``sdk.Holding``'s threads,
``aio.AsyncLeaseHolding``'s task and timer), so its rules are pinned here once, without
waiting: when to renew and how long to back off; that a refusal is the loss and any other
exception a retry; that no renewal is sent past the deadline, whatever the clock did; that
a renewal answered after the loss changes nothing; that a guard ending any way but a
requested stop is a declared loss; that the loss is declared once and never cleared; what
the exit releases. ``tests/unit/test_holdings.py`` drives both holdings through the same
rules on real time.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

import pytest

from joblease.core.transaction import ContentionError
from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseGoneError,
    LeaseLostError,
    RenewalStoppedError,
    StaleLeaseError,
)
from joblease.domain.holder import MAX_RETRY_DELAY, HoldingEngine
from joblease.domain.token import FencingToken
from joblease.kube.api import UnavailableError

TOKEN = FencingToken(3, 7)


class ClockLease:
    """A held lease on a clock the test sets (``now``); the engine reads only ``remaining``."""

    def __init__(self, seconds: float) -> None:
        self.name, self.holder, self.token = "job", "a", TOKEN
        self.lease_until: datetime | None = datetime(2026, 12, 6, 12, tzinfo=UTC)
        self.loss: LeaseLostError | None = None
        self.now = 0.0
        self.deadline = seconds

    @property
    def generation(self) -> int:
        return self.token.generation

    def remaining(self) -> float:
        return self.deadline - self.now

    def valid(self) -> bool:
        return self.loss is None and self.remaining() > 0


class Driver:
    """What the engine tells its driver, recorded."""

    def __init__(self) -> None:
        self.lost: list[bool] = []
        self.stood_down = 0
        self.renewed = 0


def engine(lease: ClockLease, *, fraction: float = 1 / 3, stop_before: float = 0.0,
           driver: Driver | None = None) -> tuple[HoldingEngine[Any], Driver]:
    d = driver or Driver()
    return HoldingEngine(lease, fraction, stop_before, lost=d.lost.append,
                         stand_down=lambda: setattr(d, "stood_down", d.stood_down + 1),
                         renewed=lambda: setattr(d, "renewed", d.renewed + 1)), d


def stale() -> StaleLeaseError:
    return StaleLeaseError("job", "a", TOKEN, "b", FencingToken(3, 8), "Held")


# -- the renewer ----------------------------------------------------------------------------

def test_the_renewer_waits_a_fraction_of_the_lease_and_never_past_the_deadline() -> None:
    lease = ClockLease(30.0)
    e, _ = engine(lease)
    assert e.renew_pause() == pytest.approx(10.0)
    lease.now = 25.0  # the renewer overslept: only the 5 s left are waited
    assert e.renew_pause() == pytest.approx(5.0)
    lease.now = 31.0
    assert e.renew_pause() == 0.0  # never a negative wait


def test_transient_failures_back_off_then_a_success_restores_the_interval() -> None:
    lease = ClockLease(30.0)
    e, d = engine(lease)
    errors: list[Exception] = [UnavailableError(0, "Unavailable", "reset"),
                               ContentionError("8 conflicting writes"), TimeoutError("read"),
                               RuntimeError("credential plugin"), KeyError("status"),
                               ValueError("bad json")]
    pauses = []
    for err in errors:
        assert e.renewal_done(err) is True  # retried, whatever its type
        pauses.append(e.renew_pause())
    assert pauses == [0.1, 0.2, 0.4, 0.8, MAX_RETRY_DELAY, MAX_RETRY_DELAY]
    assert e.renew_failures == 6 and e.loss is None and d.lost == [] and d.renewed == 0
    lease.deadline = lease.now + 30.0
    assert e.renewal_done(None) is True
    assert e.renew_pause() == pytest.approx(10.0) and d.renewed == 1


@pytest.mark.parametrize("refusal", [
    stale(), LeaseGoneError("job", "default", "deleted"),
    LeaseExpiredError("job", "a", TOKEN, None)])
def test_a_refusal_is_the_loss_with_its_reason_and_the_renewer_stops(
        refusal: LeaseLostError) -> None:
    lease = ClockLease(30.0)
    e, d = engine(lease)
    assert e.renewal_done(refusal) is False
    assert e.loss is refusal and lease.loss is refusal and d.lost == [False]
    assert e.renew_pause() is None and e.deadline_left() is None


@pytest.mark.parametrize("jump", [30.0, 3600.0])
def test_no_renewal_is_sent_past_the_deadline_after_a_clock_jump(jump: float) -> None:
    """A suspended machine, a renewer that overslept: the expiry, not a late renewal."""
    lease = ClockLease(30.0)
    e, d = engine(lease)
    lease.now += jump
    assert e.renew_due() is False
    assert isinstance(e.loss, LeaseExpiredError) and d.lost == [False]


def test_a_renewal_answered_after_the_loss_changes_nothing() -> None:
    """A hung request that comes back after the watchdog declared the expiry: the loss
    stays, the renewer stops, and the driver is not told of a renewal (``joblease run``
    would have pushed its supervisor's kill time past the stop; docs/safety.md #37)."""
    lease = ClockLease(30.0)
    e, d = engine(lease)
    assert e.renew_due() is True  # the renewal goes out, and hangs
    lease.now = 30.0
    assert e.deadline_left() is None
    lost = e.loss
    lease.deadline = 60.0  # the late answer moved the lease's deadline
    assert e.renewal_done(None) is False
    assert e.loss is lost and d.renewed == 0 and d.lost == [False]


def test_the_deadline_is_the_local_one_whatever_the_servers_end_says() -> None:
    lease = ClockLease(30.0)
    lease.lease_until = datetime(2999, 1, 1, tzinfo=UTC)  # a wall clock far ahead
    e, _ = engine(lease)
    lease.now = 30.0
    assert e.deadline_left() is None and isinstance(e.loss, LeaseExpiredError)


# -- the watchdog ---------------------------------------------------------------------------

def test_the_watchdog_sleeps_until_the_deadline_less_stop_before_and_declares_it() -> None:
    lease = ClockLease(30.0)
    e, d = engine(lease, stop_before=5.0)
    assert e.deadline_left() == pytest.approx(25.0)
    lease.now = 24.9
    assert e.deadline_left() == pytest.approx(0.1) and e.loss is None
    lease.now = 25.0
    assert e.deadline_left() is None
    err = e.loss
    assert isinstance(err, LeaseExpiredError) and lease.loss is err and d.lost == [False]
    assert (err.name, err.holder, err.lease_until) == ("job", "a", lease.lease_until)


def test_a_renewal_moves_the_watchdogs_deadline_without_a_signal() -> None:
    lease = ClockLease(30.0)
    e, _ = engine(lease)
    lease.now = 10.0
    lease.deadline = 40.0  # renewed
    assert e.renewal_done(None) is True
    lease.now = 30.0  # the watchdog wakes at the old deadline
    assert e.deadline_left() == pytest.approx(10.0) and e.loss is None


# -- every guard's end ----------------------------------------------------------------------

@pytest.mark.parametrize(("error", "cancelled", "why"), [
    (None, False, "ended unexpectedly"),
    (None, True, "was cancelled"),
    (SystemExit(3), False, "stopped by an unexpected error: SystemExit(3)"),
    (KeyError("x"), False, "stopped by an unexpected error: KeyError('x')")])
def test_a_guard_that_ends_while_guarding_is_a_declared_loss(
        error: BaseException | None, cancelled: bool, why: str) -> None:
    lease = ClockLease(30.0)
    e, d = engine(lease)
    e.guard_ended("renewal", error, cancelled=cancelled)
    assert isinstance(e.loss, RenewalStoppedError) and d.lost == [False]
    assert str(e.loss).endswith(f"renewal of 'job' {why}")


@pytest.mark.parametrize("how", ["stop", "completed"])
def test_a_guard_that_ends_after_the_holding_stopped_guarding_is_no_loss(how: str) -> None:
    lease = ClockLease(30.0)
    e, d = engine(lease)
    if how == "stop":
        e.stop()
    else:
        e.completion_done(None)
    assert d.stood_down == 1 and e.stopped
    e.guard_ended("renewal", RuntimeError("late"))
    e.guard_ended("deadline watchdog", cancelled=True)
    lease.now = 31.0
    assert e.deadline_left() is None and e.renew_pause() is None and not e.renew_due()
    assert e.loss is None and d.lost == []


def test_the_loss_is_declared_once_and_the_lease_keeps_its_own() -> None:
    lease = ClockLease(30.0)
    outside = stale()
    lease.loss = outside  # a direct lease.renew() was refused
    e, d = engine(lease)
    first = LeaseExpiredError("job", "a", TOKEN, None)
    e.declare(first)
    e.declare(stale())
    e.guard_ended("renewal", RuntimeError("after"))
    assert e.loss is first and lease.loss is outside and d.lost == [False]


def test_a_driver_that_raises_on_the_loss_does_not_undo_it() -> None:
    lease = ClockLease(30.0)

    def explode(_: bool) -> None:
        raise RuntimeError("hook failed")

    e = HoldingEngine(lease, 1 / 3, 0.0, lost=explode, stand_down=lambda: None,
                      renewed=lambda: None)
    lease.now = 30.0
    with contextlib.suppress(RuntimeError):
        e.deadline_left()
    assert isinstance(e.loss, LeaseExpiredError) and e.stopped


# -- the body's side: check, completion, exit -------------------------------------------------

def test_check_adopts_the_leases_loss_and_declares_a_passed_deadline_itself() -> None:
    lease = ClockLease(30.0)
    e, d = engine(lease)
    e.check()
    lease.loss = stale()
    with pytest.raises(StaleLeaseError) as err:
        e.check()
    assert e.loss is err.value and d.lost == [True]  # the body raises it: no cancel

    lease2 = ClockLease(30.0)
    e2, d2 = engine(lease2, stop_before=10.0)
    lease2.now = 20.0
    with pytest.raises(LeaseExpiredError):
        e2.check()
    assert d2.lost == [True]


def test_a_refused_completion_is_the_loss_and_a_completion_stops_the_guards() -> None:
    lease = ClockLease(30.0)
    e, d = engine(lease)
    e.completion_done(UnavailableError(0, "Unavailable", "reset"))  # no answer: still held
    assert not e.stopped and d.stood_down == 0
    refusal = stale()
    e.completion_done(refusal)
    assert e.loss is refusal and d.lost == [True] and not e.completed


@pytest.mark.parametrize(("completed", "lost", "raised", "failed", "release"), [
    (False, False, False, False, False),
    (False, False, True, False, True),
    (False, False, False, True, True),
    (True, False, True, True, None),
    (False, True, False, False, None)])
def test_the_exit_releases_unless_completed_or_lost_and_counts_failed_work(
        completed: bool, lost: bool, raised: bool, failed: bool, release: bool | None) -> None:
    e, _ = engine(ClockLease(30.0))
    e.failed = failed
    if completed:
        e.completion_done(None)
    if lost:
        e.declare(stale())
    assert e.release_on_exit(raised) is release


def test_a_check_that_cannot_build_the_expiry_is_a_declared_loss_not_a_bug() -> None:
    lease = ClockLease(30.0)
    lease.lease_until = "not a time"  # type: ignore[assignment]
    e, d = engine(lease)
    lease.now = 30.0
    with pytest.raises(RenewalStoppedError, match="check of 'job' stopped by an unexpected"):
        e.check()
    assert isinstance(e.loss, RenewalStoppedError) and d.lost == [True]
