"""The worker's supervisor and the drain's ``Stopper``, with real processes.

Pinned (issue 22, item 1; the promises the per-job sentinel kept before): a watched group is
SIGKILLed at its deadline, a renewal moves the deadline, ``done`` forgets a group, a worker
that dies (SIGKILL: its pipe closes) takes every watched command with it — SIGTERM, then
SIGKILL by the grace — while ``close()`` (a clean exit) kills nothing; one supervisor serves
many commands; hostile lines do not stop it. The ``Stopper`` stops every running command
with one thread, and one registered after the stop at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from joblease.engines.runner import Stopper
from joblease.engines.supervisor import Supervisor, Watcher, watcher_argv

SLEEP = ["sleep", "30"]


def spawn(command: list[str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command or SLEEP, start_new_session=True)


def gone_within(child: subprocess.Popen[bytes], seconds: float) -> int:
    started = time.monotonic()
    code = child.wait(seconds + 2)
    assert time.monotonic() - started < seconds, "stopped too late"
    return code


def test_a_group_is_killed_at_its_deadline_and_a_renewal_moves_it() -> None:
    supervisor = Supervisor(grace=5.0)
    try:
        early, renewed = spawn(), spawn()
        supervisor.watch(early.pid, time.monotonic() + 0.3)
        supervisor.watch(renewed.pid, time.monotonic() + 0.3)
        supervisor.extend(renewed.pid, time.monotonic() + 1.5)
        assert gone_within(early, 2.0) == -signal.SIGKILL
        assert renewed.poll() is None  # its deadline moved on
        assert gone_within(renewed, 3.0) == -signal.SIGKILL
    finally:
        supervisor.close()


def test_done_forgets_a_group_and_a_clean_close_kills_nothing() -> None:
    supervisor = Supervisor(grace=0.2)
    forgotten, left = spawn(), spawn()
    try:
        supervisor.watch(forgotten.pid, time.monotonic() + 0.3)
        supervisor.done(forgotten.pid)
        supervisor.watch(left.pid, time.monotonic() + 30)
        time.sleep(0.6)
        assert forgotten.poll() is None
        watcher = supervisor.pid
        supervisor.close()
        assert watcher is not None
        with pytest.raises(ProcessLookupError):
            os.kill(watcher, 0)  # the watcher exited
        time.sleep(0.3)
        assert left.poll() is None  # a clean exit leaves commands to the worker
    finally:
        for child in (forgotten, left):
            child.kill()
            child.wait()


def test_a_worker_killed_with_sigkill_takes_its_commands_with_it() -> None:
    """The worker process itself dies (no thread of it can act): its supervisor stops every
    command it watched, SIGTERM first, SIGKILL after the grace for one that ignores it."""
    worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        from joblease.engines.supervisor import Supervisor
        s = Supervisor(grace=0.5)
        polite = subprocess.Popen(["sleep", "30"], start_new_session=True)
        stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 30"],
                                    start_new_session=True)
        for child in (polite, stubborn):
            s.watch(child.pid, time.monotonic() + 60)
        print(polite.pid, stubborn.pid, flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert worker.stdout is not None
    polite, stubborn = map(int, worker.stdout.readline().split())
    time.sleep(0.2)
    worker.kill()
    worker.wait()
    started = time.monotonic()
    while time.monotonic() - started < 5 and any(_alive(p) for p in (polite, stubborn)):
        time.sleep(0.05)
    assert not _alive(polite) and not _alive(stubborn), "a command outlived its worker"
    assert time.monotonic() - started < 3.0  # the grace (0.5 s) plus a little


def test_the_supervisor_process_imports_only_what_its_loop_needs() -> None:
    """Every worker starts one: importing the ``joblease`` package there cost about 60 ms of
    CPU per worker, most of what a short drain's supervisors cost (docs/benchmarks.md)."""
    argv = watcher_argv(0.5)
    timed = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=30, check=True)
    imported = {line.rsplit("|", 1)[1].strip() for line in timed.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert {"os", "select", "signal"} <= imported  # the probe sees the loop's own imports
    heavy = {name for name in imported if name.split(".")[0] in
             ("joblease", "site", "subprocess", "threading", "dataclasses", "inspect")}
    assert not heavy, f"the supervisor process imported {sorted(heavy)}"


def test_a_watcher_loaded_from_no_file_runs_as_a_module_and_still_kills_at_the_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a file to run (a zip, a frozen build) the command line must still start a
    watcher: an empty path would start a process that exits at once, silently."""
    from joblease.engines import watcher

    monkeypatch.setattr(watcher, "__file__", None)
    argv = watcher_argv(0.5)
    assert argv[1:3] == ["-m", "joblease.engines.watcher"]
    supervisor = Supervisor(grace=0.5)
    try:
        child = spawn()
        supervisor.watch(child.pid, time.monotonic() + 0.3)
        assert gone_within(child, 3.0) == -signal.SIGKILL
    finally:
        supervisor.close()


def test_hostile_lines_are_ignored_and_overdue_groups_killed_at_once() -> None:
    watcher = Watcher(grace=1.0)
    for line in ("", "  ", "watch", "watch 1", "deadline x", "watch 3 y", "done z", "done",
                 "nonsense 1 2", "watch 7 5.0"):
        assert watcher.handle(line)  # never raises: the guarding loop must not die of a line
    assert watcher.deadlines == {7: 5.0}
    assert watcher.wait_seconds(4.0) == 1.0 and watcher.wait_seconds(9.0) == 0.0
    assert watcher.handle("exit") is False


def test_the_stopper_stops_every_running_command_and_late_ones_at_once() -> None:
    stopper = Stopper()
    polite = spawn()
    stubborn = spawn(["sh", "-c", "trap '' TERM; sleep 30"])
    time.sleep(0.1)  # let the trap be set
    finished = spawn(["true"])
    finished.wait()
    for child in (polite, stubborn, finished):
        stopper.add(child)
    stopper.stop_all(grace=0.3)
    assert gone_within(polite, 1.0) == -signal.SIGTERM
    assert gone_within(stubborn, 2.0) == -signal.SIGKILL
    assert stopper.remove(polite) and stopper.remove(stubborn)
    assert not stopper.remove(finished)  # it had ended: not stopped by the drain
    late = spawn()
    stopper.add(late)  # registered after the stop was requested
    assert gone_within(late, 1.0) == -signal.SIGTERM and stopper.remove(late)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (its parent, the killed worker, is gone: init reaps it soon) counts as dead
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"
