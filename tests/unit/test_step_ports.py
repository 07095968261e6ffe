"""What the two step drivers send: each request's own timeout, a watch's bounds, a stop.

``joblease.core.steps.SyncPort`` and ``joblease.core.asteps.AsyncPort`` decide nothing, so
what they can get wrong is the wire: a read, write or call sent without the timeout its
step carries waits the transport's default instead (a renewal bounded by the lease's
deadline would wait 10 s past it); a watch without a client-side bound beyond the
server's ``timeoutSeconds`` hangs on a dead connection; an interrupt that arrives between
two watches must end the next one (a pool being closed would otherwise wait out a
5-minute watch). Found by mutation testing (issue 31, item 8): each of these could be
dropped without a unit test noticing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from joblease.core.asteps import AsyncPort
from joblease.core.steps import (
    WATCH_IDLE_SLACK,
    WATCH_SLACK,
    Calibrate,
    Call,
    ClaimBy,
    Sleep,
    Stopped,
    SyncPort,
    Watch,
    claim_by,
)
from joblease.core.transaction import Read, Write
from joblease.domain.lease import LeaseStatus
from joblease.kube.aioleases import AsyncLeaseStore
from joblease.kube.leases import LeaseStore, list_call
from support.fakekube import AsyncFakeKubeApi, FakeKubeApi, lease_object

pytestmark = pytest.mark.unit


class TimedApi(FakeKubeApi):
    """The in-memory server, recording each request's method and timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[tuple[str, float | None]] = []

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        self.timeouts.append((method, kwargs.get("timeout")))
        return super().request(method, path, body, **kwargs)


def perform(kind: str, api: FakeKubeApi, step: Any, **port: Any) -> Any:
    """``step`` performed by the ``kind`` driver over ``api``."""
    if kind == "sync":
        return SyncPort(LeaseStore(api), **port).perform(step)  # type: ignore[arg-type]
    store = AsyncLeaseStore(AsyncFakeKubeApi(api))  # type: ignore[arg-type]
    return asyncio.run(AsyncPort(store, **port).perform(step))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_each_request_step_goes_out_with_the_timeout_it_carries(kind: str) -> None:
    api = TimedApi()
    api.put_object(lease_object("job", {"phase": "Available"}))
    seen = perform(kind, api, Read("ns", "job", 1.5))
    perform(kind, api, Write(seen, LeaseStatus.from_dict({"phase": "Available"}), 2.5))
    page = perform(kind, api, Call(list_call("ns"), 3.5))
    assert [obj["metadata"]["name"] for obj in page.items] == ["job"]
    assert api.timeouts == [("GET", 1.5), ("PATCH", 2.5), ("GET", 3.5)]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_calibrate_runs_the_clients_calibration_and_answers_nothing(kind: str) -> None:
    calls: list[int] = []

    def calibrate() -> None:
        calls.append(1)

    async def acalibrate() -> None:
        calls.append(1)

    assert perform(kind, FakeKubeApi(), Calibrate(),
                   calibrate=calibrate if kind == "sync" else acalibrate) is None
    assert calls == [1]
    assert perform(kind, FakeKubeApi(), Calibrate()) is None  # a port without one: nothing
    assert calls == [1]


def test_a_claim_step_without_a_clients_claim_is_a_bug_said_so() -> None:
    step = ClaimBy("job", "a", "cid", None, 1)
    with pytest.raises(TypeError) as err:
        claim_by(None, step)
    assert str(err.value) == ("this port was built without a client's claim() to perform "
                              "ClaimBy")


# -- watches ---------------------------------------------------------------------------------

class Stream:
    """A watch stream: delivers its events until closed."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for event in self.events:
            if self.closed:
                return
            yield event


class WatchApi(FakeKubeApi):
    """Hands out prepared streams and records each watch's timeout."""

    def __init__(self, *streams: Stream) -> None:
        super().__init__()
        self.streams = list(streams)
        self.watches: list[tuple[str, dict[str, str], float]] = []
        self.on_open: Any = None

    def watch(self, path: str, query: dict[str, str], *, timeout: float) -> Stream:
        self.watches.append((path, query, timeout))
        stream = self.streams.pop(0)
        if self.on_open is not None:
            self.on_open(stream)
        return stream


def events(n: int) -> list[dict[str, Any]]:
    return [{"type": "MODIFIED", "object": {"n": i}} for i in range(n)]


def watch_step(got: list[Any], seconds: int = 300) -> Watch:
    return Watch("/apis/x", {"labelSelector": "a=b"}, lambda kind, obj: got.append(obj["n"]),
                 seconds)


