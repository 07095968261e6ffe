"""Two parts of the scale section alone, for before/after comparisons of one change.

``python -m bench.scale_parts creation N`` runs phase 1 (the operator started, then N
JobLeases created) and prints the operator's CPU per creation. ``python -m bench.scale_parts
due-at-once W1,W2,…`` creates 500 JobLeases per entry, claims them all due at one time and
prints the expiry lag p99 against the write-rate bound with the operator at W writers
(``JOBLEASE_OPERATOR_WRITERS``). Each starts its own control plane. Run the commands of a
comparison interleaved (before, after, before, after): the machine's load moves.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from bench import common
from bench.common import create_leases, create_namespace
from bench.opwatch import Operator
from bench.scale import _expiry, _start_during_creation
from joblease.kube.api import KubeApi
from joblease_localcluster.cluster import LocalCluster

DUE_TOGETHER = 500
LEASE_SECONDS = 5


def creation(cluster: LocalCluster, kubeconfig: str, work: Path, leases: int) -> None:
    """Phase 1 of the scale section at ``leases``; one JSON line of what it measured."""
    create_namespace(KubeApi.from_kubeconfig(kubeconfig), "parts")
    names = [f"s-{i:06d}" for i in range(leases)]
    op = Operator(kubeconfig, work / "operator.log", "parts")
    try:
        out = _start_during_creation(cluster, op, kubeconfig, "parts", names,
                                     dict.fromkeys(names, 30), 600)
    finally:
        op.stop()
    print("RESULT", json.dumps({k: out[k] for k in (
        "cpu_ms_per_creation", "create_rate", "cpu_s", "rss_mb_peak")}), flush=True)


def due_at_once(cluster: LocalCluster, kubeconfig: str, work: Path, writers: list[int]
                ) -> None:
    """500 JobLeases due at one time, once per entry of ``writers``."""
    api = KubeApi.from_kubeconfig(kubeconfig)
    for k, count in enumerate(writers):
        namespace = f"due-{k}-{count}"
        create_namespace(api, namespace)
        names = [f"e-{i:04d}" for i in range(DUE_TOGETHER)]
        create_leases(api, namespace, names, LEASE_SECONDS)
        op = Operator(kubeconfig, work / f"operator-{k}.log", namespace,
                      extra_env={"JOBLEASE_OPERATOR_WRITERS": str(count)})
        op.launch()
        try:
            out = _expiry(cluster, op, kubeconfig, namespace, names, LEASE_SECONDS, None,
                          aligned=True)
        finally:
            op.stop()
        print("RESULT", json.dumps({
            "writers": count, "p50": out["lag_s"]["p50"], "p99": out["lag_s"]["p99"],
            "write_rate": out["write_rate"], "bound_s": out["bound_s"],
            "p99_past_bound": out["lag_s"]["p99"] - out["bound_s"]}), flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("creation", "due-at-once"):
        print(__doc__, file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="joblease-parts-"))
    with LocalCluster() as cluster:
        common.install_crd(cluster)
        kubeconfig = str(cluster.kubeconfig_for("admin"))
        if argv[0] == "creation":
            creation(cluster, kubeconfig, work, int(argv[1]))
        else:
            due_at_once(cluster, kubeconfig, work, [int(w) for w in argv[1].split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
