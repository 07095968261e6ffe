"""The asyncio driver of the client's operations (``joblease.core.steps`` has the steps).

Apart from ``steps`` so that the blocking path (``joblease.sdk``, the CLI's one-shot verbs)
never imports asyncio (tens of milliseconds of a CLI call, issue 18).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from joblease.core.steps import (
    WATCH_IDLE_SLACK,
    Calibrate,
    Call,
    ClaimBy,
    Sleep,
    Step,
    Steps,
    T,
    Watch,
    Whoami,
    claim_by,
    unknown_step,
)
from joblease.core.transaction import Read, ServerTime, Write, arun_steps
from joblease.kube.aioleases import AsyncLeaseStore


class AsyncPort:
    """Performs steps with an ``AsyncLeaseStore`` (the asyncio client's I/O).

    A stop is a task cancellation: ``CancelledError`` passes through the driver.
    """

    def __init__(self, store: AsyncLeaseStore, calibrate: Callable[[], Any] | None = None,
                 claim: Callable[..., Any] | None = None) -> None:
        self.store = store
        self.api = store.api
        self._calibrate = calibrate
        self._claim = claim

    async def perform(self, step: Step) -> Any:
        """Perform one step and return its answer (its exception propagates)."""
        if isinstance(step, Read):
            return await self.store.get(step.namespace, step.name, step.timeout)
        if isinstance(step, Write):
            return await self.store.write_status(step.observed, step.status, step.timeout)
        if isinstance(step, ServerTime):
            return await self.api.server_now()
        if isinstance(step, Call):
            return await self.store.call(step.call, step.timeout)
        if isinstance(step, Watch):
            return await self.api.watch(step.path, {**step.query, "watch": "true"},
                                        step.on_event,
                                        idle_timeout=step.seconds + WATCH_IDLE_SLACK)
        if isinstance(step, Sleep):
            return await asyncio.sleep(max(0.0, step.seconds))
        if isinstance(step, Calibrate):
            return None if self._calibrate is None else await self._calibrate()
        if isinstance(step, ClaimBy):
            return await claim_by(self._claim, step)
        if isinstance(step, Whoami):
            return await self.api.whoami()
        raise unknown_step(step)



async def adrive(steps: Steps[T], port: AsyncPort) -> T:
    """Run an operation to its end, awaiting each step with ``port``.

    A cancellation is not thrown into the operation: it ends the driver at once.
    """
    return await arun_steps(steps, port.perform)
