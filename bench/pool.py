"""7. Work pool: drain J jobs with W ``joblease work`` processes (issue 17, item 6).

Five measurements, each against a baseline from the same run:

* **floor**: W processes (the pool's workers are processes too), each doing bare
  conditional status writes on its own JobLease from its cached ``resourceVersion``
  (``bench.pool_worker floor``), J writes in all before the drain and J after: 2 per job,
  as a claim and a completion are. Started together after their set-up, so no interpreter
  start-up is timed.
* **drain**: J JobLeases labelled ``batch=drain`` (created by threads, untimed), then W
  ``joblease work --selector batch=drain --until-empty --concurrency 1 -- true``
  processes. jobs/s = J ÷ (last ``completion.time`` − first ``acquireTime``), both written
  by the protocol on the server's clock; ratio = jobs/s ÷ (floor writes/s ÷ 2). Also: the
  wall time from starting the workers to the last one's exit, wasted writes (409s counted
  by kube-apiserver, ``apiserver_request_total``) per job, jobs per worker from
  ``completion.holder``, and the rate while all W were busy.
* **claim latency**: W idle workers (no ``--until-empty``) with their watches open (counted
  by kube-apiserver's ``apiserver_longrunning_requests``); T jobs created at a steady rate
  well below capacity. Each job's command writes the wall time it started into a file
  named after ``$JOBLEASE_NAME``; latency = that time − the create response's arrival (one
  machine, one clock; the response arrives a little after the job became visible, so this
  errs short by under one round trip, and includes ``sh`` + ``date`` starting, a few ms).
  Then a few leases held by a holder that never renews join the pool: the time from their
  ``leaseUntil`` to a worker's command starting (the margin is part of it, as it must be).
  The workers get SIGTERM at the end and drain.
* **PostgreSQL**: what a user would build instead: the suite's PostgreSQL 15
  (``tests.support.postgres``), a table of J jobs, W processes each claiming with
  ``FOR UPDATE SKIP LOCKED`` (one transaction), running the same no-op command as a
  subprocess (both pay the fork/exec), marking it done (a second transaction). Both stores
  run without fsync here (etcd ``--unsafe-no-fsync``, PostgreSQL ``fsync=off``).

* **dispatched** (issue 30; ``pool.dispatched``): the drain above with a dispatcher
  (:class:`DispatchRun`: in this process, driven only through ``Dispatcher.for_client``,
  ``start`` and ``kill``; the jobs opt in with ``spec.dispatch``; the workers are the same
  ``joblease work --concurrency 1`` processes under ServiceAccount holder names), then with
  it killed halfway; then, each with a dispatcher of its own: the **order** phase with W
  workers (the same seeded priorities as by turns); an **urgent job**: W workers kept busy
  by ``sleep 1`` jobs, and a few times a job of a higher priority than all queued, its
  wait = its ``acquireTime`` − the first ``completion.time`` at or after its creation
  (``bench.pool_figures.urgent_wait``: server records, one machine's clock); and the
  **trickle** (ready → claimed, watch events per job) to W idle dispatched workers. One of
  these three that fails is reported as not measured; the others still run.

Every child process is stopped by its PID when the section ends, also on failure.
"""

from __future__ import annotations

import compileall
import contextlib
import itertools
import json
import math
import os
import queue
import random
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from bench.common import (
    REPO,
    CpuWindow,
    apiserver_metric,
    apiserver_requests,
    count,
    list_leases,
    progress,
    summary,
)
from bench.pool_figures import Span, cpu_budget, places_late, urgent_wait
from joblease.core.dispatcher import Dispatcher
from joblease.domain.lease import Observed, Phase, dispatched_claim
from joblease.kube import lite
from joblease.kube.api import MERGE_PATCH, ApiError, KubeApi
from joblease.kube.leases import LeaseStore, lease_path
from joblease.sdk.client import LeaseClient

DRAIN_LABEL = {"batch": "drain"}
PROGRESS_EVERY = 30.0  # seconds between a drain's progress lines
DISPATCH_LABEL = {"batch": "dispatched"}  # the dispatched drains (issue 30)
LATENCY_LABEL = {"batch": "latency"}
JOB_SPEC = {"leaseDurationSeconds": 30}
EXPIRING_DURATION = 2  # seconds: the abandoned leases of the latency phase
NOOP = ("true",)
# the command of a latency job: the wall time it started, into a file named after its job
MARK = 'date +%s.%N > "$0/$JOBLEASE_NAME"'
SPAWNS = 30  # processes started to measure what one start costs
STARTUPS = 3  # `joblease work --until-empty` on an empty selector: a worker's fixed cost
REAL_LABEL = {"batch": "floor-real"}
ORDER_PRIORITIES = 5  # jobs of the order phase get a priority of 0..4 at random (seeded)
TARGETS = {"ratio": 0.85, "wasted_per_job": 0.05, "trickle_wasted_per_job": 0.2,
           "cpu_per_job_s": 0.005, "spread": 1.5, "latency_p99": 0.5, "displaced_one": 0,
           # issue 30, dispatched: places late with 20 workers; an urgent job's wait after
           # a worker frees (every round); the trickle's ready -> claimed and its events
           "dispatched_max_late": 19, "urgent_wait_s": 0.1, "dispatched_latency_p99": 0.1,
           "dispatched_trickle_events_per_job": 10,
           # a killed worker's proposed job claimed by another (no attempt counted)
           "killed_rerun_s": 16}
URGENT_ROUNDS = 8  # urgent jobs, one at a time, each while every worker is busy


