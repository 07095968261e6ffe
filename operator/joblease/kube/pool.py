"""A work pool's feed: list the JobLeases of one label selector, then watch them.

The cache this feeds (``joblease.domain.pool.PoolView``) decides everything; this module
only moves the API server's list and watch events into a :class:`FeedSink` and keeps
the stream going:

1. List (paginated; the ``continue`` token keeps the pages one snapshot) and hand the
   items and the list's ``resourceVersion`` to ``sink.replace``.
2. Watch from that ``resourceVersion`` with ``allowWatchBookmarks=true``; every event
   moves the resume point, BOOKMARK events included.
3. When the server ends the watch (its ``timeoutSeconds``) or the connection breaks, watch
   again from the last ``resourceVersion`` — no re-list, no event lost or repeated.
4. When the server no longer keeps that version (HTTP 410, or an ERROR event with code
   410 — etcd compacted it, or the watch cache moved past it) list again: ``sink.replace``
   starts the view over, which is the only way to learn about deletions that happened
   meanwhile.

Finished leases are filtered on the server (``fieldSelector``
``status.phase!=Completed,status.phase!=Failed``, which the CRD's ``selectableFields``
allow): a lease that completes leaves the selection, and the watch reports it as DELETED,
so the cache holds only work that may still run. An API server without selectable fields
(before Kubernetes 1.31) refuses the field selector with 400; the feed then filters the
same way on its side (a finished lease arrives as DELETED).
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from joblease.domain.lease import Observed
from joblease.kube.api import ApiError, InvalidError, WatchStream
from joblease.kube.leases import LeaseStore, lease_path

UNFINISHED = "status.phase!=Completed,status.phase!=Failed"
WATCH_SECONDS = 300  # the server ends a watch after this long; the feed resumes it
PAGE_SIZE = 500
RETRY_FIRST, RETRY_MAX = 0.2, 5.0  # seconds between attempts while the server fails

log = logging.getLogger(__name__)


class FeedSink(Protocol):
    """Where a feed delivers what it learns (``joblease.sdk.pool.Pool`` over a PoolView)."""

    def replace(self, items: list[Observed], resource_version: str) -> None:
        """A complete list: start over from it."""

    def apply(self, event_type: str, obs: Observed) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""

    def bookmark(self, resource_version: str) -> None:
        """The watch has reached ``resource_version`` (nothing changed in the selection)."""

    def trouble(self, error: ApiError) -> None:
        """A list or watch failed (not a 410, which just re-lists); the feed retries."""


@dataclass
class FeedCounts:
    """What the feed has done (for tests, metrics and bug reports)."""

    lists: int = 0
    watches: int = 0
    gone: int = 0
    failures: int = 0
    events: int = 0


class LeaseFeed:
    """List+watch of the JobLeases in ``namespace`` matching ``label_selector``.

    Run :meth:`run` in a thread of its own; :meth:`stop` ends it from any other.

    Args:
        store: Reads through its ``KubeApi`` (one identity, one server-clock estimate).
        namespace: The pool's namespace.
        label_selector: The pool (``team=batch,queue=nightly``); ``""`` is every JobLease.
        watch_seconds: The ``timeoutSeconds`` asked of the server for each watch.
        page_size: Items per list page.
        server_filter: Filter finished leases with a field selector (else on this side).

    Attributes:
        resource_version: Where the next watch resumes (``None``: list first).
        counts: What happened so far.
    """

    def __init__(self, store: LeaseStore, namespace: str, label_selector: str, *,
                 watch_seconds: int = WATCH_SECONDS, page_size: int = PAGE_SIZE,
                 server_filter: bool = True) -> None:
        self.store = store
        self.namespace = namespace
        self.label_selector = label_selector
        self.watch_seconds = watch_seconds
        self.page_size = page_size
        self.field_selector: str | None = UNFINISHED if server_filter else None
        self.resource_version: str | None = None
        self.counts = FeedCounts()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._stream: WatchStream | None = None

    def list(self) -> tuple[list[Observed], str]:
        """One consistent list of the selection, and its ``resourceVersion``."""
        items: list[Observed] = []
        token, version = "", ""
        while True:
            query = self._selectors({"limit": str(self.page_size)})
            if token:
                query["continue"] = token
            body = self.store.api.request("GET", lease_path(self.namespace), query=query).body
            items.extend(o for o in map(Observed.from_object, body.get("items") or [])
                         if self._wanted(o))
            meta = body.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            token = str(meta.get("continue") or "")
            if not token:
                self.counts.lists += 1
                return items, version

    def run(self, sink: FeedSink) -> None:
        """List, then watch and resume until :meth:`stop` (steps 1-4 of the module doc)."""
        failures = 0
        while not self._stopped.is_set():
            try:
                if self.resource_version is None:
                    items, version = self.list()
                    self.resource_version = version
                    sink.replace(items, version)
                self._watch(sink)
                failures = 0
            except ApiError as err:
                if self._stopped.is_set():
                    return
                failures = self._failed(err, failures, sink)

    def stop(self) -> None:
        """End :meth:`run` soon: the open stream is closed, no request is started again."""
        self._stopped.set()
        self.interrupt()

    def interrupt(self) -> None:
        """Close the open watch now; :meth:`run` resumes from the last resourceVersion."""
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()

    def _watch(self, sink: FeedSink) -> None:
        query = self._selectors({"resourceVersion": self.resource_version or "",
                                 "allowWatchBookmarks": "true",
                                 "timeoutSeconds": str(self.watch_seconds)})
        stream = self.store.api.watch(lease_path(self.namespace), query,
                                      timeout=self.watch_seconds + 30)
        with self._lock:
            self._stream = stream
        if self._stopped.is_set():
            stream.close()
        self.counts.watches += 1
        try:
            for event in stream:
                self._deliver(event, sink)
        finally:
            with self._lock:
                self._stream = None

    def _deliver(self, event: dict[str, Any], sink: FeedSink) -> None:
        kind, obj = event.get("type"), event["object"]
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        self.counts.events += 1
        if kind == "BOOKMARK":
            sink.bookmark(version)
        elif kind in ("ADDED", "MODIFIED", "DELETED"):
            obs = Observed.from_object(obj)
            sink.apply(kind if self._wanted(obs) else "DELETED", obs)
        if version:
            self.resource_version = version

    def _failed(self, err: ApiError, failures: int, sink: FeedSink) -> int:
        """Decide how to go on after ``err``; routine turns are not reported as trouble."""
        if err.status == 410:
            self.counts.gone += 1
            self.resource_version = None  # list again, at once
            return 0
        if isinstance(err, InvalidError) and self.field_selector and "field" in err.message:
            log.warning("the API server refuses the field selector %r (%s); filtering "
                        "finished JobLeases on this side", self.field_selector, err.message)
            self.field_selector = None
            return failures
        sink.trouble(err)
        self.counts.failures += 1
        pause = min(RETRY_MAX, RETRY_FIRST * 2 ** failures) * random.uniform(0.5, 1.0)
        log.debug("JobLease feed %s/%s: %s; again in %.1fs", self.namespace,
                  self.label_selector, err, pause)
        self._stopped.wait(pause)
        return failures + 1

    def _selectors(self, query: dict[str, str]) -> dict[str, str]:
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        if self.field_selector:
            query["fieldSelector"] = self.field_selector
        return query

    def _wanted(self, obs: Observed) -> bool:
        """What the server-side field selector keeps (checked here too, when it is off)."""
        return self.field_selector is not None or not obs.status.phase.finished
