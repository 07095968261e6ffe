"""The supervisor process itself: steps 1-3 of :mod:`joblease.engines.supervisor`.

Run by path, not as ``python -m joblease.engines.supervisor``: ``Supervisor`` starts
``python -S -P <this file> GRACE``, so the process imports no ``joblease`` module (the
package's ``__init__`` alone costs about 60 ms of CPU: ``dataclasses``, ``inspect``, the
domain) and no ``site``. Every worker starts one; it costs about a third of what it did
(docs/benchmarks.md). So this file imports the standard library only, and only what the
loop needs: ``tests/unit/test_supervisor.py`` pins that.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

POLL_GONE = 0.05  # how often step 3 checks whether the groups are gone


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
    try:  # noqa: SIM105 -- contextlib costs this process 7 ms of imports (module doc)
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # gone already, or no longer ours: nothing to stop


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -S -P watcher.py GRACE``: watch for one worker until it leaves."""
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the terminal is the worker's
    run(float(args[0]) if args else 5.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
