"""The kopf adapter, and the only controller module that imports kopf.

It owns ``kopf.run`` (:func:`run`), kopf's settings (:func:`kopf_settings`) and the memo key
under which each handler finds this run's :class:`~joblease.controller.runtime.Operator`;
every handler only defers to it. ``Operator`` itself has no kopf import.

Deliberately write-free towards kopf's own bookkeeping: only ``@kopf.on.event`` (returns
``None``, so nothing is stored in ``status``), no create/update/timer/daemon handlers (they
would add annotations and a finalizer), Events posting from logs disabled, peering off
(:func:`kopf_settings`).

What kopf watches (issue 28): only pods, and only those labelled for delegation —
filtered by the API server (:data:`POD_LABEL_SELECTOR` in kopf's
``settings.watching.label_selectors``; the ``labels=`` of a handler filters on the
client, after every pod in scope has been listed, decoded and remembered), listed in
pages (``chunk_size``). JobLeases come through the run's own compact feed
(``joblease.controller.runtime``): kopf's watch kept every initial list whole and a
``ResourceMemory`` per object. Handlers are ``async def``: kopf runs a plain ``def``
in a thread pool, one hop per event for a handler that only stores a record.

Why a registry per run (:func:`build_registry`) instead of decorators on kopf's default
registry at import time: importing this module then changes nothing, and two runs in one
process cannot see each other's handlers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kopf

from joblease.kube.pods import LEASE_LABEL

if TYPE_CHECKING:
    from joblease.controller.runtime import Operator

MEMO_KEY = "operator"
IDLE_WORKER_SECONDS = 0.5
POD_WATCH = ("", "v1", "pods")  # kopf's selector of the pod resource (the core group is "")
# The pods the operator watches, as the API server's labelSelector: those asking for a
# delegated lease (the label present, any value). One constant, so that a label of another
# feature joins it here (kopf ANDs all selectors that apply to one resource).
POD_LABEL_SELECTOR = LEASE_LABEL
POD_PAGE_SIZE = 500


def run(operator: Operator) -> None:
    """Run ``operator`` under kopf until interrupted (standalone: no peering, no election)."""
    settings = operator.settings
    kopf.run(registry=build_registry(), settings=kopf_settings(),
             memo=kopf.Memo({MEMO_KEY: operator}), standalone=True,
             clusterwide=settings.clusterwide, namespaces=settings.namespaces,
             liveness_endpoint=settings.liveness_endpoint)


def kopf_settings() -> kopf.OperatorSettings:
    """A kopf configuration that writes nothing of its own: no Events from logs, no peering."""
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    # kopf keeps one worker task (with its queue) per object for this long after the
    # object's last event. Our handlers only copy the event into the view, so a worker has
    # nothing to wait for; at the default 5 s the initial list of 100,000 JobLeases kept
    # about as many tasks alive at once (the operator's transient peak).
    settings.queueing.idle_timeout = IDLE_WORKER_SECONDS
    settings.watching.label_selectors[POD_WATCH] = POD_LABEL_SELECTOR
    settings.watching.chunk_size = POD_PAGE_SIZE
    return settings


def operator_of(memo: Any) -> Operator:
    """The run's :class:`Operator`, which :func:`run` put in kopf's memo."""
    operator: Operator = memo[MEMO_KEY]
    return operator


async def start(memo: kopf.Memo, **_: Any) -> None:
    """Connect, calibrate the server clock, start the loops (``Operator.start``)."""
    await operator_of(memo).start()


async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Stop the loops (``Operator.stop``)."""
    await operator_of(memo).stop()


async def on_pod_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Feed a labelled pod's watch event to the run's pod view (``Operator.observe_pod``)."""
    operator_of(memo).observe_pod(event)


def build_registry() -> kopf.OperatorRegistry:
    """A fresh kopf registry holding exactly this module's handlers."""
    registry = kopf.OperatorRegistry()
    # kopf's default registry adds its login handlers by itself; a registry of our own must
    # name one. The official client's: kubeconfig, in-cluster token, exec plugins (the same
    # loaders ``joblease.kube.api`` uses).
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(start)
    kopf.on.cleanup(registry=registry)(stop)
    # No labels= here: the server-side selector (kopf_settings) already keeps the watch to
    # labelled pods, and a pod that loses its label leaves the selection with a DELETED
    # event whose object no longer has the label: a client-side filter would swallow exactly
    # the event that tells PodView to forget it.
    kopf.on.event(*POD_WATCH, registry=registry)(on_pod_event)
    return registry
