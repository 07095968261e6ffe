"""Fault runs: start real worker processes, inject one fault, check the history twice.

A :class:`FaultEnv` bundles what a run needs (cluster, operator, PostgreSQL fence, folders).
Each ``run_*`` function performs one randomized run from a ``random.Random`` and returns a
:class:`RunReport` after both checkers have judged its history.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from joblease.fencing.postgres import PostgresFence
from joblease.sdk.client import LeaseClient
from support.operator_process import OperatorProcess
from support.paths import ARTIFACTS, CRD, REPO
from support.waiting import retry

from . import porcupine
from .checker import Violation, check
from .history import OK, Recorder, load, write_merged

FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEWS = ("+10m", "-10m", "+1h", "-1h")
STEP_TIMEOUT = 60.0


def faketime_env(skew: str | None) -> dict[str, str]:
    """Environment that moves a process's wall clock by ``skew`` (libfaketime)."""
    if not skew:
        return {}
    if not FAKETIME_LIB.is_file():
        raise RuntimeError(f"libfaketime not found at {FAKETIME_LIB}: apt-get install faketime")
    site = str(Path(__file__).resolve().parent / "faketime_site")
    path = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH", "")) if p)
    return {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": skew, "DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": path}


class Operator(OperatorProcess):
    """The operator for fault runs: ``kill9``/``start`` for crashes, ``restart(skew)``.

    It is not waited for at start: a run measures how the system copes while it comes up.
    """

    def __init__(self, kubeconfig: Path, log: Path, skew: str | None = None) -> None:
        super().__init__(kubeconfig, log, extra_env=faketime_env(skew), cwd=REPO)
        self.skew = skew

    def start(self, wait: bool = False, timeout: float = 45) -> Operator:
        super().start(wait=wait, timeout=timeout)
        return self

    def restart(self, skew: str | None = None,  # type: ignore[override]
                wait: bool = False) -> None:
        self.skew = skew
        super().restart(extra_env=faketime_env(skew), wait=wait)


@dataclass
class FaultEnv:
    """What every fault run needs."""

    cluster: Any
    namespace: str
    dsn: str
    operator: Operator
    workdir: Path
    artifacts: Path = ARTIFACTS / "faults"

    @property
    def kubeconfig(self) -> Path:
        return Path(self.cluster.kubeconfig)

    def client(self) -> LeaseClient:
        return LeaseClient(self.namespace, kubeconfig=str(self.kubeconfig), calibrate=False)


def install_crd(cluster: Any) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD), check=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/jobleases.joblease.dev", check=True)


def install_target(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        PostgresFence().install(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS effects (id bigserial PRIMARY KEY, "
                     "resource text, holder text, epoch bigint, generation bigint, note text)")


# -- results ---------------------------------------------------------------------------------

@dataclass
class RunReport:
    """One run: its kind, seed, figures and both checkers' verdicts."""

    kind: str
    seed: int
    operations: int
    faults: int
    ours: list[Violation]
    porcupine: porcupine.PorcupineResult
    run_dir: Path
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def agree(self) -> bool:
        return bool(self.ours) == self.porcupine.violation

    def line(self) -> str:
        return (f"run kind={self.kind} seed={self.seed} operations={self.operations} "
                f"faults={self.faults} violations(ours)={len(self.ours)} "
                f"violations(porcupine)={int(self.porcupine.violation)} "
                f"porcupine={self.porcupine.result} dir={self.run_dir}")


@dataclass
class Summary:
    """Figures per fault kind, printed as the one summary line."""

    per_kind: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0] * 5))

    def add(self, r: RunReport) -> None:
        row = self.per_kind[r.kind]
        row[0] += 1
        row[1] += r.operations
        row[2] += r.faults
        row[3] += len(r.ours)
        row[4] += int(r.porcupine.violation)

    def line(self) -> str:
        total = [sum(row[i] for row in self.per_kind.values()) for i in range(5)]
        parts = [_fmt("", total)]
        parts += [f"[{kind}: {_fmt('', row)}]" for kind, row in sorted(self.per_kind.items())]
        return "summary " + " ".join(parts)


