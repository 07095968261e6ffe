"""Work-pool chaos: real ``joblease work`` processes draining a batch while being killed and paused.

One run (:func:`run_pool_chaos`):

1. creates ``jobs`` JobLeases labelled ``pool=<run>`` (priorities 0/5/10, a short
   ``spec.backoff``; ``…-doomed`` jobs exit 1 every attempt and have ``maxAttempts: 2``,
   ``…-flaky`` jobs fail their first generation, some others have a generous
   ``maxAttempts``), and waits until the operator has initialized every one;
2. starts ``workers`` processes of ``joblease work --until-empty -c K`` (through
   ``tests.faults.pool_worker``, which records their lease operations) whose command is
   ``tests.faults.pool_job`` (two fenced writes to PostgreSQL, recorded);
3. a chaos loop (seeded) SIGKILLs workers that have a command running and restarts them
   under a new name, and SIGSTOPs others — the worker alone, or with its commands and their
   supervisor — for up to twice the lease, then SIGCONTs them; with ``plan.dispatch``
   (issue 30) every job opts in, a pool dispatcher in this process
   (:class:`RecordedDispatcher`, its claims recorded) hands them out, and it is killed
   (its record left to lapse) once ``kill_dispatcher_after`` of the batch is finished:
   the workers fall back to turns;
4. when the chaos time is over (or the batch is nearly drained) everything is resumed and
   the workers drain the rest and exit by themselves;
5. the history goes through both checkers (:func:`harness.judge`), and
   :func:`pool_properties` checks what a pool promises on top (issue 17, item 5).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

_TESTS_DIR = str(Path(__file__).resolve().parents[1])
if _TESTS_DIR not in sys.path:  # `python -m tests.faults.pool_chaos` (make pool-chaos)
    sys.path.insert(0, _TESTS_DIR)

from joblease.core.claiming import REFUSED as CLAIM_REFUSED  # noqa: E402
from joblease.core.dispatcher import Dispatcher  # noqa: E402
from joblease.core.transaction import Outcome  # noqa: E402
from joblease.domain.dispatch import Queued  # noqa: E402
from joblease.domain.lease import Observed  # noqa: E402
from support.paths import REPO  # noqa: E402
from support.waiting import retry, wait_for  # noqa: E402

from .harness import FaultEnv, RunReport, judge  # noqa: E402
from .history import OK, REFUSED, Op, Recorder, load  # noqa: E402
from .worker import classify, ms  # noqa: E402

PRIORITIES = (0, 5, 10)


@dataclass
class ChaosPlan:
    """The size and pace of one run."""

    jobs: int = 200
    workers: int = 8
    concurrency: int = 2
    duration: int = 3  # leaseDurationSeconds
    backoff: dict[str, Any] = field(default_factory=lambda: {
        "initialSeconds": 1, "factor": 1.5, "maxSeconds": 3})
    chaos_seconds: float = 60.0  # faults are injected for at most this long
    pace: tuple[float, float] = (0.6, 1.6)  # seconds between two chaos actions
    work: float = 0.4  # mean seconds between a command's two writes
    timeout: float = 240.0  # the whole batch must be drained by then
    dispatch: bool = False  # issue 30: jobs opt in, a dispatcher hands them out, then dies
    kill_dispatcher_after: float = 0.3  # ... once this fraction of the batch is finished


BIG = ChaosPlan(jobs=200, workers=8, concurrency=2, duration=6, chaos_seconds=60,
                timeout=300)
"""The issue's run (``make pool-chaos``, the slow test). A 6 s lease: with 3 s, 16 slots and
the API server on the same two loaded CPUs, renewals timed out and most jobs were lost at
least once (692 takeovers for 200 jobs, measured) — the sizing advice of docs/pools.md."""


@dataclass
class JobSpec:
    """One job of the batch and what it was created with."""

    name: str
    priority: int
    max_attempts: int | None

    @property
    def doomed(self) -> bool:
        return self.name.endswith("-doomed")


def make_jobs(rng: random.Random, plan: ChaosPlan, run: str) -> list[JobSpec]:
    """The batch: mixed priorities, ~6 % doomed, ~10 % flaky, ~20 % with a maxAttempts."""
    jobs = []
    for i in range(plan.jobs):
        roll = rng.random()
        kind, max_attempts = "", None
        if roll < 0.06:
            kind, max_attempts = "-doomed", 2
        elif roll < 0.16:
            kind = "-flaky"
        elif roll < 0.36:
            max_attempts = 20
        jobs.append(JobSpec(f"{run}-{i:03d}{kind}", rng.choice(PRIORITIES), max_attempts))
    return jobs


def dispatch_names(plan: ChaosPlan) -> list[str]:
    """The ServiceAccount names a dispatched batch's jobs name: every worker's first
    incarnations, at most 16 (the CRD allows 64; a later incarnation only takes turns)."""
    rounds = max(1, 16 // plan.workers)
    return [f"w{i}.{r}" for r in range(rounds) for i in range(plan.workers)][:16]


def worker_holder(env: FaultEnv, plan: ChaosPlan, name: str) -> str:
    """A worker's holder: its name, or, dispatched, the ServiceAccount username the jobs name."""
    return f"system:serviceaccount:{env.namespace}:{name}" if plan.dispatch else name


