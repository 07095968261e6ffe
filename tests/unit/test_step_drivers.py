"""The step drivers know every step and refuse the ones they do not (issue 31).

Both drivers (``joblease.core.steps.SyncPort``, ``joblease.core.asteps.AsyncPort``) used to
answer any step they did not recognise with ``whoami()``: a step type added without a
performer would have sent the wrong request and handed its answer to the operation. The
compare-and-swap loop moved from ``joblease.kube.transact`` to ``joblease.core``; the old
module re-exports the same objects for its remaining importers.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

import joblease.kube.transact as old_home
from joblease.core import steps, transaction
from joblease.core.asteps import AsyncPort
from joblease.core.steps import SyncPort, Whoami
from joblease.kube.aioleases import AsyncLeaseStore
from joblease.kube.leases import LeaseStore
from support.fakekube import AsyncFakeKubeApi, FakeKubeApi

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Unheard:
    """A step no driver performs."""


class WhoamiApi(FakeKubeApi):
    def whoami(self) -> str:
        return "system:serviceaccount:ns:worker"


def test_the_blocking_driver_refuses_a_step_it_does_not_know() -> None:
    port = SyncPort(LeaseStore(WhoamiApi()))  # type: ignore[arg-type]
    assert port.perform(Whoami()) == "system:serviceaccount:ns:worker"
    with pytest.raises(TypeError, match="no driver performs Unheard steps"):
        port.perform(Unheard())  # type: ignore[arg-type]


def test_the_asyncio_driver_refuses_a_step_it_does_not_know() -> None:
    port = AsyncPort(AsyncLeaseStore(AsyncFakeKubeApi(WhoamiApi())))  # type: ignore[arg-type]
    assert asyncio.run(port.perform(Whoami())) == "system:serviceaccount:ns:worker"
    with pytest.raises(TypeError, match="no driver performs Unheard steps"):
        asyncio.run(port.perform(Unheard()))  # type: ignore[arg-type]


def test_the_old_module_re_exports_the_very_objects_and_no_asyncio_path() -> None:
    assert old_home.transact is steps.transact
    for name in ("transaction", "run_steps", "arun_steps", "Read", "Write", "ServerTime",
                 "Outcome", "ContentionError", "MAX_CONFLICTS"):
        assert getattr(old_home, name) is getattr(transaction, name), name
    assert old_home.Step == transaction.TransactionStep
    for gone in ("atransact", "AsyncStore", "AsyncTransport"):
        assert not hasattr(old_home, gone), gone
