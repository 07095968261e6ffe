"""One operator run: its settings, its views of leases and pods, its loops.

Why an object and not module globals: the lease view, the pod view and the heartbeat used
to be module-level singletons that ``main`` patched before ``kopf.run``, so two runs in
one process (tests, an embedding program) shared one view, and a handler's inputs were
invisible in its signature. An :class:`Operator` owns all per-run state and knows nothing
of kopf: the adapter (``joblease.controller.handlers.run``) hands it to kopf in ``memo``
(kopf gives every handler a shallow copy of that memo, so each sees this same object)
together with a kopf registry built for this run alone.

What stays process-wide is what is process-wide by nature: the Prometheus metrics
(one ``/metrics`` endpoint per process). The overdue gauges follow the run started last,
and stop reporting when that run stops.

JobLeases reach the run through its own feed, not through kopf (issue 28): one
``joblease.core.feed.LeaseFeed`` per watched namespace (or one for all), in a thread,
listing page by page (:data:`PAGE_SIZE`) and shrinking each object to a compact record as
it is decoded (``compact_lease``), then watching with bookmarks, resuming, re-listing on
410. kopf's JobLease watch kept the whole initial list, its raw text and a
``ResourceMemory`` per object (13 KB per initialised lease above the process, measured in
the issue); this feed keeps the view's record only. kopf still runs the process (login,
health, start-up and clean-up) and the pod watch (``joblease.controller.handlers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from joblease.controller import metrics
from joblease.controller.events import EventPoster
from joblease.controller.heartbeat import Heartbeat
from joblease.controller.pods import Delegator, PodView
from joblease.controller.reconciler import LeaseView, Reconciler, observed_transition
from joblease.controller.settings import OperatorSettings, dispatch_pools
from joblease.core.dispatcher import Dispatcher, whoami
from joblease.core.feed import LeaseFeed, compact_lease
from joblease.domain.lease import Observed
from joblease.kube import lite
from joblease.kube.api import ApiError, KubeApi
from joblease.kube.leases import LeaseStore
from joblease.kube.pods import PodInfo, PodStore

log = logging.getLogger("joblease.operator")
PAGE_SIZE = 500  # JobLeases per list page: about 4 MB of raw JSON when initialised
FEED_RESTART = 1.0  # seconds before a feed that hit an unexpected error starts again


class Operator:
    """The state and behaviour of one operator run, independent of any other run.

    Args:
        settings: The validated configuration (:class:`OperatorSettings`).
        api_factory: Builds the API client at start (tests inject a fake); default: from
            ``settings.kubeconfig`` (or in-cluster) with the settings' server clock.
        dispatch_api_factory: Builds the dispatchers' own client, if any pool is
            dispatched; default: ``api_factory`` if one was given, else the light transport
            (``joblease.kube.lite``) on the same configuration.
    """

    def __init__(self, settings: OperatorSettings,
                 api_factory: Callable[[OperatorSettings], KubeApi] | None = None,
                 dispatch_api_factory: Callable[[OperatorSettings], KubeApi] | None = None
                 ) -> None:
        self.settings = settings
        self.view = LeaseView(on_sooner=self._wake_reconciler)
        self.pods = PodView()
        self.heartbeat = Heartbeat(settings.health_file)
        self.api: KubeApi | None = None
        self.events: EventPoster | None = None
        self.reconciler: Reconciler | None = None
        self.delegator: Delegator | None = None
        self._api_factory = api_factory or _api_from_settings
        self._dispatch_api_factory = (dispatch_api_factory or api_factory
                                      or _dispatch_api_from_settings)
        self.dispatch_api: KubeApi | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._feeds: list[LeaseFeed] = []
        self._feed_threads: list[threading.Thread] = []
        self._feeds_stopped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due_sooner: asyncio.Event | None = None
        self.dispatchers: list[Dispatcher] = []

    async def start(self) -> None:
        """Connect, calibrate the server clock, start the reconcile and delegation loops."""
        settings = self.settings
        api = self.api = await asyncio.to_thread(self._api_factory, settings)
        error = await asyncio.to_thread(api.calibrate)
        log.info("server clock estimated to ±%.1f ms; settings: %s", error * 1000, settings)
        margin = settings.margin + timedelta(seconds=error)
        self.events = EventPoster(LeaseStore(api))
        metrics.OVERDUE.watch(self.view.held, api.server_now)
        leases = LeaseStore(api, on_conflict=metrics.CONFLICTS.inc)  # every write's 409 counted
        self.reconciler = Reconciler(leases, self.view, margin, events=self.events,
                                     writers=settings.writers)
        self.delegator = Delegator(leases, PodStore(api), self.view, self.pods,
                                   margin, announce=self.reconciler.announce)
        self._loop, self._due_sooner = asyncio.get_running_loop(), asyncio.Event()
        self._tasks = [
            asyncio.create_task(_loop(self.reconciler.pass_once, self.heartbeat.beat,
                                      woken=self._due_sooner),
                                name="joblease-reconcile"),
            asyncio.create_task(_loop(self.delegator.pass_once), name="joblease-delegate"),
        ]
        self._start_feeds(api)
        await asyncio.to_thread(self._start_dispatchers, api, margin)

    def _start_dispatchers(self, api: KubeApi, margin: timedelta) -> None:
        """One dispatcher per configured pool (``--dispatch-pools``; issue 30).

        Each acts only while it holds its pool's dispatcher record, so replicas of the
        operator elect one per pool; the others stand by and take over once it lapses.

        They share a transport of their own, the light one when the configuration allows:
        measured, the ``kubernetes`` client's request path was a quarter of a dispatcher's
        CPU per job (docs/benchmarks.md). Its server-clock estimate is its own, so it is
        calibrated and its error goes into the dispatchers' margin, as the operator's does
        into the operator's.
        """
        pools = dispatch_pools(self.settings.dispatch_pools)
        if not pools:
            return
        dispatch_api = self.dispatch_api = self._dispatch_api_factory(self.settings)
        if dispatch_api is not api:
            error = dispatch_api.calibrate()
            margin = self.settings.margin + timedelta(seconds=error)
        store = LeaseStore(dispatch_api)
        identity = whoami(store)
        for namespace, selector in pools:
            self.dispatchers.append(Dispatcher(store, dispatch_api, lambda: margin, namespace,
                                               selector, identity).start())
            log.info("dispatching pool %r in %s as %s", selector, namespace, identity)

    async def stop(self) -> None:
        """Stop the feeds and the loops, then the writer threads and the Event queue."""
        for dispatcher in self.dispatchers:  # hand over: the record is deleted
            await asyncio.to_thread(dispatcher.close)
        self.dispatchers = []
        if self.dispatch_api is not None and self.dispatch_api is not self.api:
            await asyncio.to_thread(self.dispatch_api.close)
        self.dispatch_api = None
        await asyncio.to_thread(self._stop_feeds)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        metrics.OVERDUE.unwatch(self.view.held)
        if self.reconciler is not None:
            await asyncio.to_thread(self.reconciler.close)
        if self.events is not None:
            await asyncio.to_thread(self.events.close)
        if self.api is not None:
            await asyncio.to_thread(self.api.close)

    def observe_lease(self, event: Mapping[str, Any]) -> None:
        """Keep the lease view current from one raw watch event (tests and embedders).

        The run's own feed does not come through here: it decodes with ``compact_lease``
        and delivers records through :class:`ViewSink` (then :meth:`observe`). This entry
        decodes the same way and counts an unreadable object as the feed does.
        """
        body: dict[str, Any] = dict(event.get("object") or {})
        if not body.get("metadata", {}).get("resourceVersion"):
            return
        try:
            obs = compact_lease(body)
        except Exception as err:
            meta = body.get("metadata", {})
            unreadable(body, err)
            log.error("JobLease %s/%s: cannot read it (%s: %s); other leases are unaffected",
                      meta.get("namespace"), meta.get("name"), type(err).__name__, err)
            return
        if event.get("type") == "DELETED":
            self.view.drop(obs.namespace, obs.name, obs.uid)
            return
        self.observe(obs)

    def observe(self, obs: Observed) -> None:
        """Store one version in the view; count and announce workers' transitions."""
        previous = self.view.put(obs)
        metrics.count_failed(previous, obs)
        transition = observed_transition(previous, obs)
        if transition is None:
            return
        metrics.TRANSITIONS.labels(transition.kind).inc()
        if self.reconciler is not None and transition.kind != "renewed":
            self.reconciler.announce(obs, transition)  # renewals are too frequent for Events

    def observe_pod(self, event: Mapping[str, Any]) -> None:
        """Keep the view of pods that delegate a lease current (``joblease.controller.pods``)."""
        body: dict[str, Any] = dict(event.get("object") or {})
        if not body.get("metadata", {}).get("uid"):
            return
        pod = PodInfo.from_object(body)
        if event.get("type") == "DELETED":
            self.pods.drop(pod)
        else:
            self.pods.put(pod)

    def _start_feeds(self, api: KubeApi) -> None:
        """One feed thread per watched namespace (or one for all; see :func:`feed_scopes`)."""
        self._feeds_stopped.clear()
        for namespace, in_scope in feed_scopes(self.settings.namespaces):
            feed = LeaseFeed(LeaseStore(api), namespace, None, page_size=PAGE_SIZE,
                             include_finished=True, decode=compact_lease,
                             on_unreadable=unreadable)
            sink = ViewSink(self, in_scope)
            thread = threading.Thread(target=self._run_feed, args=(feed, sink), daemon=True,
                                      name=f"joblease-feed-{namespace or 'all'}")
            self._feeds.append(feed)
            self._feed_threads.append(thread)
            thread.start()

    def _run_feed(self, feed: LeaseFeed, sink: ViewSink) -> None:
        """Run one feed until stopped; an unexpected error restarts it (from where it was)."""
        while not self._feeds_stopped.is_set():
            try:
                feed.run(sink)
            except Exception:
                log.exception("the JobLease feed of %r failed; it starts again in %.0f s",
                              feed.namespace or "all namespaces", FEED_RESTART)
            self._feeds_stopped.wait(FEED_RESTART)

    def _stop_feeds(self) -> None:
        self._feeds_stopped.set()
        for feed in self._feeds:
            feed.stop()
        for thread in self._feed_threads:
            thread.join(timeout=10)
        self._feeds, self._feed_threads = [], []

    def _wake_reconciler(self) -> None:
        """Something is due sooner than the reconcile loop planned: wake it (any thread)."""
        loop, event = self._loop, self._due_sooner
        if loop is not None and event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(event.set)