def test_a_watch_is_bounded_on_this_side_beyond_the_servers_own_length() -> None:
    api = WatchApi(Stream(events(2)))
    got: list[int] = []
    SyncPort(LeaseStore(api)).perform(watch_step(got, seconds=120))  # type: ignore[arg-type]
    assert got == [0, 1]
    assert api.watches == [("/apis/x", {"labelSelector": "a=b"}, 120 + WATCH_SLACK)]


def test_the_asyncio_watch_asks_for_a_watch_and_gives_up_on_silence_beyond_its_length(
        ) -> None:
    seen: list[tuple[str, dict[str, str], float]] = []

    class Api(AsyncFakeKubeApi):
        async def watch(self, path: str, query: dict[str, str], on_event: Any, *,
                        idle_timeout: float) -> None:
            seen.append((path, query, idle_timeout))
            on_event("ADDED", {"n": 7})

    got: list[int] = []
    port = AsyncPort(AsyncLeaseStore(Api(FakeKubeApi())))  # type: ignore[arg-type]
    assert asyncio.run(port.perform(watch_step(got, seconds=120))) is None
    assert got == [7]
    assert seen == [("/apis/x", {"labelSelector": "a=b", "watch": "true"},
                     120 + WATCH_IDLE_SLACK)]


def test_an_interrupt_between_two_watches_ends_the_next_one_and_only_that_one() -> None:
    api = WatchApi(Stream(events(3)), Stream(events(3)))
    port = SyncPort(LeaseStore(api))  # type: ignore[arg-type]
    port.interrupt()  # no watch open: kept for the next
    first: list[int] = []
    port.perform(watch_step(first))
    assert first == [] and api.streams[0].closed is False
    second: list[int] = []
    port.perform(watch_step(second))
    assert second == [0, 1, 2]


def test_an_interrupt_closes_the_open_watch_and_is_not_kept_for_the_next() -> None:
    api = WatchApi(Stream(events(3)), Stream(events(3)))
    port = SyncPort(LeaseStore(api))  # type: ignore[arg-type]
    got: list[int] = []

    def on_event(kind: str, obj: dict[str, Any]) -> None:
        got.append(obj["n"])
        if obj["n"] == 0:
            port.interrupt()  # from the watch's own thread: the open stream is closed

    port.perform(Watch("/apis/x", {}, on_event, 300))
    assert got == [0]
    again: list[int] = []
    port.perform(watch_step(again))
    assert again == [0, 1, 2]


def test_a_watch_opened_after_the_stop_delivers_nothing_and_stops() -> None:
    stop = threading.Event()
    stop.set()
    api = WatchApi(Stream(events(3)))
    got: list[int] = []
    with pytest.raises(Stopped):
        SyncPort(LeaseStore(api), stop=stop).perform(watch_step(got))  # type: ignore[arg-type]
    assert got == []


class RecordingStop(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


def test_a_stoppable_sleep_waits_what_it_is_asked_and_a_negative_one_not_at_all() -> None:
    stop = RecordingStop()
    port = SyncPort(LeaseStore(FakeKubeApi()), stop=stop)  # type: ignore[arg-type]
    port.perform(Sleep(0.05))
    port.perform(Sleep(-3.0))
    assert stop.waits == [0.05, 0.0]
    stop.set()
    with pytest.raises(Stopped):
        port.perform(Sleep(0.05))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_claim_step_goes_through_the_clients_claim_with_everything_it_carries(
        kind: str) -> None:
    """A pool's claim is the client's public ``claim()``: same name, holder, claim id,
    cached version and conflict bound, so it is the same compare-and-swap as any other."""
    calls: list[tuple[Any, ...]] = []

    def claim(name: str, holder: str, *, observed: Any, claim_id: str,
              max_conflicts: int) -> str:
        calls.append((name, holder, observed, claim_id, max_conflicts))
        return "the lease"

    async def aclaim(*args: Any, **kwargs: Any) -> str:
        return claim(*args, **kwargs)

    seen = object()
    answer = perform(kind, FakeKubeApi(), ClaimBy("job", "w1", "cid-1", seen, 1),  # type: ignore[arg-type]
                     claim=claim if kind == "sync" else aclaim)
    assert answer == "the lease"
    assert calls == [("job", "w1", seen, "cid-1", 1)]


def test_a_sleep_without_a_stop_goes_to_the_injected_sleeper() -> None:
    """The injection point a test's clock uses (the docstring of ``SyncPort``)."""
    slept: list[float] = []
    port = SyncPort(LeaseStore(FakeKubeApi()), sleep=slept.append)  # type: ignore[arg-type]
    port.perform(Sleep(0.2))
    port.perform(Sleep(-1.0))
    assert slept == [0.2, 0.0]
