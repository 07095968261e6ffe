"""Issue 29 on the real node: an Indexed Job whose every index writes through its own fence.

A real Job (the Job controller of kube-controller-manager) of 4 completions, parallelism 2;
its pods run ``examples/indexed_worker.py`` from the working tree, wrapped so that the
process ignores SIGTERM (the hostile case: a pod deleted with a long grace period keeps
running and writing). The JobLeases are made by the user's recipe
(``examples/indexed-leases.sh``), owned by the Job; the operator runs on the host.

(a) The holder of index 0 is deleted with a 120 s grace period and keeps writing: the Job
controller creates its replacement without waiting for it (after its pod-failure backoff of
10 s: a deleted pod counts as failed); the replacement is Ready while the old pod's lease
still runs, and gets no token until that lease has lapsed; then it writes with the next
generation and no row of the old generation lands after its first row (the old process is
refused and exits long before its grace period ends).
(b) The holder of index 1 is frozen with SIGSTOP past its lease, deleted (the Job replaces
it; the replacement takes the lapsed lease at once) and resumed: its in-flight write is
refused by the fence.
(c) The Job completes; every index has exactly one Completed JobLease, completed with the
token of the pod the Job counted as succeeded for that index.

Only the two first holders must write for long (``STEPS``: past the lease that outlives their
deletion or freezing). Every later pod — the two replacements and indexes 2 and 3 — writes
``LATER_STEPS`` rows: what the test asks of them (a first row with the next generation, a
Succeeded pod whose token completes its lease) takes a few rows, and the minute more of rows
that each wrote before proved nothing more (the run took about 3 minutes). The pods read their
step count at start from a file the test rewrites once both first holders have written.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from node_support import VENV_PYTHON, NodeCluster, worker_pod

from joblease.domain.lease import parse_time
from joblease_localcluster import build
from support.operator_process import OperatorProcess
from support.paths import REPO
from support.postgres import PostgresServer
from support.waiting import wait_for

# The Job controller counts a deleted pod as failed and creates its replacement after the
# pod-failure backoff (10 s for the first, doubling): the lease must outlast that for the
# replacement to be seen waiting. The old holder is deleted just after a renewal, so its
# lease has DURATION left; each first holder writes long enough to outlive it.
DURATION = 30
STEPS, STEP_SECONDS = 100, 0.5
LATER_STEPS = 10  # every pod started after the two first holders wrote
BACKOFF = 10
GRACE = 120
JOB = "ingest"
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
# The hostile worker: SIGTERM ignored, its step count read from the test's file (the first
# holders read STEPS, every later pod LATER_STEPS), then the example itself.
WRAPPER = ("import os, pathlib, runpy, signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "os.environ['JOBLEASE_STEPS'] = "
           "pathlib.Path(os.environ['STEPS_FILE']).read_text().strip(); "
           f"runpy.run_path({str(REPO / 'examples' / 'indexed_worker.py')!r}, "
           "run_name='__main__')")
HEARTBEAT_PROBE = ("import os, sys, time; "
                   "sys.exit(time.time() - os.stat('/tmp/heartbeat').st_mtime > 2)")



@pytest.fixture
def operator(node_cluster: NodeCluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator as a host process (its PID is the only one stopped)."""
    op = OperatorProcess(node_cluster.cluster.kubeconfig, tmp_path / "operator.log").start()
    yield op
    op.stop()
    print(op.output(3000))


def indexed_job(ns: str, dsn: str, steps_file: Path) -> dict[str, Any]:
    """The Job of examples/indexed-job.yaml, on this node (host network, working tree).

    ``steps_file``'s folder is mounted into every pod: each reads its step count there.
    """
    pod = worker_pod("unused", ns, [], command=[str(VENV_PYTHON), "-c", WRAPPER],
                     extra_mounts=(steps_file.parent,), env={
        "DATABASE_URL": dsn, "JOBLEASE_LEASE_PREFIX": JOB, "STEPS_FILE": str(steps_file),
        "JOBLEASE_STEP_SECONDS": str(STEP_SECONDS), "PYTHONPATH": str(REPO / "operator")})
    spec = pod["spec"]
    spec["containers"][0]["readinessProbe"] = {
        "exec": {"command": [str(VENV_PYTHON), "-c", HEARTBEAT_PROBE]},
        "periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": JOB, "namespace": ns},
            "spec": {"completionMode": "Indexed", "completions": 4, "parallelism": 2,
                     "backoffLimit": 10, "suspend": True,
                     "template": {"metadata": {"labels": {
                         "joblease.dev/lease": JOB, "joblease.dev/lease-per-index": "true"}},
                         "spec": spec}}}


