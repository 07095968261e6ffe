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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from joblease.controller import metrics
from joblease.controller.events import EventPoster
from joblease.controller.heartbeat import Heartbeat
from joblease.controller.pods import Delegator, PodView
from joblease.controller.reconciler import LeaseView, Reconciler, observed_transition
from joblease.controller.settings import OperatorSettings
from joblease.domain.lease import Observed
from joblease.kube.api import KubeApi
from joblease.kube.leases import LeaseStore
from joblease.kube.pods import PodInfo, PodStore

log = logging.getLogger("joblease.operator")


class Operator:
    """The state and behaviour of one operator run, independent of any other run.

    Args:
        settings: The validated configuration (:class:`OperatorSettings`).
        api_factory: Builds the API client at start (tests inject a fake); default: from
            ``settings.kubeconfig`` (or in-cluster) with the settings' server clock.
    """

    def __init__(self, settings: OperatorSettings,
                 api_factory: Callable[[OperatorSettings], KubeApi] | None = None) -> None:
        self.settings = settings
        self.view = LeaseView()
        self.pods = PodView()
        self.heartbeat = Heartbeat(settings.health_file)
        self.api: KubeApi | None = None
        self.events: EventPoster | None = None
        self.reconciler: Reconciler | None = None
        self.delegator: Delegator | None = None
        self._api_factory = api_factory or _api_from_settings
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Connect, calibrate the server clock, start the reconcile and delegation loops."""
        settings = self.settings
        api = self.api = await asyncio.to_thread(self._api_factory, settings)
        error = await asyncio.to_thread(api.calibrate)
        log.info("server clock estimated to ±%.1f ms; settings: %s", error * 1000, settings)
        margin = settings.margin + timedelta(seconds=error)
        self.events = EventPoster(LeaseStore(api))
        metrics.OVERDUE.watch(self.view.snapshot, api.server_now)
        leases = LeaseStore(api, on_conflict=metrics.CONFLICTS.inc)  # every write's 409 counted
        self.reconciler = Reconciler(leases, self.view, margin, events=self.events,
                                     writers=settings.writers)
        self.delegator = Delegator(leases, PodStore(api), self.view, self.pods,
                                   margin, announce=self.reconciler.announce)
        self._tasks = [
            asyncio.create_task(_loop(self.reconciler.pass_once, self.heartbeat.beat),
                                name="joblease-reconcile"),
            asyncio.create_task(_loop(self.delegator.pass_once), name="joblease-delegate"),
        ]

    async def stop(self) -> None:
        """Stop the loops, then the writer threads and the Event queue."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        metrics.OVERDUE.unwatch(self.view.snapshot)
        if self.reconciler is not None:
            await asyncio.to_thread(self.reconciler.close)
        if self.events is not None:
            await asyncio.to_thread(self.events.close)
        if self.api is not None:
            await asyncio.to_thread(self.api.close)

    def observe_lease(self, event: Mapping[str, Any]) -> None:
        """Keep the lease view current; count and announce workers' transitions."""
        body: dict[str, Any] = dict(event.get("object") or {})
        if not body.get("metadata", {}).get("resourceVersion"):
            return
        try:
            obs = Observed.from_object(body)
        except Exception as err:
            meta = body.get("metadata", {})
            metrics.OBJECT_ERRORS.labels("read").inc()
            log.error("JobLease %s/%s: cannot read it (%s: %s); other leases are unaffected",
                      meta.get("namespace"), meta.get("name"), type(err).__name__, err)
            return
        if event.get("type") == "DELETED":
            self.view.drop(obs.namespace, obs.name, obs.uid)
            return
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


def _api_from_settings(settings: OperatorSettings) -> KubeApi:
    api = KubeApi.from_kubeconfig(settings.kubeconfig)
    # The estimate is configured from the settings, not from the environment: the clock is
    # replaced before the first request, so nothing has been observed on the old one.
    api.clock = settings.server_clock()
    return api


async def _loop(pass_once: Callable[[], float],
                after_pass: Callable[[], None] = lambda: None) -> None:
    while True:
        try:
            wait = await asyncio.to_thread(pass_once)
            after_pass()
        except Exception:  # keep the loop alive; the next pass retries
            log.exception("pass %s failed", getattr(pass_once, "__qualname__", pass_once))
            wait = 1.0
        await asyncio.sleep(min(wait, 1.0))