def run(cluster: Any, kubeconfig: str, namespace: str, jobs: int, workers: int,
        latency_jobs: int, latency_rate: float, logs: Path, order_jobs: int = 200,
        urgent_rounds: int = URGENT_ROUNDS) -> dict[str, Any]:
    logs = logs / "pool"
    logs.mkdir(parents=True, exist_ok=True)
    product = _product()
    progress(f"pool: product {product['joblease']} (commit {product['commit']})")
    api = KubeApi.from_kubeconfig(kubeconfig)
    try:
        floor_names = _create(api, namespace, [f"floor-{i:03d}" for i in range(workers)], {})
        # the real-body floor: one JobLease per job, half before the drain, half after
        real = _create(api, namespace, [f"real-{i:05d}" for i in range(jobs)], REAL_LABEL)
        before = _floor(kubeconfig, namespace, floor_names, jobs, logs)
        real_before = _floor_real(cluster, kubeconfig, namespace, real[:jobs // 2], workers,
                                  logs)
        drain = _drain(cluster, api, kubeconfig, namespace, jobs, workers, logs)
        after = _floor(kubeconfig, namespace, floor_names, jobs, logs)
        real_after = _floor_real(cluster, kubeconfig, namespace, real[jobs // 2:], workers,
                                 logs)
        latency = _claim_latency(cluster, api, kubeconfig, namespace, workers, latency_jobs,
                                 latency_rate, logs)
        order = {"one": _order(api, kubeconfig, namespace, order_jobs, 1, logs),
                 "many": _order(api, kubeconfig, namespace, order_jobs, workers, logs)}
        dispatched = {  # issue 30: the same drain, dispatched; then killed halfway
            "drain": _drain(cluster, api, kubeconfig, namespace, jobs, workers, logs,
                            dispatch=DispatchRun(kubeconfig, namespace, kill_halfway=False)),
            "killed_halfway": _drain(cluster, api, kubeconfig, namespace, jobs, workers, logs,
                                     dispatch=DispatchRun(kubeconfig, namespace,
                                                          kill_halfway=True))}
        dispatched.update(_dispatched_sections(cluster, api, kubeconfig, namespace, workers,
                                               latency_jobs, latency_rate, order_jobs,
                                               urgent_rounds, logs))
        series = [labels for labels, _ in apiserver_metric(cluster, "apiserver_watch_events_total")
                  if {"jobleases", "JobLease", "jobleases.joblease.dev"} & set(labels.values())]
    finally:
        api.close()
    postgres = _postgres(jobs, workers, logs)
    # what each job's processes cost alone: the command, and the Python sentinel that
    # `joblease work` (as `joblease run`) starts beside every command
    spawns = {"command": spawn_cost(NOOP, SPAWNS),
              "python": spawn_cost([sys.executable, "-c", "pass"], SPAWNS)}
    try:  # a worker's fixed cost: start, list an empty selector, calibrate, exit
        spawns["worker"] = spawn_cost(work_argv(kubeconfig, namespace, "batch=empty",
                                                "startup-w", NOOP, until_empty=True), STARTUPS)
        for each in (drain, dispatched["drain"]):  # each drain started `workers` workers
            each["worker_cpu_s_per_job_net"] = ((each["worker_cpu_s_per_job"] * jobs
                                                 - workers * spawns["worker"]["cpu_s"]) / jobs)
    except (subprocess.SubprocessError, OSError) as err:
        progress(f"pool: a worker's start-up not measured: {err}")
    floor_rate = ((before["writes"] + after["writes"])
                  / (before["seconds"] + after["seconds"]))
    real_rate = ((real_before["jobs"] + real_after["jobs"])
                 / (real_before["seconds"] + real_after["seconds"]))
    out: dict[str, Any] = {
        "product": product, "jobs": jobs, "workers": workers, "floor_before": before,
        "floor_after": after, "floor_writes_per_s": floor_rate,
        "floor_real_before": real_before, "floor_real_after": real_after,
        "floor_real_jobs_per_s": real_rate, "drain": drain, "latency": latency,
        "order": order, "dispatched": dispatched, "watch_events_series": series,
        "postgres": postgres,
        "spawn_cost": spawns, "targets": TARGETS,
        "ratio": drain["jobs_per_s"] / (floor_rate / 2),
        "ratio_real": drain["jobs_per_s"] / real_rate}
    out["cpu_budget"] = _cpu_budgets(real_before, real_after, dispatched.get("drain"), jobs)
    if "jobs_per_s" in postgres:
        out["versus_postgres"] = drain["jobs_per_s"] / postgres["jobs_per_s"]
    out["met"] = {
        "ratio": out["ratio"] >= TARGETS["ratio"],
        "ratio_real": out["ratio_real"] >= TARGETS["ratio"],
        "wasted_per_job": drain["wasted_per_job"] <= TARGETS["wasted_per_job"],
        "trickle_wasted_per_job": latency["wasted_per_job"] <= TARGETS["trickle_wasted_per_job"],
        "cpu_per_job": drain["worker_cpu_s_per_job"] <= TARGETS["cpu_per_job_s"],
        "spread": drain["per_worker"]["spread"] <= TARGETS["spread"],
        "latency_p99": latency["claimed"]["p99"] <= TARGETS["latency_p99"],
        "displaced_one": order["one"]["displaced"] == 0,
        **_dispatched_met(dispatched)}
    return out


def _cpu_budgets(real_before: dict[str, Any], real_after: dict[str, Any],
                 dispatched: dict[str, Any] | None, jobs: int) -> dict[str, dict[str, float]]:
    """The floor's and the dispatched drain's CPU per job by process (``cpu_budget``)."""
    floor_jobs = real_before["jobs"] + real_after["jobs"]
    clients = (real_before["cpu_s_per_job"] * real_before["jobs"]
               + real_after["cpu_s_per_job"] * real_after["jobs"]) / floor_jobs
    out = {"floor": cpu_budget([real_before["cpu_window"], real_after["cpu_window"]],
                               floor_jobs, clients)}
    if dispatched is not None and "cpu_window" in dispatched:
        out["dispatched"] = cpu_budget(
            [dispatched["cpu_window"]], jobs, dispatched["worker_cpu_s_per_job"],
            dispatched["dispatch"]["dispatcher_cpu_s_per_job"])
    return out


def _dispatched_sections(cluster: Any, api: KubeApi, kubeconfig: str, namespace: str,
                         workers: int, latency_jobs: int, latency_rate: float, order_jobs: int,
                         urgent_rounds: int, logs: Path) -> dict[str, Any]:
    """Issue 30's order, urgent wait and trickle with a dispatcher, each with its own.

    A section that fails is reported as such (``{"error": …}``) and the others still run:
    the drains before them took minutes.
    """
    sections: dict[str, Callable[[], dict[str, Any]]] = {
        "order": lambda: _order(api, kubeconfig, namespace, order_jobs, workers, logs,
                                dispatch=DispatchRun(kubeconfig, namespace, kill_halfway=False)),
        "urgent": lambda: _urgent(cluster, api, kubeconfig, namespace, workers, urgent_rounds,
                                  logs),
        "killed_assignee": lambda: _killed_assignee(api, kubeconfig, namespace, logs),
        "trickle": lambda: _claim_latency(cluster, api, kubeconfig, namespace, workers,
                                          latency_jobs, latency_rate, logs,
                                          dispatch=DispatchRun(kubeconfig, namespace,
                                                               kill_halfway=False))}
    out: dict[str, Any] = {}
    for key, section in sections.items():
        try:
            out[key] = section()
        except (RuntimeError, ApiError, OSError, subprocess.SubprocessError) as err:
            progress(f"pool: dispatched {key} not measured: {err}")
            out[key] = {"error": str(err).splitlines()[0] if str(err) else repr(err)}
    return out


def _dispatched_met(dispatched: dict[str, Any]) -> dict[str, bool | None]:
    """Issue 30's targets for the dispatched order, urgent wait and trickle (None: not
    measured)."""
    order, urgent, trickle = (dispatched.get(k) or {} for k in ("order", "urgent", "trickle"))
    killed = dispatched.get("killed_assignee") or {}
    return {
        "killed_rerun": (killed["rerun_s"] <= TARGETS["killed_rerun_s"]
                         and killed["attempts"] == 0 and killed["generation"] == 1
                         and killed["holder_is_heir"] if "rerun_s" in killed else None),
        "dispatched_max_late": (order["max_late"] <= TARGETS["dispatched_max_late"]
                                if "max_late" in order else None),
        "urgent_wait": (urgent["wait_s"]["max"] <= TARGETS["urgent_wait_s"]
                        if "wait_s" in urgent else None),
        "dispatched_latency_p99": (trickle["claimed"]["p99"]
                                   <= TARGETS["dispatched_latency_p99"]
                                   if "claimed" in trickle else None),
        "dispatched_trickle_events": (trickle["events_per_job"]
                                      + trickle.get("lease_events_per_job", 0.0)
                                      <= TARGETS["dispatched_trickle_events_per_job"]
                                      if "events_per_job" in trickle else None)}


def _product() -> dict[str, str]:
    """Which joblease the workers run: the package a child process imports, and its commit.

    The workers inherit this process's environment (``PYTHONPATH`` included), so pointing
    ``PYTHONPATH`` at another checkout measures that checkout with this benchmark. Its
    modules are compiled first (``compileall``), as a wheel install does (``bench.cli``):
    under ``PYTHONDONTWRITEBYTECODE=1`` (this machine's shells set it) every worker would
    otherwise compile about 100 modules at start-up, CPU no installed worker pays.
    """
    where = subprocess.run([sys.executable, "-c", "import joblease; print(joblease.__file__)"],
                           capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    compileall.compile_dir(str(Path(where).parent), quiet=1)
    commit = subprocess.run(["git", "-C", str(Path(where).parent), "rev-parse", "--short",
                             "HEAD"], capture_output=True, text=True, timeout=30).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(Path(where).parent), "status", "--porcelain",
                            "--", "."], capture_output=True, text=True, timeout=30).stdout.strip()
    return {"joblease": where, "commit": (commit or "?") + ("+dirty" if dirty else "")}


# -- child processes ---------------------------------------------------------------------


class Processes:
    """Child processes of one kind, each stopped by its own PID when the block ends.

    With ``lines``, each child's stdout lines are read by a thread into one queue (the
    gang protocol of ``bench.pool_worker``: ``READY``, a go line on stdin, one JSON
    result); otherwise stdout goes to a log file like stderr always does.
    """

    def __init__(self, argvs: Sequence[Sequence[str]], logs: Path, label: str, *,
                 lines: bool = False) -> None:
        self.label = label
        self._logs = logs
        self.procs: list[subprocess.Popen[str]] = []
        self.lines: queue.Queue[tuple[int, str]] = queue.Queue()
        self._files: list[IO[str]] = []
        for i, argv in enumerate(argvs):
            err = open(logs / f"{label}-{i}.err", "w")  # noqa: SIM115 (closed in stop)
            out = subprocess.PIPE if lines else open(logs / f"{label}-{i}.out", "w")  # noqa: SIM115
            self._files += [err] + ([] if lines else [out])  # type: ignore[list-item]
            proc = subprocess.Popen(list(argv), cwd=REPO, text=True, stdout=out, stderr=err,
                                    stdin=subprocess.PIPE if lines else subprocess.DEVNULL)
            self.procs.append(proc)
            if lines:
                threading.Thread(target=self._read, args=(i, proc), daemon=True).start()

    def _read(self, index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.put((index, line.strip()))

    def collect(self, what: str, parse: Callable[[str], Any], timeout: float) -> list[Any]:
        """One line from every child, parsed (raise on a dead child or at ``timeout``)."""
        found: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(found) < len(self.procs):
            try:
                index, line = self.lines.get(timeout=min(1.0, max(0.01,
                                                                  deadline - time.monotonic())))
            except queue.Empty:
                self._raise_if_dead_or_late(what, deadline)
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                found[index] = parse(line)
        return [found[i] for i in range(len(self.procs))]

    def _raise_if_dead_or_late(self, what: str, deadline: float) -> None:
        dead = [i for i, p in enumerate(self.procs) if p.poll() not in (None, 0)]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"{self.label}: no {what} in time; exited: "
                               f"{[self.procs[i].returncode for i in dead]} "
                               f"{self.failure_log()}")

    def ready(self, timeout: float) -> None:
        """Wait for every child's ``READY``."""
        self.collect("READY", _ready_line, timeout)

    def go(self) -> None:
        """Release every child at once (each is blocked reading its stdin)."""
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("GO\n")
            proc.stdin.flush()

    def results(self, timeout: float) -> list[dict[str, Any]]:
        """Every child's JSON result line."""
        return self.collect("result", _json_object, timeout)

    def wait(self, timeout: float, tick: Callable[[], None] | None = None,
             every: float = 30.0) -> list[int]:
        """Wait for every child to exit by itself; ``tick`` every ``every`` seconds."""
        deadline = time.monotonic() + timeout
        next_tick = time.monotonic() + every
        while any(p.poll() is None for p in self.procs):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.label}: still running after {timeout:.0f} s")
            if tick is not None and time.monotonic() > next_tick:
                tick()
                next_tick += every
            time.sleep(0.05)
        return [int(p.returncode) for p in self.procs]

    def stop(self, grace: float = 10.0) -> list[int | None]:
        """SIGTERM every child still running, SIGKILL after ``grace``; close the logs."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for f in self._files:
            f.close()
        for proc in self.procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        return [p.returncode for p in self.procs]

    def failure_log(self) -> str:
        """The end of the first failed child's stderr (for the error message)."""
        for i, proc in enumerate(self.procs):
            if proc.poll() not in (None, 0):
                path = self._logs / f"{self.label}-{i}.err"
                return f"{path}: ..." + path.read_text(errors="replace")[-1500:]
        return ""

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _ready_line(line: str) -> bool:
    if line != "READY":
        raise ValueError(line)
    return True