class ViewSink:
    """One feed's deliveries into the run's view (``joblease.core.feed.PagedFeedSink``).

    Args:
        operator: The run whose view and transitions it feeds.
        in_scope: Whether a namespace belongs to this feed (a pattern is filtered here).
    """

    def __init__(self, operator: Operator, in_scope: Callable[[str], bool]) -> None:
        self.operator, self.in_scope = operator, in_scope
        self._listed: set[tuple[str, str]] = set()

    def list_started(self) -> None:
        """A (re-)list begins."""
        self._listed = set()

    def list_page(self, items: list[Observed]) -> None:
        """Store one page (each version as a watch event would)."""
        for obs in items:
            if self.in_scope(obs.namespace):
                self._listed.add((obs.namespace, obs.name))
                self.operator.observe(obs)

    def list_done(self, resource_version: str) -> None:
        """Forget what the complete list no longer shows (deleted while unwatched)."""
        gone = self.operator.view.forget_unlisted(self._listed, self.in_scope)
        self._listed = set()
        log.info("JobLeases listed at resourceVersion %s; %d known, %d gone since the last "
                 "list", resource_version, sum(self.operator.view.phases().values()),
                 len(gone))

    def apply(self, event_type: str, obs: Observed) -> None:
        """One watch event."""
        if not self.in_scope(obs.namespace):
            return
        if event_type == "DELETED":
            self.operator.view.drop(obs.namespace, obs.name, obs.uid)
        else:
            self.operator.observe(obs)

    def bookmark(self, resource_version: str) -> None:
        """Nothing changed up to ``resource_version``: nothing to do."""

    def trouble(self, error: ApiError) -> None:
        """The list or watch failed; the feed retries with backoff."""
        log.warning("JobLease list/watch failed, retrying: %s", error)


