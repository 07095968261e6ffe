"""The one feed's list+watch loop against a scripted API: resume, re-list on 410, filtering,
the selectors every list and watch carries, backoff with jitter reset by a good watch.

The real server's 410 (an ERROR event after a 200) is checked in tests/cluster/test_pool.py;
here every path is driven deterministically, including the HTTP-410 answer to opening a
watch, which the local API server (with its watch cache) does not give.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from joblease.core.asteps import AsyncPort, adrive
from joblease.core.feed import (
    RETRY_FIRST,
    RETRY_MAX,
    UNFINISHED,
    Feed,
    LeaseFeed,
    compact_lease,
    retry_pause,
)
from joblease.core.steps import Sleep
from joblease.domain.lease import Observed
from joblease.domain.pool import PoolView
from joblease.kube.aioleases import AsyncLeaseStore
from joblease.kube.api import (
    ForbiddenError,
    GoneError,
    InvalidError,
    UnavailableError,
    WatchStream,
)
from joblease.kube.leases import LeaseStore


def obj(name: str, rv: int, phase: str = "Available") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "resourceVersion": str(rv)},
            "spec": {}, "status": {"phase": phase, "generation": 0}}


@dataclass
class Body:
    body: dict[str, Any]


class Chunks:
    """A urllib3 response's ``stream()``: one chunk per event, then maybe a broken connection."""

    def __init__(self, events: list[dict[str, Any] | Exception]) -> None:
        self.events = events

    def stream(self, amt: int) -> Iterator[bytes]:
        for event in self.events:
            if isinstance(event, Exception):
                raise event
            yield json.dumps(event).encode() + b"\n"

    def release_conn(self) -> None:
        pass


@dataclass
class Raw:
    response: Chunks


def stream(events: list[dict[str, Any] | Exception]) -> WatchStream:
    """The real WatchStream (its parsing, its ERROR handling) over scripted chunks."""
    return WatchStream(Raw(Chunks(events)), "/jobleases", (OSError,))


@dataclass
class ScriptedApi:
    """Answers lists and watches from scripts; records every query it was sent."""

    lists: list[dict[str, Any] | Exception]
    watches: list[list[dict[str, Any] | Exception] | Exception]
    feed: LeaseFeed | None = None
    sent: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    timeouts: list[float] = field(default_factory=list)

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, str],
                content_type: str | None = None, timeout: float = 0) -> Body:
        self.sent.append(("list", dict(query)))
        self.paths.append(path)
        self.timeouts.append(timeout)
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Body(answer)

    def watch(self, path: str, query: dict[str, str], *, timeout: float) -> WatchStream:
        self.sent.append(("watch", dict(query)))
        self.paths.append(path)
        if not self.watches:
            assert self.feed is not None
            self.feed.stop()  # the script is over
            return stream([])
        answer = self.watches.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return stream(answer)


class Recorder(PoolView):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.troubles: list[Exception] = []

    def replace(self, items: Any, resource_version: str) -> None:
        items = list(items)
        self.calls.append(f"replace {[o.name for o in items]} @{resource_version}")
        super().replace(items, resource_version)

    def apply(self, event_type: str, obs: Observed) -> None:
        self.calls.append(f"{event_type} {obs.name} @{obs.resource_version}")
        super().apply(event_type, obs)

    def trouble(self, error: Exception) -> None:
        self.troubles.append(error)


def listing(rv: int, *names: str, token: str = "") -> dict[str, Any]:
    return {"metadata": {"resourceVersion": str(rv), "continue": token},
            "items": [obj(n, rv - 1) for n in names]}