def _json_object(line: str) -> dict[str, Any]:
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError(line)
    return data


def work_argv(kubeconfig: str, namespace: str, selector: str, holder: str,
              command: Sequence[str], *, until_empty: bool) -> list[str]:
    """One ``joblease work`` process of the pool, as a user would start it."""
    return [sys.executable, "-m", "joblease.cli", "work", "--kubeconfig", kubeconfig,
            "-n", namespace, "--selector", selector, "--holder", holder,
            "--concurrency", "1", *(["--until-empty"] if until_empty else []),
            "--", *command]


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


# -- set-up ------------------------------------------------------------------------------


def _create(api: KubeApi, namespace: str, names: list[str], labels: dict[str, str],
            spec: dict[str, Any] | None = None) -> list[str]:
    """Create JobLeases from 8 threads (untimed set-up); returns the names."""
    store = LeaseStore(api)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: store.create(namespace, n, spec or JOB_SPEC, labels), names))
    return names


def _children_cpu() -> float:
    """CPU seconds (user + system) of every child reaped so far, their own children included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def spawn_cost(argv: Sequence[str], times: int) -> dict[str, float]:
    """Mean wall and CPU seconds of starting ``argv`` and waiting for it, ``times`` times."""
    cpu, start = _children_cpu(), time.perf_counter()
    for _ in range(times):
        subprocess.run(list(argv), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)
    return {"wall_s": (time.perf_counter() - start) / times,
            "cpu_s": (_children_cpu() - cpu) / times}


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# -- floor -------------------------------------------------------------------------------


def _floor(kubeconfig: str, namespace: str, names: list[str], writes: int,
           logs: Path) -> dict[str, Any]:
    argvs = [[sys.executable, "-m", "bench.pool_worker", "floor", "--kubeconfig", kubeconfig,
              "--namespace", namespace, "--name", name, "--writes", str(k)]
             for name, k in zip(names, _split(writes, len(names)), strict=True)]
    with Processes(argvs, logs, "floor", lines=True) as gang:
        gang.ready(120 + 5 * len(names))
        gang.go()
        results = gang.results(120 + writes * 0.05)
    figures = _gang_figures(results)
    progress(f"pool: floor {figures['count']} writes from {len(names)} processes in "
             f"{figures['seconds']:.1f} s = {figures['count'] / figures['seconds']:.0f} writes/s")
    return {"writes": figures["count"], "seconds": figures["seconds"],
            "writes_per_s": figures["count"] / figures["seconds"]}


def _gang_figures(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Total count and the span from the first start to the last end of a gang's results."""
    start = min(float(r["start"]) for r in results)
    end = max(float(r["end"]) for r in results)
    counts = [int(r["count"]) for r in results]
    return {"count": sum(counts), "seconds": end - start, "per_process": counts}


def _floor_real(cluster: Any, kubeconfig: str, namespace: str, names: list[str], workers: int,
                logs: Path) -> dict[str, Any]:
    """The floor with the pool's real bodies: W processes, each claiming and completing its
    share of ``names`` (``bench.pool_worker floor-real``), one watcher open on them."""
    shares = [names[sum(_split(len(names), workers)[:i]):][:k]
              for i, k in enumerate(_split(len(names), workers))]
    argvs = [[sys.executable, "-m", "bench.pool_worker", "floor-real", "--kubeconfig",
              kubeconfig, "--namespace", namespace, "--names", ",".join(share),
              "--holder", f"real-w{i:02d}"] for i, share in enumerate(shares) if share]
    watcher_argv = [sys.executable, "-m", "bench.pool_worker", "watch", "--kubeconfig",
                    kubeconfig, "--namespace", namespace, "--selector", _selector(REAL_LABEL)]
    with Processes([watcher_argv], logs, "real-watch", lines=True) as watcher:
        watcher.ready(120)
        with Processes(argvs, logs, "floor-real", lines=True) as gang:
            gang.ready(120 + 5 * len(argvs))
            events, requests = _watch_events(cluster), apiserver_requests(cluster)
            window = CpuWindow(cluster)
            gang.go()
            results = gang.results(120 + len(names) * 0.1)
            host = window.close()
        time.sleep(0.5)  # the last events reach the watcher
        events = _watch_events(cluster) - events
        conflicts = _status_writes(apiserver_requests(cluster), requests, "409")
        watcher.go()
        watched = watcher.results(30)[0]
        seen = int(watched["count"])
    figures = _gang_figures(results)
    jobs = figures["count"] // 2
    progress(f"pool: floor with the pool's bodies, {jobs} jobs (claim + completion) from "
             f"{len(argvs)} processes, one watcher, in {figures['seconds']:.1f} s = "
             f"{jobs / figures['seconds']:.1f} jobs/s; {events / jobs:.2f} watch events per "
             f"job (the watcher saw {seen})")
    return {"jobs": jobs, "writes": figures["count"], "seconds": figures["seconds"],
            "jobs_per_s": jobs / figures["seconds"],
            "writes_per_s": figures["count"] / figures["seconds"],
            "events_per_job": events / jobs, "watcher_events": seen, "conflicts": conflicts,
            "cpu_window": host,
            # the client's own CPU for a job's two writes (no choosing, no command)
            "cpu_s_per_job": sum(float(r.get("cpu_s", math.nan)) for r in results) / jobs,
            # the watcher's CPU per event it read and decoded (JSON, no view)
            "watcher_cpu_s_per_event": float(watched.get("cpu_s", math.nan)) / max(1, seen),
            # events to watchers other than ours (kube-controller-manager's garbage
            # collector watches every resource): the same in every phase, per job
            "others_per_job": (events - seen) / jobs}


def _watch_events(cluster: Any) -> float:
    """Watch events kube-apiserver sent for JobLeases, all watchers together
    (``apiserver_watch_events_total``: one per event per watch)."""
    return _watch_event_totals(cluster)[0]


def _watch_event_totals(cluster: Any) -> tuple[float, float]:
    """Watch events sent for JobLeases, and for ``coordination.k8s.io`` Leases (presence
    records, the dispatcher's record, the workers' inboxes: what proposing costs besides
    the JobLease events), all watchers together, from one scrape."""
    jobleases = {"jobleases", "JobLease", "jobleases.joblease.dev"}
    totals = [0.0, 0.0]
    for labels, v in apiserver_metric(cluster, "apiserver_watch_events_total"):
        values = set(labels.values())
        if jobleases & values:
            totals[0] += v
        elif "coordination.k8s.io" in values and {"leases", "Lease"} & values:
            totals[1] += v
    return totals[0], totals[1]


