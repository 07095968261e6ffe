"""One watcher process per worker: it stops commands when the worker itself cannot.

A command run under a lease (``joblease run``, each job of ``joblease work``) must stop by
its lease's deadline, also when the process that runs it is SIGKILLed, OOM-killed or
paused: then no thread of that process can act. So a separate, long-lived *supervisor*
process watches every command of one worker. The worker tells it, through a pipe:

* ``watch PGID DEADLINE``: a command's process group and the local monotonic deadline
  (``CLOCK_MONOTONIC`` is shared by every process on the host) by which it must be gone;
* ``deadline PGID DEADLINE``: a renewal moved that deadline;
* ``done PGID``: the command ended; forget it;
* ``exit``: the worker is leaving cleanly; the supervisor exits without killing anything.

The supervisor, in numbered steps:

1. sleep until the next line or the earliest deadline, whichever comes first;
2. a deadline passed: SIGKILL that group (the lease may be someone else's by now);
3. the pipe closed without ``exit``, the worker died: SIGTERM every group it still
   watches, wait until they are gone, ``grace`` seconds or the earliest of their
   deadlines, whichever comes first, then SIGKILL what is left and exit.

Why one per worker and not one per command: starting a Python process costs about 20 ms
of CPU, which was most of a no-op job's cost (issue 22). Nothing here decides about
leases; it only enforces deadlines the worker computed.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time

POLL_GONE = 0.05  # how often step 3 checks whether the groups are gone


class Supervisor:
    """The worker's side: starts the watcher on first use and talks to it.

    Thread-safe: every slot of a worker shares one. ``close()`` it when the worker leaves
    cleanly (the watcher then exits without killing anything).

    Args:
        grace: Seconds between SIGTERM and SIGKILL when the worker died (step 3).
    """

    def __init__(self, grace: float = 5.0) -> None:
        self.grace = grace
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def watch(self, pgid: int, deadline: float) -> None:
        """Watch group ``pgid``: SIGKILL it at ``deadline`` (local monotonic) unless told."""
        self._send(f"watch {pgid} {deadline!r}")

    def extend(self, pgid: int, deadline: float) -> None:
        """A renewal moved group ``pgid``'s deadline."""
        self._send(f"deadline {pgid} {deadline!r}")

    def done(self, pgid: int) -> None:
        """Group ``pgid``'s command ended: forget it."""
        self._send(f"done {pgid}")

    def close(self) -> None:
        """The worker leaves cleanly: the watcher exits without killing anything."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(BrokenPipeError, ValueError, OSError):
            assert proc.stdin is not None
            proc.stdin.write(b"exit\n")
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)

    @property
    def pid(self) -> int | None:
        """The watcher's pid (``None`` before first use)."""
        return None if self._proc is None else self._proc.pid

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None:
                # its own session: a signal to the worker's group does not reach it
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "joblease.engines.supervisor", repr(self.grace)],
                    stdin=subprocess.PIPE, start_new_session=True)
            with contextlib.suppress(BrokenPipeError, ValueError, OSError):
                assert self._proc.stdin is not None
                self._proc.stdin.write(line.encode() + b"\n")
                self._proc.stdin.flush()


class Watcher:
    """The supervisor process's state: the groups it watches and their deadlines."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.deadlines: dict[int, float] = {}

    def handle(self, line: str) -> bool:
        """Apply one line from the worker; ``False`` means exit now (``exit``).

        A line it cannot read is ignored: the loop that guards the commands must not die
        of one (the worker only writes well-formed lines; this is the fail-safe).
        """
        word, *values = line.split() or [""]
        if word == "exit":
            return False
        try:
            if word in ("watch", "deadline") and len(values) == 2:
                self.deadlines[int(values[0])] = float(values[1])
            elif word == "done" and values:
                self.deadlines.pop(int(values[0]), None)
        except ValueError:
            pass
        return True

    def wait_seconds(self, now: float) -> float | None:
        """How long step 1 may sleep (``None``: until a line comes)."""
        if not self.deadlines:
            return None
        return max(0.0, min(self.deadlines.values()) - now)

    def kill_overdue(self, now: float) -> None:
        """Step 2: SIGKILL every group whose deadline has passed."""
        for pgid in [g for g, deadline in self.deadlines.items() if deadline <= now]:
            _signal_group(pgid, signal.SIGKILL)
            del self.deadlines[pgid]

    def orphaned(self) -> None:
        """Step 3: the worker died: stop every group, SIGTERM first, SIGKILL by the end."""
        if not self.deadlines:
            return
        for pgid in self.deadlines:
            _signal_group(pgid, signal.SIGTERM)
        end = min(time.monotonic() + self.grace, *self.deadlines.values())
        while time.monotonic() < end and any(_alive(g) for g in self.deadlines):
            time.sleep(POLL_GONE)
        for pgid in self.deadlines:
            _signal_group(pgid, signal.SIGKILL)


def run(grace: float, fd: int = 0) -> None:
    """The supervisor process's loop over the pipe ``fd`` (steps 1-3 of the module doc)."""
    watcher = Watcher(grace)
    pending = b""
    while True:
        ready, _, _ = select.select([fd], [], [], watcher.wait_seconds(time.monotonic()))
        if not ready:
            watcher.kill_overdue(time.monotonic())
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            watcher.orphaned()
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip() and not watcher.handle(line.decode()):
                return
        watcher.kill_overdue(time.monotonic())


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m joblease.engines.supervisor GRACE``: watch for one worker until it leaves."""
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the terminal is the worker's
    run(float(args[0]) if args else 5.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