SESSION = Summary()
"""Every run judged in this process (the pytest session prints its line at the end)."""


def _fmt(prefix: str, row: list[int]) -> str:
    return (f"{prefix}runs={row[0]} operations={row[1]} faults={row[2]} "
            f"violations(ours)={row[3]} violations(porcupine)={row[4]}")


def judge(env: FaultEnv, kind: str, seed: int, run_dir: Path, faults: int,
          notes: dict[str, Any] | None = None) -> RunReport:
    """Read the final state, merge the history, run both checkers."""
    final_read(env, run_dir)
    ops = load(run_dir / "history")
    merged = write_merged(ops, run_dir / "merged.jsonl")
    html = ARTIFACTS / "porcupine" / f"{run_dir.name}.html"
    result = porcupine.check_file(merged, html)
    report = RunReport(kind, seed, len(ops), faults, check(ops), result, run_dir, notes or {})
    SESSION.add(report)
    if report.ours or report.porcupine.violation:
        keep = env.artifacts / run_dir.name
        shutil.copytree(run_dir / "history", keep / "history", dirs_exist_ok=True)
        shutil.copy(merged, keep / "merged.jsonl")
    return report


def final_read(env: FaultEnv, run_dir: Path) -> None:
    """Record the harness's read of every lease of the run (the API server's final state)."""
    client = env.client()
    leases = {json.loads(line)["lease"] for path in (run_dir / "history").glob("*.jsonl")
              for line in path.read_text().splitlines()
              if line.strip().startswith('{"v"') and '"invoke"' in line}

    def bounds() -> tuple[float, float]:
        now = client.api.server_now()
        return now.earliest.timestamp() * 1000.0, now.latest.timestamp() * 1000.0

    rec = Recorder(run_dir / "history" / "harness.jsonl", "harness", bounds)
    for name in sorted(leases):
        with rec.operation("read", name) as res:
            st = retry(lambda n=name: client.get(n)).status  # type: ignore[misc]
            res.update(status=OK, phase=st.phase.value, holder=st.holder,
                       generation=st.generation, epoch=st.epoch,
                       completion=({"generation": st.completion.generation,
                                    "holder": st.completion.holder}
                                   if st.completion else None))
    rec.close()
    client.api.close()


# -- workers ---------------------------------------------------------------------------------

class Workers:
    """The run's worker processes (only these PIDs are ever signalled)."""

    def __init__(self, env: FaultEnv, run_dir: Path) -> None:
        self.env, self.run_dir = env, run_dir
        self.procs: dict[str, subprocess.Popen[str]] = {}
        (run_dir / "history").mkdir(parents=True, exist_ok=True)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)

    def spawn(self, role: str, holder: str, lease: str, *extra: str, skew: str | None = None,
              broken: str | None = None) -> subprocess.Popen[str]:
        env = {**os.environ, **faketime_env(skew), "PYTHONUNBUFFERED": "1"}
        env.pop("JOBLEASE_TEST_BROKEN", None)
        if broken:
            env["JOBLEASE_TEST_BROKEN"] = broken
        argv = [sys.executable, "-m", "tests.faults.worker", role, "--lease", lease,
                "--holder", holder, "--namespace", self.env.namespace,
                "--kubeconfig", str(self.env.kubeconfig),
                "--history", str(self.run_dir / "history"), "--dsn", self.env.dsn, *extra]
        err = (self.run_dir / "logs" / f"{holder}.err").open("w")
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.PIPE, text=True)
        err.close()
        self.procs[holder] = proc
        return proc

    def expect(self, holder: str, *events: str, timeout: float = STEP_TIMEOUT
               ) -> dict[str, Any]:
        """Read the worker's stdout until one of ``events`` (bounded by ``timeout``)."""
        proc = self.procs[holder]
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        try:
            while time.monotonic() < deadline:
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    break
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"worker {holder} exited (code {proc.wait(10)}) before "
                                       f"{events}; see {self.run_dir / 'logs'}")
                msg: dict[str, Any] = json.loads(line)
                if msg["event"] in events:
                    return msg
        finally:
            sel.close()
        raise TimeoutError(f"worker {holder}: no {events} within {timeout:.0f}s")

    def wait_all(self, timeout: float = STEP_TIMEOUT) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        codes: dict[str, int] = {}
        for holder, proc in self.procs.items():
            try:
                codes[holder] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[holder] = proc.wait(30)
            if proc.stdout is not None:
                proc.stdout.close()
        return codes

    @contextlib.contextmanager
    def cleanup(self) -> Iterator[Workers]:
        try:
            yield self
        finally:
            for proc in self.procs.values():
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                    proc.wait(30)


