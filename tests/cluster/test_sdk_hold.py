"""Holding a lease while work runs: background renewal, and the stop signal on loss."""

from __future__ import annotations

import asyncio
import time

import pytest

from joblease import AsyncHolding, Holding, LeaseLostError, Phase, StaleLeaseError
from joblease.kube.leases import lease_path
from joblease.sdk.client import Lease, LeaseClient


def steal(leases: LeaseClient, name: str, thief: str) -> None:
    """A claim-shaped write (holder change + generation + 1) that ignores the lease's end."""
    obs = leases.get(name)
    patch = {"metadata": {"resourceVersion": obs.resource_version},
             "status": {"holder": thief, "generation": obs.status.generation + 1}}
    leases.api.request("PATCH", lease_path(leases.namespace, name, "status"), patch,
                       content_type="application/merge-patch+json")


def test_holding_renews_past_the_duration_then_releases(leases: LeaseClient) -> None:
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 2})
    lease = leases.claim("job", holder="a")
    first_until = lease.lease_until
    with Holding(lease) as holding:
        time.sleep(4.5)
        holding.check()
        assert lease.valid() and lease.lease_until is not None and first_until is not None
        assert lease.lease_until > first_until
        assert lease.generation == 1
    status = leases.get("job").status
    assert status.phase is Phase.AVAILABLE and status.attempts == 0


def test_holding_signals_loss_and_check_raises_the_stale_error(leases: LeaseClient) -> None:
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 3})
    lease = leases.claim("job", holder="a")
    with Holding(lease) as holding:
        steal(leases, "job", "thief")
        assert holding.lost.wait(5), "renewal thread did not notice the takeover"
        with pytest.raises(StaleLeaseError, match="current generation is 2"):
            holding.check()
        with pytest.raises(LeaseLostError):
            holding.complete("too late")
    status = leases.get("job").status
    assert (status.holder, status.generation, status.phase) == ("thief", 2, Phase.HELD)


def test_holding_complete_records_the_result(leases: LeaseClient) -> None:
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 3})
    with Holding(leases.claim("job", holder="a")) as holding:
        holding.complete("42 rows")
    status = leases.get("job").status
    assert status.phase is Phase.COMPLETED and status.completion is not None
    assert status.completion.result == "42 rows"


def test_async_holding_cancels_the_body_and_raises_lease_lost(leases: LeaseClient) -> None:
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 3})
    lease: Lease = leases.claim("job", holder="a")
    effects: list[int] = []

    async def work() -> None:
        with pytest.warns(DeprecationWarning, match="joblease.aio"):  # deprecated, still works
            holding = AsyncHolding(lease)
        async with holding:
            await asyncio.to_thread(steal, leases, "job", "thief")
            for i in range(100):  # would take 10 s; must be cut short by the loss
                effects.append(i)
                await asyncio.sleep(0.1)

    started = time.monotonic()
    with pytest.raises(StaleLeaseError):
        asyncio.run(work())
    assert time.monotonic() - started < 5
    assert len(effects) < 60