class AsyncScripted:
    """The same script behind the asyncio transport's surface (``AsyncKubeApi``)."""

    def __init__(self, api: ScriptedApi) -> None:
        self.api = api
        self.stopped = False

    async def request(self, method: str, path: str, body: Any = None, *,
                      query: dict[str, str], content_type: str | None = None,
                      timeout: float = 0) -> Body:
        return self.api.request(method, path, body, query=query, timeout=timeout)

    async def watch(self, path: str, query: dict[str, str], on_event: Any, *,
                    idle_timeout: float) -> None:
        assert query.pop("watch") == "true"
        for event in self.api.watch(path, query, timeout=idle_timeout):
            on_event(event["type"], event["object"])
        if self.stopped:
            raise asyncio.CancelledError  # how an AsyncPool stops its feed: cancellation

    def stop(self) -> None:
        self.stopped = True


DRIVER = "sync"


@pytest.fixture(params=["sync", "async"], autouse=True)
def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs the one feed under both drivers: the thread's and the asyncio one."""
    monkeypatch.setattr(sys.modules[__name__], "DRIVER", request.param)
    return str(request.param)


def run(api: ScriptedApi, **kwargs: Any) -> tuple[Feed, Recorder]:
    sink = Recorder()
    if DRIVER == "sync":
        feed = LeaseFeed(LeaseStore(api), "ns", "pool=a", watch_seconds=7, **kwargs)  # type: ignore[arg-type]
        api.feed = feed
        feed.run(sink)
        return feed, sink
    aapi = AsyncScripted(api)
    api.feed = aapi  # type: ignore[assignment]
    afeed = Feed("ns", "pool=a", watch_seconds=7, **kwargs)

    async def main() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await adrive(afeed.steps(sink), AsyncPort(AsyncLeaseStore(aapi)))  # type: ignore[arg-type]

    asyncio.run(main())
    return afeed, sink


def gone_event() -> dict[str, Any]:
    return {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                        "message": "too old resource version: 11 (40)"}}


