"""The seed example on real pods: a SIGSTOPped holder is fenced out by PostgreSQL.

Two worker pods run ``joblease run --lease seed -- podworker.py seed`` (host network, the
PostgreSQL server on 127.0.0.1). Pod A holds generation N and writes; every process of its
container is stopped with SIGSTOP (they are ordinary host PIDs) past the lease; pod B takes
N + 1 and writes; A is resumed. The outcome is read from the API server, the database and
``kubectl logs``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from node_support import VENV_PYTHON, WORKER, NodeCluster, worker_pod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.postgres import PostgresServer
from support.waiting import wait_for

DURATION = 3



def _events(nc: NodeCluster, ns: str, pod: str) -> list[dict[str, Any]]:
    out = nc.kubectl("logs", pod, "-n", ns)
    if os.environ.get("JL_DEBUG"):
        print(pod, out.stdout[-800:], out.stderr[-300:])
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"t"')]


def _terminated(nc: NodeCluster, ns: str, pod: str) -> dict[str, Any] | None:
    status = nc.api(f"/api/v1/namespaces/{ns}/pods/{pod}")["status"]
    for cs in status.get("containerStatuses", []):
        if "terminated" in cs.get("state", {}):
            return dict(cs["state"]["terminated"])
    return None


def test_paused_pod_is_fenced_out(node_cluster: NodeCluster, node_ns: str,
                                  pg: PostgresServer) -> None:
    nc, ns = node_cluster, node_ns
    dsn = pg.create_database(f"seed_{ns.replace('-', '_')}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE report (id serial PRIMARY KEY, job text, generation int, "
                     "writer text, at timestamptz DEFAULT clock_timestamp())")
    nc.apply({"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
              "metadata": {"name": "seed", "namespace": ns},
              "spec": {"leaseDurationSeconds": DURATION,
                                  "podDelegation": {"enabled": True}}})
    kubeconfig = nc.cluster.kubeconfig_for("admin")

    def pod(name: str) -> dict[str, Any]:
        command = [str(VENV_PYTHON.parent / "joblease"), "run", "-n", ns, "--kubeconfig",
                   str(kubeconfig), "--lease", "seed", "--holder", name, "--wait", "120",
                   "--grace", "1", "--", str(VENV_PYTHON), str(WORKER), "seed"]
        return worker_pod(name, ns, [], command=command, env={"DATABASE_URL": dsn},
                          extra_mounts=(nc.cluster.dir,))

    nc.apply(pod("pod-a"))
    first = wait_for(lambda: [e for e in _events(nc, ns, "pod-a") if e.get("event") == "wrote"],
                     60, "pod-a to write")[0]
    n = first["gen"]
    assert nc.lease(ns, "seed")["holder"] == "pod-a"
    with nc.paused(ns, "pod-a"):
        nc.apply(pod("pod-b"))
        b_first = wait_for(lambda: [e for e in _events(nc, ns, "pod-b")
                                    if e.get("event") == "wrote"], 60, "pod-b to write")[0]
        assert b_first["gen"] == n + 1
        status = nc.lease(ns, "seed")
        assert (status["holder"], status["generation"]) == ("pod-b", n + 1)
    # A resumes: its renewal is refused, `joblease run` kills its command; any write it
    # still attempts is refused by PostgreSQL's fence.
    ended = wait_for(lambda: _terminated(nc, ns, "pod-a"), 60, "pod-a's container to end")
    a_events = _events(nc, ns, "pod-a")
    logs = nc.kubectl("logs", "pod-a", "-n", ns).stdout
    assert ended["exitCode"] != 0, (ended, logs)
    refused = [e for e in a_events if e.get("event") == "refused"]
    assert all(e["gen"] == n for e in refused)
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT id, generation, writer FROM report ORDER BY id").fetchall()
        fence = conn.execute("SELECT generation FROM joblease_fence WHERE resource = 'seed'"
                             ).fetchone()
    first_b = min(r[0] for r in rows if r[2] == "pod-b")
    stale = [r for r in rows if r[2] == "pod-a" and r[0] > first_b]
    assert not stale, f"a write of the paused pod landed after pod-b's: {stale}"
    assert fence is not None and fence[0] >= n + 1
    # A's complete with its old token is refused by the API server.
    done = subprocess.run([str(VENV_PYTHON.parent / "joblease"), "complete", "seed", "-n", ns,
                           "--kubeconfig", str(kubeconfig), "--holder", "pod-a",
                           "--token", f"{nc.lease(ns, 'seed')['epoch']}/{n}"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 4, (done.stdout, done.stderr)
    print(f"\nseed on pods: A gen {n}, B gen {n + 1}; A exit {ended['exitCode']}; "
          f"A refused writes {len(refused)}; A log tail: {logs.strip().splitlines()[-3:]}; "
          f"complete: {done.stderr.strip()[-200:]}")
