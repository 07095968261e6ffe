"""``python -m bench [--quick] [--only SECTION ...]``: every benchmark in one run.

Starts a fresh local control plane, installs the CRD, runs the sections in order, prints a
table, and writes ``bench/results/results.json``, ``bench/results/plot.png`` and
``bench/results/latest.md``. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import common
from bench.common import RESULTS, create_namespace, loadavg, progress
from joblease.kube.api import KubeApi
from joblease_localcluster.cluster import LocalCluster

SECTIONS = ("latency", "contention", "throughput", "handover", "scale", "cli", "pool")


@dataclass(frozen=True)
class Sizes:
    latency_iterations: int
    contention_workers: int
    contention_rounds: int
    jobs: int
    job_workers: int
    handover_durations: tuple[int, ...]
    handover_rounds: int
    handover_per_round: int
    scale_leases: int
    scale_renew_leases: int
    scale_renew_rounds: int
    scale_expire_leases: int
    scale_duration: int
    reconcile_timeout: float
    cli_rounds: int = 21
    pool_jobs: int = 1000  # drained; the floors write as many jobs' writes before and after
    pool_workers: int = 20
    pool_latency_jobs: int = 50  # the trickle: jobs arriving one by one at idle workers
    pool_latency_rate: float = 5.0  # jobs/s: well below the pool's capacity
    pool_order_jobs: int = 200  # random priorities, created at once; 1 worker, then W
    pool_urgent_rounds: int = 8  # dispatched: an urgent job while every worker is busy
    scale_bursts: tuple[int, ...] = (500, 5000)  # leases due at once (expiry lag p99)
    scale_idle_seconds: float = 30.0  # the window the operator's idle CPU is measured over


FULL = Sizes(500, 50, 5, 1000, 20, (5, 15), 4, 10, 10_000, 200, 5, 500, 5, 900.0)
# pool_jobs: 60 (was 200): the smoke test runs three drains, two floors and PostgreSQL's
# queue of that many jobs, each job a process; 60 still fills 4 workers (and kills the
# dispatcher halfway) while every phase and figure is still produced
QUICK = Sizes(15, 5, 1, 40, 4, (3,), 1, 2, 200, 10, 2, 20, 3, 120.0, cli_rounds=3,
              pool_jobs=60, pool_workers=4, pool_latency_jobs=20, pool_latency_rate=10.0,
              pool_order_jobs=40, pool_urgent_rounds=2, scale_bursts=(20, 50),
              scale_idle_seconds=3.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes: a smoke run (about a minute), not a measurement")
    parser.add_argument("--only", action="append", choices=SECTIONS, default=[],
                        help="run only these sections (repeatable)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--leases", type=int, default=None, metavar="N",
                        help="JobLeases in the scale section (default 10,000; 200 with "
                        "--quick); `make bench-scale` runs 100,000")
    args = parser.parse_args(argv)
    if args.leases is not None and args.leases < 1:
        parser.error(f"--leases must be at least 1, not {args.leases}")
    # SIGTERM unwinds like Ctrl-C, so the control plane and workers are stopped, not orphaned
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = QUICK if args.quick else FULL
    if args.leases is not None:  # initialization is timed out at 30 ms per lease at least
        sizes = dataclasses.replace(sizes, scale_leases=args.leases, reconcile_timeout=max(
            sizes.reconcile_timeout, 0.03 * args.leases))
    sections = args.only or list(SECTIONS)
    results: dict[str, Any] = {
        "mode": "quick" if args.quick else "full", "sizes": sizes.__dict__,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "load_start": loadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    progress(f"load average at start: {results['load_start']} ({os.cpu_count()} CPUs)")
    began = time.monotonic()
    failed: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="joblease-bench-"))
    progress("starting the local control plane (etcd, kube-apiserver, ...)")
    with LocalCluster() as cluster:
        progress(f"control plane ready at {cluster.server}")
        common.install_crd(cluster)
        kubeconfig = str(cluster.kubeconfig_for("admin"))
        admin = KubeApi.from_kubeconfig(kubeconfig)
        for section in sections:
            namespace = f"bench-{section}"
            create_namespace(admin, namespace)
            progress(f"== {section} ==")
            t0 = time.monotonic()
            try:
                results[section] = _run(section, cluster, kubeconfig, namespace, sizes, work,
                                        args.out)
            except Exception as err:  # report it, keep the other sections' results
                progress(f"{section} FAILED: {err!r}")
                traceback.print_exc()
                failed.append(section)
                continue
            results[section]["section_seconds"] = time.monotonic() - t0
        admin.close()
        progress("stopping the control plane")
    results["load_end"] = loadavg()
    results["total_seconds"] = time.monotonic() - began
    results["failed"] = failed
    progress(f"load average at end: {results['load_end']}")
    from bench import report

    # the measurements first: a long run's results survive a bug in the report below
    common.write_json(args.out / "results.json", results)
    table = report.table(results)
    print(table)
    (args.out / "latest.md").write_text(table + "\n")
    plot = report.plot(results, args.out / "plot.png")
    progress(f"wrote {args.out / 'results.json'}, {args.out / 'latest.md'}"
             + (f", {plot}" if plot else " (no plot: matplotlib not installed; "
                "pip install -e '.[bench]')"))
    if failed:
        progress(f"sections that failed: {', '.join(failed)}; logs kept in {work}")
        return 1
    shutil.rmtree(work, ignore_errors=True)  # only the operator's log; nothing to keep
    return 0


def _run(section: str, cluster: LocalCluster, kubeconfig: str, namespace: str, sizes: Sizes,
         work: Path, out: Path) -> dict[str, Any]:
    if section == "latency":
        from bench import latency

        return latency.run(kubeconfig, namespace, sizes.latency_iterations, out)
    if section == "contention":
        from bench import contention

        return contention.run(cluster, kubeconfig, namespace, sizes.contention_workers,
                              sizes.contention_rounds)
    if section == "throughput":
        from bench import throughput

        return throughput.run(kubeconfig, namespace, sizes.jobs, sizes.job_workers)
    if section == "handover":
        from bench import handover

        return handover.run(kubeconfig, namespace, list(sizes.handover_durations),
                            sizes.handover_rounds, sizes.handover_per_round)
    if section == "cli":
        from bench import cli

        return cli.run(kubeconfig, namespace, sizes.cli_rounds)
    if section == "pool":
        from bench import pool

        return pool.run(cluster, kubeconfig, namespace, sizes.pool_jobs, sizes.pool_workers,
                        sizes.pool_latency_jobs, sizes.pool_latency_rate, work,
                        sizes.pool_order_jobs, sizes.pool_urgent_rounds)
    from bench import scale

    return scale.run(cluster, kubeconfig, namespace, sizes.scale_leases,
                     sizes.scale_renew_leases, sizes.scale_renew_rounds,
                     sizes.scale_expire_leases, sizes.scale_duration, work,
                     sizes.reconcile_timeout, sizes.scale_bursts, sizes.scale_idle_seconds)


if __name__ == "__main__":
    sys.exit(main())
