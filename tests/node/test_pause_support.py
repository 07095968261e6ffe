"""The node tests' pause: it stops a pod's app, never a readiness probe in flight.

``NodeCluster.paused`` is how the journey, the seed and the Indexed Job tests freeze a
holder past its lease; the journey then waits for the pod to turn not Ready. A full run
at ``7bb0c88`` saw a paused pod stay Ready for 30 s: the pause stopped every process of
the container, a probe's exec'd ``sh`` (or its ``$(date)``) included, and a stopped probe
holds the kubelet's probe up while its last result, Ready, stands. Here a pod's probe is
slow on purpose (``sleep`` first), so a pause lands while one is in flight, three times.
"""

from __future__ import annotations

import time
from typing import Any

from node_support import NodeCluster, _descends

from joblease_localcluster import images
from support.waiting import wait_for

HEARTBEAT = "while :; do touch /tmp/heartbeat; sleep 0.2; done"
# fresh heartbeat: at most 2 s old; the sleep keeps a probe in flight most of the time
PROBE = "sleep 0.6; test $(( $(date +%s) - $(stat -c %Y /tmp/heartbeat) )) -le 2"


def _pod(name: str, ns: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"hostNetwork": True, "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                     "containers": [{
                         "name": "app", "image": images.BASE_IMAGE,
                         "imagePullPolicy": "Never", "command": ["sh", "-c", HEARTBEAT],
                         "readinessProbe": {"exec": {"command": ["sh", "-c", PROBE]},
                                            "periodSeconds": 1, "timeoutSeconds": 2,
                                            "failureThreshold": 2}}]}}


def _probe_pids(nc: NodeCluster, ns: str, pod: str) -> list[int]:
    """Processes of the container that are not the app's: a probe in flight."""
    return nc.processes(ns, pod)[1]


def test_a_pause_stops_the_app_and_never_a_probe_in_flight(node_cluster: NodeCluster,
                                                            node_ns: str) -> None:
    nc, ns, name = node_cluster, node_ns, "paused-app"
    nc.apply(_pod(name, ns))
    wait_for(lambda: nc.pod_ready(ns, name), 60, f"{name} Ready")
    for round_ in range(3):
        probes = wait_for(lambda: _probe_pids(nc, ns, name), 20, "a probe in flight")
        with nc.paused(ns, name) as stopped:
            paused = time.monotonic()
            assert not set(stopped) & set(probes), (
                f"round {round_}: the pause stopped a probe's process: {stopped} ∩ {probes}")
            assert set(nc.task_pids(ns, name)) <= set(stopped), "the app itself was not paused"
            wait_for(lambda: not nc.pod_ready(ns, name), 20, f"{name} not Ready while paused")
            turned = time.monotonic() - paused
        wait_for(lambda: nc.pod_ready(ns, name), 30, f"{name} Ready again")
        print(f"\npause round {round_}: probe pids {probes} left running; stopped {stopped}; "
              f"not Ready after {turned:.1f}s")


def test_descends_follows_parents_to_a_root_and_stops_at_a_cycle() -> None:
    parents = {10: 1, 11: 10, 20: 99, 21: 20, 30: 31, 31: 30}
    assert _descends(1, {1}, parents) and _descends(11, {1}, parents)
    assert not _descends(21, {1}, parents)  # an exec'd probe's child: parent is the shim
    assert not _descends(30, {1}, parents)  # a cycle (reused PIDs) ends, not loops
    assert not _descends(42, {1}, parents)  # ended: no parent known
