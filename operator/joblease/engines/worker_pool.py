"""``joblease work --selector SEL -- CMD``: run CMD once per claimed job, K at a time.

A pool worker is ``joblease run`` in a loop over a label selector: each of its
``concurrency`` slots (a thread) claims the next job of the pool (``claim_next``: priority
first, then FIFO, without herding onto the same job as the other workers), runs the command
under that lease with :func:`joblease.engines.runner.run_under_lease` — the same environment,
renewal, stop-on-loss and exit-code rules as ``run`` — and claims again. The slots share one
pool (one list + watch of the selector), so K slots cost one watch, not K.

Why threads: each slot spends its life waiting (for a claim, for its command); the work is
the command, in its own process. Why one process for K slots rather than K processes: one
watch, one clock calibration and one connection pool for all of them.

Stopping:

* ``--until-empty``: the worker exits once no slot is busy and nothing unfinished is left in
  the selector (the other workers' jobs included: one of them may still fail and need a
  retry here).
* SIGTERM or SIGINT *drains*: no new claims; running commands may finish within
  ``drain_timeout``; then their groups get SIGTERM (SIGKILL after ``grace``) and their
  leases are released without counting an attempt (the job did not fail, its worker left).
  A second signal ends the wait at once.

Exit codes (the command's own codes are not the worker's: each job's outcome is recorded
in its JobLease, and a failed job is retried by the pool):

* 0 — drained cleanly, or ``--until-empty`` found nothing unfinished and no Failed job;
* 6 — the API server refused the worker (RBAC, validation) while claiming;
* 7 — ``--until-empty``: nothing unfinished, but JobLeases of the selector are Failed
  (``maxAttempts`` used up), so a batch driver (a Kubernetes Job) sees the batch failed;
* 8 — the drain timed out: commands were stopped and their leases released.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from joblease.engines.runner import RunResult, Stopper, run_under_lease, say
from joblease.engines.supervisor import Supervisor
from joblease.kube.api import ApiError, UnavailableError
from joblease.sdk.client import Lease

EXIT_OK, EXIT_API, EXIT_JOBS_FAILED, EXIT_DRAIN_TIMEOUT = 0, 6, 7, 8
MAX_UNAVAILABLE_PAUSE = 5.0
MAX_LOOK = 1.0  # the main loop looks at least this often, even with nothing due (a net)


class ClaimSource(Protocol):
    """What a pool worker needs from ``LeaseClient.pool(selector)``."""

    def claim_next(self, holder: str | None = None, *, timeout: float | None = None,
                   until_empty: bool = False) -> Lease | None:
        """Claim the pool's next job, waiting up to ``timeout``; ``None`` if none came."""

    def unfinished(self, timeout: float = ...) -> int:
        """How many JobLeases of the selector are not Completed or Failed.

        Raises:
            UnavailableError: the pool has not listed its leases within ``timeout``.
        """


@dataclass
class WorkOptions:
    """How a pool worker runs.

    Attributes:
        command: The command run once per claimed job.
        concurrency: Slots: commands running at once.
        until_empty: Exit when nothing unfinished is left in the selector.
        drain_timeout: Seconds running commands get to finish after SIGTERM/SIGINT.
        grace: Seconds between SIGTERM and SIGKILL when a command must stop.
        holder: The holder name (``None``: the SDK's default; ``@identity`` allowed).
        progress_every: Seconds between periodic progress lines (also one per job end).
        poll: Longest wait for one claim; bounds how long a slot takes to notice a drain.
    """

    command: list[str]
    concurrency: int = 1
    until_empty: bool = False
    drain_timeout: float = 30.0
    grace: float = 5.0
    holder: str | None = None
    progress_every: float = 5.0
    poll: float = 1.0


@dataclass
class Tally:
    """The worker's counts since it started (guarded by ``lock``)."""

    done: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0
    busy: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, result: RunResult | None) -> str:
        """Count one ended job; return the word for it (``None``: the command never ran)."""
        with self.lock:
            self.busy -= 1
            if result is None:
                self.failed += 1
                return "failed to start"
            if result.completed:
                self.done += 1
                return "completed"
            if result.interrupted:
                self.released += 1
                return "stopped by the drain, released"
            if result.lost:
                self.lost += 1
                return "lease lost"
            self.failed += 1
            return f"failed (exit {result.child_exit}), released as failed"


