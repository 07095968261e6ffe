"""Pod-delegated leases on real containers: the downward API file, env vars, handovers.

The operator runs on the host (admin kubeconfig); the pods run ``podworker.py watch`` from
the working tree and print every token change they read from
``/etc/joblease/annotations``, stamped with the host clock, so the test can compare it with
the moment the API server showed the new annotation (a watch in this process).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from node_support import NodeCluster, PodWatch, worker_pod

from support.operator_process import OperatorProcess
from support.waiting import wait_for

# 6 in CI (a round is about 9 s: a cold CI run is near its 60-minute budget); the figure in
# docs/real-node.md was taken over 20 (JOBLEASE_NODE_TAKEOVERS=20)
TAKEOVERS = int(os.environ.get("JOBLEASE_NODE_TAKEOVERS", "6"))
# The kubelet rewrites a downward API volume when it syncs the pod (on the pod's update
# event, else every sync period): observed here p50 0.1 s, and once 7.7 s with the 2 CPUs
# shared by the whole suite and other work. The bound is the kubelet's, not ours; what this
# test proves is that the *file* follows every takeover while the env var does not.
LAG_LIMIT = 15.0


@pytest.fixture
def operator(node_cluster: NodeCluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator as a host process (its PID is the only one stopped)."""
    op = OperatorProcess(node_cluster.cluster.kubeconfig, tmp_path / "operator.log").start()
    yield op
    op.stop()
    assert op.proc is not None
    if op.proc.returncode not in (0, -15):
        print(op.output(4000))


def _lease(nc: NodeCluster, ns: str, duration: int) -> None:
    nc.apply({"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
              "metadata": {"name": "work", "namespace": ns},
              "spec": {"leaseDurationSeconds": duration, "podDelegation": {"enabled": True}}})


def _start(nc: NodeCluster, ns: str, name: str, **kwargs: Any) -> tuple[str, float]:
    began = time.monotonic()
    nc.apply(worker_pod(name, ns, ["watch", "900"], lease="work", **kwargs))
    wait_for(lambda: nc.pod_ready(ns, name), 60, f"pod {name} Ready")
    return name, time.monotonic() - began


def _holder(nc: NodeCluster, ns: str) -> tuple[str, int] | None:
    st = nc.lease(ns, "work")
    if st.get("phase") != "Held" or not str(st.get("holder", "")).startswith("pod:"):
        return None
    return str(st["holder"]).split("/")[1], int(st["generation"])


def _seen(nc: NodeCluster, ns: str, pod: str, gen: int) -> dict[str, Any] | None:
    out = nc.kubectl("logs", pod, "-n", ns)
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry["gen"] == str(gen):
                return dict(entry)
    return None


def test_downward_file_follows_takeovers_env_keeps_start_value(
        node_cluster: NodeCluster, node_ns: str, operator: OperatorProcess) -> None:
    nc, ns = node_cluster, node_ns
    _lease(nc, ns, 30)
    watch = PodWatch(nc, ns)
    running: list[float] = []
    standby = [_start(nc, ns, f"w{i}") for i in range(2)]
    running += [s for _, s in standby]
    lags: list[float] = []
    count = 2
    try:
        last_gen = 0
        for _ in range(TAKEOVERS):  # bounded: one takeover per round
            pod, gen = wait_for(
                lambda g=last_gen: (h := _holder(nc, ns)) and h[1] > g and h, 30,
                f"a pod to hold the lease after generation {last_gen}")
            assert gen == last_gen + 1, f"generation jumped from {last_gen} to {gen}"
            entry = wait_for(lambda p=pod, g=gen: _seen(nc, ns, p, g), LAG_LIMIT + 5,
                             f"{pod} to read generation {gen} from its file")
            changed = wait_for(lambda p=pod, g=gen: watch.when(p, str(g)), 5, "the watch")
            lags.append(entry["t"] - changed)
            # env from the same fieldRef: still the value the pod started with
            assert entry["env"] == "0", entry
            last_gen = gen
            _, seconds = _start(nc, ns, f"w{count}")
            running.append(seconds)
            count += 1
            nc.kubectl("delete", "pod", pod, "-n", ns, "--grace-period=0", "--force",
                       check=True)
    finally:
        watch.stop()
    lags.sort()
    p50, worst = statistics.median(lags), lags[-1]
    print(f"\ndownward API lag over {len(lags)} takeovers: p50 {p50:.3f}s max {worst:.3f}s; "
          f"pod create→Ready p50 {statistics.median(running):.2f}s max {max(running):.2f}s")
    assert worst < LAG_LIMIT, lags


def test_not_ready_holder_hands_over_with_next_generation(
        node_cluster: NodeCluster, node_ns: str, operator: OperatorProcess) -> None:
    nc, ns = node_cluster, node_ns
    _lease(nc, ns, 4)
    for name in ("a", "b"):
        _start(nc, ns, name, readiness_file=True)
    pod, gen = wait_for(lambda: _holder(nc, ns), 30, "a pod to hold the lease")
    wait_for(lambda: _seen(nc, ns, pod, gen), LAG_LIMIT, f"{pod} to read {gen}")
    # The readiness probe fails once /tmp/ready is gone (through the container's root).
    pid = nc.container_pids(ns, pod)[0]
    Path(f"/proc/{pid}/root/tmp/ready").unlink()
    wait_for(lambda: not nc.pod_ready(ns, pod), 15, f"{pod} not Ready")
    other = "b" if pod == "a" else "a"
    held = wait_for(lambda: (_holder(nc, ns) or ("", 0))[0] == other and _holder(nc, ns),
                    30, f"{other} to take over")
    assert held == (other, gen + 1)
    wait_for(lambda: _seen(nc, ns, other, gen + 1), LAG_LIMIT, f"{other} to read {gen + 1}")


def test_deleted_holder_hands_over_with_next_generation(
        node_cluster: NodeCluster, node_ns: str, operator: OperatorProcess) -> None:
    nc, ns = node_cluster, node_ns
    _lease(nc, ns, 30)
    for name in ("a", "b"):
        _start(nc, ns, name)
    pod, gen = wait_for(lambda: _holder(nc, ns), 30, "a pod to hold the lease")
    began = time.monotonic()
    nc.kubectl("delete", "pod", pod, "-n", ns, "--wait=false", check=True)  # graceful
    other = "b" if pod == "a" else "a"
    wait_for(lambda: (_holder(nc, ns) or ("", 0))[0] == other, 30, f"{other} to take over")
    assert _holder(nc, ns) == (other, gen + 1)
    wait_for(lambda: _seen(nc, ns, other, gen + 1), LAG_LIMIT, f"{other} to read {gen + 1}")
    # A 30 s lease handed over long before it would expire: the deletion released it.
    assert time.monotonic() - began < 20