def test_watch_resumes_from_the_last_version_and_relists_only_after_410(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = ScriptedApi(
        lists=[listing(10, "a", "b"), listing(40, "b", "c")],
        watches=[
            [{"type": "MODIFIED", "object": obj("a", 11)},
             {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}],
            [{"type": "DELETED", "object": obj("a", 16)}],  # resumed from 15: no re-list
            [gone_event()],  # resumed from 16: the server no longer keeps it
            [{"type": "ADDED", "object": obj("d", 41)}],
        ])
    feed, sink = run(api)
    assert sink.calls == ["replace ['a', 'b'] @10", "MODIFIED a @11", "DELETED a @16",
                          "replace ['b', 'c'] @40", "ADDED d @41"]
    watched_from = [q["resourceVersion"] for kind, q in api.sent if kind == "watch"]
    assert watched_from == ["10", "15", "16", "40", "41"]
    assert (feed.counts.lists, feed.counts.gone) == (2, 1)
    assert sink.troubles == []  # a 410 is routine: no trouble for a waiting claimer
    assert sorted(o.name for o in (sink.get(n) for n in "abcd") if o) == ["b", "c", "d"]
    first = api.sent[0][1]
    assert first["labelSelector"] == "pool=a" and first["fieldSelector"] == UNFINISHED
    watch = api.sent[1][1]
    assert watch["allowWatchBookmarks"] == "true" and watch["timeoutSeconds"] == "7"


def test_an_http_410_on_opening_the_watch_relists_too() -> None:
    api = ScriptedApi(lists=[listing(10, "a"), listing(50, "z")],
                      watches=[GoneError(410, "Gone", "too old"), []])
    feed, sink = run(api)
    assert sink.calls == ["replace ['a'] @10", "replace ['z'] @50"]
    assert feed.counts.gone == 1


def test_a_broken_stream_resumes_after_a_pause_without_relisting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = ScriptedApi(lists=[listing(10, "a")],
                      watches=[[{"type": "MODIFIED", "object": obj("a", 12)},
                                ConnectionResetError("connection reset")],
                               [{"type": "MODIFIED", "object": obj("a", 13)}]])
    feed, sink = run(api)
    assert sink.calls == ["replace ['a'] @10", "MODIFIED a @12", "MODIFIED a @13"]
    assert [q["resourceVersion"] for k, q in api.sent if k == "watch"] == ["10", "12", "13"]
    assert (feed.counts.lists, feed.counts.failures) == (1, 1)


def test_pages_are_stitched_and_the_list_keeps_retrying_a_refusal() -> None:
    api = ScriptedApi(lists=[ForbiddenError(403, "Forbidden", "cannot list"),
                             listing(10, "a", token="next"), listing(10, "b")],
                      watches=[])
    feed, sink = run(api)
    assert sink.calls == ["replace ['a', 'b'] @10"] and feed.counts.failures == 1
    assert api.sent[2][1]["continue"] == "next"
    assert isinstance(sink.troubles[0], ForbiddenError)


def test_without_selectable_fields_finished_leases_are_filtered_on_this_side() -> None:
    refused = InvalidError(400, "BadRequest",
                           'field label not supported: status.phase')
    done = obj("done", 9, phase="Completed")
    api = ScriptedApi(lists=[refused, {"metadata": {"resourceVersion": "10"},
                                       "items": [obj("a", 9), done]}],
                      watches=[[{"type": "ADDED", "object": obj("b", 11)},
                                {"type": "MODIFIED", "object": obj("a", 12, "Failed")}]])
    feed, sink = run(api)
    assert feed.field_selector is None and "fieldSelector" not in api.sent[1][1]
    assert sink.troubles == []
    assert sink.calls == ["replace ['a'] @10", "ADDED b @11", "DELETED a @12"]
    assert sink.get("a") is None and sink.unfinished() == 1


def test_an_unreadable_object_is_skipped_counted_and_logged_and_the_feed_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    """One bad object never stops the feed (issue 23, item 2): the asyncio pool skipped it,
    the thread pool's feed stopped on it; now both skip, count and log it."""
    hostile = {"metadata": {"name": "bad", "resourceVersion": "11"},
               "status": {"phase": "Held", "generation": "not a number"}}
    api = ScriptedApi(lists=[{"metadata": {"resourceVersion": "10"},
                              "items": [obj("a", 9), {"metadata": "not an object"}]}],
                      watches=[[{"type": "ADDED", "object": hostile},
                                {"type": "MODIFIED", "object": {"metadata": "x"}},
                                {"type": "ADDED", "object": obj("b", 12)}]])
    feed, sink = run(api)
    assert sink.calls == ["replace ['a'] @10", "ADDED b @12"]
    assert feed.counts.unreadable == 3 and feed.counts.events == 3
    assert feed.resource_version == "12"
    assert "skipping an unreadable JobLease 'bad'" in caplog.text


def test_every_list_and_watch_asks_the_namespace_for_the_pools_selectors_only() -> None:
    """The watch carries the list's selectors: without them it would stream every JobLease
    of the namespace (another pool's, finished ones) into the view."""
    api = ScriptedApi(lists=[listing(10, "a", token="next"), listing(10, "b")],
                      watches=[[{"type": "BOOKMARK", "object": {"metadata": {
                          "resourceVersion": "15"}}}], []])
    feed, sink = run(api)
    assert [kind for kind, _ in api.sent] == ["list", "list", "watch", "watch", "watch"]
    for _, query in api.sent:
        assert (query["labelSelector"], query["fieldSelector"]) == ("pool=a", UNFINISHED)
    assert "continue" not in api.sent[0][1] and api.sent[1][1]["continue"] == "next"
    assert set(api.paths) == {"/apis/joblease.dev/v1alpha1/namespaces/ns/jobleases"}
    assert api.timeouts and all(t > 0 for t in api.timeouts)  # a list never waits unbounded
    assert [q["resourceVersion"] for k, q in api.sent if k == "watch"] == ["10", "15", "15"]
    assert sink.resource_version == "15"  # the BOOKMARK moved the view's resume point
    assert (feed.counts.lists, feed.counts.watches, feed.counts.failures) == (1, 3, 0)


def test_a_refused_field_selector_is_left_out_of_the_watch_too() -> None:
    refused = InvalidError(400, "BadRequest", "field label not supported: status.phase")
    api = ScriptedApi(lists=[refused, listing(10, "a")], watches=[[]])
    run(api)
    assert [("fieldSelector" in q, q["labelSelector"]) for _, q in api.sent] == [
        (True, "pool=a"), (False, "pool=a"), (False, "pool=a"), (False, "pool=a")]


def test_a_refusal_that_is_not_about_the_field_selector_keeps_it() -> None:
    refused = InvalidError(400, "BadRequest", "labelSelector: invalid value")
    api = ScriptedApi(lists=[refused, listing(10, "a")], watches=[])
    feed, sink = run(api)
    assert feed.field_selector == UNFINISHED and sink.troubles == [refused]
    assert api.sent[1][1]["fieldSelector"] == UNFINISHED


def test_failures_back_off_doubling_and_a_watch_that_ends_well_resets_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    def sleep(seconds: float) -> Sleep:
        slept.append(seconds)
        return Sleep(0.0)

    monkeypatch.setattr("joblease.core.feed.Sleep", sleep)
    monkeypatch.setattr("joblease.core.feed.random.uniform", lambda low, high: high)
    lost = UnavailableError(0, "Unavailable", "connection refused")
    api = ScriptedApi(lists=[lost] * 6 + [listing(10, "a")],
                      watches=[[], lost, []])
    feed, sink = run(api)
    first = RETRY_FIRST
    assert slept == [first, 2 * first, 4 * first, 8 * first, 16 * first, RETRY_MAX, first]
    assert feed.counts.failures == 7 and sink.troubles == [lost] * 7


def test_a_retry_pause_is_jittered_between_half_and_all_of_its_doubling_step() -> None:
    for failures in range(25):
        step = min(RETRY_MAX, RETRY_FIRST * 2.0 ** failures)
        pauses = [retry_pause(failures) for _ in range(50)]
        assert all(step / 2 <= p <= step for p in pauses), (failures, min(pauses), max(pauses))
        assert max(pauses) - min(pauses) > step / 10  # jittered, not one value


# -- issue 28: the operator's feed, page by page, compact, finished leases included ---------

class PagedRecorder:
    """A ``PagedFeedSink``: records each call, keeps no list of its own."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def list_started(self) -> None:
        self.calls.append("started")

    def list_page(self, items: list[Observed]) -> None:
        self.calls.append(f"page {[(o.name, o.status.phase.value) for o in items]}")

    def list_done(self, resource_version: str) -> None:
        self.calls.append(f"done @{resource_version}")

    def apply(self, event_type: str, obs: Observed) -> None:
        self.calls.append(f"{event_type} {obs.name}")

    def bookmark(self, resource_version: str) -> None:
        self.calls.append(f"bookmark @{resource_version}")

    def trouble(self, error: Exception) -> None:
        self.calls.append(f"trouble {error}")


def run_paged(api: ScriptedApi, **kwargs: Any) -> tuple[Feed, PagedRecorder]:
    sink = PagedRecorder()
    if DRIVER == "sync":
        feed = LeaseFeed(LeaseStore(api), "", None, watch_seconds=7, **kwargs)  # type: ignore[arg-type]
        api.feed = feed
        feed.run(sink)
        return feed, sink
    aapi = AsyncScripted(api)
    api.feed = aapi  # type: ignore[assignment]
    afeed = Feed("", None, watch_seconds=7, **kwargs)

    async def main() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await adrive(afeed.steps(sink), AsyncPort(AsyncLeaseStore(aapi)))  # type: ignore[arg-type]

    asyncio.run(main())
    return afeed, sink


def test_a_paged_sink_gets_each_page_as_it_is_read_and_relists_after_410() -> None:
    """The operator's view: no list of every JobLease is collected before it is stored."""
    first = listing(10, "a", token="t1")
    first["items"].append(obj("done", 5, phase="Completed"))
    api = ScriptedApi(lists=[first, listing(10, "b"), listing(40, "c")],
                      watches=[[{"type": "MODIFIED", "object": obj("a", 11, "Failed")}],
                               [gone_event()], []])
    feed, sink = run_paged(api, include_finished=True, page_size=2)
    assert sink.calls == [
        "started", "page [('a', 'Available'), ('done', 'Completed')]",
        "page [('b', 'Available')]", "done @10",
        "MODIFIED a",  # a finished lease stays in the selection (TTL deletion needs it)
        "started", "page [('c', 'Available')]", "done @40"]
    lists = [query for kind, query in api.sent if kind == "list"]
    assert all("fieldSelector" not in q and "labelSelector" not in q for q in lists)
    assert [q.get("continue") for q in lists] == [None, "t1", None]
    assert lists[0]["limit"] == "2"
    assert (feed.counts.lists, feed.counts.gone) == (2, 1)


def test_an_unreadable_object_in_a_page_or_an_event_is_skipped_and_reported() -> None:
    bad = {"metadata": {"name": "bad", "namespace": "ns", "resourceVersion": "3"},
           "status": {"generation": "not a number"}}
    page = listing(10, "a", "b")
    page["items"].insert(1, bad)
    api = ScriptedApi(lists=[page], watches=[[{"type": "ADDED", "object": bad},
                                              {"type": "ADDED", "object": obj("c", 11)}]])
    refused: list[str] = []
    feed, sink = run_paged(api, include_finished=True,
                           on_unreadable=lambda o, err: refused.append(o["metadata"]["name"]))
    assert sink.calls == ["started", "page [('a', 'Available'), ('b', 'Available')]",
                          "done @10", "ADDED c"]
    assert refused == ["bad", "bad"] and feed.counts.unreadable == 2


def test_the_decoder_shapes_what_the_sink_gets() -> None:
    api = ScriptedApi(lists=[listing(10, "a")], watches=[])
    decoded: list[str] = []

    def decode(raw: dict[str, Any]) -> Observed:
        decoded.append(raw["metadata"]["name"])
        return compact_lease(raw)

    run_paged(api, include_finished=True, decode=decode)
    assert decoded == ["a"]


def test_a_compact_record_keeps_what_the_operator_decides_from_and_shares_the_rest() -> None:
    """What the view keeps per lease (docs/operations.md gives its size)."""
    def lease(name: str, status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "batch", "uid": f"uid-{name}",
                             "resourceVersion": "7", "generation": 1,
                             "creationTimestamp": "2026-12-03T11:00:00Z",
                             "labels": {"queue": "nightly"},
                             "managedFields": [{"manager": "kubectl", "fieldsV1": {}}]},
                "spec": {"leaseDurationSeconds": 30, "ttlSecondsAfterFinished": 60,
                         "podDelegation": {"enabled": True}},
                "status": status}
    held = {"phase": "Held", "holder": "system:serviceaccount:batch:worker", "generation": 3,
            "epoch": 5, "acquireTime": "2026-12-03T12:00:00Z",
            "renewTime": "2026-12-03T12:00:10Z", "leaseUntil": "2026-12-03T12:00:40Z",
            "claimId": "c1", "attempts": 1,
            "conditions": [{"type": "Held", "status": "True", "reason": "Claimed",
                            "message": "claimed", "lastTransitionTime": "2026-12-03T12:00:00Z"}]}
    full = Observed.from_object(lease("a", held))
    a, b = compact_lease(lease("a", held)), compact_lease(lease("b", held))
    assert a.status.conditions == () and a.status.acquire_time is None
    assert a.status == replace(full.status, conditions=(), acquire_time=None)
    assert (a.spec, a.uid, a.resource_version, a.created) == (
        full.spec, full.uid, full.resource_version, full.created)
    assert a.spec is b.spec and a.status.holder is b.status.holder
    born = [compact_lease(lease(n, {"phase": "Available", "generation": 0, "attempts": 0}))
            for n in ("c", "d")]
    assert born[0].status is born[1].status and born[0].status.epoch is None


