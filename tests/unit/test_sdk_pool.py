"""The thread-based work pool's own concerns (``joblease.sdk.pool.Pool``), in-memory.

What both pools share is tested once, for both, in ``tests/unit/test_pools.py`` (claims,
waits, a dead watch, a refused or missing first list, presence, the client's shared
pools). Here stays what needs the thread pool's clock injection (``joblease.sdk.pool.time``
replaced by a fake whose ``sleep`` moves ``monotonic``): a lost answer is retried on the
same name with the same claim id, pausing 50 ms doubling to 2 s, never past the timeout;
a waiter wakes at the certain server time, without polling. The claims are real
(``LeaseClient``, ``LeaseStore`` and ``transact`` over ``support.fakekube``); only the
list+watch is scripted (``support.pools.ScriptedFeed``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from joblease.domain.clock import ServerClock, ServerNow
from joblease.kube.api import UnavailableError
from joblease.sdk.client import DEFAULT_MARGIN, LeaseClient
from joblease.sdk.pool import Pool
from support.fakekube import T_NOW, FakeKubeApi
from support.pools import ScriptedFeed, available, held_by_other, server

LOST = UnavailableError(0, "Unavailable", "connection reset")


class FakeTime:
    """``time`` for ``joblease.sdk.pool``: ``sleep`` moves ``monotonic`` and is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def feeds(monkeypatch: pytest.MonkeyPatch) -> list[ScriptedFeed]:
    made: list[ScriptedFeed] = []

    def feed(store: Any, namespace: str, selector: str, *, watch_seconds: int) -> ScriptedFeed:
        made.append(ScriptedFeed(store.api))
        return made[-1]

    monkeypatch.setattr("joblease.sdk.pool.LeaseFeed", feed)
    return made


def pool_over(api: FakeKubeApi, feeds: list[ScriptedFeed], **kwargs: Any
              ) -> tuple[LeaseClient, Pool, ScriptedFeed]:
    client = LeaseClient("ns", api=api, calibrate=False)  # type: ignore[arg-type]
    pool = client.pool("team=batch", **kwargs)
    assert feeds[-1].listed.wait(5) or feeds[-1].before_list is not None
    return client, pool, feeds[-1]


@pytest.fixture
def closing() -> Iterator[list[Pool]]:
    pools: list[Pool] = []
    yield pools
    for pool in pools:
        pool.close()




# -- claiming from the cache -------------------------------------------------------------------

@pytest.mark.parametrize(("timeout", "pauses"), [
    (3.0, [0.05, 0.1, 0.2, 0.4, 0.8]),  # the next pause (1.6) would end past the timeout
    (10.0, [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]),  # doubling stops at 2 s
])
def test_lost_answers_are_retried_doubling_to_two_seconds_and_never_past_the_timeout(
        feeds: list[ScriptedFeed], closing: list[Pool], monkeypatch: pytest.MonkeyPatch,
        timeout: float, pauses: list[float]) -> None:
    api = server(available("first"))
    _, pool, _ = pool_over(api, feeds)
    closing.append(pool)
    clock = FakeTime()
    monkeypatch.setattr("joblease.sdk.pool.time", clock)
    api.refuse_next = [LOST] * 1000
    with pytest.raises(UnavailableError) as err:
        pool.claim_next("w", timeout=timeout)
    assert err.value is LOST
    assert clock.slept == pytest.approx(pauses)
    assert pool.conflicts == 0  # unknown is not refused


# -- waiting -----------------------------------------------------------------------------------

class RealTimeApi(FakeKubeApi):
    """A fake server whose clock runs with this process's (exact: no error interval)."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.monotonic()
        self.clock = ServerClock()
        self.clock.observe(0.0, 0.0, int(T_NOW.timestamp()))  # T_NOW is a whole second
        self.server_now_calls = 0

    def server_now(self) -> ServerNow:
        self.server_now_calls += 1
        return ServerNow.exact(T_NOW + timedelta(seconds=self.monotonic()))

    def monotonic(self) -> float:
        return time.monotonic() - self.start


def test_a_waiter_wakes_when_a_holders_end_plus_margin_has_certainly_passed_without_polling(
        feeds: list[ScriptedFeed], closing: list[Pool]) -> None:
    api = RealTimeApi()
    wake = 0.4
    server(held_by_other("busy", wake - DEFAULT_MARGIN.total_seconds()), api=api)
    _, pool, _ = pool_over(api, feeds)  # type: ignore[arg-type]
    closing.append(pool)
    lease = pool.claim_next("w", timeout=5)
    assert lease is not None and lease.name == "busy"
    assert api.monotonic() >= wake
    assert api.monotonic() < 3  # woken at the end, not at the timeout
    assert api.server_now_calls < 20  # it slept until then; it did not spin
