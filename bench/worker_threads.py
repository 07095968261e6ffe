"""Where a dispatched worker's CPU goes, thread by thread (issue 30).

    python -m bench.worker_threads [--jobs 1000] [--workers 20]

Runs ``bench.pool``'s dispatched drain (its own local control plane, the same workers, jobs
and dispatcher as ``python -m bench --only pool``) with every ``joblease work`` started
through this module's ``--wrap`` mode: before the CLI runs, a thread reads every thread's
CPU from ``/proc/self/task/<tid>/stat`` (every 50 ms until the slots start, then every
0.3 s); at exit the process writes the last readings by thread name, its own
``getrusage`` and its children's (the commands and the supervisor). Printed per job, summed
over the workers: each thread's CPU, the sampler's own (not the product's), the children's,
and the main thread's CPU when the first slot started (the start-up, roughly). A thread
that ends between two readings loses up to 0.3 s of its CPU: short-lived threads are
undercounted.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import runpy
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SAMPLER = "bench-sampler"
OUT_ENV = "JOBLEASE_BENCH_THREADS_DIR"


def _thread_cpu(tid: int) -> float | None:
    try:
        with open(f"/proc/self/task/{tid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    """The last CPU reading of every thread of this process, by name and native id."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, int], float] = {}
        self.at_slot_start: dict[str, float] = {}

    def sample(self) -> None:
        threads = threading.enumerate()
        if not self.at_slot_start and any(t.name.startswith("slot-") for t in threads):
            main = threading.main_thread().native_id
            self.at_slot_start = {"main": _thread_cpu(main) or 0.0 if main else 0.0,
                                  "process": sum(os.times()[:2])}
        for thread in threads:
            if thread.native_id is not None:
                cpu = _thread_cpu(thread.native_id)
                if cpu is not None:
                    self.last[(_family(thread.name), thread.native_id)] = cpu

    def run(self) -> None:
        while True:
            self.sample()
            time.sleep(0.3 if self.at_slot_start else 0.05)

    def report(self) -> dict[str, Any]:
        self.sample()
        by_name: dict[str, float] = {}
        for (name, _), cpu in self.last.items():
            by_name[name] = by_name.get(name, 0.0) + cpu
        own, children = (resource.getrusage(who) for who in
                         (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        return {"threads": by_name, "process": own.ru_utime + own.ru_stime,
                "children": children.ru_utime + children.ru_stime,
                "at_slot_start": self.at_slot_start}


def _family(name: str) -> str:
    """A thread's name without what differs between its instances (a selector, a pid)."""
    return name.split("[", 1)[0].split("-kill-", 1)[0]


def wrap(argv: Sequence[str]) -> None:
    """Run ``joblease`` with ``argv`` under the sampler; write its report at exit."""
    sampler = Sampler()
    threading.Thread(target=sampler.run, name=SAMPLER, daemon=True).start()

    def write() -> None:
        folder = Path(os.environ.get(OUT_ENV, tempfile.gettempdir()))
        (folder / f"{os.getpid()}.json").write_text(json.dumps(sampler.report()))

    atexit.register(write)
    sys.argv = ["joblease", *argv]
    runpy.run_module("joblease.cli", run_name="__main__", alter_sys=True)


def summarize(folder: Path, jobs: int) -> dict[str, Any]:
    """Per job, summed over the workers' reports in ``folder``."""
    reports = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    threads: dict[str, float] = {}
    for report in reports:
        for name, cpu in report["threads"].items():
            threads[name] = threads.get(name, 0.0) + cpu

    def per_job(seconds: float) -> float:
        return round(seconds * 1000 / jobs, 3)

    return {"workers": len(reports), "jobs": jobs,
            "threads_ms_per_job": {name: per_job(cpu) for name, cpu in
                                   sorted(threads.items(), key=lambda kv: -kv[1])},
            "process_ms_per_job": per_job(sum(r["process"] for r in reports)),
            "children_ms_per_job": per_job(sum(r["children"] for r in reports)),
            "main_at_slot_start_ms_per_job": per_job(
                sum(r["at_slot_start"].get("main", 0.0) for r in reports)),
            "process_at_slot_start_ms_per_job": per_job(
                sum(r["at_slot_start"].get("process", 0.0) for r in reports))}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--wrap"]:
        wrap(args[1:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.worker_threads", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=20)
    options = parser.parse_args(args)
    from bench import common, pool
    from joblease.kube.api import KubeApi
    from joblease_localcluster.cluster import LocalCluster

    plain = pool.work_argv

    def wrapped(*a: Any, **k: Any) -> list[str]:
        argv = plain(*a, **k)
        return [argv[0], "-m", "bench.worker_threads", "--wrap",
                *argv[argv.index("joblease.cli") + 1:]]

    pool.work_argv = wrapped
    pool._product()
    with tempfile.TemporaryDirectory() as reports, tempfile.TemporaryDirectory() as logs, \
            LocalCluster() as cluster:
        os.environ[OUT_ENV] = reports
        common.install_crd(cluster)
        kubeconfig = str(cluster.kubeconfig_for("admin"))
        api = KubeApi.from_kubeconfig(kubeconfig)
        common.create_namespace(api, "worker-threads")
        figures = pool._drain(cluster, api, kubeconfig, "worker-threads", options.jobs,
                              options.workers, Path(logs), dispatch=pool.DispatchRun(
                                  kubeconfig, "worker-threads", kill_halfway=False))
        api.close()
        summary = summarize(Path(reports), options.jobs)
    summary["jobs_per_s"] = round(figures["jobs_per_s"], 1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