# -- drain -------------------------------------------------------------------------------


class DispatchRun:
    """A dispatched drain's dispatcher, in this process (issue 30, item 5).

    On the light transport, as the operator's dispatchers are
    (``JOBLEASE_BENCH_DISPATCH_CLIENT=kubernetes``: the ``kubernetes`` client, to compare).

    Its jobs opt in (``spec.dispatch``) for the workers' holders, which take the form of
    ServiceAccounts (no admission here: the holders are only names). Its CPU is that of
    its own threads (its feed, its loop, its claim writers: the threads named
    ``joblease-dispatch…``), read from ``/proc`` before it is stopped: this process's CPU
    also counts the drain's progress ticks. Those scraped kube-apiserver's ``/metrics``
    each second until 2026-12-07 (45 ms of this process's CPU and 75 ms of kube-apiserver's
    each: 7 % of the 2-CPU host, slowing the dispatched drains alone); now every 30 s, as in
    the drain by turns. ``kill_halfway``: killed (its record left to lapse) once half the
    jobs have left its view (finished); the figures then say when the workers fell back.
    """

    def __init__(self, kubeconfig: str, namespace: str, *, kill_halfway: bool,
                 watched: Sequence[str] = ()) -> None:
        self.kubeconfig, self.namespace, self.kill_halfway = kubeconfig, namespace, kill_halfway
        self.watched = tuple(watched)  # jobs whose visibility each proposal records
        self.dispatcher: Dispatcher | None = None
        self.client: LeaseClient | None = None
        self.killed_at: float | None = None  # wall time
        self._cpu = 0.0
        self.threads_cpu: dict[str, float] = {}  # its threads' CPU seconds (by thread name)
        self._listed = False  # its view held every job once (kill_halfway counts from then)
        self.stopped = False

    def holder(self, worker: int) -> str:
        return f"system:serviceaccount:{self.namespace}:pool-w{worker:02d}"

    def spec(self, workers: int) -> dict[str, Any]:
        names = [f"pool-w{i:02d}" for i in range(workers)]
        return {**JOB_SPEC, "dispatch": {"enabled": True, "serviceAccountNames": names}}

    def start(self, selector: str) -> None:
        # the light transport, as the operator's dispatchers use; `kubernetes`: a comparison
        if os.environ.get("JOBLEASE_BENCH_DISPATCH_CLIENT") == "kubernetes":
            self.client = LeaseClient(self.namespace, kubeconfig=self.kubeconfig)
        else:
            self.client = LeaseClient(self.namespace, api=lite.connect(self.kubeconfig))
        ahead = os.environ.get("JOBLEASE_BENCH_DISPATCH_AHEAD")  # a comparison's knob
        options: dict[str, Any] = {} if ahead is None else {"ahead": int(ahead)}
        kind = RecordingDispatcher if self.watched else Dispatcher
        self.dispatcher = kind.for_client(self.client, selector, **options)
        if isinstance(self.dispatcher, RecordingDispatcher):
            self.dispatcher.watched = self.watched
        self.dispatcher.start()
        self._cpu = time.process_time()

    def tick(self, jobs: int) -> None:
        """Kill the dispatcher (``kill_halfway``) once half the jobs left its view (finished).

        From the view, not from kube-apiserver's request counts: a scrape of ``/metrics``
        each second cost the host 7 % of its CPU during the drain.
        """
        if not self.kill_halfway or self.killed_at is not None or self.dispatcher is None:
            return
        # the jobs exist before the dispatcher starts: its first list holds them all, and a
        # finished job then leaves its view (an empty view before the list is no progress)
        unfinished = self.dispatcher.view.unfinished()  # one read of a length: no lock
        self._listed = self._listed or unfinished >= jobs
        if not self._listed:
            return
        done = jobs - unfinished
        if done >= jobs / 2:
            self.threads_cpu = dispatcher_threads_cpu()
            self.dispatcher.kill()
            self.killed_at = time.time()
            progress(f"pool: dispatcher killed at ~{done:.0f} of {jobs} jobs")

    def abandon(self) -> None:
        """Kill the dispatcher and close its client unless :meth:`stop` did (a failure)."""
        if self.stopped or self.dispatcher is None or self.client is None:
            return
        self.stopped = True
        if self.killed_at is None:
            self.dispatcher.kill()
        self.client.api.close()

    def stop(self, items: list[Observed]) -> dict[str, Any]:
        process_cpu = time.process_time() - self._cpu
        assert self.dispatcher is not None and self.client is not None
        self.stopped = True
        if self.killed_at is None:
            self.threads_cpu = dispatcher_threads_cpu()
            self.dispatcher.kill()
        cpu = sum(self.threads_cpu.values())
        counts = self.dispatcher.counts
        self.client.api.close()
        own = [obs.status.acquire_time.timestamp() for obs in items
               if obs.status.acquire_time is not None
               and not dispatched_claim(obs.status.claim_id)]
        dispatched = len(items) - len(own)
        out: dict[str, Any] = {
            "dispatcher_cpu_s_per_job": cpu / max(1, len(items)),
            "dispatcher_threads_cpu_s": {k: round(v, 3) for k, v in self.threads_cpu.items()},
            # this whole process (the dispatcher, the drain's ticks and metric scrapes)
            "process_cpu_s_per_job": process_cpu / max(1, len(items)),
            "assigned": counts.assigned, "refused": counts.refused,
            "reassigned": counts.reassigned, "claimed_by_dispatcher": dispatched,
            "claimed_by_workers": len(own)}
        if self.killed_at is not None:
            after = [t for t in own if t >= self.killed_at]
            out["fallback_s"] = (min(after) - self.killed_at) if after else math.nan
        return out


@contextlib.contextmanager
def _dispatching(dispatch: DispatchRun | None, selector: str) -> Iterator[None]:
    """Start ``dispatch`` on ``selector`` (if any) for the block; killed if the block fails
    before :meth:`DispatchRun.stop` (its figures) was called."""
    if dispatch is None:
        yield
        return
    dispatch.start(selector)
    try:
        yield
    finally:
        dispatch.abandon()


class RecordingDispatcher(Dispatcher):
    """A ``Dispatcher`` that records its proposals and when each ``watched`` job came into view.

    The urgent section's evidence (:func:`bench.pool_figures.urgent_wait`): a lower job
    proposed to a worker with a free slot before the urgent job was first in the
    dispatcher's view, and claimed by that worker, was decided without it: that slot was
    given away before the urgent job could be seen. Only the urgent section uses it.

    Attributes:
        watched: The jobs whose first appearance in the view is recorded.
        proposals: ``(job, worker, worker had a free slot)``, in the order proposed.
        times: Each proposal's wall time (``time.time``), to match claims to proposals.
        first_seen: Watched job → the index in ``proposals`` of the first proposal decided
            with it in view.
    """

    watched: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.proposals: list[tuple[str, str, bool]] = []
        self.first_seen: dict[str, int] = {}
        self.times: list[float] = []

    def _propose(self, job: Observed, worker: str, now: float) -> None:
        for name in self.watched:
            if name not in self.first_seen and self.view.get(name) is not None:
                self.first_seen[name] = len(self.proposals)
        free = self.view.held_by().get(worker, 0) < self._slots.get(worker, 0)
        self.proposals.append((job.name, worker, free))
        self.times.append(time.time())
        super()._propose(job, worker, now)

    def decided_unseen(self, urgent: str, claims: dict[str, tuple[str | None, float]]
                       ) -> set[str]:
        """Jobs whose claim followed a proposal to a free slot decided before ``urgent`` was
        first in view.

        Which proposal a claim followed: the last one to its holder made at or before its
        ``acquireTime`` (``claims``: job → (holder, acquired), wall clock: one machine),
        else its holder's first. Not simply the job's last proposal: a job taken back from
        a worker that had already claimed it, to give it to another, is proposed again
        after the claim (the race this figure is about).
        """
        seen_at = self.first_seen.get(urgent, len(self.proposals))
        by_pair: dict[tuple[str, str], list[int]] = {}
        for at, (name, worker, _) in enumerate(self.proposals):
            by_pair.setdefault((name, worker), []).append(at)
        out: set[str] = set()
        for job, (holder, acquired) in claims.items():
            mine = by_pair.get((job, holder or ""), [])
            if not mine:
                continue
            before = [at for at in mine if self.times[at] <= acquired]
            at = before[-1] if before else mine[0]
            if at < seen_at and self.proposals[at][2]:
                out.add(job)
        return out