def unreadable(obj: Any, err: Exception) -> None:
    """An object the feed cannot read as a JobLease: skipped (the feed logs it), counted."""
    metrics.OBJECT_ERRORS.labels("read").inc()


def feed_scopes(namespaces: tuple[str, ...]) -> list[tuple[str, Callable[[str], bool]]]:
    """The feeds a run needs: ``(namespace to list, which namespaces it keeps)``.

    Every namespace (no ``--namespace``): one cluster-wide feed. Plain names: one feed per
    namespace (RBAC may grant no more). Any kopf pattern (``*``, ``?``, ``!``): one
    cluster-wide feed kept to the matching namespaces (:func:`namespace_matches`).
    """
    if not namespaces:
        return [("", lambda _: True)]
    if any(ch in pattern for pattern in namespaces for ch in "*?!,"):
        return [("", lambda ns: any(namespace_matches(ns, p) for p in namespaces))]
    return [(name, lambda ns, name=name: ns == name) for name in namespaces]  # type: ignore[misc]


def namespace_matches(namespace: str, pattern: str) -> bool:
    """Whether ``namespace`` matches a kopf namespace pattern (kopf's ``match_namespace``).

    Comma-separated globs, left to right: the first inclusive glob decides the initial
    match, a ``!`` glob excludes, a later inclusive glob re-includes only what an exclusion
    removed; a leading exclusive glob implies a catch-all before it. (Not imported from
    kopf: nothing here but the adapter imports kopf.)
    """
    globs = [g.strip() for g in pattern.split(",") if g.strip()]
    started = matched = bool(globs) and globs[0].startswith("!")
    excluded = False
    for glob in globs:
        if glob.startswith("!"):
            if matched and fnmatch.fnmatchcase(namespace, glob[1:]):
                matched, excluded = False, True
        elif not started:
            started, matched = True, fnmatch.fnmatchcase(namespace, glob)
        elif excluded and fnmatch.fnmatchcase(namespace, glob):
            matched, excluded = True, False
    return matched