def create_jobs(env: FaultEnv, plan: ChaosPlan, run: str, jobs: list[JobSpec]) -> None:
    """Create the batch and wait until every JobLease reads with a status.

    Since issue 28 that is at once (the CRD's default; the operator writes nothing for a
    new JobLease); the wait stays as a check that the CRD in use has the default.
    """
    client = env.client()
    try:
        for job in jobs:
            spec: dict[str, Any] = {"leaseDurationSeconds": plan.duration,
                                    "priority": job.priority, "backoff": plan.backoff}
            if job.max_attempts is not None:
                spec["maxAttempts"] = job.max_attempts
            if plan.dispatch:
                spec["dispatch"] = {"enabled": True, "serviceAccountNames": dispatch_names(plan)}
            retry(lambda s=spec, j=job: client.store.create(  # type: ignore[misc]
                env.namespace, j.name, s, labels={"pool": run}))

        def initialized() -> bool:
            objs = client.store.list_objects(env.namespace, f"pool={run}")
            return len(objs) == len(jobs) and all(o.get("status") for o in objs)

        wait_for(initialized, 60, "every JobLease of the batch to read with a status",
                 poll=0.2)
    finally:
        client.close()


# -- worker processes ------------------------------------------------------------------------

class PoolWorkers:
    """The run's ``joblease work`` processes; only these PIDs (and their children) are signalled."""

    def __init__(self, env: FaultEnv, plan: ChaosPlan, run: str, run_dir: Path) -> None:
        self.env, self.plan, self.run, self.run_dir = env, plan, run, run_dir
        self.history = run_dir / "history"
        self.logs = run_dir / "logs"
        self.history.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # slot index → current process
        self.names: dict[int, str] = {}
        self.restarts: dict[int, int] = defaultdict(int)
        self.exited: list[tuple[str, int]] = []  # (name, code) of processes that ended

    def start(self, index: int) -> None:
        name = f"w{index}.{self.restarts[index]}"
        job = [sys.executable, "-m", "tests.faults.pool_job", "--history", str(self.history),
               "--dsn", self.env.dsn, "--work", str(self.plan.work)]
        argv = [sys.executable, "-m", "tests.faults.pool_worker", str(self.history), name,
                "--", "work", "-n", self.env.namespace, "--kubeconfig",
                str(self.env.kubeconfig), "-l", f"pool={self.run}",
                "-c", str(self.plan.concurrency), "--until-empty",
                "--holder", worker_holder(self.env, self.plan, name),
                "--grace", "1", "--drain-timeout", "10", "--progress-every", "5", "--", *job]
        log = (self.logs / f"{name}.err").open("wb")
        self.procs[index] = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=log,
                                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        self.names[index] = name

    def kill(self, index: int) -> None:
        """SIGKILL the worker (its commands die with it: its supervisor stops them)."""
        proc = self.procs[index]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        self.exited.append((self.names[index], proc.wait(30)))
        self.restarts[index] += 1

    def busy(self, index: int) -> bool:
        """Whether the worker has a command running (a kill then orphans a job)."""
        return any(_is_command(pid) for pid in descendants(self.procs[index].pid))

    def tree(self, index: int) -> list[int]:
        """The worker and every process below it (commands, the supervisor)."""
        pid = self.procs[index].pid
        return [pid, *descendants(pid)]

    def live(self) -> list[int]:
        return [i for i, p in self.procs.items() if p.poll() is None]

    def wait_all(self, timeout: float) -> dict[str, int]:
        """Wait for every current worker to exit by itself (``--until-empty``)."""
        deadline = time.monotonic() + timeout
        codes: dict[str, int] = {}
        for index, proc in self.procs.items():
            try:
                codes[self.names[index]] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[self.names[index]] = -999  # did not drain: reported, then killed
        return codes

    def cleanup(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                for pid in [proc.pid, *descendants(proc.pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                proc.kill()
                proc.wait(30)


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc; bounded by the process table)."""
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < 10_000:
        parent = todo.pop()
        for task in _listdir(f"/proc/{parent}/task"):
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
                for child in map(int, children):
                    found.append(child)
                    todo.append(child)
    return found


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _is_command(pid: int) -> bool:
    """Whether ``pid`` is a job's command (the worker's own argv names it too: not that)."""
    return _cmdline(pid).split(" ")[1:3] == ["-m", "tests.faults.pool_job"]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


# -- chaos -----------------------------------------------------------------------------------

@dataclass
class Chaos:
    """What the chaos loop did."""

    kills: int = 0
    killed_ns: dict[str, int] = field(default_factory=dict)  # worker name → when killed
    pauses: int = 0
    tree_pauses: int = 0
    log: list[str] = field(default_factory=list)  # what was done when (run_dir/chaos.log)
    # (resume at, pids resumed first: the commands, pids resumed 0.3 s later)
    paused: list[tuple[float, list[int], list[int]]] = field(default_factory=list)

    def resume_due(self, now: float) -> None:
        """SIGCONT what is due: the commands first, so that a stale one gets to write.

        Why the head start: resumed together, the worker's supervisor (past the deadline)
        usually kills it before its next write; the fence would never be tested.
        """
        due = [p for p in self.paused if p[0] <= now]
        self.paused = [p for p in self.paused if p[0] > now]
        for _, first, rest in due:
            self.log.append(f"{time.monotonic_ns()} SIGCONT first={first} rest={rest}")
            _cont(first)
            if first:
                time.sleep(0.3)
            _cont(rest)

    def resume_all(self) -> None:
        self.resume_due(float("inf"))


def _cont(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def chaos_loop(workers: PoolWorkers, rng: random.Random, plan: ChaosPlan,
               unfinished: Any) -> Chaos:
    """Kill and pause workers until the chaos time is over or the batch is nearly drained."""
    chaos = Chaos()
    end = time.monotonic() + plan.chaos_seconds
    next_action = time.monotonic() + rng.uniform(*plan.pace)
    while time.monotonic() < end:
        now = time.monotonic()
        chaos.resume_due(now)
        if now < next_action:
            time.sleep(min(0.1, next_action - now))
            continue
        next_action = now + rng.uniform(*plan.pace)
        if unfinished() <= max(2, plan.jobs // 10):
            break
        paused_pids = {pid for _, first, rest in chaos.paused for pid in first + rest}
        candidates = [i for i in workers.live() if workers.procs[i].pid not in paused_pids]
        if not candidates:
            continue
        index = rng.choice(candidates)
        if rng.random() < 0.4:
            if workers.busy(index):
                chaos.log.append(f"{time.monotonic_ns()} SIGKILL {workers.names[index]} "
                                 f"pid={workers.procs[index].pid}")
                chaos.killed_ns[workers.names[index]] = time.monotonic_ns()
                workers.kill(index)
                chaos.kills += 1
                time.sleep(rng.uniform(0.0, 0.5))
                workers.start(index)
        else:
            chaos.paused.append(_pause(workers, index, rng, plan, now))
            chaos.log.append(f"{time.monotonic_ns()} SIGSTOP {workers.names[index]} "
                             f"first={chaos.paused[-1][1]} rest={chaos.paused[-1][2]} "
                             f"for {chaos.paused[-1][0] - now:.1f}s")
            chaos.pauses += 1
            chaos.tree_pauses += int(bool(chaos.paused[-1][1]))
    chaos.resume_all()
    return chaos


def _pause(workers: PoolWorkers, index: int, rng: random.Random, plan: ChaosPlan,
           now: float) -> tuple[float, list[int], list[int]]:
    """SIGSTOP a worker alone (its commands run on), or with its commands and its supervisor.

    A paused tree stays stopped past the lease and its backoff most of the time, so the job
    is taken over and the stale command's next write, once resumed, meets the fence.
    """
    pid = workers.procs[index].pid
    if rng.random() < 0.5:
        stopped, first = [pid], []
        resume = now + rng.uniform(0.3, 2.0 * plan.duration)
    else:
        stopped = workers.tree(index)
        first = [p for p in stopped[1:] if _is_command(p)]
        resume = now + rng.uniform(2.0 * plan.duration, 3.0 * plan.duration)
    for p in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGSTOP)
    return resume, first, [p for p in stopped if p not in first]


# -- a dispatcher, recorded (issue 30) -------------------------------------------------------

class RecordedDispatcher(Dispatcher):
    """A pool dispatcher whose claims land in the run's history, as process ``dispatcher``.

    Its claims are claims like any other for the checkers (the worker's adoption is then
    its first renewal). One process for its concurrent claims, as one worker's slots are:
    the priority check excuses a process's claims that were in flight together.
    """

    killed_ns: int | None = None
    proposed_ns: dict[str, int]

    def recording(self, history: Path) -> RecordedDispatcher:
        def bounds() -> tuple[float, float]:
            now = self.api.server_now()
            return now.earliest.timestamp() * 1000.0, now.latest.timestamp() * 1000.0

        self.recorder = Recorder(history / "dispatcher.jsonl", "dispatcher", bounds)
        self.proposed_ns = {}
        return self

    def _propose(self, job: Observed, worker: str, now: float) -> None:
        """``Dispatcher._propose``, each job's first proposal time kept (the priority check:
        a job is given out by its proposal; the worker's claim follows at its pace)."""
        self.proposed_ns.setdefault(job.name, time.monotonic_ns())
        super()._propose(job, worker, now)

    def _write_claim(self, queued: Queued, worker: str, margin: Any) -> Outcome:
        """``Dispatcher._write_claim``, each write recorded as a claim for ``worker``."""
        rec = self.recorder
        op = rec.invoke("claim", queued.job.name, holder=worker, assign=True)
        try:
            outcome = super()._write_claim(queued, worker, margin)
        except CLAIM_REFUSED as refusal:
            rec.complete(op, REFUSED, **classify(refusal)[1])
            raise
        except Exception as err:
            status, fields = classify(err)
            rec.complete(op, status, **fields)
            raise
        st = outcome.observed.status
        rec.complete(op, OK, generation=st.generation, epoch=st.epoch,
                     lease_until=ms(st.lease_until), holder=st.holder)
        return outcome

    def kill(self) -> None:
        self.killed_ns = self.killed_ns or time.monotonic_ns()
        super().kill()


def kill_dispatcher_when(dispatcher: RecordedDispatcher, plan: ChaosPlan,
                         unfinished: Any, end: float) -> threading.Thread:
    """Kill ``dispatcher`` once ``plan.kill_dispatcher_after`` of the batch is finished."""
    def watch() -> None:
        left = plan.jobs * (1.0 - plan.kill_dispatcher_after)
        while time.monotonic() < end and unfinished() > left:
            time.sleep(0.3)
        dispatcher.kill()

    thread = threading.Thread(target=watch, daemon=True, name="kill-dispatcher")
    thread.start()
    return thread


# -- the run ---------------------------------------------------------------------------------

@dataclass
class PoolReport:
    """A run's figures, the checkers' report and the pool properties' findings."""

    seed: int
    plan: ChaosPlan
    report: RunReport
    chaos: Chaos
    final: dict[str, dict[str, Any]]
    codes: dict[str, int]
    findings: dict[str, list[str]]
    figures: dict[str, Any]

    def line(self) -> str:
        f = self.figures
        return (f"pool-chaos seed={self.seed} jobs={self.plan.jobs} workers={self.plan.workers}"
                f"x{self.plan.concurrency} completed={f['completed']} failed={f['failed']} "
                f"kills={self.chaos.kills} pauses={self.chaos.pauses} "
                f"(with commands {self.chaos.tree_pauses}) claims={f['claims']} "
                f"retries={f['retries']} retries_after_loss={f['retries_after_loss']} "
                f"stale_writes_refused={f['stale_refused']} "
                f"violations={len(self.report.ours)}/{int(self.report.porcupine.violation)} "
                f"porcupine={self.report.porcupine.result} seconds={f['seconds']:.0f}")


def run_pool_chaos(env: FaultEnv, seed: int, plan: ChaosPlan) -> PoolReport:
    """One seeded run (see the module doc); nothing is asserted here, everything reported."""
    rng = random.Random(seed)
    run = f"pc{seed % 100000}"
    run_dir = env.workdir / f"pool-chaos-{seed}"
    jobs = make_jobs(rng, plan, run)
    create_jobs(env, plan, run, jobs)
    client = env.client()
    began = time.monotonic()

    def unfinished() -> int:
        objs = retry(lambda: client.store.list_objects(env.namespace, f"pool={run}"))
        return sum(1 for o in objs if (o.get("status") or {}).get("phase")
                   not in ("Completed", "Failed"))

    workers = PoolWorkers(env, plan, run, run_dir)
    dispatcher: RecordedDispatcher | None = None
    try:
        if plan.dispatch:
            made = RecordedDispatcher.for_client(client, f"pool={run}")
            assert isinstance(made, RecordedDispatcher)
            dispatcher = made.recording(workers.history)
            dispatcher.start()
            kill_dispatcher_when(dispatcher, plan, unfinished, began + plan.timeout)
        for index in range(plan.workers):
            workers.start(index)
        chaos = chaos_loop(workers, rng, plan, unfinished)
        left = max(10.0, plan.timeout - (time.monotonic() - began))
        with contextlib.suppress(AssertionError):
            wait_for(lambda: unfinished() == 0, left, "the batch to drain", poll=0.5)
        codes = workers.wait_all(30)
    finally:
        workers.cleanup()
        if dispatcher is not None:
            dispatcher.kill()
            dispatcher.recorder.close()
        client.close()
    seconds = time.monotonic() - began
    (run_dir / "chaos.log").write_text("".join(f"{line}\n" for line in chaos.log))
    report = judge(env, "pool-chaos", seed, run_dir, faults=chaos.kills + chaos.pauses)
    final = _final_states(env, run)
    ops = load(run_dir / "history")
    findings = pool_properties(ops, jobs, final, plan, _fence_rows(env.dsn, run),
                               given=None if dispatcher is None else dispatcher.proposed_ns)
    figures = _figures(ops, final, seconds)
    if dispatcher is not None:
        figures.update(_dispatch_figures(ops, dispatcher, chaos.killed_ns))
    return PoolReport(seed, plan, report, chaos, final, codes, findings, figures)


def _final_states(env: FaultEnv, run: str) -> dict[str, dict[str, Any]]:
    client = env.client()
    try:
        objs = retry(lambda: client.store.list_objects(env.namespace, f"pool={run}"))
    finally:
        client.close()
    return {o["metadata"]["name"]: dict(o.get("status") or {}) for o in objs}


def _fence_rows(dsn: str, run: str) -> dict[str, Any]:
    """Per job: the effects rows in commit order, and the fence's highest token."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        effects = conn.execute("SELECT resource, epoch, generation FROM effects "
                               "WHERE resource LIKE %s ORDER BY id", (f"{run}-%",)).fetchall()
        fence = conn.execute("SELECT resource, epoch, generation FROM joblease_fence "
                             "WHERE resource LIKE %s", (f"{run}-%",)).fetchall()
    rows: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for resource, epoch, gen in effects:
        rows[resource].append((int(epoch), int(gen)))
    return {"effects": dict(rows), "fence": {r: (int(e), int(g)) for r, e, g in fence}}


def _figures(ops: list[Op], final: dict[str, dict[str, Any]], seconds: float
             ) -> dict[str, Any]:
    claims = [o for o in ops if o.op == "claim" and o.ok]
    claimed_jobs = {o.lease for o in claims}
    return {
        "completed": sum(1 for s in final.values() if s.get("phase") == "Completed"),
        "failed": sum(1 for s in final.values() if s.get("phase") == "Failed"),
        "claims": len(claims),
        "retries": len(claims) - len(claimed_jobs),
        "retries_after_loss": len(_takeovers(ops)),
        "stale_refused": sum(1 for o in ops if o.op == "write" and o.status == "refused"),
        "seconds": seconds,
    }


def _dispatch_figures(ops: list[Op], dispatcher: RecordedDispatcher,
                      kills: dict[str, int]) -> dict[str, Any]:
    """The jobs the dispatcher gave out (claims on its proposals, recorded ``proposed``, and
    any it claimed for a worker); the fallback: its kill → the first claim a worker made by
    turns; a killed assignee (a worker of an earlier version, claimed for): its kill → the
    claim that took its never-adopted job back."""
    ok = [o for o in ops if o.op == "claim" and o.ok]
    by_dispatcher = [o for o in ok if o.process == "dispatcher" or o.args.get("proposed")]
    killed = dispatcher.killed_ns
    own_after = sorted(o.call_ns for o in ok if o.process != "dispatcher"
                       and not o.args.get("proposed")
                       and killed is not None and o.call_ns >= killed)
    fallback = (own_after[0] - killed) / 1e9 if own_after and killed is not None else None
    by_job: dict[str, list[Op]] = defaultdict(list)
    for o in ops:
        by_job[o.lease].append(o)
    rerun = [(claim.ret_ns - kills[prev.args["holder"].rsplit(":", 1)[-1]]) / 1e9
             for claim, prev, _ in _takeovers(ops)
             if claim.ret_ns is not None and never_ran(prev, by_job[prev.lease])
             and prev.args["holder"].rsplit(":", 1)[-1] in kills]
    return {"dispatched": len(by_dispatcher), "own_after_kill": len(own_after),
            "fallback_s": fallback, "reassigned": dispatcher.counts.reassigned,
            "killed_assignee_rerun_s": max(rerun, default=None)}


# -- what a pool promises (issue 17, item 5) -------------------------------------------------

def _takeovers(ops: list[Op]) -> list[tuple[Op, Op, float]]:
    """Claims of g+1 after a generation g that was not released or completed (a lost holder).

    Returns ``(claim of g+1, claim of g, end of g's window in server ms)``.
    """
    by_job: dict[str, list[Op]] = defaultdict(list)
    for o in ops:
        by_job[o.lease].append(o)
    found = []
    for job_ops in by_job.values():
        claims = {int(o.result["generation"]): o for o in job_ops if o.op == "claim" and o.ok}
        for gen, claim in claims.items():
            prev = claims.get(gen - 1)
            if prev is None:
                continue
            ended = [o for o in job_ops if o.op in ("release", "complete")
                     and o.status != "refused" and int(o.args.get("generation", -1)) == gen - 1]
            if ended:
                continue
            until = [float(o.result["lease_until"]) for o in job_ops
                     if o.op in ("claim", "renew") and o.ok and o.result.get("lease_until")
                     and _gen_of(o) == gen - 1]
            if until:
                found.append((claim, prev, max(until)))
    return found


def never_ran(claim: Op, job_ops: list[Op]) -> bool:
    """Whether ``claim`` was a dispatcher's assignment its holder never adopted (issue 30).

    The holder adopts with a renewal before it runs anything; with no acknowledged renew,
    complete or release of that generation by it, it ran nowhere (an unacknowledged one
    that did land would have made the taking back's compare-and-swap fail).
    """
    gen = int(claim.result["generation"])
    return bool(claim.args.get("assign")) and not any(
        o.op in ("renew", "complete", "release") and o.ok and _gen_of(o) == gen
        for o in job_ops)


def _gen_of(o: Op) -> int:
    return int(o.result["generation"]) if o.op == "claim" else int(o.args["generation"])


def pool_properties(ops: list[Op], jobs: list[JobSpec], final: dict[str, dict[str, Any]],
                    plan: ChaosPlan, fence: dict[str, Any],
                    given: dict[str, int] | None = None) -> dict[str, list[str]]:
    """Every broken pool promise, by property name (empty lists: all hold).

    ``given``: when a dispatcher first proposed each job (``time.monotonic_ns``).
    """
    found: dict[str, list[str]] = {
        "finished": [], "one-completion": [], "fence": [], "backoff": [], "max-attempts": [],
        "priority": []}
    by_job: dict[str, list[Op]] = defaultdict(list)
    for o in ops:
        by_job[o.lease].append(o)
    initial_ms = float(plan.backoff["initialSeconds"]) * 1000.0
    for job in jobs:
        st = final.get(job.name, {})
        phase = st.get("phase")
        job_ops = by_job[job.name]
        if phase not in ("Completed", "Failed"):
            found["finished"].append(f"{job.name}: phase {phase}")
        _check_completion(job, st, job_ops, fence, found["one-completion"])
        _check_fence(job, st, fence, found["fence"])
        _check_attempts(job, st, found["max-attempts"])
        _check_failed_release_backoff(job, job_ops, initial_ms, found["backoff"])
    for claim, prev, until in _takeovers(ops):
        if never_ran(prev, by_job[prev.lease]):
            continue  # an assignment never adopted: taken back with no attempt, no backoff
        if claim.server_hi is not None and claim.server_hi < until + initial_ms:
            found["backoff"].append(
                f"{claim.lease}: generation {claim.result['generation']} claimed by server "
                f"time {claim.server_hi:.0f} ms, before the lost window's end {until:.0f} ms "
                f"+ the backoff {initial_ms:.0f} ms")
    found["priority"] = _check_priority(ops, jobs, given)
    return found


def _check_completion(job: JobSpec, st: dict[str, Any], ops: list[Op], fence: dict[str, Any],
                      out: list[str]) -> None:
    acked = [o for o in ops if o.op == "complete" and o.ok]
    if len(acked) > 1:
        out.append(f"{job.name}: {len(acked)} acknowledged completions")
    if st.get("phase") != "Completed":
        if acked:
            out.append(f"{job.name}: completion acknowledged but phase {st.get('phase')}")
        return
    record = st.get("completion") or {}
    gen, holder = record.get("generation"), record.get("holder")
    claimed = {(int(o.result["generation"]), o.result.get("holder")) for o in ops
               if o.op == "claim" and o.status != "refused" and o.result.get("generation")}
    if (gen, holder) not in claimed:
        out.append(f"{job.name}: completion record {record} names no claim of the history")
    if acked and int(acked[0].args["generation"]) != gen:
        out.append(f"{job.name}: acknowledged completion of generation "
                   f"{acked[0].args['generation']}, record says {gen}")


def _check_fence(job: JobSpec, st: dict[str, Any], fence: dict[str, Any],
                 out: list[str]) -> None:
    rows = fence["effects"].get(job.name, [])
    if any(b < a for a, b in itertools.pairwise(rows)):
        out.append(f"{job.name}: the target committed tokens out of order: {rows}")
    if st.get("phase") == "Completed":
        token = (int(st.get("epoch") or 0), int((st.get("completion") or {}).get("generation", 0)))
        if fence["fence"].get(job.name) != token:
            out.append(f"{job.name}: the fence's last accepted token "
                       f"{fence['fence'].get(job.name)} is not the completion's {token}")


def _check_attempts(job: JobSpec, st: dict[str, Any], out: list[str]) -> None:
    if job.doomed and (st.get("phase") != "Failed" or st.get("reason") != "AttemptsExhausted"):
        out.append(f"{job.name}: doomed (maxAttempts {job.max_attempts}) but phase "
                   f"{st.get('phase')}, reason {st.get('reason')}")
    if st.get("phase") == "Failed" and job.max_attempts is None:
        out.append(f"{job.name}: Failed without a maxAttempts")
    if st.get("phase") == "Failed" and int(st.get("attempts", 0)) != job.max_attempts:
        out.append(f"{job.name}: Failed after {st.get('attempts')} attempts, maxAttempts "
                   f"{job.max_attempts}")


def _check_failed_release_backoff(job: JobSpec, ops: list[Op], initial_ms: float,
                                  out: list[str]) -> None:
    """A claim after a release as failed waits for the backoff (on the server's clock)."""
    releases = {int(o.args["generation"]): o for o in ops
                if o.op == "release" and o.ok and o.args.get("failed")}
    for o in ops:
        if o.op != "claim" or not o.ok:
            continue
        rel = releases.get(int(o.result["generation"]) - 1)
        if rel is not None and rel.server_lo is not None and o.server_hi is not None \
                and o.server_hi < rel.server_lo + initial_ms:
            out.append(f"{job.name}: generation {o.result['generation']} claimed by server "
                       f"time {o.server_hi:.0f} ms, within the backoff of the failed release "
                       f"invoked at {rel.server_lo:.0f} ms")


def _check_priority(ops: list[Op], jobs: list[JobSpec],
                    given: dict[str, int] | None = None) -> list[str]:
    """No job was given out before every higher-priority job had been given out.

    A job is given out by its first claim, or, in a dispatched pool, by its first proposal
    (``given``: the dispatcher's proposals, ``time.monotonic_ns`` as the history's).

    Why this holds: a worker chooses a lower priority only when no higher one is a
    candidate in its view — each is held, resting or finished, so a claim of it had been
    sent already (all jobs were created and initialized before the workers started). A
    dispatcher proposes the head of the queue, in order; the workers then claim at their
    own pace (a paused one holds its proposal until it is taken back), so two jobs proposed
    together may be *claimed* in either order — which is why a proposal counts.

    A worker's threads choose one at a time (under the pool's lock) but record their claims
    when the claim is sent, so two of its claims sent together may be recorded in either
    order: a higher-priority first claim by the same process that began before the lower
    one returned is not "later" (CI-like run, seed 299783829: one worker's two threads
    recorded 2 ms apart in the other order).
    """
    priority = {j.name: j.priority for j in jobs}
    proposed = given or {}
    first: dict[str, Op] = {}
    for o in ops:
        if o.op != "claim" or o.status == "refused" or o.lease not in priority:
            continue
        if o.lease not in first or o.call_ns < first[o.lease].call_ns:
            first[o.lease] = o
    out = []
    for low, low_op in first.items():
        at = min(low_op.call_ns, proposed.get(low, low_op.call_ns))
        ended = low_op.ret_ns if low_op.ret_ns is not None else low_op.call_ns
        later = [high for high, o in first.items()
                 if priority[high] > priority[low]
                 and min(o.call_ns, proposed.get(high, o.call_ns)) > at
                 and not (o.process == low_op.process and o.call_ns <= ended)]
        never = [j.name for j in jobs if j.priority > priority[low] and j.name not in first]
        if later or never:
            out.append(f"{low} (priority {priority[low]}) first claimed before "
                       f"{(later + never)[:3]} of a higher priority")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.faults.pool_chaos [--seed S] [--jobs N] …``: one run on its own cluster.

    What ``make pool-chaos`` runs (the 200-job, 8-worker run by default). Prints the run's
    line and every broken promise; exit 1 if anything was found.
    """
    import argparse
    import secrets
    import tempfile

    from joblease_localcluster.cluster import LocalCluster
    from support.postgres import PostgresServer

    from .harness import Operator, install_crd, install_target

    p = argparse.ArgumentParser(prog="pool-chaos")
    p.add_argument("--seed", type=int, default=int(os.environ.get("JOBLEASE_POOL_SEED", "0"))
                   or secrets.randbelow(1 << 30))
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--chaos-seconds", type=float, default=60.0)
    args = p.parse_args(argv)
    plan = ChaosPlan(jobs=args.jobs, workers=args.workers, concurrency=args.concurrency,
                     duration=BIG.duration, chaos_seconds=args.chaos_seconds,
                     timeout=max(BIG.timeout, args.jobs * 1.5))
    print(f"pool-chaos seed={args.seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="joblease-pool-chaos-") as tmp, \
            LocalCluster() as cluster:
        install_crd(cluster)
        pg = PostgresServer().start()
        operator = Operator(cluster.kubeconfig, Path(tmp) / "operator.log")
        try:
            dsn = pg.create_database("poolchaos")
            install_target(dsn)
            operator.start()
            cluster.kubectl("create", "namespace", "pool-chaos")
            env = FaultEnv(cluster, "pool-chaos", dsn, operator, Path(tmp))
            result = run_pool_chaos(env, args.seed, plan)
        finally:
            operator.stop()
            pg.stop()
    print(result.line(), flush=True)
    broken = {k: v for k, v in result.findings.items() if v}
    for kind, lines in broken.items():
        for line in lines[:20]:
            print(f"  {kind}: {line}", flush=True)
    for v in result.report.ours[:20]:
        print(f"  violation: {v}", flush=True)
    return 1 if broken or result.report.ours or result.report.porcupine.result != "ok" else 0


if __name__ == "__main__":
    sys.exit(main())