def dispatcher_threads_cpu() -> dict[str, float]:
    """CPU seconds of this process's live dispatcher threads (``joblease-dispatch…``), by
    name, the claim writers summed as one (``/proc/self/task/<tid>/stat``: Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        if not thread.name.startswith("joblease-dispatch") or thread.native_id is None:
            continue
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        utime, stime = fields.rsplit(")", 1)[1].split()[11:13]
        name = thread.name.split("[")[0].rstrip("_0123456789")
        out[name] = out.get(name, 0.0) + (int(utime) + int(stime)) / tick
    return out


def _drain(cluster: Any, api: KubeApi, kubeconfig: str, namespace: str, jobs: int,
           workers: int, logs: Path, dispatch: DispatchRun | None = None) -> dict[str, Any]:
    label = DRAIN_LABEL if dispatch is None else {
        "batch": f"{DISPATCH_LABEL['batch']}-{'killed' if dispatch.kill_halfway else 'live'}"}
    names = [f"{label['batch']}-{i:05d}" for i in range(jobs)]
    t0 = time.monotonic()
    _create(api, namespace, names, label, None if dispatch is None else dispatch.spec(workers))
    progress(f"pool: created {jobs} jobs in {time.monotonic() - t0:.1f} s (untimed)")
    selector = _selector(label)
    before = apiserver_requests(cluster)
    events, lease_events = _watch_event_totals(cluster)
    window = CpuWindow(cluster)
    started = time.monotonic()

    printed = [started]

    def tick() -> None:
        # kube-apiserver's /metrics only every PROGRESS_EVERY: one scrape costs it about
        # 75 ms of CPU and this process 45 (docs/benchmarks.md), 7 % of the 2-CPU host when
        # the dispatched drains scraped every second
        if time.monotonic() - printed[0] >= PROGRESS_EVERY:
            done = _status_writes(apiserver_requests(cluster), before, "200") / 2
            printed[0] = time.monotonic()
            progress(f"pool: drain, {time.monotonic() - started:.0f} s: ~{done:.0f} of {jobs} "
                     "jobs done (status writes ÷ 2)")
        if dispatch is not None:
            dispatch.tick(jobs)  # counts from its dispatcher's view: no request

    holders = [f"pool-w{i:02d}" if dispatch is None else dispatch.holder(i)
               for i in range(workers)]
    if dispatch is not None:
        dispatch.start(selector)
    argvs = [work_argv(kubeconfig, namespace, selector, holder, NOOP, until_empty=True)
             for holder in holders]
    cpu, began = _children_cpu(), time.time()
    with Processes(argvs, logs, "drain") as pool:
        # a dispatcher to kill halfway is looked at every 0.2 s (its view: no request), so
        # that a short drain (--quick) is killed halfway too
        codes = pool.wait(120 + jobs * 0.2, tick,
                          every=0.2 if dispatch is not None else PROGRESS_EVERY)
        failure = pool.failure_log()
    wall = time.monotonic() - started
    cpu = _children_cpu() - cpu  # the workers, their commands and sentinels, start-up included
    host = window.close()  # before the scrapes below: they are no part of the drain
    after = apiserver_requests(cluster)
    events_after, lease_events_after = _watch_event_totals(cluster)
    events, lease_events = events_after - events, lease_events_after - lease_events
    items = [Observed.from_object(o) for o in list_leases(api, namespace)
             if (o["metadata"].get("labels") or {}) == label]
    figures = drain_figures(items, workers)
    if dispatch is not None:
        figures["dispatch"] = dispatch.stop(items)
    wasted = _status_writes(after, before, "409")
    figures.update({
        # the wall time outside the server-clock window (one clock: one machine): the
        # workers' start-up (list, calibration) and their exit (--until-empty's checks)
        "before_first_claim_s": figures.get("first_claim", math.nan) - began,
        "after_last_completion_s": began + wall - figures.get("last_completion", math.nan),
        "jobs": jobs, "workers": workers, "exit_codes": codes, "wall_seconds": wall,
        "worker_cpu_s_per_job": cpu / jobs, "cpu_window": host,
        "wasted_writes": wasted, "wasted_per_job": wasted / jobs,
        "events_per_job": events / jobs, "lease_events_per_job": lease_events / jobs,
        "status_writes_per_job": _status_writes(after, before, None) / jobs,
        "requests_per_job": _requests_per_job(after, before, jobs)})
    if figures["completed"] != jobs:
        raise RuntimeError(f"pool drain: {figures['completed']} of {jobs} jobs completed "
                           f"(exit codes {codes}) {failure}")
    progress(f"pool: drained {jobs} jobs in {figures['server_seconds']:.1f} s (server clock) "
             f"= {figures['jobs_per_s']:.1f} jobs/s; wall {wall:.1f} s; "
             f"{figures['wasted_per_job']:.3f} wasted writes per job, "
             f"{figures['events_per_job']:.1f} watch events per job, worker CPU "
             f"{figures['worker_cpu_s_per_job'] * 1000:.1f} ms per job")
    return figures


def _status_writes(after: dict[tuple[str, str, str, str], float],
                   before: dict[tuple[str, str, str, str], float], code: str | None) -> float:
    def total(t: dict[tuple[str, str, str, str], float]) -> float:
        return count(t, verbs=("PATCH",), resource="jobleases", subresource="status", code=code)

    return total(after) - total(before)


def _requests_per_job(after: dict[tuple[str, str, str, str], float],
                      before: dict[tuple[str, str, str, str], float],
                      jobs: int) -> dict[str, float]:
    """Requests by verb and resource (and subresource) per job, kube-apiserver's count.

    JobLeases are keyed by verb alone (``PATCH status``), the rest by resource too
    (``PUT leases``, ``GET`` of ``/version`` has no resource: ``GET -``): every request costs
    kube-apiserver CPU, the drain's and its workers' start-ups alike.
    """
    out: dict[str, float] = {}
    for key, value in after.items():
        verb, resource, subresource, _ = key
        label = (f"{verb} {subresource}".strip() if resource == "jobleases"
                 else f"{verb} {resource or '-'} {subresource}".strip())
        out[label] = out.get(label, 0.0) + value - before.get(key, 0.0)
    return {k: round(v / jobs, 4) for k, v in sorted(out.items()) if v >= 1}


def drain_figures(items: list[Observed], workers: int) -> dict[str, Any]:
    """Throughput and fairness of a drain, from the JobLeases' own records.

    jobs/s spans the first claim (``acquireTime``) to the last completion on the server's
    clock. The steady rate counts only the completions while every worker was busy: from
    the latest first claim of any worker to the earliest last completion of any worker.
    """
    done = [o for o in items if o.status.phase is Phase.COMPLETED and o.status.completion
            and o.status.acquire_time]
    if not done:
        return {"completed": 0, "jobs_per_s": math.nan, "server_seconds": math.nan,
                "per_worker": {"max": 0, "min": 0, "spread": math.inf, "workers_used": 0}}
    acquired = {o.name: o.status.acquire_time.timestamp() for o in done}  # type: ignore[union-attr]
    finished = {o.name: o.status.completion.time.timestamp() for o in done}  # type: ignore[union-attr]
    holders = {o.name: o.status.completion.holder for o in done}  # type: ignore[union-attr]
    first, last = min(acquired.values()), max(finished.values())
    per = Counter(holders.values())
    counts = [per.get(h, 0) for h in per] + [0] * max(0, workers - len(per))
    return {"completed": len(done), "server_seconds": last - first, "first_claim": first,
            "last_completion": last,
            "jobs_per_s": len(done) / (last - first) if last > first else math.nan,
            "steady": _steady(acquired, finished, holders),
            "cycle": _cycle(acquired, finished, holders),
            "per_worker": {"max": max(counts), "min": min(counts),
                           "spread": max(counts) / min(counts) if min(counts) else math.inf,
                           "workers_used": len(per), "counts": dict(sorted(per.items()))}}


def _cycle(acquired: dict[str, float], finished: dict[str, float],
           holders: dict[str, str]) -> dict[str, dict[str, float]]:
    """Where a worker's time goes, from the protocol's own timestamps (server clock).

    ``held``: a job's claim decision to its completion decision (the claim's write, the
    command and its sentinel, the renewal thread's start and stop). ``between``: a
    completion decision to the same worker's next claim decision (the completion's write,
    then choosing and deciding the next claim).
    """
    jobs: dict[str, list[tuple[float, float]]] = {}
    for name, holder in holders.items():
        jobs.setdefault(holder, []).append((acquired[name], finished[name]))
    held: list[float] = []
    between: list[float] = []
    for spans in jobs.values():
        spans.sort()
        held += [end - start for start, end in spans]
        between += [nxt[0] - cur[1] for cur, nxt in itertools.pairwise(spans)]
    return {"held_s": summary(held), "between_s": summary(between)}


def _steady(acquired: dict[str, float], finished: dict[str, float],
            holders: dict[str, str]) -> dict[str, float]:
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    for name, holder in holders.items():
        starts[holder] = min(starts.get(holder, math.inf), acquired[name])
        ends[holder] = max(ends.get(holder, -math.inf), finished[name])
    begin, end = max(starts.values()), min(ends.values())
    if end <= begin:
        return {"seconds": 0.0, "jobs": 0, "jobs_per_s": math.nan}
    inside = sum(1 for t in finished.values() if begin <= t <= end)
    return {"seconds": end - begin, "jobs": inside, "jobs_per_s": inside / (end - begin)}


# -- claim latency -----------------------------------------------------------------------


def _claim_latency(cluster: Any, api: KubeApi, kubeconfig: str, namespace: str, workers: int,
                   jobs: int, rate: float, logs: Path,
                   dispatch: DispatchRun | None = None) -> dict[str, Any]:
    """The trickle: ``jobs`` at ``rate`` to idle workers; ready -> claimed, events per job.

    With ``dispatch`` (issue 30) the jobs opt in, the dispatcher starts before the workers,
    and the expiry part is left out (its leases are claimed by a holder outside the pool).
    """
    marks = logs / ("marks" if dispatch is None else "marks-dispatched")
    marks.mkdir(exist_ok=True)
    label = LATENCY_LABEL if dispatch is None else {"batch": "latency-dispatched"}
    spec = JOB_SPEC if dispatch is None else dispatch.spec(workers)
    holders = [f"idle-w{i:02d}" if dispatch is None else dispatch.holder(i)
               for i in range(workers)]
    watching = _watches(cluster)
    argvs = [work_argv(kubeconfig, namespace, _selector(label), holder,
                       ["sh", "-c", MARK, str(marks)], until_empty=False) for holder in holders]
    claims: dict[str, Any] | None = None
    expired: dict[str, Any] = {}
    with _dispatching(dispatch, _selector(label)), \
            Processes(argvs, logs, "latency" if dispatch is None else "latency-d") as pool:
        _wait_for_watches(cluster, watching + workers, pool, timeout=60 + 5 * workers)
        if dispatch is not None:  # how many streams a worker opens is the product's business
            _settle_watches(cluster, pool, timeout=30)
        time.sleep(1.0)  # settled: every worker's first list, calibration and presence done
        before = apiserver_requests(cluster)
        events, lease_events = _watch_event_totals(cluster)
        names = [f"paced-{'' if dispatch is None else 'd-'}{i:04d}" for i in range(jobs)]
        # the 409s of the first and the second half apart: workers started together learn
        # each other's presence within their first seconds (warm-up lists, then every 5 s)
        middle: list[dict[tuple[str, str, str, str], float]] = []
        arrived = _paced_create(api, namespace, names, rate,
                                at_half=lambda: middle.append(apiserver_requests(cluster)),
                                spec=spec, labels=label)
        started = _wait_marks(marks, names, timeout=30 + 2 * jobs / rate)
        time.sleep(0.5)  # the completions' events
        after = apiserver_requests(cluster)
        events_after, lease_events_after = _watch_event_totals(cluster)
        events, lease_events = events_after - events, lease_events_after - lease_events
        items = [o for o in map(Observed.from_object, list_leases(api, namespace))
                 if o.name in arrived]
        acquired = {o.name: o.status.acquire_time.timestamp() for o in items
                    if o.status.acquire_time is not None}
        if dispatch is None:
            expired = _expired_then_claimed(api, namespace, marks, max(3, jobs // 10))
        else:
            claims = dispatch.stop(items)
        codes = pool.stop(grace=30)
    samples = [started[n] - arrived[n] for n in names]
    # ready -> claimed: the claim's acquireTime (the claimer's estimate of the server's
    # time, one machine) minus the create response's arrival
    claimed = [acquired[n] - arrived[n] for n in names if n in acquired]
    out: dict[str, Any] = {
        "jobs": jobs, "rate": rate, "workers": workers, "created": summary(samples),
        "samples": samples, "claimed": summary(claimed), "claimed_samples": claimed,
        "wasted_per_job": _status_writes(after, before, "409") / jobs,
        "wasted_per_job_halves": [_status_writes(middle[0], before, "409") / (jobs // 2),
                                  _status_writes(after, middle[0], "409") / (jobs - jobs // 2)],
        "status_writes_per_job": _status_writes(after, before, None) / jobs,
        "events_per_job": events / jobs, "lease_events_per_job": lease_events / jobs,
        "exit_codes_after_sigterm": codes}
    if dispatch is None:
        out["after_expiry"] = expired
    else:
        out["dispatch"] = claims
    progress(f"pool: trickle{'' if dispatch is None else ', dispatched'} of {jobs} jobs at "
             f"{rate:.0f}/s to {workers} idle workers: "
             f"ready -> claimed p50 {out['claimed']['p50']:.3f} s, p99 "
             f"{out['claimed']['p99']:.3f} s; -> command started p50 "
             f"{out['created']['p50']:.3f} s, p99 {out['created']['p99']:.3f} s; "
             f"{out['wasted_per_job']:.2f} wasted writes per job, {events / jobs:.1f} watch "
             f"events per job" + ("" if dispatch is not None else
                                  f"; after an expiry p50 "
                                  f"{expired['s_after_lease_until']['p50']:.2f} s"))
    return out


def _watches(cluster: Any) -> float:
    """Open watches on JobLeases, kube-apiserver's own gauge."""
    return sum(v for labels, v in apiserver_metric(cluster, "apiserver_longrunning_requests")
               if labels.get("verb") == "WATCH" and labels.get("resource") == "jobleases")


