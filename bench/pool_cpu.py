"""A small dispatched drain, for the CPU per job of the workers and of the dispatcher.

    python -m bench.pool_cpu [--jobs 1000] [--workers 10] [--rounds 1]

Issue 30: the full pool section (``python -m bench --only pool``) takes minutes and its
wall-clock figures move with the machine's load. CPU seconds per job move far less, so a
change to ``joblease work`` or to the dispatcher can be judged on this alone, in a minute or
two: its own local control plane, ``bench.pool``'s dispatched drain (the same workers, jobs
and dispatcher), and one JSON line per round:

* ``worker_ms_per_job``: the ``joblease work`` processes, their commands and supervisors,
  start-up included (``getrusage`` of the reaped children), per job;
* ``worker_ms_per_job_net``: the same less the workers' start-up, measured as
  ``bench.pool`` does (``joblease work --until-empty`` on an empty selector, twice);
* ``dispatcher_ms_per_job``: the dispatcher's own threads (``bench.pool.DispatchRun``);
* the drain's status writes, watch events and requests per job (kube-apiserver's counts).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench import common, pool
from bench.common import create_namespace, progress
from joblease.kube.api import KubeApi
from joblease_localcluster.cluster import LocalCluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pool_cpu", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="joblease-pool-cpu-"))
    with LocalCluster() as cluster:
        common.install_crd(cluster)
        kubeconfig = str(cluster.kubeconfig_for("admin"))
        api = KubeApi.from_kubeconfig(kubeconfig)
        namespace = "bench-pool"
        create_namespace(api, namespace)
        pool._product()  # compiles the product's modules, as an install would
        empty = pool.work_argv(kubeconfig, namespace, "batch=nothing", "nobody", ["true"],
                               until_empty=True)
        startup = pool.spawn_cost(empty, 2)
        progress(f"pool_cpu: a worker's start-up {startup['cpu_s'] * 1000:.0f} ms of CPU")
        for round_ in range(args.rounds):
            pool.DISPATCH_LABEL = {"batch": f"cpu{round_}"}
            figures = pool._drain(cluster, api, kubeconfig, namespace, args.jobs,
                                  args.workers, logs,
                                  dispatch=pool.DispatchRun(kubeconfig, namespace,
                                                            kill_halfway=False))
            print(json.dumps(_summary(figures, args.jobs, args.workers, startup["cpu_s"])),
                  flush=True)
        api.close()
    return 0


def _summary(figures: dict[str, object], jobs: int, workers: int, startup_s: float
             ) -> dict[str, object]:
    worker = float(figures["worker_cpu_s_per_job"])  # type: ignore[arg-type]
    dispatch: dict[str, object] = figures["dispatch"]  # type: ignore[assignment]
    return {
        "jobs": jobs, "workers": workers,
        "worker_ms_per_job": round(worker * 1000, 2),
        "worker_ms_per_job_net": round((worker * jobs - workers * startup_s) / jobs * 1000, 2),
        "worker_startup_cpu_s": round(startup_s, 3),
        "dispatcher_ms_per_job": round(
            float(dispatch["dispatcher_cpu_s_per_job"]) * 1000, 2),  # type: ignore[arg-type]
        "dispatcher_threads_cpu_s": dispatch["dispatcher_threads_cpu_s"],
        "status_writes_per_job": figures["status_writes_per_job"],
        "events_per_job": figures["events_per_job"],
        "requests_per_job": figures["requests_per_job"],
        "jobs_per_s": figures["jobs_per_s"], "wall_s": figures["wall_seconds"]}


if __name__ == "__main__":
    raise SystemExit(main())