def new_run(env: FaultEnv, kind: str, seed: int) -> tuple[Path, str]:
    run_dir = env.workdir / f"{kind}-{seed}"
    lease = f"{kind}-{seed}".lower().replace("_", "-")[:60]
    return run_dir, lease


def create_lease(env: FaultEnv, name: str, duration: int) -> None:
    client = env.client()
    retry(lambda: client.store.create(env.namespace, name,
                                      {"leaseDurationSeconds": duration}))
    client.api.close()


# -- scenarios -------------------------------------------------------------------------------

def run_pause(env: FaultEnv, rng: random.Random, seed: int, *, skew: str | None = None,
              broken: str | None = None, kind: str = "pause") -> RunReport:
    """A holds and writes; SIGSTOP past its lease; B takes over and writes; SIGCONT A.

    A must notice the loss before another effect; its renew, complete and write are refused.
    """
    run_dir, lease = new_run(env, kind, seed)
    duration = rng.choice([2, 3])
    create_lease(env, lease, duration)
    skew_a = skew or None
    skew_b = rng.choice(SKEWS) if skew else None
    w = Workers(env, run_dir)
    notes: dict[str, Any] = {"duration": duration, "skew_a": skew_a, "skew_b": skew_b}
    with w.cleanup():
        w.spawn("hold", "a", lease, "--work", "60", "--write-every", "0.3",
                "--probe-after-loss", skew=skew_a, broken=broken)
        w.expect("a", "claimed")
        w.spawn("hold", "b", lease, "--work", str(rng.uniform(1.0, 2.0)),
                "--claim-timeout", "40", skew=skew_b)
        w.expect("a", "wrote")
        a = w.procs["a"]
        os.kill(a.pid, signal.SIGSTOP)
        stopped = time.monotonic_ns()
        notes["b_claimed"] = w.expect("b", "claimed")
        w.expect("b", "wrote")
        time.sleep(rng.uniform(0.0, 0.5))
        os.kill(a.pid, signal.SIGCONT)
        notes["a_lost"] = w.expect("a", "lost", "error")
        notes["probe"] = {e: w.expect("a", f"probe-{e}")["ok"] for e in
                          ("write", "renew", "complete")}
        notes["b_done"] = w.expect("b", "completed", "lost", "error")["event"]
        notes["codes"] = w.wait_all()
        notes["stopped_ns"] = stopped
    return judge(env, kind, seed, run_dir, faults=1, notes=notes)


def run_delayed_write(env: FaultEnv, rng: random.Random, seed: int) -> RunReport:
    """A's write is held back past its lease; B claims and writes first; A's write arrives."""
    run_dir, lease = new_run(env, "delayed-write", seed)
    duration = 2
    create_lease(env, lease, duration)
    w = Workers(env, run_dir)
    notes: dict[str, Any] = {}
    with w.cleanup():
        delay = duration + rng.uniform(2.0, 3.0)
        w.spawn("hold", "a", lease, "--no-renew", "--delay-write", f"{delay:.2f}")
        w.expect("a", "claimed")
        w.spawn("hold", "b", lease, "--work", "1", "--write-every", "0.2",
                "--claim-timeout", "30")
        notes["b"] = w.expect("b", "completed", "lost", "error")["event"]
        notes["a"] = w.expect("a", "lost", "error", "wrote")["event"]
        notes["codes"] = w.wait_all()
    return judge(env, "delayed-write", seed, run_dir, faults=1, notes=notes)


