"""A work pool's feed: list the JobLeases of one label selector, then watch them — once.

One feed for both pools (``joblease.sdk.Pool`` in a thread, ``joblease.aio.AsyncPool``
in a task): :meth:`Feed.steps` is the loop, as sans-IO steps; :class:`LeaseFeed` drives it
in a thread, ``AsyncPool`` with ``adrive``. The cache it feeds
(``joblease.domain.pool.PoolView``) decides everything; the feed only moves the API
server's list and watch events into a :class:`FeedSink` and keeps the stream going:

1. List (paginated; the ``continue`` token keeps the pages one snapshot) and hand the
   items and the list's ``resourceVersion`` to ``sink.replace``.
2. Watch from that ``resourceVersion`` with ``allowWatchBookmarks=true``; every event
   moves the resume point, BOOKMARK events included.
3. When the server ends the watch (its ``timeoutSeconds``, :data:`WATCH_SECONDS`) or the
   connection breaks, watch again from the last ``resourceVersion``: no re-list, no event
   lost or repeated.
4. When the server no longer keeps that version (HTTP 410, or an ERROR event with code
   410: etcd compacted it, or the watch cache moved past it) list again at once:
   ``sink.replace`` starts the view over, the only way to learn about deletions meanwhile.
5. Any other failure is reported to ``sink.trouble`` and retried after a backoff with
   jitter (:data:`RETRY_FIRST` doubling to :data:`RETRY_MAX`, times 0.5–1), so that a
   fleet of workers does not retry in step against a recovering API server.
6. An object that cannot be read as a JobLease (in a list or an event) is skipped,
   counted (``counts.unreadable``) and logged; it never stops the feed.

Two kinds of sink (issue 28): a pool's :class:`FeedSink` gets the whole list at once
(``replace``); a :class:`PagedFeedSink` (the operator's view of every JobLease) gets it page
by page (``list_started``, ``list_page`` per page, ``list_done`` with the list's version,
when it forgets what the list did not show), so that no list of every object is ever held
besides the sink's own records. A feed may also shrink each object as it is decoded
(``decode``, e.g. :func:`compact_lease`): the raw page is dropped before the next is read.

Finished leases are filtered on the server (``fieldSelector``
``status.phase!=Completed,status.phase!=Failed``, which the CRD's ``selectableFields``
allow): a lease that completes leaves the selection, and the watch reports it as DELETED,
so the cache holds only work that may still run. An API server without selectable fields
(before Kubernetes 1.31) refuses the field selector with 400; the feed then filters the
same way on its side (a finished lease arrives as DELETED). A feed built with
``include_finished`` (the operator's: it deletes finished leases after their TTL) sends no
field selector and keeps them. A feed built with ``fields`` narrows its selection further
(a dispatched worker's two streams, ``joblease.core.scope``); refused, it falls back to
the whole selection, a superset, which costs events but never a job.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from joblease.core.steps import Call, Sleep, Steps, Stopped, SyncPort, Watch, drive
from joblease.domain.lease import LeaseSpec, LeaseStatus, Observed
from joblease.kube.api import DEFAULT_TIMEOUT, ApiError, InvalidError
from joblease.kube.leases import LeaseStore, Page, lease_path, list_call

UNFINISHED = "status.phase!=Completed,status.phase!=Failed"
WATCH_SECONDS = 300  # the server ends a watch after this long; the feed resumes it
PAGE_SIZE = 500
RETRY_FIRST, RETRY_MAX = 0.2, 5.0  # seconds between attempts while the server fails

log = logging.getLogger(__name__)


class FeedSink(Protocol):
    """Where a feed delivers what it learns (a pool over its ``PoolView``)."""

    def replace(self, items: list[Observed], resource_version: str) -> None:
        """A complete list: start over from it."""

    def apply(self, event_type: str, obs: Observed) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""

    def bookmark(self, resource_version: str) -> None:
        """The watch has reached ``resource_version`` (nothing changed in the selection)."""

    def trouble(self, error: ApiError) -> None:
        """A list or watch failed (not a 410, which just re-lists); the feed retries."""


@runtime_checkable
class PagedFeedSink(Protocol):
    """A sink that takes a list page by page (the operator's view); watch events as FeedSink.

    Between ``list_started`` and ``list_done`` the sink keeps what it knew (its timers go on
    working from it) and only learns which objects the new list still shows.
    """

    def list_started(self) -> None:
        """A (re-)list begins: remember which objects the pages below show."""

    def list_page(self, items: list[Observed]) -> None:
        """One page of the list (its objects as ADDED, in the list's one snapshot)."""

    def list_done(self, resource_version: str) -> None:
        """The list is complete at ``resource_version``: forget objects it did not show."""

    def apply(self, event_type: str, obs: Observed) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""

    def bookmark(self, resource_version: str) -> None:
        """The watch has reached ``resource_version``."""

    def trouble(self, error: ApiError) -> None:
        """A list or watch failed (not a 410, which just re-lists); the feed retries."""


Decode = Callable[[dict[str, Any]], Observed]
Unreadable = Callable[[Any, Exception], None]

_SHARED_SPECS: dict[LeaseSpec, LeaseSpec] = {}
_SHARED_SPECS_MAX = 4096
_BORN = LeaseStatus()


def compact_lease(obj: dict[str, Any]) -> Observed:
    """A JobLease as a small record: what expiry, TTL, delegation, metrics and Events need.

    Parsed like ``Observed.from_object``, then shrunk (measured in docs/operations.md):

    * no ``conditions`` (the largest part of an initialised status) and no
      ``acquireTime``: no decision taken from a record reads them; a write decides from
      a fresh read (``joblease.controller.reconciler.write_basis``);
    * nothing of ``metadata`` but names, uid, version, generation and creation time
      (``managedFields``, labels and annotations go with the raw object);
    * one shared instance per distinct spec (most JobLeases of a cluster share a handful),
      one shared never-written status, one interned string per namespace and holder.

    Raises what ``Observed.from_object`` raises for an object that is not a JobLease.
    """
    obs = Observed.from_object(obj)
    status = obs.status
    if status == _BORN:
        status = _BORN
    elif status.conditions or status.acquire_time or status.holder:
        status = replace(status, conditions=(), acquire_time=None,
                         holder=sys.intern(status.holder) if status.holder else None)
    return replace(obs, namespace=sys.intern(obs.namespace), spec=_shared_spec(obs.spec),
                   status=status)


def _shared_spec(spec: LeaseSpec) -> LeaseSpec:
    shared = _SHARED_SPECS.get(spec)
    if shared is not None:
        return shared
    if len(_SHARED_SPECS) < _SHARED_SPECS_MAX:  # bounded: hostile specs cannot grow it
        _SHARED_SPECS[spec] = spec
    return spec


@dataclass
class FeedCounts:
    """What the feed has done (for tests, metrics and bug reports)."""

    lists: int = 0
    watches: int = 0
    gone: int = 0
    failures: int = 0
    events: int = 0
    unreadable: int = 0


def retry_pause(failures: int) -> float:
    """Seconds before attempt ``failures + 1`` of a failing list or watch (with jitter)."""
    return float(min(RETRY_MAX, RETRY_FIRST * 2.0 ** min(failures, 16)) * random.uniform(0.5, 1.0))


class Feed:
    """List+watch of the JobLeases in ``namespace`` matching ``label_selector``, sans I/O.

    Args:
        namespace: The pool's namespace.
        label_selector: The pool (``team=batch,queue=nightly``); ``""`` is every JobLease.
        watch_seconds: The ``timeoutSeconds`` asked of the server for each watch.
        page_size: Items per list page.
        server_filter: Filter finished leases with a field selector (else on this side).
        include_finished: Keep finished leases too (no filter anywhere; the operator).
        decode: Turns one raw object into its record (default ``Observed.from_object``).
        on_unreadable: Told of each object ``decode`` refused (besides the count and log).
        fields: A field selector that narrows the selection (with ``server_filter``).

    Attributes:
        fields: The field selector that narrows the selection (``None``: none).
        resource_version: Where the next watch resumes (``None``: list first).
        counts: What happened so far.
    """

    def __init__(self, namespace: str, label_selector: str | None, *,
                 watch_seconds: int = WATCH_SECONDS, page_size: int = PAGE_SIZE,
                 server_filter: bool = True, include_finished: bool = False,
                 decode: Decode = Observed.from_object,
                 on_unreadable: Unreadable | None = None, fields: str | None = None) -> None:
        self.namespace = namespace
        self.label_selector = label_selector or ""
        self.watch_seconds = watch_seconds
        self.page_size = page_size
        self.include_finished = include_finished
        self.fields = fields
        self.field_selector: str | None = (
            ",".join(filter(None, (fields, UNFINISHED)))
            if server_filter and not include_finished else None)
        self.resource_version: str | None = None
        self.counts = FeedCounts()
        self._decode = decode
        self._on_unreadable = on_unreadable

    def steps(self, sink: FeedSink | PagedFeedSink) -> Steps[None]:
        """List, then watch and resume, forever (steps 1-6 of the module doc).

        Ends only when its driver stops it (``Stopped`` thrown in, or a cancellation).
        """
        failures = 0
        while True:
            try:
                if self.resource_version is None:
                    yield from self._relist(sink)
                yield from self._watch_steps(sink)
                failures = 0
            except ApiError as err:
                if self._routine(err):
                    continue
                sink.trouble(err)
                self.counts.failures += 1
                pause = retry_pause(failures)
                failures += 1
                log.debug("JobLease feed %s/%s: %s; again in %.1fs", self.namespace,
                          self.label_selector, err, pause)
                yield Sleep(pause)

    def list_steps(self) -> Steps[tuple[list[Observed], str]]:
        """One consistent list of the selection, and its ``resourceVersion``."""
        items: list[Observed] = []
        version = yield from self.pages_steps(items.extend)
        return items, version

    def pages_steps(self, on_page: Callable[[list[Observed]], None]) -> Steps[str]:
        """One consistent list, handed to ``on_page`` page by page; returns its version.

        Each raw page is decoded and dropped before the next is asked for, so at most one
        page of raw objects is alive at a time.
        """
        token, version = "", ""
        while True:
            page: Page = yield Call(list_call(self.namespace, self.label_selector,
                                              self.page_size, token, self.field_selector),
                                    DEFAULT_TIMEOUT)
            on_page([obs for obs in map(self._readable, page.items)
                     if obs is not None and self._wanted(obs)])
            version = page.resource_version or version
            token = page.next_token
            del page
            if not token:
                self.counts.lists += 1
                return version

    def _relist(self, sink: FeedSink | PagedFeedSink) -> Steps[None]:
        if isinstance(sink, PagedFeedSink):
            sink.list_started()
            version = yield from self.pages_steps(sink.list_page)
            self.resource_version = version
            sink.list_done(version)
            return
        items, version = yield from self.list_steps()
        self.resource_version = version
        sink.replace(items, version)

    def _watch_steps(self, sink: FeedSink | PagedFeedSink) -> Steps[None]:
        query = self._selectors({"resourceVersion": self.resource_version or "",
                                 "allowWatchBookmarks": "true",
                                 "timeoutSeconds": str(self.watch_seconds)})
        self.counts.watches += 1
        yield Watch(lease_path(self.namespace), query,
                    lambda kind, obj: self._deliver(kind, obj, sink), self.watch_seconds)

    def _deliver(self, kind: str, obj: dict[str, Any], sink: FeedSink | PagedFeedSink
                 ) -> None:
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        version = str(metadata.get("resourceVersion") or "") if isinstance(metadata, dict) else ""
        self.counts.events += 1
        if kind == "BOOKMARK":
            sink.bookmark(version)
        elif kind in ("ADDED", "MODIFIED", "DELETED"):
            obs = self._readable(obj)
            if obs is not None:
                sink.apply(kind if self._wanted(obs) else "DELETED", obs)
        if version:
            self.resource_version = version

    def _readable(self, obj: Any) -> Observed | None:
        """``obj`` as a JobLease, or ``None`` (counted, logged) if it cannot be read as one."""
        try:
            return self._decode(obj)
        except Exception as err:  # any shape the API server may hand over: skip, never stop
            self.counts.unreadable += 1
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            log.warning("JobLease feed %s/%s: skipping an unreadable JobLease %r (%s: %s)",
                        self.namespace, self.label_selector, name, type(err).__name__, err)
            if self._on_unreadable is not None:
                self._on_unreadable(obj, err)
            return None

    def _routine(self, err: ApiError) -> bool:
        """Whether ``err`` is a routine turn (410, a refused field selector): go on at once."""
        if err.status == 410:
            self.counts.gone += 1
            self.resource_version = None  # list again, at once
            return True
        if isinstance(err, InvalidError) and self.field_selector and "field" in err.message:
            log.warning("the API server refuses the field selector %r (%s); filtering "
                        "finished JobLeases on this side", self.field_selector, err.message)
            self.field_selector = None
            return True
        return False

    def _selectors(self, query: dict[str, str]) -> dict[str, str]:
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        if self.field_selector:
            query["fieldSelector"] = self.field_selector
        return query

    def _wanted(self, obs: Observed) -> bool:
        """What the server-side field selector keeps (checked here too, when it is off)."""
        return (self.include_finished or self.field_selector is not None
                or not obs.status.phase.finished)


class LeaseFeed(Feed):
    """The thread driver of a :class:`Feed`: :meth:`run` in a thread, :meth:`stop` from another.

    Args:
        store: Reads through its ``KubeApi`` (one identity, one server-clock estimate).
        namespace, label_selector, watch_seconds, page_size, server_filter,
            include_finished, decode, on_unreadable, fields: As :class:`Feed`.
    """

    def __init__(self, store: LeaseStore, namespace: str, label_selector: str | None, *,
                 watch_seconds: int = WATCH_SECONDS, page_size: int = PAGE_SIZE,
                 server_filter: bool = True, include_finished: bool = False,
                 decode: Decode = Observed.from_object,
                 on_unreadable: Unreadable | None = None, fields: str | None = None) -> None:
        super().__init__(namespace, label_selector, watch_seconds=watch_seconds,
                         page_size=page_size, server_filter=server_filter,
                         include_finished=include_finished, decode=decode,
                         on_unreadable=on_unreadable, fields=fields)
        self.store = store
        self._stopped = threading.Event()
        self._port = SyncPort(store, stop=self._stopped)

    def list(self) -> tuple[list[Observed], str]:
        """One consistent list of the selection, and its ``resourceVersion`` (blocking)."""
        return drive(self.list_steps(), self._port)

    def run(self, sink: FeedSink | PagedFeedSink) -> None:
        """List, then watch and resume until :meth:`stop` (steps 1-6 of the module doc)."""
        try:
            drive(self.steps(sink), self._port)
        except Stopped:
            return

    def stop(self) -> None:
        """End :meth:`run` soon: the open stream is closed, no request is started again."""
        self._stopped.set()
        self.interrupt()

    def interrupt(self) -> None:
        """Close the open watch now; :meth:`run` resumes from the last resourceVersion."""
        self._port.interrupt()
