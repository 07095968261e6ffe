"""``joblease.aio.AsyncLeaseHolding``'s guards, with a lease whose renewals the test scripts.

The rules of ``docs/safety.md`` ("The holder's loop") for the asyncio holding: a refusal is
a loss; any other failure is retried; a hung renewal cannot delay the loss past the
deadline (the watchdog timer sends nothing); a renewer that ends any other way is a
``RenewalStoppedError``; a loss cancels the body, which exits with the loss; a completion
stops the guards for good. Real time, in tenths of a second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from joblease.aio import AsyncLeaseHolding
from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseLostError,
    RenewalStoppedError,
    StaleLeaseError,
)
from joblease.domain.token import FencingToken
from joblease.kube.api import UnavailableError

TOKEN = FencingToken(1, 1)


class ScriptedLease:
    """The ``AsyncLease`` surface a holding uses; ``renew`` does what the test says."""

    def __init__(self, seconds: float,
                 renew: Callable[[ScriptedLease], Awaitable[None]] | None = None) -> None:
        self.name, self.holder, self.generation, self.token = "job", "a", 1, TOKEN
        self.lease_until = None
        self.loss: LeaseLostError | None = None
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.script = renew
        self.renews = 0
        self.cancelled_renewals = 0
        self.completed: list[str] = []
        self.released: list[bool] = []

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def valid(self) -> bool:
        return self.loss is None and self.remaining() > 0

    async def renew(self) -> None:
        self.renews += 1
        try:
            if self.script is not None:
                await self.script(self)
        except asyncio.CancelledError:
            self.cancelled_renewals += 1
            raise
        self.deadline = time.monotonic() + self.seconds

    async def complete(self, result: str = "") -> None:
        self.completed.append(result)
        self.deadline = time.monotonic()

    async def release(self, failed: bool = False) -> None:
        self.released.append(failed)


def hold(lease: ScriptedLease, **kwargs: Any) -> AsyncLeaseHolding:
    return AsyncLeaseHolding(lease, **kwargs)  # type: ignore[arg-type]


async def hang(_: ScriptedLease) -> None:
    await asyncio.Event().wait()


def stale() -> StaleLeaseError:
    return StaleLeaseError("job", "a", TOKEN, "b", FencingToken(1, 2), "Held")


def test_a_hung_renewal_cannot_delay_the_loss_past_the_deadline() -> None:
    lease = ScriptedLease(0.6, hang)

    async def main() -> tuple[float, int]:
        steps = 0
        with pytest.raises(LeaseExpiredError) as err:
            async with hold(lease) as holding:
                while steps < 100:  # 10 s unless cut short
                    await asyncio.sleep(0.1)
                    steps += 1
        assert holding.loss is err.value and lease.loss is err.value and holding.lost.is_set()
        return time.monotonic() - lease.deadline, steps

    late, steps = asyncio.run(main())
    assert -0.05 < late < 0.1  # at the deadline: the timer, not the hung request
    assert steps in range(4, 8)
    assert lease.renews == 1 and lease.cancelled_renewals == 1  # abandoned, not awaited
    assert lease.released == []  # a lost lease is not released


def test_a_refused_renewal_is_the_loss_and_cancels_the_body() -> None:
    async def refuse(_: ScriptedLease) -> None:
        raise stale()

    lease = ScriptedLease(0.9, refuse)

    async def main() -> float:
        started = time.monotonic()
        with pytest.raises(StaleLeaseError):
            async with hold(lease):
                await asyncio.sleep(10)
        return time.monotonic() - started

    assert asyncio.run(main()) < 0.5  # at the first renewal, a third of 0.9 s
    assert lease.renews == 1


def test_transient_failures_are_retried_and_a_renewal_moves_the_deadline() -> None:
    failures = [UnavailableError(0, "Unavailable", "reset"), RuntimeError("a bug")]

    async def flaky(_: ScriptedLease) -> None:
        if failures:
            raise failures.pop(0)

    lease = ScriptedLease(0.6, flaky)

    async def main() -> AsyncLeaseHolding:
        async with hold(lease) as holding:
            await asyncio.sleep(1.2)  # twice the lease: only renewals keep it
            holding.check()
        return holding

    holding = asyncio.run(main())
    assert holding.renew_failures == 2 and holding.loss is None and lease.renews >= 4
    assert lease.released == [False]


@pytest.mark.parametrize("ending", ["base-exception", "outside-cancel"])
def test_a_renewer_that_ends_any_other_way_is_a_declared_loss(ending: str) -> None:
    class Unplanned(BaseException):
        pass

    async def die(_: ScriptedLease) -> None:
        raise Unplanned("no one caught this")

    lease = ScriptedLease(0.9, die if ending == "base-exception" else None)

    async def main() -> None:
        with pytest.raises(RenewalStoppedError) as err:
            async with hold(lease) as holding:
                if ending == "outside-cancel":
                    assert holding._renewer is not None
                    holding._renewer.cancel()
                await asyncio.sleep(10)
        expected = "Unplanned" if ending == "base-exception" else "was cancelled"
        assert expected in str(err.value)

    asyncio.run(main())


def test_a_completion_stops_both_guards_for_good() -> None:
    lease = ScriptedLease(0.45)

    async def main() -> AsyncLeaseHolding:
        async with hold(lease) as holding:
            await asyncio.sleep(0.2)
            await holding.complete("done")
            renews = lease.renews
            await asyncio.sleep(0.8)  # past the old deadline and several renewal times
            assert lease.renews == renews
        return holding

    holding = asyncio.run(main())
    assert holding.completed and holding.loss is None and lease.completed == ["done"]
    assert lease.released == []


@pytest.mark.parametrize("how", ["normal", "raised", "fail()"])
def test_the_exit_releases_and_counts_an_attempt_only_for_failed_work(how: str) -> None:
    lease = ScriptedLease(5)

    async def main() -> None:
        async with hold(lease) as holding:
            if how == "raised":
                raise ValueError("work failed")
            if how == "fail()":
                holding.fail()

    if how == "raised":
        with pytest.raises(ValueError, match="work failed"):
            asyncio.run(main())
    else:
        asyncio.run(main())
    assert lease.released == [how != "normal"]


def test_a_callers_cancellation_stays_a_cancellation() -> None:
    lease = ScriptedLease(5)

    async def body() -> None:
        async with hold(lease):
            await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.ensure_future(body())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert lease.loss is None and lease.released == [True]


def test_check_declares_a_passed_deadline_and_raises_without_cancelling_the_body() -> None:
    lease = ScriptedLease(5)

    async def main() -> None:
        async with hold(lease, stop_before=4.9) as holding:
            time.sleep(0.15)  # the body itself overruns (blocking on purpose)
            with pytest.raises(LeaseExpiredError):
                holding.check()
            await asyncio.sleep(0)  # not cancelled: the raise is the signal
            with pytest.raises(LeaseExpiredError):
                holding.check()

    asyncio.run(main())
    assert lease.released == []


def test_an_expiry_names_the_lease_its_holder_generation_and_end() -> None:
    lease = ScriptedLease(0.3, hang)
    lease.lease_until = datetime(2026, 12, 5, 12, tzinfo=UTC)  # type: ignore[assignment]

    async def main() -> None:
        async with hold(lease):
            await asyncio.sleep(10)

    with pytest.raises(LeaseExpiredError) as err:
        asyncio.run(main())
    assert (err.value.name, err.value.holder, err.value.generation, err.value.lease_until) == (
        "job", "a", 1, datetime(2026, 12, 5, 12, tzinfo=UTC))


def test_an_error_in_the_deadline_watchdog_is_a_declared_loss() -> None:
    """The watchdog is a loop callback: an exception there was only logged by asyncio, and
    the body ran on past its deadline (found writing the test above, docs/safety.md #27)."""
    lease = ScriptedLease(0.3, hang)
    lease.lease_until = "not a time"  # type: ignore[assignment]  # the expiry error raises

    async def main() -> float:
        started = time.monotonic()
        with pytest.raises(RenewalStoppedError, match="deadline watchdog"):
            async with hold(lease):
                await asyncio.sleep(10)
        return time.monotonic() - started

    assert asyncio.run(main()) < 1  # the body was stopped at the deadline


@pytest.mark.parametrize("refusal", [
    UnavailableError(0, "Unavailable", "reset"),
    StaleLeaseError("job", "a", TOKEN, "b", FencingToken(1, 2), "Held")])
def test_a_release_that_fails_on_exit_is_not_the_bodys_error(refusal: Exception) -> None:
    """The lease then ends at its deadline; the work's own outcome is what the block says."""
    lease = ScriptedLease(5)

    async def release(failed: bool = False) -> None:
        lease.released.append(failed)
        raise refusal

    lease.release = release  # type: ignore[method-assign]

    async def main() -> str:
        async with hold(lease):
            return "done"

    assert asyncio.run(main()) == "done" and lease.released == [False]


def test_a_check_adopts_a_loss_the_lease_met_outside_the_holding() -> None:
    lease = ScriptedLease(5)

    async def main() -> None:
        async with hold(lease) as holding:
            lease.loss = stale()  # a direct lease.renew() was refused
            with pytest.raises(StaleLeaseError) as err:
                holding.check()
            assert holding.loss is err.value is lease.loss and holding.lost.is_set()

    asyncio.run(main())
    assert lease.released == []
