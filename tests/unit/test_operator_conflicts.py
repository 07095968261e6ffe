"""``joblease_operator_conflicts_total`` counts every 409 the operator meets (issue 31).

The counter used to be incremented by nothing while the docs, the dashboard and a test
(which asserted it unchanged) named it. The count is taken where every request of the
operator's ``LeaseStore`` passes (``LeaseStore(api, on_conflict=...)``), so a status
compare-and-swap in ``transact`` and a conditional TTL delete are both seen; the wiring in
``Operator.start`` is checked here against the in-memory API server and in
``tests/cluster/test_operator.py`` against the real one.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY

from joblease.controller.runtime import Operator
from joblease.controller.settings import OperatorSettings
from joblease.core.steps import transact
from joblease.domain.lease import Observed, decide_claim
from joblease.domain.time import format_time
from joblease.kube.api import ConflictError, InvalidError
from joblease.kube.leases import LeaseStore
from support.fakekube import FakeKubeApi, lease_object

pytestmark = pytest.mark.unit
AVAILABLE = {"phase": "Available", "generation": 0, "attempts": 0}  # the CRD's status default


def conflicts() -> float:
    value = REGISTRY.get_sample_value("joblease_operator_conflicts_total")
    assert value is not None, "the counter must be exported from the start"
    return value


def counting_store() -> tuple[FakeKubeApi, LeaseStore, list[str]]:
    api = FakeKubeApi()
    seen: list[str] = []
    return api, LeaseStore(api, on_conflict=lambda: seen.append("409")), seen  # type: ignore[arg-type]


def test_each_409_of_a_compare_and_swap_is_reported_once() -> None:
    api, store, seen = counting_store()
    api.put_object(lease_object("job", AVAILABLE))
    api.refuse_next = [ConflictError(409, "Conflict", "modified") for _ in range(3)]

    out = transact(store, "ns", "job",
                   lambda obs, now: decide_claim(obs, "a", now, timedelta(0)))
    assert out.transition is not None and out.transition.kind == "claimed"
    assert seen == ["409"] * 3


def test_a_conditional_delete_refused_with_409_is_reported_and_still_raises() -> None:
    api, store, seen = counting_store()
    stale = Observed.from_object(api.put_object(lease_object("job", {"phase": "Completed"})))
    api.put_object(lease_object("job", {"phase": "Completed"}))  # a new resourceVersion
    with pytest.raises(ConflictError):
        store.delete_if_unchanged(stale)
    assert seen == ["409"]
    assert api.stored("ns", "job") is not None


def test_other_refusals_are_not_conflicts() -> None:
    api, store, seen = counting_store()
    api.put_object(lease_object("job"))
    api.refuse_next = [InvalidError(422, "Invalid", "CEL says no")]
    obs = store.get("ns", "job")
    with pytest.raises(InvalidError):
        store.write_status(obs, obs.status)
    assert seen == []


class CalibratedFake(FakeKubeApi):
    """The fake API with the two calls ``Operator.start``/``stop`` add."""

    def calibrate(self) -> float:
        return 0.004

    def close(self) -> None:
        pass


def test_the_operator_counts_a_conflict_of_its_own_write() -> None:
    """Operator.start wires the counter: an expiry that meets one 409 counts one."""
    api = CalibratedFake()
    ended = api.now.earliest - timedelta(seconds=60)
    api.put_object(lease_object("job", {
        "phase": "Held", "holder": "a", "generation": 1, "epoch": 7, "attempts": 0,
        "acquireTime": format_time(ended - timedelta(seconds=30)),
        "renewTime": format_time(ended - timedelta(seconds=30)),
        "leaseUntil": format_time(ended)}))
    api.refuse_next = [ConflictError(409, "Conflict", "modified")]

    async def scenario() -> float:
        op = Operator(OperatorSettings(writers=1, metrics_port=0),
                      api_factory=lambda _: api)  # type: ignore[arg-type,return-value]
        op._start_feeds = lambda api: None  # type: ignore[method-assign]  # fed by hand
        before = conflicts()
        await op.start()
        try:
            op.observe_lease({"type": "ADDED", "object": api.stored("ns", "job")})
            deadline = time.monotonic() + 5
            while (api.stored("ns", "job") or {})["status"]["phase"] != "Expired":
                assert time.monotonic() < deadline, "the lease was never expired"
                await asyncio.sleep(0.02)
        finally:
            await op.stop()
        return conflicts() - before

    assert asyncio.run(scenario()) == 1