def _wait_for_watches(cluster: Any, wanted: float, pool: Processes, timeout: float) -> None:
    """Until every worker is idle and waiting: its watch is open on the API server."""
    deadline = time.monotonic() + timeout
    while (seen := _watches(cluster)) < wanted:
        if time.monotonic() > deadline or any(p.poll() is not None for p in pool.procs):
            raise RuntimeError(f"pool: {seen:.0f} watches open, wanted {wanted:.0f} (workers "
                               f"exited: {[p.returncode for p in pool.procs]})")
        time.sleep(0.2)


def _settle_watches(cluster: Any, pool: Processes, timeout: float, quiet: float = 1.5) -> None:
    """Until kube-apiserver's count of open JobLease watches has not moved for ``quiet`` s.

    Why: a dispatched worker's streams (the whole pool until it sees the dispatcher, then
    its own part of it) are the product's business and change with it; a count that stays
    put says the workers have settled, whatever the number.
    """
    deadline = time.monotonic() + timeout
    seen, since = _watches(cluster), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline or any(p.poll() is not None for p in pool.procs):
            raise RuntimeError(f"pool: open watches still moving ({seen:.0f}) after "
                               f"{timeout:.0f} s (workers exited: "
                               f"{[p.returncode for p in pool.procs]})")
        time.sleep(0.2)
        if (now := _watches(cluster)) != seen:
            seen, since = now, time.monotonic()


def _paced_create(api: KubeApi, namespace: str, names: list[str], rate: float,
                  at_half: Callable[[], None] = lambda: None,
                  spec: dict[str, Any] | None = None,
                  labels: dict[str, str] | None = None) -> dict[str, float]:
    """Create one job every 1/rate s on a fixed schedule; each response's arrival time.

    ``at_half`` is called just before the first job of the second half is created."""
    store = LeaseStore(api)
    arrived: dict[str, float] = {}
    t0 = time.monotonic() + 0.1
    for i, name in enumerate(names):
        if i == len(names) // 2:
            at_half()
        time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        store.create(namespace, name, spec or JOB_SPEC, labels or LATENCY_LABEL)
        arrived[name] = time.time()
    return arrived


def _wait_marks(marks: Path, names: list[str], timeout: float) -> dict[str, float]:
    """The start time each job's command wrote, once all have (raise at ``timeout``)."""
    deadline = time.monotonic() + timeout
    found: dict[str, float] = {}
    while True:
        for name in names:
            if name not in found:
                with contextlib.suppress(OSError, ValueError):
                    found[name] = float((marks / name).read_text())
        if len(found) == len(names):
            return found
        if time.monotonic() > deadline:
            raise RuntimeError(f"pool: {len(names) - len(found)} of {len(names)} jobs never "
                               f"started, e.g. {sorted(set(names) - set(found))[:3]}")
        time.sleep(0.05)


