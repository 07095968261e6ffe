"""Micro-benchmark: what running one no-op job under a lease costs a worker (issue 22, item 1).

``python -m bench.jobcost [--jobs N]``. Each job is what a ``joblease work`` slot does once
it holds a lease: ``run_under_lease(lease, ["true"], …)`` with the worker's drain control
and, where the product has one, its shared supervisor — the holding's guards, the spawn,
the watcher, the wait, the completion. The API server is the in-memory one of the unit
tests (``tests/support/fakekube.py``: the real ``LeaseStore`` and ``transact``, no HTTP),
so the figures are the worker's own overhead, not the network's.

Reported per job, as the median of N: CPU (this process *and* its children, from
``getrusage``: a per-job sentinel included; the live supervisor's from ``/proc``, as the
mean over the N jobs) and wall time, each minus
the same figure for running ``true`` alone with ``subprocess`` (what any runner pays).
Works on the old product (a sentinel process and an interrupter thread per job) and the
new (one supervisor per worker), so ``PYTHONPATH`` chooses which is measured.
"""

from __future__ import annotations

import argparse
import inspect
import os
import resource
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.support.fakekube import FakeKubeApi, lease_object

import joblease
from joblease.domain.clock import ServerClock
from joblease.engines.runner import run_under_lease
from joblease.sdk.client import LeaseClient


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _process_cpu(pid: int | None) -> float:
    """CPU seconds a live process used so far (``/proc``): ``getrusage`` counts children
    only once they have exited and been waited for, and the supervisor lives on."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(action: Callable[[], Any], times: int) -> tuple[float, float]:
    """Median (CPU, wall) seconds of ``action`` over ``times`` runs."""
    cpu, wall = [], []
    for _ in range(times):
        c0, w0 = _cpu(), time.perf_counter()
        action()
        wall.append(time.perf_counter() - w0)
        cpu.append(_cpu() - c0)
    return statistics.median(cpu), statistics.median(wall)


def _controls() -> tuple[str, dict[str, Any], Callable[[], None], Callable[[], int | None]]:
    """The worker's drain control and supervisor for this product, how to end them, and
    the pid of a long-lived watcher whose CPU ``getrusage`` cannot see (if any)."""
    params = inspect.signature(run_under_lease).parameters
    if "supervisor" in params:
        from joblease.engines.runner import Stopper
        from joblease.engines.supervisor import Supervisor

        supervisor = Supervisor(5.0)
        return ("one supervisor per worker", {"stop": Stopper(), "supervisor": supervisor},
                supervisor.close, lambda: supervisor.pid)
    return "a sentinel per job", {"stop": threading.Event()}, lambda: None, lambda: None


def measure(jobs: int) -> dict[str, Any]:
    """The per-job figures of ``jobs`` no-op jobs (and the bare ``true`` baseline)."""
    api = FakeKubeApi()
    # deadlines on this process's monotonic clock, as with a real API server: the watcher
    # (a sentinel or the supervisor) compares them with CLOCK_MONOTONIC
    start = time.monotonic()
    api.monotonic = time.monotonic  # type: ignore[method-assign]
    api.clock = ServerClock()
    api.clock.observe(start, start, int(api.now.earliest.timestamp()))
    client = LeaseClient("ns", api=api, calibrate=False)  # type: ignore[arg-type]
    kind, controls, close, watcher = _controls()
    counter = iter(range(10 * jobs + 100))

    def one_job() -> None:
        name = f"job-{next(counter)}"
        api.put_object(lease_object(name, {"phase": "Available"}, leaseDurationSeconds=3600))
        lease = client.claim(name, "worker")
        result = run_under_lease(lease, ["true"], 5.0, forward_signals=False, **controls)
        assert result.completed, result

    try:
        one_job()  # warm: imports, the supervisor's start
        before = _process_cpu(watcher())
        job_cpu, job_wall = _measure(one_job, jobs)
        watcher_cpu = (_process_cpu(watcher()) - before) / jobs
    finally:
        close()
    true_cpu, true_wall = _measure(lambda: subprocess.run(["true"], check=True), jobs)
    return {"product": joblease.__file__, "kind": kind, "jobs": jobs,
            "cpu_ms": (job_cpu + watcher_cpu - true_cpu) * 1e3,
            "watcher_cpu_ms": watcher_cpu * 1e3, "wall_ms": (job_wall - true_wall) * 1e3,
            "true_cpu_ms": true_cpu * 1e3, "true_wall_ms": true_wall * 1e3}


def main() -> None:
    """Print the per-job overhead of the product on ``PYTHONPATH``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    figures = measure(args.jobs)
    print(f"{figures['kind']} ({figures['product']}): {figures['jobs']} jobs, per job beyond "
          f"`true` itself: {figures['cpu_ms']:.2f} ms CPU (children included), "
          f"{figures['wall_ms']:.2f} ms wall (of the CPU, the live supervisor's: "
          f"{figures['watcher_cpu_ms']:.2f} ms); `true` alone: {figures['true_cpu_ms']:.2f} ms "
          f"CPU, {figures['true_wall_ms']:.2f} ms wall")


if __name__ == "__main__":
    main()
