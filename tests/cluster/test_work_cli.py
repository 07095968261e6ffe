"""``joblease work`` as a real process against the real API server (issue 17, item 3)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from joblease.sdk.client import LeaseClient

JOBLEASE = [sys.executable, "-m", "joblease.cli"]


def work(cluster: Any, namespace: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig_for("admin"))}
    return subprocess.Popen([*JOBLEASE, "work", "-n", namespace, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    return proc.returncode, stderr


def phases(leases: LeaseClient, *names: str) -> dict[str, str]:
    return {n: leases.get(n).status.phase.value for n in names}


def test_until_empty_runs_every_job_once_k_at_a_time(cluster: Any, leases: LeaseClient,
                                                    tmp_path: Path) -> None:
    names = [f"job-{i}" for i in range(6)]
    for name in names:
        leases.store.create(leases.namespace, name, {"leaseDurationSeconds": 5},
                            labels={"pool": "a"})
    leases.store.create(leases.namespace, "other", {"leaseDurationSeconds": 5},
                        labels={"pool": "b"})
    log = tmp_path / "runs.txt"
    script = (f'echo "start $JOBLEASE_NAME $JOBLEASE_TOKEN $(date +%s.%N)" >> {log}; '
              f'sleep 0.6; echo "end $JOBLEASE_NAME x $(date +%s.%N)" >> {log}')
    code, stderr = finish(work(cluster, leases.namespace, "-l", "pool=a", "-c", "3",
                               "--until-empty", "--holder", "w", "--", "sh", "-c", script))
    assert code == 0, stderr
    assert phases(leases, *names) == dict.fromkeys(names, "Completed")
    assert phases(leases, "other") == {"other": "Available"}  # not in the selector
    events = [line.split() for line in log.read_text().splitlines()]
    starts = sorted(e[1] for e in events if e[0] == "start")
    assert starts == names  # each job ran exactly once
    assert all(e[2].endswith("/1") for e in events if e[0] == "start")  # its own token
    timeline = sorted((float(e[3]), 1 if e[0] == "start" else -1) for e in events)
    running, most = 0, 0
    for _, step in timeline:
        running += step
        most = max(most, running)
    assert 2 <= most <= 3, timeline  # concurrent, never more than K
    assert "done=6 failed=0" in stderr and "remaining=0 busy=0/3" in stderr, stderr


def test_higher_priority_is_claimed_first(cluster: Any, leases: LeaseClient) -> None:
    for name, priority in (("low", 0), ("high", 10), ("mid", 5)):
        leases.store.create(leases.namespace, name, {"priority": priority},
                            labels={"pool": "p"})
    code, stderr = finish(work(cluster, leases.namespace, "-l", "pool=p", "--until-empty",
                               "--", "true"))
    assert code == 0, stderr
    assert re.findall(r"work: (\w+): claimed", stderr) == ["high", "mid", "low"], stderr


def test_failing_command_is_retried_after_backoff_until_max_attempts(
        cluster: Any, leases: LeaseClient) -> None:
    leases.store.create(leases.namespace, "doomed", {
        "maxAttempts": 2, "backoff": {"initialSeconds": 1, "maxSeconds": 1}},
        labels={"pool": "f"})
    began = time.monotonic()
    code, stderr = finish(work(cluster, leases.namespace, "-l", "pool=f", "--until-empty",
                               "--", "sh", "-c", "exit 3"))
    assert code == 7, stderr  # nothing unfinished, but a Failed job in the selector
    st = leases.get("doomed").status
    assert (st.phase.value, st.reason, st.attempts) == ("Failed", "AttemptsExhausted", 2)
    assert "done=0 failed=2" in stderr, stderr
    assert time.monotonic() - began >= 1.0  # the second attempt waited for the backoff


def test_sigterm_drains_running_commands_finish_and_nothing_new_is_claimed(
        cluster: Any, leases: LeaseClient, tmp_path: Path) -> None:
    for name in ("first", "second"):
        leases.store.create(leases.namespace, name, {"leaseDurationSeconds": 5},
                            labels={"pool": "d"})
    started = tmp_path / "started"
    proc = work(cluster, leases.namespace, "-l", "pool=d", "--drain-timeout", "20", "--",
                "sh", "-c", f"touch {started}; sleep 1.5")
    _wait_for_file(started, proc)
    proc.send_signal(signal.SIGTERM)
    code, stderr = finish(proc)
    assert code == 0, stderr
    done = phases(leases, "first", "second")
    assert sorted(done.values()) == ["Available", "Completed"], done  # finished; no new claim
    assert "done=1" in stderr, stderr


def test_drain_timeout_stops_the_command_and_releases_without_an_attempt(
        cluster: Any, leases: LeaseClient, tmp_path: Path) -> None:
    leases.store.create(leases.namespace, "long", {"leaseDurationSeconds": 5},
                        labels={"pool": "t"})
    started = tmp_path / "started"
    proc = work(cluster, leases.namespace, "-l", "pool=t", "--drain-timeout", "0.5",
                "--grace", "1", "--", "sh", "-c", f"touch {started}; exec sleep 60")
    _wait_for_file(started, proc)
    proc.send_signal(signal.SIGTERM)
    code, stderr = finish(proc, timeout=30)
    assert code == 8, stderr
    st = leases.get("long").status
    assert (st.phase.value, st.attempts, st.holder) == ("Available", 0, None), st
    assert "released=1" in stderr, stderr


def test_work_without_a_command_is_a_usage_error(cluster: Any, leases: LeaseClient) -> None:
    code, stderr = finish(work(cluster, leases.namespace, "-l", "pool=x"))
    assert code == 2 and "no command given" in stderr, stderr


def _wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