class WorkPool:
    """K slots running ``options.command`` under leases from ``pool``.

    Args:
        pool: The claim source (``LeaseClient.pool(selector)``); shared by every slot.
        options: How to run.
        count_failed: Returns how many JobLeases of the selector are Failed; asked once,
            when ``--until-empty`` ends, to choose between exit 0 and 7.
        out: Where progress lines go (stderr).
    """

    def __init__(self, pool: ClaimSource, options: WorkOptions, *,
                 count_failed: Callable[[], int] = lambda: 0, out: TextIO | None = None
                 ) -> None:
        self.pool = pool
        self.options = options
        self.count_failed = count_failed
        self.out = out or sys.stderr
        self.tally = Tally()
        self.draining = threading.Event()  # no new claims
        self.stop = threading.Event()  # set once the running commands were told to stop
        self.stopper = Stopper()  # stops them, one thread for all of them
        self.supervisor = Supervisor(options.grace)  # one watcher process for every job
        self._wake = threading.Event()  # the main loop has something to look at
        self._drain_deadline: float | None = None
        self._timed_out = False  # the drain timeout stopped running commands
        self._emptied = False  # --until-empty found nothing unfinished
        self._fatal: BaseException | None = None
        self._claim_rounds = 0  # claim_next calls answered: the pool has been listed
        self._last_progress = 0.0

    # -- control ---------------------------------------------------------------------------

    def drain(self) -> None:
        """Stop claiming and let running commands finish (a second call: stop them now).

        Safe from a signal handler: it only sets events and reads the clock.
        """
        if self.draining.is_set():
            self._drain_deadline = time.monotonic()
        else:
            self._drain_deadline = time.monotonic() + self.options.drain_timeout
            self.draining.set()
        self._wake.set()

    def run(self) -> int:
        """Run until drained or (``until_empty``) empty; return the exit code."""
        slots = [threading.Thread(target=self._slot, name=f"slot-{i}", daemon=True)
                 for i in range(self.options.concurrency)]
        for slot in slots:
            slot.start()
        self._say(f"started {len(slots)} slot(s) for: {' '.join(self.options.command)}")
        while any(slot.is_alive() for slot in slots):
            self._wake.clear()  # before looking: news that comes meanwhile is not lost
            self._supervise()
            self._wake.wait(self._next_look())
        for slot in slots:
            slot.join()
        self.supervisor.close()  # no command left: the watcher exits without killing
        self.progress(force=True)
        return self._exit_code()

    # -- the main loop's steps -------------------------------------------------------------

    def _supervise(self) -> None:
        if self.draining.is_set():
            if not self.stop.is_set() and time.monotonic() >= (self._drain_deadline or 0.0):
                with self.tally.lock:
                    busy = self.tally.busy
                if busy:
                    self._say(f"drain timeout: stopping {busy} running command(s)")
                    self._timed_out = True
                self.stop.set()
                self.stopper.stop_all(self.options.grace)
        elif self.options.until_empty and self._empty():
            self._say("nothing unfinished left in the selector")
            self._emptied = True
            self.drain()
        self.progress()

    def _next_look(self) -> float:
        """Seconds the main loop may sleep: until the next progress line or drain deadline.

        What else it reacts to wakes it (``_wake``): a slot that found nothing to claim
        (``--until-empty`` then asks whether the pool is empty), a slot that ended, a drain
        requested. It used to look every 0.2 s; each look cost a worker about 0.15 ms of
        CPU, 0.8 ms a second while idle (docs/benchmarks.md).
        """
        now = time.monotonic()
        due = self._last_progress + self.options.progress_every
        if self.draining.is_set() and not self.stop.is_set():
            due = min(due, self._drain_deadline if self._drain_deadline is not None else now)
        return max(0.0, min(due - now, MAX_LOOK))

    def _empty(self) -> bool:
        with self.tally.lock:
            if self.tally.busy or self._claim_rounds < self.options.concurrency:
                return False
        return self._remaining() == 0

    def _remaining(self) -> int | None:
        """Unfinished jobs in the selector; ``None`` while the pool cannot tell (no list yet).

        Never raises: the main loop must keep supervising the slots whatever the API server
        does (their claims report and retry its failures).
        """
        try:
            return self.pool.unfinished(timeout=0.0)
        except ApiError:
            return None

    def _exit_code(self) -> int:
        if self._fatal is not None:
            return EXIT_API
        if self._timed_out:
            return EXIT_DRAIN_TIMEOUT
        if self._emptied:
            failed = self.count_failed()
            if failed:
                self._say(f"{failed} JobLease(s) of the selector are Failed")
                return EXIT_JOBS_FAILED
        return EXIT_OK

    def progress(self, force: bool = False) -> None:
        """Print the progress line if ``progress_every`` has passed (or ``force``)."""
        now = time.monotonic()
        if not force and now - self._last_progress < self.options.progress_every:
            return
        self._last_progress = now
        t = self.tally
        with t.lock:
            counts = (f"done={t.done} failed={t.failed} lost={t.lost} released={t.released}",
                      f"busy={t.busy}/{self.options.concurrency}")
        remaining = self._remaining()
        self._say(f"{counts[0]} remaining={'?' if remaining is None else remaining} "
                  f"{counts[1]}")

    def _say(self, text: str) -> None:
        say(f"joblease work: {text}", self.out)

    # -- slots -----------------------------------------------------------------------------

    def _slot(self) -> None:
        """Claim and run until the drain; a fatal API refusal drains the whole worker."""
        unavailable = 0
        try:
            while not self.draining.is_set():
                try:
                    lease = self.pool.claim_next(self.options.holder,
                                                 timeout=self.options.poll,
                                                 until_empty=self.options.until_empty)
                except UnavailableError as err:
                    unavailable += 1
                    self._pause_after(err, unavailable)
                    continue
                unavailable = 0
                with self.tally.lock:
                    self._claim_rounds += 1
                if lease is not None:
                    self._run(lease)
                elif self.options.until_empty:
                    self._wake.set()  # the main loop asks whether the pool is empty
                    self.draining.wait(0.1)  # an empty pool answers at once: do not spin
        except ApiError as err:
            self._give_up(err)
        except BaseException as err:  # a slot never dies silently: the worker drains
            self._give_up(err)
        finally:
            self._wake.set()  # the main loop waits for every slot to end

    def _pause_after(self, err: UnavailableError, failures: int) -> None:
        pause = min(MAX_UNAVAILABLE_PAUSE, 0.2 * 2 ** min(failures, 5))
        self._say(f"API server unavailable ({err}); claiming again in {pause:.1f}s")
        self.draining.wait(pause)

    def _give_up(self, err: BaseException) -> None:
        self._say(f"stopping: {type(err).__name__}: {err}")
        self._fatal = err
        self.drain()

    def _run(self, lease: Lease) -> None:
        with self.tally.lock:
            self.tally.busy += 1
        if self.draining.is_set():
            # claimed just as the drain began: give it back at once, no attempt counted
            self._release_unrun(lease)
            self.tally.count(RunResult(0, False, False, interrupted=True))
            return
        self._say(f"{lease.name}: claimed at generation {lease.generation} (token "
                  f"{lease.token})")
        result: RunResult | None = None
        try:
            result = run_under_lease(lease, self.options.command, self.options.grace,
                                     stop=self.stopper, forward_signals=False,
                                     supervisor=self.supervisor)
        except OSError as err:  # the command could not start; Holding released as failed
            self._say(f"{lease.name}: {err}")
        word = self.tally.count(result)
        self._say(f"{lease.name}: {word}")
        self.progress(force=True)

    def _release_unrun(self, lease: Lease) -> None:
        try:
            lease.release()
        except Exception as err:  # the lease ends by itself at leaseUntil
            self._say(f"{lease.name}: release after the drain began failed: {err}")
