"""``joblease run --lease NAME -- CMD…``: run a command only while holding its lease.

The command gets its token in the environment (``JOBLEASE_NAME``, ``JOBLEASE_NAMESPACE``,
``JOBLEASE_HOLDER``, ``JOBLEASE_GENERATION``, ``JOBLEASE_EPOCH``, ``JOBLEASE_TOKEN`` as
``epoch/generation``, ``JOBLEASE_LEASE_UNTIL``). The lease is renewed while it runs; the
moment the lease is lost the command's process group gets SIGTERM, then SIGKILL after the
grace period. Exit 0 completes the lease; any other exit releases it as failed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from joblease.domain.errors import LeaseError, format_time
from joblease.kube.api import ApiError
from joblease.sdk.client import Lease
from joblease.sdk.hold import Holding

EXIT_LEASE_LOST = 4
PR_SET_PDEATHSIG = 1


@dataclass
class RunResult:
    """How a run ended: the command's exit code and whether the lease was lost.

    ``interrupted`` means the caller's ``stop`` ended the command (``joblease work``
    draining past its timeout): the lease was released without counting an attempt,
    because the job did not fail, its worker left.
    """

    child_exit: int
    lost: bool
    completed: bool
    interrupted: bool = False


def lease_environment(lease: Lease) -> dict[str, str]:
    """The variables a command run under ``lease`` sees."""
    return {
        "JOBLEASE_NAME": lease.name,
        "JOBLEASE_NAMESPACE": lease.namespace,
        "JOBLEASE_HOLDER": lease.holder,
        "JOBLEASE_GENERATION": str(lease.token.generation),
        "JOBLEASE_EPOCH": str(lease.token.epoch),
        "JOBLEASE_TOKEN": str(lease.token),
        "JOBLEASE_LEASE_UNTIL": format_time(lease.lease_until) if lease.lease_until else "",
    }


class _StopChildOnLoss(Holding):
    """A holding that stops the command's process group the moment the lease is lost."""

    def __init__(self, lease: Lease, grace: float) -> None:
        # A lease that cannot be renewed is declared lost `grace` before its deadline (at
        # most half of what is left), so SIGKILL lands by the deadline itself.
        super().__init__(lease, stop_before=min(grace, max(0.0, lease.remaining()) / 2))
        self.grace = grace
        self.child: subprocess.Popen[bytes] | None = None
        self.sentinel: Sentinel | None = None
        self._child_lock = threading.Lock()

    def on_lost(self) -> None:
        with self._child_lock:
            child = self.child
        if child is None:
            return  # not started yet: run_under_lease checks the loss before starting it
        if child.poll() is not None:
            print(f"joblease run: lease {self.lease.name!r} lost ({self.loss}); the command "
                  f"had already ended ({child.returncode})", file=sys.stderr, flush=True)
            return
        print(f"joblease run: lease {self.lease.name!r} lost ({self.loss}); stopping the "
              f"command (pid {child.pid})", file=sys.stderr, flush=True)
        _signal_group(child, signal.SIGTERM)
        threading.Thread(target=self._kill_after_grace, args=(child,), daemon=True).start()

    def start_child(self, command: list[str], env: dict[str, str]
                    ) -> subprocess.Popen[bytes] | None:
        """Start the command unless the lease is already lost (then return ``None``)."""
        with self._child_lock:
            if self.loss is not None or not self.lease.valid():
                return None
            self.sentinel = Sentinel.start(self.lease.deadline, self.grace)
            self.child = subprocess.Popen(command, env=env, start_new_session=True,
                                          preexec_fn=_die_with_parent)
            self.sentinel.watch(self.child.pid)
        if self.loss is not None:  # lost while starting: on_lost saw no child yet
            _signal_group(self.child, signal.SIGKILL)
        return self.child

    def _kill_after_grace(self, child: subprocess.Popen[bytes]) -> None:
        try:
            child.wait(max(0.0, min(self.grace, self.lease.remaining())))
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)

    def on_renewed(self) -> None:
        if self.sentinel is not None:
            self.sentinel.extend(self.lease.deadline)


class Sentinel:
    """A tiny watcher process that kills the command's group if this runner cannot.

    Why a process: if the runner is SIGKILLed (or OOM-killed) or paused, no thread of it
    can stop the command, which runs in its own session. The sentinel reads deadlines
    (local monotonic, shared by every process on the host) from a pipe: it kills the
    group when the newest deadline passes, and stops it (SIGTERM, then SIGKILL by the
    deadline) when the pipe closes without ``done`` — the runner died.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self._lock = threading.Lock()

    @classmethod
    def start(cls, deadline: float, grace: float) -> Sentinel:
        """Start the watcher (before the command, so no instant is left unwatched)."""
        proc = subprocess.Popen([sys.executable, "-c", _SENTINEL_SOURCE, str(grace)],
                                stdin=subprocess.PIPE, start_new_session=True)
        sentinel = cls(proc)
        sentinel._send(f"deadline {deadline!r}")
        return sentinel

    def watch(self, pgid: int) -> None:
        """Tell the watcher which process group to kill."""
        self._send(f"pgid {pgid}")

    def extend(self, deadline: float) -> None:
        """A renewal moved the deadline."""
        self._send(f"deadline {deadline!r}")

    def done(self) -> None:
        """The command ended normally: the watcher exits without killing anything."""
        self._send("done")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(5)

    def _send(self, line: str) -> None:
        with self._lock, contextlib.suppress(BrokenPipeError, ValueError, OSError):
            assert self._proc.stdin is not None
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()


_SENTINEL_SOURCE = r"""
import os, select, signal, sys, time
grace = float(sys.argv[1]); deadline = None; pgid = None; buf = b""
def kill(sig):
    if pgid is not None:
        try: os.killpg(pgid, sig)
        except ProcessLookupError: pass