def create_leases(nc: NodeCluster, ns: str) -> str:
    """Run the user's recipe, examples/indexed-leases.sh, with the cluster's kubectl."""
    kubectl = build.find_binary("kubectl")
    assert kubectl is not None
    env = {**os.environ, "PATH": f"{kubectl.parent}:{os.environ['PATH']}",
           "KUBECONFIG": str(nc.cluster.kubeconfig), "KUBECTL_ARGS": f"-n {ns}"}
    out = subprocess.run(["sh", str(REPO / "examples" / "indexed-leases.sh"), JOB, JOB,
                          str(DURATION), "6"], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


class LeaseLog:
    """Polls the Job's JobLeases (0.1 s) and keeps the last ``leaseUntil`` of every generation.

    A renewal moves ``leaseUntil`` once per third of the duration, so a poll every 0.1 s
    sees every value a lease had for long enough to matter.
    """

    def __init__(self, nc: NodeCluster, ns: str) -> None:
        self.nc, self.ns = nc, ns
        self.until: dict[tuple[str, int], datetime] = {}
        self.holder: dict[tuple[str, int], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        path = (f"/apis/joblease.dev/v1alpha1/namespaces/{self.ns}/jobleases"
                f"?labelSelector=joblease.dev/job={JOB}")
        deadline = time.monotonic() + 600
        while not self._stop.is_set() and time.monotonic() < deadline:
            for item in self.nc.api(path)["items"]:
                st = item.get("status") or {}
                key = (item["metadata"]["name"], int(st.get("generation", 0)))
                if st.get("leaseUntil"):
                    self.until[key] = parse_time(st["leaseUntil"])
                if st.get("holder"):
                    self.holder[key] = st["holder"]
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def holder_of(nc: NodeCluster, ns: str, lease: str) -> tuple[str, int] | None:
    """(pod name, generation) of a Held lease, else None."""
    st = nc.lease(ns, lease)
    if st.get("phase") != "Held":
        return None
    return str(st["holder"]).split("/")[1], int(st["generation"])


def rows(dsn: str, lease: str) -> list[tuple[int, str, datetime]]:
    """(generation, writer, at) of every row written for ``lease``, in time order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('indexed_rows')").fetchone()
        if exists is None or exists[0] is None:
            return []
        return list(conn.execute("SELECT generation, writer, at FROM indexed_rows "
                                 "WHERE lease = %s ORDER BY at", (lease,)).fetchall())


def index_pods(nc: NodeCluster, ns: str, index: int) -> list[dict[str, Any]]:
    """The Job's pods of one completion index."""
    selector = f"{INDEX_KEY}={index}"
    return list(nc.api(f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")["items"])


def follow_logs(nc: NodeCluster, ns: str, pod: str, path: Path) -> subprocess.Popen[bytes]:
    """``kubectl logs -f`` into a file: the log outlives the deleted pod object."""
    kubectl = build.find_binary("kubectl")
    assert kubectl is not None
    with path.open("wb") as out:
        return subprocess.Popen([str(kubectl), "--kubeconfig", str(nc.cluster.kubeconfig),
                                 "logs", "-f", pod, "-n", ns], stdout=out,
                                stderr=subprocess.STDOUT)


def set_steps(steps_file: Path, steps: int) -> None:
    """Write the step count the next pods read (renamed into place: never read half-written)."""
    partial = steps_file.with_suffix(".partial")
    partial.write_text(str(steps))
    partial.replace(steps_file)


def first_row_of(dsn: str, lease: str, generation: int) -> datetime | None:
    found = [at for gen, _, at in rows(dsn, lease) if gen == generation]
    return found[0] if found else None


def test_indexed_job_one_fenced_writer_per_index(
        node_cluster: NodeCluster, node_ns: str, pg: PostgresServer,
        operator: OperatorProcess, tmp_path: Path) -> None:
    nc, ns = node_cluster, node_ns
    dsn = pg.create_database(f"idx_{ns.replace('-', '_')}")
    steps_file = tmp_path / "steps" / "count"
    steps_file.parent.mkdir()
    set_steps(steps_file, STEPS)
    nc.apply(indexed_job(ns, dsn, steps_file))
    create_leases(nc, ns)
    listed = nc.kubectl("get", "jl", "-n", ns, "-l", f"joblease.dev/job={JOB}", check=True)
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()[1:]) == [
        f"{JOB}-{i}" for i in range(4)], listed.stdout
    log = LeaseLog(nc, ns)
    followers: list[subprocess.Popen[bytes]] = []
    began = time.monotonic()
    try:
        nc.kubectl("patch", "job", JOB, "-n", ns, "--type=merge", "-p",
                   '{"spec":{"suspend":false}}', check=True)
        held = {i: wait_for(lambda i=i: (h := holder_of(nc, ns, f"{JOB}-{i}"))
                            and first_row_of(dsn, f"{JOB}-{i}", h[1]) and h, 90,
                            f"index {i}'s pod to hold its lease and write")
                for i in (0, 1)}
        (p0, n0), (p1, n1) = held[0], held[1]
        set_steps(steps_file, LATER_STEPS)  # both first holders run: every later pod is short
        claimed_until = wait_for(lambda: log.until.get((f"{JOB}-0", n0)), 10, "the lease log")

        # (b) freeze index 1's holder: every process of its container
        with nc.paused(ns, p1):
            # (a) delete index 0's holder; it ignores SIGTERM and keeps writing
            followers.append(follow_logs(nc, ns, p0, tmp_path / "p0.log"))
            wait_for(lambda: log.until[(f"{JOB}-0", n0)] != claimed_until, DURATION,
                     f"a renewal of {JOB}-0 (the delete comes just after one)")
            deleted_at, deleted_wall = time.monotonic(), datetime.now().astimezone()
            nc.kubectl("delete", "pod", p0, "-n", ns, f"--grace-period={GRACE}",
                       "--wait=false", check=True)
            r0 = wait_for(lambda: next((p["metadata"]["name"] for p in index_pods(nc, ns, 0)
                                        if p["metadata"]["name"] != p0), None), 30,
                          "the Job controller to replace index 0's pod")
            replaced_after = time.monotonic() - deleted_at
            assert replaced_after < BACKOFF + 10, "not replaced while the old pod still ran"
            r0_ready = wait_for(lambda: nc.pod_ready(ns, r0), 60, f"{r0} Ready")
            ready_at = datetime.now().astimezone()  # this host is the API server's clock
            still = holder_of(nc, ns, f"{JOB}-0")
            # Ready, and nothing for it yet: the old pod's lease has not lapsed
            assert still == (p0, n0), still
            assert not any(k.startswith("joblease.dev/") for k in
                           (r0_ready["metadata"].get("annotations") or {})), r0_ready["metadata"]
            taken = wait_for(lambda: (h := holder_of(nc, ns, f"{JOB}-0")) and h[0] == r0 and h,
                             60, f"{r0} to hold {JOB}-0")
            assert taken[1] == n0 + 1
            st0 = nc.lease(ns, f"{JOB}-0")
            old_until = log.until[(f"{JOB}-0", n0)]
            assert parse_time(st0["acquireTime"]) >= old_until, (st0, old_until)
            r0_first = wait_for(lambda: first_row_of(dsn, f"{JOB}-0", n0 + 1), 60,
                                f"{r0} to write with generation {n0 + 1}")
            assert r0_first >= old_until
            waited = (old_until - ready_at).total_seconds()
            assert waited > 0, (old_until, ready_at)
            # the old pod really was still writing after its deletion, and was refused
            wait_for(lambda: not index_pods_named(nc, ns, 0, p0), GRACE - 30,
                     f"{p0} to end (refused) well before its grace period")
            old_rows = [at for gen, _, at in rows(dsn, f"{JOB}-0") if gen == n0]
            assert max(old_rows) < r0_first, "a row of the old generation landed after the new"
            # it did keep writing after its deletion, as long as its token was the newest
            kept = [at for at in old_rows if at > deleted_wall]
            assert len(kept) >= 10, f"{p0} wrote {len(kept)} rows after its deletion"
            p0_log = (tmp_path / "p0.log").read_text()
            assert "refused by the fence" in p0_log, p0_log[-2000:]

            # (b) the frozen holder's lease lapses; it is deleted and replaced
            wait_for(lambda: (h := holder_of(nc, ns, f"{JOB}-1")) is None or h[1] != n1,
                     DURATION * 5, f"{JOB}-1 to lapse while {p1} is frozen")
            followers.append(follow_logs(nc, ns, p1, tmp_path / "p1.log"))
            nc.kubectl("delete", "pod", p1, "-n", ns, f"--grace-period={GRACE}",
                       "--wait=false", check=True)
            r1 = wait_for(lambda: next((p["metadata"]["name"] for p in index_pods(nc, ns, 1)
                                        if p["metadata"]["name"] != p1), None), 30,
                          "the Job controller to replace index 1's pod")
            n1_new = wait_for(lambda: (h := holder_of(nc, ns, f"{JOB}-1")) and h[0] == r1
                              and h[1], 60, f"{r1} to hold {JOB}-1")
            assert n1_new > n1
            wait_for(lambda: first_row_of(dsn, f"{JOB}-1", n1_new), 60,
                     f"{r1} to write with generation {n1_new}")
        wait_for(lambda: "refused by the fence" in (tmp_path / "p1.log").read_text(), 30,
                 f"{p1}'s resumed write to be refused")
        r1_first = first_row_of(dsn, f"{JOB}-1", n1_new)
        assert r1_first is not None
        late = [at for gen, _, at in rows(dsn, f"{JOB}-1") if gen == n1 and at > r1_first]
        assert not late, f"a row of the frozen generation {n1} landed after {n1_new}: {late}"

        # (c) the Job completes; each index: one Completed lease, the succeeded pod's token
        job = wait_for(lambda: (j := nc.get("job", JOB, "-n", ns))["status"].get("succeeded")
                       == 4 and j, 400, "the Job to complete")
        assert job["status"].get("completedIndexes") == "0-3"
        leases = nc.get("jl", "-n", ns, "-l", f"joblease.dev/job={JOB}")["items"]
        assert sorted(x["metadata"]["name"] for x in leases) == [f"{JOB}-{i}" for i in range(4)]
        for i in range(4):
            succeeded = [p for p in index_pods(nc, ns, i) if p["status"]["phase"] == "Succeeded"]
            assert len(succeeded) == 1, [p["metadata"]["name"] for p in index_pods(nc, ns, i)]
            pod = succeeded[0]["metadata"]
            st = wait_for(lambda i=i: (s := nc.lease(ns, f"{JOB}-{i}")).get("phase")
                          == "Completed" and s, 30, f"{JOB}-{i} Completed")
            holder = f"pod:{ns}/{pod['name']}/{pod['uid']}"
            assert st["completion"]["holder"] == holder, (st, holder)
            gens = {gen for gen, writer, _ in rows(dsn, f"{JOB}-{i}") if writer == pod["name"]}
            assert gens == {st["completion"]["generation"]}, (gens, st)
        table = nc.kubectl("get", "jl", "-n", ns, "-l", f"joblease.dev/job={JOB}", check=True)
        assert table.stdout.count("Completed") == 4, table.stdout
    finally:
        log.stop()
        for follower in followers:
            follower.terminate()
            follower.wait(timeout=10)
    print(f"\nindexed job: replacement of index 0 created {replaced_after:.1f}s after the "
          f"delete; when it was Ready the lease was {still} and had {waited:.1f}s to run; "
          f"the deleted pod wrote {len(kept)} rows after its delete, none after the new "
          f"generation's first; "
          f"generations {n0}->{n0 + 1}, "
          f"{n1}->{n1_new}; whole run {time.monotonic() - began:.1f}s\n{table.stdout}")


def index_pods_named(nc: NodeCluster, ns: str, index: int, name: str) -> bool:
    """Whether the pod ``name`` of ``index`` still exists."""
    return any(p["metadata"]["name"] == name for p in index_pods(nc, ns, index))
