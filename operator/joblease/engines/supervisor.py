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
import subprocess
import sys
import threading

from joblease.engines import watcher
from joblease.engines.watcher import Watcher

__all__ = ["Supervisor", "Watcher", "watcher_argv"]


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
                self._proc = subprocess.Popen(watcher_argv(self.grace),
                                              stdin=subprocess.PIPE, start_new_session=True)
            with contextlib.suppress(BrokenPipeError, ValueError, OSError):
                assert self._proc.stdin is not None
                self._proc.stdin.write(line.encode() + b"\n")
                self._proc.stdin.flush()


def watcher_argv(grace: float) -> list[str]:
    """The supervisor process's command line: :mod:`joblease.engines.watcher` run by path.

    ``-S``: no ``site`` (the watcher needs only the standard library); ``-P``: the file's
    own directory is not put first on ``sys.path``, where a module of this package could
    shadow one of the standard library's. A package loaded from no file (a zip, a frozen
    build) runs it as ``-m joblease.engines.watcher`` instead: dearer to start, never a
    command line naming no file, whose process would exit at once and leave the worker's
    commands unwatched.
    """
    if watcher.__file__ is None or not os.path.isfile(watcher.__file__):
        return [sys.executable, "-m", watcher.__name__, repr(grace)]
    return [sys.executable, "-S", "-P", watcher.__file__, repr(grace)]