# -- issue 31 item 8: what mutation testing found unpinned ------------------------------------

def test_an_event_without_a_version_or_not_an_object_keeps_the_resume_point(
        caplog: pytest.LogCaptureFixture) -> None:
    """The resume point moves only with a version the server gave: an empty or invented one
    would resume the next watch from nothing (a re-list) or from garbage (an error)."""
    api = ScriptedApi(lists=[listing(10, "a")],
                      watches=[[{"type": "MODIFIED", "object": obj("a", 11)},
                                {"type": "BOOKMARK", "object": {"metadata": {}}},
                                {"type": "ADDED", "object": "not an object"}],
                               []])
    feed, sink = run(api)
    assert [q["resourceVersion"] for k, q in api.sent if k == "watch"] == ["10", "11", "11"]
    assert sink.calls == ["replace ['a'] @10", "MODIFIED a @11"]
    assert feed.counts.unreadable == 1
    assert "skipping an unreadable JobLease None (" in caplog.text


def test_the_unreadable_objects_log_line_names_the_feed_the_object_and_the_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    """What an operator greps for when a JobLease never reaches a pool."""
    def decode(raw: dict[str, Any]) -> Observed:
        if raw["metadata"]["name"] == "bad":
            raise ValueError("generation is not a number")
        return Observed.from_object(raw)

    api = ScriptedApi(lists=[listing(10, "a", "bad")], watches=[])
    run(api, decode=decode)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "JobLease feed ns/pool=a: skipping an unreadable JobLease 'bad' "
        "(ValueError: generation is not a number)"]