def run_race(env: FaultEnv, rng: random.Random, seed: int, procs: int = 50,
             rounds: int = 3) -> RunReport:
    """``procs`` processes claim the same lease at the same instants, ``rounds`` times."""
    run_dir, lease = new_run(env, "race", seed)
    create_lease(env, lease, 10)
    w = Workers(env, run_dir)
    interval = 2.5
    notes: dict[str, Any] = {"procs": procs, "rounds": rounds}
    with w.cleanup():
        for i in range(procs):
            w.spawn("race", f"r{i:02d}", lease, "--rounds", str(rounds),
                    "--interval", f"{interval:.2f}")
        # every process reports ready (imports done, clock calibrated), then all start at
        # the same instant of the machine's monotonic clock
        for i in range(procs):
            w.expect(f"r{i:02d}", "ready", timeout=180)
        start = time.monotonic_ns() + 500_000_000
        for proc in w.procs.values():
            assert proc.stdin is not None
            proc.stdin.write(f"{start}\n")
            proc.stdin.flush()
        notes["codes"] = w.wait_all(timeout=60 + rounds * interval)
    return judge(env, "race", seed, run_dir, faults=0, notes=notes)


CRASH_COMPONENTS = ("operator", "kube-apiserver", "etcd")


def run_crash(env: FaultEnv, rng: random.Random, seed: int, component: str,
              leases: int = 2) -> RunReport:
    """Holders work on ``leases`` jobs while ``component`` is killed (-9) and restarted.

    Safety must hold throughout; afterwards the work resumes and every job completes once.
    """
    run_dir, base = new_run(env, f"crash-{component}", seed)
    names = [f"{base}-{i}" for i in range(leases)]
    for name in names:
        create_lease(env, name, 3)
    w = Workers(env, run_dir)
    notes: dict[str, Any] = {"component": component}
    with w.cleanup():
        for i, name in enumerate(names):
            w.spawn("hold", f"a{i}", name, "--work", f"{rng.uniform(2.0, 5.0):.2f}")
        for i in range(leases):
            w.expect(f"a{i}", "claimed")
        for i, name in enumerate(names):
            w.spawn("hold", f"b{i}", name, "--work", "1", "--claim-timeout", "90")
        time.sleep(rng.uniform(0.5, 2.0))
        began = time.monotonic()
        if component == "operator":
            env.operator.kill9()
            time.sleep(rng.uniform(0.5, 3.0))
            env.operator.start()
        else:
            env.cluster.restart(component, kill=True)
        notes["down_seconds"] = round(time.monotonic() - began, 2)
        for i, name in enumerate(names):
            w.spawn("hold", f"c{i}", name, "--work", "0.5", "--claim-timeout", "90")
        notes["codes"] = w.wait_all(timeout=150)
    report = judge(env, f"crash-{component}", seed, run_dir, faults=1, notes=notes)
    client = env.client()
    report.notes["final"] = {n: retry(lambda n=n: client.get(n)).status.phase.value
                             for n in names}
    client.api.close()
    return report


KINDS = ("pause", "delayed-write", "race", "skew", "crash-operator", "crash-kube-apiserver",
         "crash-etcd")


def run_random(env: FaultEnv, rng: random.Random, seed: int, kind: str | None = None
               ) -> RunReport:
    """One randomized run: the kind and its parameters drawn from ``rng``."""
    kind = kind or rng.choice(KINDS)
    if kind == "pause":
        return run_pause(env, rng, seed)
    if kind == "delayed-write":
        return run_delayed_write(env, rng, seed)
    if kind == "race":
        return run_race(env, rng, seed, procs=rng.randint(5, 12), rounds=rng.randint(2, 3))
    if kind == "skew":
        skew = rng.choice(SKEWS)
        env.operator.restart(skew=skew)
        try:
            return run_pause(env, rng, seed, skew=skew, kind="skew")
        finally:
            env.operator.restart(skew=None)
    return run_crash(env, rng, seed, kind.removeprefix("crash-"))
