"""Only the pool bench's dispatched drain, for comparing one change (issue 30).

``python -m bench.dispatch_drain [--jobs N] [--workers W]``: on the suite's local control
plane, N dispatched JobLeases drained by W ``joblease work`` processes with a dispatcher in
this process (``bench.pool._drain``, the same code as ``python -m bench --only pool``),
printing the drain's rate, the workers' and the dispatcher's CPU per job, watch events and
requests per job, completion → next claim, and the host's CPU per job by process. No floor
is measured: compare two runs of this on one machine, one after the other, not with the
full bench's ratios.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench import common, pool
from bench.pool_figures import cpu_budget
from joblease.kube.api import KubeApi
from joblease_localcluster.cluster import LocalCluster

NAMESPACE = "dispatch-drain"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=20)
    args = parser.parse_args()
    pool._product()  # compiles the product's modules, as an install would
    with LocalCluster() as cluster:
        common.install_crd(cluster)
        kubeconfig = str(cluster.kubeconfig_for("admin"))
        api = KubeApi.from_kubeconfig(kubeconfig)
        common.create_namespace(api, NAMESPACE)
        with tempfile.TemporaryDirectory() as logs:
            figures = pool._drain(cluster, api, kubeconfig, NAMESPACE, args.jobs, args.workers,
                                  Path(logs), dispatch=pool.DispatchRun(
                                      kubeconfig, NAMESPACE, kill_halfway=False))
    between = figures["cycle"]["between_s"]
    print(json.dumps({
        "jobs_per_s": round(figures["jobs_per_s"], 1),
        "worker_cpu_ms_per_job": round(figures["worker_cpu_s_per_job"] * 1000, 2),
        "dispatcher_cpu_ms_per_job": round(
            figures["dispatch"]["dispatcher_cpu_s_per_job"] * 1000, 2),
        "events_per_job": figures["events_per_job"],
        "lease_events_per_job": figures["lease_events_per_job"],
        "status_writes_per_job": figures["status_writes_per_job"],
        "wall_s": round(figures["wall_seconds"], 1),
        "before_first_claim_s": round(figures["before_first_claim_s"], 1),
        "after_last_completion_s": round(figures["after_last_completion_s"], 1),
        "requests_per_job": figures["requests_per_job"],
        "host_cpu_ms_per_job": {k: round(v, 2) for k, v in cpu_budget(
            [figures["cpu_window"]], args.jobs, figures["worker_cpu_s_per_job"],
            figures["dispatch"]["dispatcher_cpu_s_per_job"]).items()},
        "completion_to_next_claim_ms": {"p50": round(between["p50"] * 1000),
                                        "p99": round(between["p99"] * 1000)}}, indent=1))


if __name__ == "__main__":
    main()