def test_the_refused_field_selectors_warning_names_it_and_the_servers_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    refused = InvalidError(400, "BadRequest", "field label not supported: status.phase")
    run(ScriptedApi(lists=[refused, listing(10, "a")], watches=[]))
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"the API server refuses the field selector {UNFINISHED!r} (field label not "
        "supported: status.phase); filtering finished JobLeases on this side"]


def test_every_410_is_counted() -> None:
    api = ScriptedApi(lists=[listing(10, "a"), listing(20, "a"), listing(30, "a")],
                      watches=[[gone_event()], GoneError(410, "Gone", "too old"), []])
    feed, _ = run(api)
    assert (feed.counts.gone, feed.counts.lists) == (2, 3)


class ClosedUnderTheRead(Chunks):
    """urllib3 closed from another thread in the middle of a read: its ``fp`` is gone."""

    def __init__(self, events: list[dict[str, Any] | Exception], owner: list[WatchStream]
                 ) -> None:
        super().__init__(events)
        self.owner = owner

    def stream(self, amt: int) -> Iterator[bytes]:
        yield from super().stream(amt)
        self.owner[0].close()  # another thread's close() lands while this one reads
        raise AttributeError("'NoneType' object has no attribute 'read'")


def test_a_watch_closed_from_another_thread_ends_whatever_the_read_raises() -> None:
    """safety.md #41: a pool switching what it watches closes the old stream under its
    reader; urllib3 then raised AttributeError, which killed the pool (``joblease work``
    exited 6). Once closed, the stream just ends; the same error unclosed still raises."""
    owner: list[WatchStream] = []
    closing = WatchStream(Raw(ClosedUnderTheRead([{"type": "ADDED", "object": obj("a", 2)}],
                                                 owner)), "/jobleases", (OSError,))
    owner.append(closing)
    assert [e["type"] for e in closing] == ["ADDED"]
    broken = stream([AttributeError("a bug, not a close")])
    with pytest.raises(AttributeError):
        list(broken)
