"""The operator's Event queue: in order, off the caller's thread, drops counted when full."""

import threading
from typing import Any

from joblease.controller import metrics
from joblease.controller.events import EventPoster
from joblease.domain.lease import LeaseSpec, LeaseStatus, Observed
from joblease.kube.api import ApiError

OBS = Observed("ns", "job", "uid", "1", 1, LeaseSpec(), LeaseStatus())


class FakeStore:
    """Records posts; can be held so the queue fills up."""

    def __init__(self) -> None:
        self.posted: list[str] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()

    def post_event(self, obs: Observed, type_: str, reason: str, message: str) -> None:
        self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        if reason == "Boom":
            raise ApiError(500, "Internal", "boom")
        self.posted.append(reason)


def dropped() -> float:
    value: Any = metrics.EVENTS_DROPPED._value.get()  # prometheus_client's own value
    return float(value)


def test_events_are_posted_in_order_from_the_posting_thread() -> None:
    store = FakeStore()
    poster = EventPoster(store, capacity=10)  # type: ignore[arg-type]
    for reason in ("Claimed", "Boom", "Expired", "Completed"):
        poster.post(OBS, "Normal", reason, "m")
    poster.close()
    assert store.posted == ["Claimed", "Expired", "Completed"]  # an error does not stop it
    assert store.threads == {"joblease-events"}


def test_a_full_queue_drops_and_counts_instead_of_blocking() -> None:
    store = FakeStore()
    store.gate.clear()  # the first Event is taken and held; the queue holds 2 more
    poster = EventPoster(store, capacity=2)  # type: ignore[arg-type]
    before = dropped()
    poster.post(OBS, "Normal", "First", "m")
    for _ in range(500):  # until the posting thread holds it (bounded: 5 s)
        if poster._queue.empty():
            break
        threading.Event().wait(0.01)
    for i in range(5):
        poster.post(OBS, "Normal", f"E{i}", "m")
    assert dropped() - before == 3
    store.gate.set()
    poster.close()
    assert store.posted == ["First", "E0", "E1"]


def test_events_over_the_rate_are_dropped_and_counted_then_the_bucket_refills() -> None:
    """Issue 24: a burst of 100,000 initializations must not become 100,000 Event writes."""
    store = FakeStore()
    now = [0.0]
    poster = EventPoster(store, capacity=1000, rate=10.0, burst=5,  # type: ignore[arg-type]
                         clock=lambda: now[0])
    before = dropped()
    for i in range(20):
        poster.post(OBS, "Normal", f"A{i}", "m")
    now[0] = 0.5  # 5 tokens back at 10/s
    for i in range(20):
        poster.post(OBS, "Normal", f"B{i}", "m")
    poster.close()
    assert store.posted == [f"A{i}" for i in range(5)] + [f"B{i}" for i in range(5)]
    assert dropped() - before == 30


def test_a_poster_refuses_a_rate_it_cannot_keep() -> None:
    import pytest

    with pytest.raises(ValueError, match="rate > 0"):
        EventPoster(FakeStore(), rate=0)  # type: ignore[arg-type]