def _expired_then_claimed(api: KubeApi, namespace: str, marks: Path,
                          jobs: int) -> dict[str, Any]:
    """Leases whose holder went away join the pool; s from leaseUntil to the next start.

    Created without the pool's label, claimed by a holder that never renews, then
    labelled (so no idle worker sees them before they are held).
    """
    names = _create(api, namespace, [f"expiring-{i:03d}" for i in range(jobs)], {},
                    {"leaseDurationSeconds": EXPIRING_DURATION})
    client = LeaseClient(namespace, api=api, calibrate=False)
    until: dict[str, float] = {}
    for name in names:
        lease = client.claim(name, "bench-gone")
        assert lease.lease_until is not None  # a claim always sets it
        until[name] = lease.lease_until.timestamp()
        api.request("PATCH", lease_path(namespace, name), {"metadata": {"labels": LATENCY_LABEL}},
                    content_type=MERGE_PATCH)
    started = _wait_marks(marks, names, timeout=30 + EXPIRING_DURATION)
    samples = [started[n] - until[n] for n in names]
    return {"jobs": jobs, "duration": EXPIRING_DURATION, "samples": samples,
            "s_after_lease_until": summary(samples)}


# -- order -------------------------------------------------------------------------------


def _order(api: KubeApi, kubeconfig: str, namespace: str, jobs: int, workers: int,
           logs: Path, dispatch: DispatchRun | None = None) -> dict[str, Any]:
    """Jobs of random priorities created at once, drained by ``workers``: places late.

    All ``jobs`` exist before the first worker starts (8 threads create them, about a
    second), so the pool's order is known: priority (higher first), creation second, then
    creation revision (the create response's ``resourceVersion``). The start order is the
    order of ``status.acquireTime`` (ms, server clock; each job is claimed once here).
    Places late = a job's place among the starts minus its place in the pool's order;
    displaced = jobs whose place differs. With ``dispatch`` (issue 30), the jobs opt in and
    the dispatcher starts before the workers, as in the dispatched drain.
    """
    kind = f"{workers}" if dispatch is None else f"d{workers}"
    label = {"batch": f"order-{kind}"}
    rng = random.Random(f"order-{workers}-{jobs}")  # the same priorities in both modes
    names = [f"order{kind}-{i:04d}" for i in range(jobs)]
    priority = {n: rng.randrange(ORDER_PRIORITIES) for n in names}
    spec = JOB_SPEC if dispatch is None else dispatch.spec(workers)
    store = LeaseStore(api)
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as threads:
        created = dict(zip(names, threads.map(
            lambda n: store.create(namespace, n, {**spec, "priority": priority[n]}, label),
            names), strict=True))
    span = time.monotonic() - t0
    holders = [f"order{workers}-w{i:02d}" if dispatch is None else dispatch.holder(i)
               for i in range(workers)]
    argvs = [work_argv(kubeconfig, namespace, _selector(label), holder, NOOP, until_empty=True)
             for holder in holders]
    began = time.monotonic()
    with _dispatching(dispatch, _selector(label)), \
            Processes(argvs, logs, f"order{kind}") as pool:
        codes = pool.wait(120 + jobs * 1.0)
        items = {o.name: o for o in map(Observed.from_object, list_leases(api, namespace))
                 if o.name in created}
        claims = None if dispatch is None else dispatch.stop(list(items.values()))
    took = time.monotonic() - began
    done = [o for o in items.values() if o.status.acquire_time is not None
            and o.status.phase is Phase.COMPLETED]
    if len(done) != jobs:
        raise RuntimeError(f"pool order: {len(done)} of {jobs} jobs completed ({codes})")

    def pool_key(name: str) -> tuple[int, float, int, str]:
        obs = created[name]
        return (-priority[name], obs.created.timestamp() if obs.created else 0.0,
                int(obs.resource_version), name)

    late = places_late(sorted(names, key=pool_key),
                       [(o.status.acquire_time.timestamp(), o.name)  # type: ignore[union-attr]
                        for o in done])
    positive = [max(0, x) for x in late]
    out: dict[str, Any] = {
        "jobs": jobs, "workers": workers, "create_seconds": span,
        "displaced": sum(1 for x in late if x != 0),
        "late": summary([float(x) for x in positive]), "max_late": max(late),
        "max_early": -min(late), "exit_codes": codes, "seconds": took}
    if claims is not None:
        out["dispatch"] = claims
    progress(f"pool: order{'' if dispatch is None else ', dispatched'}, {jobs} jobs of "
             f"{ORDER_PRIORITIES} priorities created in {span:.1f} s, {workers} worker(s): "
             f"{out['displaced']} displaced, at most {out['max_late']} places late (p99 "
             f"{out['late']['p99']:.0f}); {took:.1f} s")
    return out


# -- an urgent job, dispatched -----------------------------------------------------------

URGENT_BODY = ("sleep", "1")
URGENT_PRIORITY = 9  # above every filler job (priority 0)


def _urgent(cluster: Any, api: KubeApi, kubeconfig: str, namespace: str, workers: int,
            rounds: int, logs: Path) -> dict[str, Any]:
    """An urgent job created while every dispatched worker is busy: its wait after one frees.

    W dispatched workers run filler jobs of priority 0 whose command is ``sleep 1``, enough
    for the whole section (W × (3 + 2 × rounds)). Then ``rounds`` times, at a random instant
    of the bodies' cycle, one job of a higher priority than all queued is created and read
    until it is claimed. The figures come from the server's records afterwards
    (:func:`bench.pool_figures.urgent_wait`), each round saying whether every slot was busy
    when the job was created; a worker between two jobs then counts as busy if its next job
    was proposed to it before the dispatcher had the urgent job in view
    (:class:`RecordingDispatcher`). Each round also carries the wait with no slot so
    excused (``wait_s_unexcused``: this figure's rule before that record existed). The
    dispatcher is killed before the workers get SIGTERM; the filler left over stays queued
    under its own label (no other section selects it).
    """
    names = [f"urgent-{r}" for r in range(rounds)]
    dispatch = DispatchRun(kubeconfig, namespace, kill_halfway=False, watched=names)
    label = {"batch": "urgent"}
    selector = _selector(label)
    spec = dispatch.spec(workers)
    filler = [f"urgent-fill-{i:04d}" for i in range(workers * (3 + 2 * rounds))]
    rng = random.Random(f"urgent-{workers}-{rounds}")
    store = LeaseStore(api)
    watching = _watches(cluster)
    argvs = [work_argv(kubeconfig, namespace, selector, dispatch.holder(i), URGENT_BODY,
                       until_empty=False) for i in range(workers)]
    began = time.monotonic()
    sent: dict[str, float] = {}
    with _dispatching(dispatch, selector), Processes(argvs, logs, "urgent") as pool:
        _wait_for_watches(cluster, watching + workers, pool, timeout=60 + 5 * workers)
        _settle_watches(cluster, pool, timeout=30)
        _create(api, namespace, filler, label, spec)
        _wait_all_busy(api, namespace, selector, workers, pool, timeout=30)
        for name in names:
            time.sleep(rng.uniform(0.3, 1.3))  # a random instant of the 1 s bodies' cycle
            sent[name] = time.time()
            store.create(namespace, name, {**spec, "priority": URGENT_PRIORITY}, label)
            _wait_claimed(store, namespace, name, timeout=30)
        items = [o for o in _list_selected(api, namespace, selector)
                 if o.status.acquire_time is not None]
        claims = dispatch.stop(items)
        codes = pool.stop(grace=15)
    recorder = dispatch.dispatcher
    assert isinstance(recorder, RecordingDispatcher)
    spans = {o.name: _span(o) for o in items}
    claimed = {name: (span.holder, span.acquired) for name, span in spans.items()}
    rounds_ = []
    for name, t in sent.items():
        others = [v for k, v in spans.items() if k != name]
        figures = urgent_wait(t, spans[name].acquired, URGENT_PRIORITY, others, workers,
                              recorder.decided_unseen(name, claimed))
        # the same round with no slot excused (the figure before the proposals were recorded)
        unexcused = urgent_wait(t, spans[name].acquired, URGENT_PRIORITY, others, workers)
        rounds_.append({"job": name, **figures, "wait_s_unexcused": unexcused["wait_s"]})
    waits = [float(r["wait_s"]) for r in rounds_]
    by_dispatcher = sum(1 for o in items if o.name in sent
                        and dispatched_claim(o.status.claim_id))
    out: dict[str, Any] = {
        "rounds": rounds, "workers": workers, "body": " ".join(URGENT_BODY),
        "filler": len(filler), "wait_s": summary(waits), "samples": rounds_,
        "all_busy_rounds": sum(1 for r in rounds_ if not r["slot_free"]),
        "lower_claimed_between": sum(int(r["lower_claimed_between"]) for r in rounds_),
        "decided_unseen": sum(int(r["decided_unseen"]) for r in rounds_),
        "claimed_by_dispatcher": by_dispatcher, "dispatch": claims,
        "seconds": time.monotonic() - began, "exit_codes_after_sigterm": codes}
    progress(f"pool: urgent job, dispatched, {rounds} rounds with {workers} busy workers "
             f"(`{out['body']}`): claimed p50 {out['wait_s']['p50']:.3f} s, max "
             f"{out['wait_s']['max']:.3f} s after a worker freed; every slot busy in "
             f"{out['all_busy_rounds']} of {rounds} ({out['decided_unseen']} refilled by a "
             f"choice made before the urgent job was seen); {out['seconds']:.1f} s")
    return out