while True:
    wait = None if deadline is None else max(0.0, deadline - time.monotonic())
    ready, _, _ = select.select([0], [], [], wait)
    if not ready:
        kill(signal.SIGKILL); sys.exit(0)
    chunk = os.read(0, 4096)
    if not chunk:
        kill(signal.SIGTERM)
        end = time.monotonic() + grace
        if deadline is not None: end = min(end, deadline)
        while pgid is not None and time.monotonic() < end:
            try: os.killpg(pgid, 0)
            except ProcessLookupError: sys.exit(0)
            time.sleep(0.05)
        kill(signal.SIGKILL); sys.exit(0)
    buf += chunk
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        word, _, value = line.decode().partition(" ")
        if word == "done": sys.exit(0)
        if word == "pgid": pgid = int(value)
        if word == "deadline": deadline = float(value)
"""


def _die_with_parent() -> None:
    """In the command's process: get SIGKILL when the runner's thread that started it dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def run_under_lease(lease: Lease, command: list[str], grace: float = 5.0, *,
                    stop: threading.Event | None = None,
                    forward_signals: bool = True) -> RunResult:
    """Run ``command`` while holding ``lease``; complete on exit 0, release otherwise.

    The command is stopped when the lease is lost, by the deadline at the latest — also if
    this process is killed or paused (the sentinel does it then). It is never started if
    the lease was already lost.

    Args:
        lease: The claimed lease.
        command: The command and its arguments.
        grace: Seconds between SIGTERM and SIGKILL when the command must stop.
        stop: When set, the command's group gets SIGTERM (SIGKILL after ``grace``) and the
            lease is released *without* counting an attempt: the worker is leaving, the job
            did not fail. ``joblease work`` sets it when its drain timeout runs out.
        forward_signals: Pass this process's SIGINT/SIGTERM on to the command (``run``).
            Only possible from the main thread; ``joblease work`` runs commands from
            threads and handles those signals itself (it drains).
    """
    holding = _StopChildOnLoss(lease, grace)
    env = {**os.environ, **lease_environment(lease)}
    with holding:
        child = holding.start_child(command, env)
        if child is None:
            print(f"joblease run: lease {lease.name!r} was lost before the command started "
                  f"({holding.loss}); not starting it", file=sys.stderr, flush=True)
            return RunResult(EXIT_LEASE_LOST, True, False)
        code, interrupted = _wait_for(child, holding, grace, stop, forward_signals)
        if code != 0 and not interrupted:
            holding.fail()  # released as failed on exit: an attempt is counted
        with contextlib.suppress(LeaseError):
            holding.check()  # a deadline that passed while we waited is a loss, not a success
        if holding.loss is None and code == 0:
            try:
                holding.complete(f"exit 0: {' '.join(command)[:200]}")
            except (LeaseError, ApiError) as err:
                print(f"joblease run: completion refused: {err}", file=sys.stderr)
                return RunResult(code, True, False, interrupted)
    return RunResult(code, holding.loss is not None, holding.completed, interrupted)


def _wait_for(child: subprocess.Popen[bytes], holding: _StopChildOnLoss, grace: float,
              stop: threading.Event | None, forward_signals: bool) -> tuple[int, bool]:
    """Wait for the command; return its exit code and whether ``stop`` interrupted it."""
    restore = _forward_signals(child) if forward_signals else (lambda: None)
    interrupter = _Interrupter(child, grace, stop) if stop is not None else None
    try:
        code = child.wait()
    finally:
        restore()
        if interrupter is not None:
            interrupter.finish()
        if holding.sentinel is not None:
            holding.sentinel.done()
    return code, interrupter is not None and interrupter.fired


class _Interrupter:
    """Stops the command when the caller's ``stop`` event is set (a thread of its own).

    Why a thread: the runner's own thread is blocked in ``wait()`` on the command, and
    polling there would delay every normal exit by the polling period.
    """

    def __init__(self, child: subprocess.Popen[bytes], grace: float,
                 stop: threading.Event) -> None:
        self.child, self.grace, self.stop = child, grace, stop
        self.fired = False
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"stop-{child.pid}",
                                        daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._ended.is_set():
            if self.stop.wait(0.1):
                break
        if self._ended.is_set() or self.child.poll() is not None:
            return
        self.fired = True
        _signal_group(self.child, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.child.wait(self.grace)
            return
        _signal_group(self.child, signal.SIGKILL)

    def finish(self) -> None:
        """The command ended: let the thread go (it never signals an ended command)."""
        self._ended.set()
        self._thread.join()


def _signal_group(child: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, sig)


def _forward_signals(child: subprocess.Popen[bytes]) -> Callable[[], None]:
    """Pass SIGINT/SIGTERM on to the command's group; return a function that restores."""
    previous: dict[signal.Signals, Any] = {}

    def forward(signum: int, _frame: object) -> None:
        _signal_group(child, signal.Signals(signum))

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, forward)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
