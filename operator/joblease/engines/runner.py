"""``joblease run --lease NAME -- CMD…``: run a command only while holding its lease.

The command gets its token in the environment (``JOBLEASE_NAME``, ``JOBLEASE_NAMESPACE``,
``JOBLEASE_HOLDER``, ``JOBLEASE_TOKEN`` as ``epoch/generation``, ``JOBLEASE_EPOCH``,
``JOBLEASE_GENERATION``, ``JOBLEASE_CLAIM_ID``, ``JOBLEASE_LEASE_UNTIL``; the form is
``joblease.domain.token.HeldToken``'s). The lease is renewed while it runs; the
moment the lease is lost the command's process group gets SIGTERM, then SIGKILL after the
grace period. Exit 0 completes the lease; any other exit releases it as failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from joblease.domain.errors import LeaseError
from joblease.domain.token import HeldToken
from joblease.engines.supervisor import Supervisor
from joblease.kube.api import ApiError
from joblease.sdk.client import Lease
from joblease.sdk.hold import Holding

_LINES = threading.Lock()


def say(line: str, stream: TextIO | None = None) -> None:
    """Write ``line`` and its newline to ``stream`` (standard error) as one piece.

    Why not ``print``: it writes the text and the newline separately, so two slots of
    ``joblease work`` finishing at once printed ``a: completedjoblease work: b: completed``
    on one line, and whoever counts lines (the node test, a log shipper) lost one
    (docs/safety.md #47).
    """
    out = sys.stderr if stream is None else stream
    with _LINES:
        out.write(line + "\n")
        out.flush()

EXIT_LEASE_LOST = 4


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


def held_token(lease: Lease) -> HeldToken:
    """The token of ``lease`` with what names its claim (the fields of every written form)."""
    return HeldToken(lease.name, lease.namespace, lease.holder, lease.token, lease.claim_id,
                     lease.lease_until)


def lease_environment(lease: Lease) -> dict[str, str]:
    """The variables a command run under ``lease`` sees (``HeldToken.to_environment``)."""
    return held_token(lease).to_environment()


class _StopChildOnLoss(Holding):
    """A holding that stops the command's process group the moment the lease is lost."""

    def __init__(self, lease: Lease, grace: float, supervisor: Supervisor) -> None:
        # A lease that cannot be renewed is declared lost `grace` before its deadline (at
        # most half of what is left), so SIGKILL lands by the deadline itself.
        super().__init__(lease, stop_before=min(grace, max(0.0, lease.remaining()) / 2))
        self.grace = grace
        self.child: subprocess.Popen[bytes] | None = None
        self.supervisor = supervisor
        self._child_lock = threading.Lock()

    def on_lost(self) -> None:
        with self._child_lock:
            child = self.child
        if child is None:
            return  # not started yet: run_under_lease checks the loss before starting it
        if child.poll() is not None:
            say(f"joblease run: lease {self.lease.name!r} lost ({self.loss}); the command "
                f"had already ended ({child.returncode})")
            return
        say(f"joblease run: lease {self.lease.name!r} lost ({self.loss}); stopping the "
            f"command (pid {child.pid})")
        _signal_group(child, signal.SIGTERM)
        # SIGKILL after the grace, by the deadline at the latest: here (a loss is rare, a
        # thread for it costs nothing per job) and, should this process die meanwhile, by
        # the supervisor
        grace = max(0.0, min(self.grace, self.lease.remaining()))
        self.supervisor.extend(child.pid, time.monotonic() + grace)
        threading.Thread(target=_kill_after, args=([child], grace), daemon=True,
                         name=f"joblease-kill-{child.pid}").start()

    def start_child(self, command: list[str], env: dict[str, str]
                    ) -> subprocess.Popen[bytes] | None:
        """Start the command unless the lease is already lost (then return ``None``).

        No ``preexec_fn``: without it the interpreter may spawn with ``vfork``, instead of
        copying the whole worker with ``fork`` (2-4 ms a job). A command outliving its
        worker is the supervisor's to stop (``joblease.engines.supervisor``).
        """
        with self._child_lock:
            if self.loss is not None or not self.lease.valid():
                return None
            self.child = subprocess.Popen(command, env=env, start_new_session=True)
            self.supervisor.watch(self.child.pid, self.lease.deadline)
        if self.loss is not None:  # lost while starting: on_lost saw no child yet
            _signal_group(self.child, signal.SIGKILL)
        return self.child

    def on_renewed(self) -> None:
        child = self.child
        if child is not None:
            self.supervisor.extend(child.pid, self.lease.deadline)


class Stopper:
    """Stops a worker's running commands on request, with no thread per command.

    ``joblease work`` asks it when its drain timeout runs out: every command still
    running gets SIGTERM, and one thread SIGKILLs after ``grace`` whatever is left. A
    command registered after the request is stopped at once. ``remove`` tells whether the
    stop ended the command (its lease is then released without counting an attempt).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, subprocess.Popen[bytes]] = {}
        self._stopped: set[int] = set()
        self._grace: float | None = None

    def add(self, child: subprocess.Popen[bytes]) -> None:
        """A command started; stop it at once if the stop was already requested."""
        with self._lock:
            self._running[child.pid] = child
            grace = self._grace
        if grace is not None:
            self._stop([child], grace)

    def remove(self, child: subprocess.Popen[bytes]) -> bool:
        """The command ended; whether this stopper stopped it."""
        with self._lock:
            self._running.pop(child.pid, None)
            return child.pid in self._stopped

    def stop_all(self, grace: float) -> None:
        """SIGTERM every running command now; SIGKILL after ``grace`` what is left."""
        with self._lock:
            self._grace = grace
            children = list(self._running.values())
        self._stop(children, grace)

    def _stop(self, children: list[subprocess.Popen[bytes]], grace: float) -> None:
        live = [child for child in children if child.poll() is None]
        if not live:
            return
        with self._lock:
            self._stopped.update(child.pid for child in live)
        for child in live:
            _signal_group(child, signal.SIGTERM)
        threading.Thread(target=_kill_after, args=(live, grace), daemon=True,
                         name="joblease-stop").start()


def _kill_after(children: list[subprocess.Popen[bytes]], grace: float) -> None:
    end = time.monotonic() + grace
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(max(0.0, end - time.monotonic()))
            continue
        _signal_group(child, signal.SIGKILL)


def run_under_lease(lease: Lease, command: list[str], grace: float = 5.0, *,
                    stop: Stopper | None = None, forward_signals: bool = True,
                    supervisor: Supervisor | None = None) -> RunResult:
    """Run ``command`` while holding ``lease``; complete on exit 0, release otherwise.

    The command is stopped when the lease is lost, by the deadline at the latest — also if
    this process is killed or paused (the supervisor does it then). It is never started if
    the lease was already lost.

    Args:
        lease: The claimed lease.
        command: The command and its arguments.
        grace: Seconds between SIGTERM and SIGKILL when the command must stop.
        stop: The worker's :class:`Stopper`: when it stops the command (SIGTERM, SIGKILL
            after ``grace``), the lease is released *without* counting an attempt: the
            worker is leaving, the job did not fail. ``joblease work``'s drain timeout.
        forward_signals: Pass this process's SIGINT/SIGTERM on to the command (``run``).
            Only possible from the main thread; ``joblease work`` runs commands from
            threads and handles those signals itself (it drains).
        supervisor: The worker's :class:`~joblease.engines.supervisor.Supervisor`, shared by its
            commands (``joblease work``); by default one for this command alone.
    """
    own = supervisor is None
    watcher = Supervisor(grace) if supervisor is None else supervisor
    try:
        return _run(lease, command, grace, stop, forward_signals, watcher)
    finally:
        if own:
            watcher.close()


def _run(lease: Lease, command: list[str], grace: float, stop: Stopper | None,
         forward_signals: bool, supervisor: Supervisor) -> RunResult:
    holding = _StopChildOnLoss(lease, grace, supervisor)
    env = {**os.environ, **lease_environment(lease)}
    with holding:
        child = holding.start_child(command, env)
        if child is None:
            say(f"joblease run: lease {lease.name!r} was lost before the command started "
                f"({holding.loss}); not starting it")
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
                say(f"joblease run: completion refused: {err}")
                return RunResult(code, True, False, interrupted)
    return RunResult(code, holding.loss is not None, holding.completed, interrupted)


def _wait_for(child: subprocess.Popen[bytes], holding: _StopChildOnLoss, grace: float,
              stop: Stopper | None, forward_signals: bool) -> tuple[int, bool]:
    """Wait for the command; return its exit code and whether ``stop`` interrupted it."""
    restore = _forward_signals(child) if forward_signals else (lambda: None)
    if stop is not None:
        stop.add(child)
    try:
        code = child.wait()
    finally:
        restore()
        interrupted = stop is not None and stop.remove(child)
        holding.supervisor.done(child.pid)
    return code, interrupted


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