def _killed_assignee(api: KubeApi, kubeconfig: str, namespace: str, logs: Path
                     ) -> dict[str, Any]:
    """A worker SIGKILLed with a job proposed to it: how soon another runs it, at what count.

    One dispatched ``joblease work`` starts and is killed once the dispatcher lists it; a
    job is then created, which the dispatcher proposes to the dead worker (its presence
    record has not lapsed yet), and a second worker is started at once. The figures come
    from the job's record: seconds from its creation to the second worker's claim
    (``acquireTime``, issue 30: ≤ 16 s), its generation (1: the dead worker wrote nothing)
    and its attempts (0: none counted). One machine, one clock: creation is read locally.
    """
    dispatch = DispatchRun(kubeconfig, namespace, kill_halfway=False)
    label = {"batch": "killed-assignee"}
    selector, name = _selector(label), "killed-assignee-job"
    store = LeaseStore(api)
    dead, heir = dispatch.holder(0), dispatch.holder(1)

    def argv(worker: int) -> list[str]:
        return work_argv(kubeconfig, namespace, selector, dispatch.holder(worker), NOOP,
                         until_empty=False)

    with _dispatching(dispatch, selector):
        dispatcher = dispatch.dispatcher
        assert dispatcher is not None
        with Processes([argv(0)], logs, "killed-assignee-first") as first:
            _wait_until(lambda: dead in dispatcher.workers(), 60, first,
                        "the first worker listed by the dispatcher")
            first.procs[0].kill()  # SIGKILL: no leaving, its record lapses on its own
            first.procs[0].wait(10)
        created = time.time()
        store.create(namespace, name, dispatch.spec(2), label)
        _wait_until(lambda: name in dispatcher.proposed.get(dead, {}), 10, None,
                    "the job proposed to the killed worker")
        with Processes([argv(1)], logs, "killed-assignee-heir") as second:
            _wait_claimed(store, namespace, name, timeout=60)
            obs = store.get(namespace, name)
            taken_back = dispatcher.counts.taken_back
            claims = dispatch.stop([obs])
            codes = second.stop(grace=15)
    assert obs.status.acquire_time is not None
    out: dict[str, Any] = {
        "rerun_s": obs.status.acquire_time.timestamp() - created,
        "holder_is_heir": obs.status.holder == heir, "generation": obs.status.generation,
        "attempts": obs.status.attempts, "taken_back": taken_back,
        "dispatch": claims, "exit_codes_after_sigterm": codes}
    progress(f"pool: killed assignee: its proposed job claimed by another worker "
             f"{out['rerun_s']:.1f} s after its creation, generation {out['generation']}, "
             f"attempts {out['attempts']}")
    return out


def _wait_until(ready: Callable[[], bool], timeout: float, pool: Processes | None,
                what: str) -> None:
    """Until ``ready()`` (read every 50 ms); raise at ``timeout`` or once a child of ``pool``
    has exited, whatever its code."""
    deadline = time.monotonic() + timeout
    while not ready():
        exited = pool is not None and any(p.poll() is not None for p in pool.procs)
        if time.monotonic() > deadline or exited:
            raise RuntimeError(f"pool: {what}: not within {timeout:.0f} s"
                               + (" (a worker exited)" if exited else ""))
        time.sleep(0.05)


def _span(obs: Observed) -> Span:
    assert obs.status.acquire_time is not None  # only claimed jobs are spans
    completion = obs.status.completion
    return Span(obs.status.acquire_time.timestamp(),
                completion.time.timestamp() if completion is not None else None,
                obs.spec.priority, obs.name, obs.status.holder)


def _list_selected(api: KubeApi, namespace: str, selector: str) -> list[Observed]:
    """The JobLeases of one label selector (a few hundred here: one page)."""
    body = api.request("GET", lease_path(namespace), query={"labelSelector": selector},
                       timeout=60).body
    return [Observed.from_object(o) for o in body.get("items", [])]


def _wait_all_busy(api: KubeApi, namespace: str, selector: str, workers: int,
                   pool: Processes, timeout: float) -> None:
    """Until every worker holds a job of ``selector`` (raise at ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        holders = {o.status.holder for o in _list_selected(api, namespace, selector)
                   if o.status.phase is Phase.HELD}
        if len(holders) >= workers:
            return
        if time.monotonic() > deadline or any(p.poll() is not None for p in pool.procs):
            raise RuntimeError(f"pool: {len(holders)} of {workers} workers busy after "
                               f"{timeout:.0f} s (exited: {[p.returncode for p in pool.procs]})")
        time.sleep(0.2)


def _wait_claimed(store: LeaseStore, namespace: str, name: str, timeout: float) -> None:
    """Until ``name`` has been claimed (read every 50 ms; raise at ``timeout``)."""
    _wait_until(lambda: store.get(namespace, name).status.acquire_time is not None, timeout,
                None, f"job {name} claimed")


# -- PostgreSQL ----------------------------------------------------------------------------

SCHEMA = """
CREATE TABLE jobs (
  id bigserial PRIMARY KEY, priority int NOT NULL DEFAULT 0,
  state text NOT NULL DEFAULT 'ready', holder text,
  started timestamptz, done timestamptz);
CREATE INDEX jobs_ready ON jobs (priority DESC, id) WHERE state = 'ready';
"""


def _postgres(jobs: int, workers: int, logs: Path) -> dict[str, Any]:
    """The same drain on a PostgreSQL ``FOR UPDATE SKIP LOCKED`` queue (same machine)."""
    from tests.support.postgres import PostgresServer, PostgresUnavailableError

    try:
        import psycopg  # noqa: F401 (the workers need it: `make setup` installs it)

        server = PostgresServer().start()
    except (ImportError, PostgresUnavailableError) as err:
        # a missing baseline is reported as such in the table, not as a failed section
        progress(f"pool: PostgreSQL not measured: {err}")
        return {"error": str(err).splitlines()[0]}
    try:
        return _postgres_drain(server.create_database("queue"), jobs, workers, logs)
    finally:
        server.stop()


def _postgres_drain(dsn: str, jobs: int, workers: int, logs: Path) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("INSERT INTO jobs (priority) SELECT 0 FROM generate_series(1, %s)",
                     (jobs,))
        conn.execute("ANALYZE jobs")
    argvs = [[sys.executable, "-m", "bench.pool_worker", "postgres", "--dsn", dsn,
              "--holder", f"pg-w{i:02d}"] for i in range(workers)]
    cpu = _children_cpu()
    with Processes(argvs, logs, "postgres", lines=True) as gang:
        gang.ready(60 + 5 * workers)
        started = time.monotonic()
        gang.go()
        results = gang.results(120 + jobs * 0.05)
        wall = time.monotonic() - started
    cpu = _children_cpu() - cpu
    with psycopg.connect(dsn) as conn:
        done, seconds = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'done'), "
            "extract(epoch FROM max(done) - min(started))::float8 FROM jobs").fetchone() or (0, 0)
        per: dict[str, int] = dict(conn.execute(
            "SELECT holder, count(*) FROM jobs WHERE state = 'done' GROUP BY holder").fetchall())
    if done != jobs:
        raise RuntimeError(f"pool: PostgreSQL queue finished {done} of {jobs} jobs")
    counts = [int(per.get(f"pg-w{i:02d}", 0)) for i in range(workers)]
    progress(f"pool: PostgreSQL SKIP LOCKED queue drained {jobs} jobs in {seconds:.1f} s "
             f"= {jobs / seconds:.0f} jobs/s")
    return {"jobs": jobs, "workers": workers, "server_seconds": seconds,
            "jobs_per_s": jobs / seconds, "wall_seconds": wall, "worker_cpu_s_per_job": cpu / jobs,
            "gang": _gang_figures(results),
            "per_worker": {"max": max(counts), "min": min(counts)}}