def _api_from_settings(settings: OperatorSettings) -> KubeApi:
    api = KubeApi.from_kubeconfig(settings.kubeconfig)
    # The estimate is configured from the settings, not from the environment: the clock is
    # replaced before the first request, so nothing has been observed on the old one.
    api.clock = settings.server_clock()
    return api


def _dispatch_api_from_settings(settings: OperatorSettings) -> KubeApi:
    """The dispatchers' transport: the same configuration, light if the client serves it.

    Anything the light client does not serve goes to the ``kubernetes`` client
    (``lite.connect``).
    """
    api = lite.connect(settings.kubeconfig)
    api.clock = settings.server_clock()
    return api


async def _loop(pass_once: Callable[[], float],
                after_pass: Callable[[], None] = lambda: None,
                woken: asyncio.Event | None = None) -> None:
    """Run ``pass_once`` again after the wait it returns (at most 1 s), or when ``woken``.

    ``woken`` is set when a new version makes something due sooner than the wait planned
    (``LeaseView.on_sooner``): the reconciler sleeps until its earliest due time, and a
    lease that arrives already due is not left waiting for that.
    """
    while True:
        try:
            if woken is not None:
                woken.clear()  # what was due before this pass, the pass sees
            wait = await asyncio.to_thread(pass_once)
            after_pass()
        except Exception:  # keep the loop alive; the next pass retries
            log.exception("pass %s failed", getattr(pass_once, "__qualname__", pass_once))
            wait = 1.0
        wait = min(wait, 1.0)
        if woken is None:
            await asyncio.sleep(wait)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), wait)
