"""The harness itself: stopping leaves nothing behind; the detached CLI cycle works.

These start their own control planes (separate from the session's), so they are skipped
when the suite runs against an external cluster.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from joblease_localcluster.build import cache_dir, find_binary
from joblease_localcluster.cluster import LocalCluster
from joblease_localcluster.process import pid_matches

pytestmark = pytest.mark.skipif(bool(os.environ.get("JOBLEASE_E2E_KUBECONFIG")),
                                reason="tests the local harness, not the external cluster")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie has exited; its parent reaps it


def test_stop_leaves_no_process_and_no_folder() -> None:
    cluster = LocalCluster(kwok=True)
    with cluster:
        folder = cluster.dir
        pids = {p.name: p.pid for p in cluster.processes}
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager",
                             "kube-scheduler", "kwok"}
        assert cluster.ready_seconds is not None and cluster.ready_seconds < 60
        # kwok really simulates a node: it turns Ready.
        node = cluster.create_fake_node("kwok-proof")
        deadline = time.monotonic() + 30
        while True:
            out = cluster.kubectl("get", "node", node, "-o",
                                  "jsonpath={.status.conditions[?(@.type=='Ready')].status}")
            if out.stdout == "True":
                break
            assert time.monotonic() < deadline, f"kwok node not Ready: {out}"
            time.sleep(0.5)
    for name, pid in pids.items():
        assert pid is not None and _gone(pid), f"{name} (pid {pid}) still running"
    assert not folder.exists()


def _localcluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "joblease_localcluster", *args],
                          capture_output=True, text=True, timeout=180, check=False)


def test_cli_up_env_down_cycle() -> None:
    name = f"test-{secrets.token_hex(3)}"
    up = _localcluster("up", "--name", name)
    state_file = cache_dir() / "clusters" / name / "state.json"
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads(state_file.read_text())
        # The processes outlive the `up` command.
        for proc in state["processes"]:
            assert pid_matches(proc["pid"], proc["argv0"]), proc

        env = _localcluster("env", "--name", name)
        assert env.returncode == 0, env.stderr
        assert env.stdout.startswith("export KUBECONFIG=")
        kubeconfig = env.stdout.strip().split("=", 1)[1].strip("'")
        assert kubeconfig == state["kubeconfig"]
        kubectl = find_binary("kubectl")
        assert kubectl is not None
        got = subprocess.run([str(kubectl), "--kubeconfig", kubeconfig, "get", "ns",
                              "default", "-o", "name"],
                             capture_output=True, text=True, check=False, timeout=30)
        assert got.stdout.strip() == "namespace/default", got.stderr
    finally:
        down = _localcluster("down", "--name", name)
    assert down.returncode == 0, down.stderr
    for proc in state["processes"]:
        assert _gone(proc["pid"]), proc
    assert not Path(state["dir"]).exists()
    assert not state_file.parent.exists()
    # A second `down` has nothing to do and says so.
    assert _localcluster("down", "--name", name).returncode == 1
