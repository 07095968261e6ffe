"""The exec-probe heartbeat: the operator's writer and the probe's one-line reader."""

import os
import subprocess
import sys
import time
from pathlib import Path

from joblease.controller.heartbeat import PROBE_SOURCE, Heartbeat


def probe(path: Path, max_age: int) -> subprocess.CompletedProcess[str]:
    """Run the probe exactly as the chart's exec probe does."""
    return subprocess.run([sys.executable, "-I", "-c", PROBE_SOURCE, str(path), str(max_age)],
                          capture_output=True, text=True, timeout=30, check=False)


def test_a_fresh_heartbeat_passes(tmp_path: Path) -> None:
    path = tmp_path / "alive"
    Heartbeat(path).beat()
    assert probe(path, 10).returncode == 0


def test_a_stale_heartbeat_fails_naming_its_age(tmp_path: Path) -> None:
    path = tmp_path / "alive"
    Heartbeat(path).beat()
    old = time.time() - 60
    os.utime(path, (old, old))
    out = probe(path, 10)
    assert out.returncode == 1
    assert "heartbeat 60" in out.stderr and "old (max 10s)" in out.stderr, out.stderr


def test_beating_again_refreshes_a_stale_file(tmp_path: Path) -> None:
    path = tmp_path / "alive"
    path.touch()
    old = time.time() - 60
    os.utime(path, (old, old))
    Heartbeat(path).beat()
    assert probe(path, 10).returncode == 0


def test_no_heartbeat_yet_fails_with_the_reason(tmp_path: Path) -> None:
    out = probe(tmp_path / "never", 10)
    assert out.returncode == 1 and "no heartbeat:" in out.stderr, out.stderr


def test_without_a_path_nothing_is_written(tmp_path: Path) -> None:
    Heartbeat(None).beat()
    assert list(tmp_path.iterdir()) == []
