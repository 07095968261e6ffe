"""A small dispatched drain, for the CPU per job of the workers and of the dispatcher.

    python -m bench.pool_cpu [--jobs 1000] [--workers 10] [--rounds 1] [--marginal]

Issue 30: the full pool section (``python -m bench --only pool``) takes minutes and its
wall-clock figures move with the machine's load. CPU seconds per job move far less, so a
change to ``joblease work`` or to the dispatcher can be judged on this alone, in a minute or
two: its own local control plane, ``bench.pool``'s dispatched drain (the same workers, jobs
and dispatcher), and one JSON line per round:

* ``worker_ms_per_job``: the ``joblease work`` processes, their commands and supervisors,
  start-up included (``getrusage`` of the reaped children), per job;
* ``worker_ms_per_job_net``: the same less the workers' start-up, measured as
  ``bench.pool`` does (``joblease work --until-empty`` on an empty selector,
  :data:`STARTUPS` times);
* ``dispatcher_ms_per_job``: the dispatcher's own threads (``bench.pool.DispatchRun``);
* the drain's status writes, watch events and requests per job (kube-apiserver's counts).

``--marginal`` adds, per round, a second drain of three times as many jobs by as many
workers, and prints what the extra jobs cost: ``marginal_worker_ms_per_job`` =
(CPU of the large drain − CPU of the small one) ÷ (the difference in jobs), the same for
the dispatcher. Everything a worker pays once — start-up, the supervisor's start, presence's
warm-up rounds, leaving — cancels out, without the empty-selector estimate (whose processes
do not start a supervisor nor reach presence's rounds); what a second of draining costs
(presence renewals, the main loop's wake-ups) stays in, as the longer drain pays it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench import common, pool
from bench.common import create_namespace, progress
from joblease.kube.api import KubeApi
from joblease_localcluster.cluster import LocalCluster

STARTUPS = 5  # empty-selector workers started to measure one start-up (2 varied by ±30 %)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pool_cpu", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--marginal", action="store_true",
                        help="also drain 3x the jobs and print the extra jobs' CPU per job")
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
        startup = pool.spawn_cost(empty, STARTUPS)
        progress(f"pool_cpu: a worker's start-up {startup['cpu_s'] * 1000:.0f} ms of CPU")
        for round_ in range(args.rounds):
            small = _drain(cluster, api, kubeconfig, namespace, f"cpu{round_}", args.jobs,
                           args.workers, logs)
            summary = _summary(small, args.jobs, args.workers, startup["cpu_s"])
            if args.marginal:
                large = _drain(cluster, api, kubeconfig, namespace, f"cpu{round_}x3",
                               3 * args.jobs, args.workers, logs)
                summary.update(_marginal(small, large, args.jobs, 3 * args.jobs))
            print(json.dumps(summary), flush=True)
        api.close()
    return 0


def _drain(cluster: LocalCluster, api: KubeApi, kubeconfig: str, namespace: str, batch: str,
           jobs: int, workers: int, logs: Path) -> dict[str, object]:
    pool.DISPATCH_LABEL = {"batch": batch}
    return pool._drain(cluster, api, kubeconfig, namespace, jobs, workers, logs,
                       dispatch=pool.DispatchRun(kubeconfig, namespace, kill_halfway=False))


def _marginal(small: dict[str, object], large: dict[str, object], small_jobs: int,
              large_jobs: int) -> dict[str, object]:
    """The extra jobs' CPU per job: what each drain paid once cancels out."""
    def total_ms(figures: dict[str, object], jobs: int, per_job: Callable[[dict[str, object]],
                                                                          float]) -> float:
        return per_job(figures) * jobs * 1000

    def worker(figures: dict[str, object]) -> float:
        return float(figures["worker_cpu_s_per_job"])  # type: ignore[arg-type]

    def dispatcher(figures: dict[str, object]) -> float:
        dispatch: dict[str, object] = figures["dispatch"]  # type: ignore[assignment]
        return float(dispatch["dispatcher_cpu_s_per_job"])  # type: ignore[arg-type]

    extra = large_jobs - small_jobs
    return {"marginal_jobs": [small_jobs, large_jobs], **{
        f"marginal_{name}_ms_per_job": round(
            (total_ms(large, large_jobs, part) - total_ms(small, small_jobs, part)) / extra, 2)
        for name, part in (("worker", worker), ("dispatcher", dispatcher))},
        "large_jobs_per_s": large["jobs_per_s"], "large_wall_s": large["wall_seconds"]}


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
