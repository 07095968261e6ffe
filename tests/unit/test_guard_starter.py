"""The thread holding starts its two guards when the first renewal is due (``GuardStarter``).

A job that ends before then starts no thread; one that runs longer is guarded exactly as
before: the first renewal at the same moment, the watchdog at the same deadline. These
tests try to break that: a renewal that would come one pause late, a holding due earlier
than all the others, a guard that cannot be started, thousands of short blocks.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
from test_holdings import HANG, SyncLease

from joblease.domain.errors import LeaseExpiredError, RenewalStoppedError
from joblease.sdk import Holding
from joblease.sdk.hold import STARTER


class TimedLease(SyncLease):
    """Records when each renewal was sent (local monotonic)."""

    def __init__(self, seconds: float, script: list[Any] | None = None) -> None:
        super().__init__(seconds, script)
        self.renewed_at: list[float] = []

    def renew(self) -> None:
        self.renewed_at.append(time.monotonic())
        super().renew()


def _guards_alive(name: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in (f"renew-{name}",
                                                               f"deadline-{name}")]


def test_a_block_that_ends_before_its_first_renewal_starts_no_guard_thread() -> None:
    lease = TimedLease(30)
    lease.name = "short"
    pending = STARTER.pending()
    with Holding(lease) as holding:
        time.sleep(0.05)
        assert _guards_alive("short") == [] and STARTER.pending() == pending + 1
        holding.complete("done")
    assert holding._guard_threads is None, "a guard thread was made"
    assert STARTER.pending() == pending and lease.completed == ["done"]


def test_the_first_renewal_comes_when_due_not_one_pause_later() -> None:
    """The renewer starts at its first pause; it must not wait that pause again."""
    lease = TimedLease(0.9)  # renews every 0.3 s
    with Holding(lease) as holding:
        entered = time.monotonic()
        time.sleep(0.5)
        holding.check()
    first = lease.renewed_at[0] - entered
    assert 0.25 <= first <= 0.4, f"first renewal after {first:.3f}s, due after 0.3s"
    assert len(lease.renewed_at) == 1 and holding.loss is None


def test_a_hung_first_renewal_still_meets_the_watchdog_at_the_deadline() -> None:
    lease = TimedLease(0.6, [HANG])
    started = time.monotonic()
    with Holding(lease) as holding:
        assert holding.lost.wait(2), "the watchdog never declared the loss"
        lost_after = time.monotonic() - started
        lease.body_ended.set()
    assert isinstance(holding.loss, LeaseExpiredError)
    assert 0.55 <= lost_after <= 0.8, f"lost after {lost_after:.2f}s, deadline 0.6s"


def test_a_holding_due_before_all_others_wakes_the_starter() -> None:
    """The starter sleeps until its earliest entry: a new, earlier one must wake it."""
    slow, fast = TimedLease(60), TimedLease(0.3)
    slow.name, fast.name = "slow", "fast"
    with Holding(slow), Holding(fast):
        time.sleep(0.25)
    assert len(fast.renewed_at) >= 1, "the earlier holding was never renewed"
    assert slow.renewed_at == []


def test_a_holding_whose_guards_cannot_start_is_lost_and_the_others_are_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    broken, fine = TimedLease(0.6), TimedLease(0.6)
    broken.name, fine.name = "broken", "fine"
    with Holding(broken) as bad, Holding(fine) as good:
        def refuse() -> None:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(bad._threads[0], "start", refuse)
        assert bad.lost.wait(1), "a holding with no guards was not declared lost"
        time.sleep(0.3)
        good.check()
    assert isinstance(bad.loss, RenewalStoppedError) and "guard start" in str(bad.loss)
    assert broken.renewed_at == [] and len(fine.renewed_at) >= 1 and good.loss is None


def test_thousands_of_short_blocks_leave_nothing_behind() -> None:
    pending = STARTER.pending()
    for i in range(3000):
        lease = TimedLease(3600)
        lease.name = f"j{i}"
        with Holding(lease) as holding:
            holding.complete()
    assert STARTER.pending() == pending
    assert len(STARTER._heap) <= 2 * pending + 64 + 1, len(STARTER._heap)


def test_a_forked_child_holds_with_a_starter_of_its_own() -> None:
    """The parent's starter lock held at the fork (another thread adding, say) must not
    leave the child's holdings without guards."""
    with STARTER._cond:  # held across the fork, as another thread might
        pid = os.fork()
        if pid == 0:  # the child: hold a lease that must renew
            ok = False
            try:
                lease = TimedLease(0.3)
                with Holding(lease) as holding:
                    time.sleep(0.25)
                    holding.check()
                ok = len(lease.renewed_at) >= 1
            finally:
                os._exit(0 if ok else 1)
    deadline = time.monotonic() + 10
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's holding never started its guards (a lock held at fork)")
    assert os.waitstatus_to_exitcode(done[1]) == 0, "the child's lease was never renewed"
