"""kopf wiring only: watch JobLeases into memory, run the reconcile loop, serve metrics.

Deliberately write-free towards kopf's own bookkeeping: only ``@kopf.on.event`` (returns
``None``, so nothing is stored in ``status``), no create/update/timer/daemon handlers (they
would add annotations and a finalizer), Events posting from logs disabled, peering off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import kopf

from joblease.controller import metrics
from joblease.controller.events import EventPoster
from joblease.controller.heartbeat import Heartbeat
from joblease.controller.pods import Delegator, PodView
from joblease.controller.reconciler import LeaseView, Reconciler, observed_transition
from joblease.domain.lease import Observed
from joblease.kube.api import KubeApi
from joblease.kube.leases import GROUP, PLURAL, VERSION, LeaseStore
from joblease.kube.pods import LEASE_LABEL, PodInfo, PodStore

log = logging.getLogger("joblease.operator")
VIEW = LeaseView()
PODS = PodView()
HEARTBEAT = Heartbeat(None)  # set by ``main.run`` from ``--health-file``


def margin_from_env() -> timedelta:
    """The expiry margin (``JOBLEASE_MARGIN_SECONDS``, default 0.25 s plus the clock error)."""
    return timedelta(seconds=float(os.environ.get("JOBLEASE_MARGIN_SECONDS", "0.25")))


def writers_from_env() -> int:
    """Threads writing one pass's due transitions (``JOBLEASE_OPERATOR_WRITERS``, default 4)."""
    return max(1, int(os.environ.get("JOBLEASE_OPERATOR_WRITERS", "4")))


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf to write nothing, calibrate the server clock, start the loop."""
    settings.posting.enabled = False
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    api = await asyncio.to_thread(KubeApi.from_kubeconfig, os.environ.get("KUBECONFIG"))
    error = await asyncio.to_thread(api.calibrate)
    log.info("server clock estimated to ±%.1f ms", error * 1000)
    margin = margin_from_env() + timedelta(seconds=error)
    events = EventPoster(LeaseStore(api))
    memo["events"] = events
    metrics.OVERDUE.watch(VIEW.snapshot, api.server_now)
    reconciler = Reconciler(LeaseStore(api), VIEW, margin, events=events,
                            writers=writers_from_env())
    delegator = Delegator(LeaseStore(api), PodStore(api), VIEW, PODS, margin,
                          announce=reconciler.announce)
    memo["reconciler"] = reconciler
    memo["loop_task"] = asyncio.create_task(_loop(reconciler.pass_once, HEARTBEAT.beat),
                                            name="joblease-reconcile")
    memo["pods_task"] = asyncio.create_task(_loop(delegator.pass_once),
                                            name="joblease-delegate")


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Stop the loop tasks."""
    for key in ("loop_task", "pods_task"):
        task = memo.get(key)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is not None:
        await asyncio.to_thread(reconciler.close)
    events: EventPoster | None = memo.get("events")
    if events is not None:
        await asyncio.to_thread(events.close)


@kopf.on.event(GROUP, VERSION, PLURAL)
def on_lease_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Keep the in-memory view current; count and announce workers' transitions."""
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
        VIEW.drop(obs.namespace, obs.name, obs.uid)
        return
    previous = VIEW.put(obs)
    metrics.count_failed(previous, obs)
    transition = observed_transition(previous, obs)
    if transition is None:
        return
    metrics.TRANSITIONS.labels(transition.kind).inc()
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is not None and transition.kind != "renewed":
        reconciler.announce(obs, transition)  # renewals are too frequent to be Events


@kopf.on.event("", "v1", "pods", labels={LEASE_LABEL: kopf.PRESENT})
def on_pod_event(event: kopf.RawEvent, **_: Any) -> None:
    """Keep the view of pods that delegate a lease current (``joblease.controller.pods``)."""
    body: dict[str, Any] = dict(event.get("object") or {})
    if not body.get("metadata", {}).get("uid"):
        return
    pod = PodInfo.from_object(body)
    if event.get("type") == "DELETED":
        PODS.drop(pod)
    else:
        PODS.put(pod)


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
