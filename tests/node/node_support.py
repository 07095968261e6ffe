"""A local cluster with a real node (kubelet + containerd + runc), for tests on real pods.

``node_cluster`` (session) starts its own control plane (the operator watches every pod,
so it must not share the suite's ``cluster``) and a :class:`RealNode`, imports the pause
and Python base images, installs the CRD, and on teardown fails the session if any
mount, cgroup or shim of the node is left behind.

Worker pods run the working tree, not a built image: the Python base image (Debian
bookworm, from mmdebstrap) supplies glibc and the system libraries, and the test's own
interpreter and the repository (with its ``.venv``) are mounted read-only at the same
paths. An edit is tested at once, with no image rebuild; the image built from the
project's Dockerfile is what ``tests/node/test_user_journey.py`` runs.

Every test here is marked ``node`` (by directory). Without root, runc, busybox-static,
mmdebstrap or overlayfs the fixture raises :class:`NodeUnavailableError` naming each
missing piece: an error, never a skip (CI runs as root).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import ssl
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from joblease_localcluster import images
from joblease_localcluster.cluster import LocalCluster
from joblease_localcluster.node import RealNode, mounts_under, require_prerequisites
from support.paths import CRD, REPO
from support.waiting import wait_for

PYTHON_HOME = Path(sys.base_prefix)  # the interpreter the .venv was made from
VENV_PYTHON = Path(sys.executable)
# A git worktree runs the main checkout's .venv, which is then outside REPO: mount it too.
VENV = Path(sys.prefix)
WORKER = REPO / "tests" / "node" / "podworker.py"


@dataclass
class NodeCluster:
    """The control plane, its real node, and helpers for pods on it."""

    cluster: LocalCluster
    node: RealNode
    figures: dict[str, float] = field(default_factory=dict)

    def kubectl(self, *args: str, check: bool = False, timeout: float = 60) -> Any:
        """Run kubectl as the admin."""
        return self.cluster.kubectl(*args, check=check, timeout=timeout)

    def get(self, *args: str) -> Any:
        """``kubectl get -o json`` decoded."""
        return json.loads(self.kubectl("get", *args, "-o", "json", check=True).stdout)

    def apply(self, obj: dict[str, Any]) -> None:
        """``kubectl apply`` one object."""
        path = self.cluster.dir / f"obj-{secrets.token_hex(4)}.yaml"
        path.write_text(yaml.safe_dump(obj))
        out = self.kubectl("apply", "-f", str(path))
        assert out.returncode == 0, out.stderr

    def api(self, path: str) -> Any:
        """GET an API path as the admin (fast: no kubectl process)."""
        context = ssl.create_default_context(cafile=str(self.cluster.ca_file))
        request = urllib.request.Request(f"{self.cluster.server}{path}")
        request.add_header("Authorization", f"Bearer {self.cluster.token_for('admin')}")
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            return json.loads(reply.read())

    def pod_ready(self, ns: str, name: str) -> dict[str, Any] | None:
        """The pod if its Ready condition is True."""
        pod = self.api(f"/api/v1/namespaces/{ns}/pods/{name}")
        ready = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        return pod if ready.get("Ready") == "True" else None

    def lease(self, ns: str, name: str) -> dict[str, Any]:
        """The JobLease's status."""
        obj = self.api(f"/apis/joblease.dev/v1alpha1/namespaces/{ns}/jobleases/{name}")
        return dict(obj.get("status") or {})

    def pod_log_files(self, ns: str, pod: str) -> str:
        """Every log the node still keeps of the pod's containers, instance by instance.

        Why besides ``kubectl logs``: it shows the current instance or the one before,
        through the kubelet's API; these are the kubelet's files (``podLogsDir``), read
        directly, one per instance still kept (a dead container's goes when the kubelet
        collects it, after about a minute). The journey once waited 30 s for a line that
        neither ``kubectl logs`` call returned (docs/safety.md #65).
        """
        uid = self.api(f"/api/v1/namespaces/{ns}/pods/{pod}")["metadata"]["uid"]
        root = self.node.dir / "pod-logs" / f"{ns}_{pod}_{uid}"

        def instance(path: Path) -> tuple[str, int]:
            stem = path.name.split(".", 1)[0]
            return path.parent.name, int(stem) if stem.isdigit() else -1

        files = sorted((p for p in root.glob("*/*.log") if p.is_file()), key=instance)
        return "".join(p.read_text(errors="replace") for p in files)

    def container_pids(self, ns: str, pod: str) -> list[int]:
        """Host PIDs of every process in the pod's app containers' cgroups.

        Everything the runtime lists: each container's own process and its descendants,
        and any process exec'd into it (a readiness probe's ``sh``, its ``date``).
        """
        pids: list[int] = []
        for cid in self._container_ids(ns, pod):
            out = self.node.ctr("tasks", "ps", cid)
            assert out.returncode == 0, out.stderr
            pids += [int(line.split()[0]) for line in out.stdout.splitlines()[1:] if line.strip()]
        return pids

    def app_pids(self, ns: str, pod: str) -> list[int]:
        """Host PIDs of the pod's apps: each container's own process and its descendants.

        Why not every process of the container: a process exec'd into it (a readiness
        probe) is the kubelet's, not the app's. A probe stopped with the app, or a child
        of it stopped while holding the exec's output open, can hang the kubelet's probe,
        and then the probe's last result, Ready, stands: a paused pod stayed Ready for 30 s
        in a full run at ``7bb0c88`` (``test_user_journey``, step 4). An exec'd process's
        parent is the runtime's shim, outside the container, so it descends from no
        container's own process.
        """
        return self.processes(ns, pod)[0]

    def processes(self, ns: str, pod: str) -> tuple[list[int], list[int]]:
        """The containers' processes from one listing: the apps', and the exec'd ones."""
        roots = set(self.task_pids(ns, pod))
        cgroup = self.container_pids(ns, pod)
        parents = {pid: parent for pid in cgroup if (parent := _parent_pid(pid)) is not None}
        apps = [pid for pid in cgroup if _descends(pid, roots, parents)]
        return apps, [pid for pid in cgroup if pid not in apps]

    def _container_ids(self, ns: str, pod: str) -> list[str]:
        status = self.api(f"/api/v1/namespaces/{ns}/pods/{pod}")["status"]
        return [cs["containerID"].split("://", 1)[1] for cs in status.get("containerStatuses", [])]

    def task_pids(self, ns: str, pod: str) -> list[int]:
        """The PID of each app container's own process (``ctr tasks ls``: TASK PID STATUS)."""
        ids = set(self._container_ids(ns, pod))
        out = self.node.ctr("tasks", "ls")
        assert out.returncode == 0, out.stderr
        rows = [line.split() for line in out.stdout.splitlines()[1:]]
        return [int(row[1]) for row in rows if len(row) >= 2 and row[0] in ids]

    @contextlib.contextmanager
    def paused(self, ns: str, pod: str) -> Iterator[list[int]]:
        """Every process of the pod's apps stopped (SIGSTOP) inside the block (:meth:`app_pids`).

        Why tolerate a process that is gone: the listing is a snapshot, and a short-lived
        process can end between the listing and the signal (CI failed once on exactly
        that, ``ProcessLookupError`` on SIGSTOP). A process that has ended needs no pause
        and gets no SIGCONT. The block is given the PIDs actually stopped, and at least one
        must be: a pod with nothing left to pause is a failure of the test, not a pause.
        Probes are never stopped (:meth:`app_pids` says why).
        """
        stopped: list[int] = []
        for pid in self.app_pids(ns, pod):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        assert stopped, f"no process of pod {ns}/{pod} was left to pause"
        try:
            yield stopped
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


def _parent_pid(pid: int) -> int | None:
    """``pid``'s parent from ``/proc`` (``None``: it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # after the command name: state, ppid


def _descends(pid: int, roots: set[int], parents: dict[int, int]) -> bool:
    """Whether ``pid`` is one of ``roots`` or below one, through ``parents`` alone."""
    seen: set[int] = set()
    while pid not in roots:
        if pid in seen or pid not in parents:
            return False
        seen.add(pid)
        pid = parents[pid]
    return True


def worker_pod(name: str, ns: str, args: list[str], *, lease: str | None = None,
               env: dict[str, str] | None = None, image: str = images.BASE_IMAGE,
               extra_mounts: tuple[Path, ...] = (), readiness_file: bool = False,
               command: list[str] | None = None) -> dict[str, Any]:
    """A host-network pod running ``podworker.py ARGS`` from the working tree.

    It has the downward API volume (``/etc/joblease/annotations``) and an env var from the
    same annotation (``JL_ENV_GENERATION``), and, with ``readiness_file``, a readiness
    probe that passes while ``/tmp/ready`` exists (a test makes the pod not Ready by
    removing it through the host PID).
    """
    mounts = [PYTHON_HOME, REPO, *extra_mounts]
    if not VENV.is_relative_to(REPO) and VENV != PYTHON_HOME:
        mounts.insert(2, VENV)
    volumes: list[dict[str, Any]] = [
        {"name": f"host{i}", "hostPath": {"path": str(p), "type": "Directory"}}
        for i, p in enumerate(mounts)]
    volumes.append({"name": "joblease", "downwardAPI": {"items": [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}}]}})
    container: dict[str, Any] = {
        "name": "worker", "image": image, "imagePullPolicy": "Never",
        "command": command or [str(VENV_PYTHON), str(WORKER), *args],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                {"name": "PYTHONUNBUFFERED", "value": "1"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "JL_ENV_GENERATION", "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.annotations['joblease.dev/generation']"}}},
                # the working tree's product: the .venv's editable install names the main
                # checkout's operator/, which a worktree's pods do not have mounted
                *({"name": k, "value": v} for k, v in
                  {"PYTHONPATH": str(REPO / "operator"), **(env or {})}.items())],
        "volumeMounts": [*({"name": f"host{i}", "mountPath": str(p), "readOnly": True}
                           for i, p in enumerate(mounts)),
                         {"name": "joblease", "mountPath": "/etc/joblease", "readOnly": True}],
    }
    if readiness_file:
        container["readinessProbe"] = {"exec": {"command": [
            str(VENV_PYTHON), "-c", "import os,sys; sys.exit(not os.path.exists('/tmp/ready'))"]},
            "periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1}
    labels = {"joblease.dev/lease": lease} if lease else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels,
                         # env from a fieldRef is fixed at start: "0" proves it never moves
                         "annotations": {"joblease.dev/generation": "0"}},
            "spec": {"hostNetwork": True, "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 2, "restartPolicy": "Never",
                     "containers": [container], "volumes": volumes}}


class PodWatch:
    """A watch on a namespace's pods, recording when each pod's generation annotation changed.

    Runs in a thread, stamps events with ``time.time()`` (the same clock the containers
    print with: they are processes of this host).
    """

    def __init__(self, nc: NodeCluster, ns: str) -> None:
        self.nc, self.ns = nc, ns
        self.changes: list[tuple[float, str, str | None]] = []
        self._seen: dict[str, str | None] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        context = ssl.create_default_context(cafile=str(self.nc.cluster.ca_file))
        url = (f"{self.nc.cluster.server}/api/v1/namespaces/{self.ns}/pods"
               "?watch=true&timeoutSeconds=600")
        request = urllib.request.Request(url)
        request.add_header("Authorization", f"Bearer {self.nc.cluster.token_for('admin')}")
        with urllib.request.urlopen(request, timeout=630, context=context) as stream:
            for raw in stream:  # bounded by timeoutSeconds
                if self._stop.is_set():
                    return
                event = json.loads(raw)
                meta = event["object"]["metadata"]
                gen = (meta.get("annotations") or {}).get("joblease.dev/generation")
                if self._seen.get(meta["name"], "unset") != gen:
                    self._seen[meta["name"]] = gen
                    self.changes.append((time.time(), meta["name"], gen))

    def when(self, pod: str, generation: str) -> float | None:
        """When ``pod``'s annotation first showed ``generation``."""
        return next((t for t, p, g in self.changes if p == pod and g == generation), None)

    def stop(self) -> None:
        """Stop reading (the thread ends at its next event or the server's timeout)."""
        self._stop.set()


@pytest.fixture(scope="session")
def node_cluster() -> Iterator[NodeCluster]:
    """A control plane plus a real node, the CRD installed; checked clean on teardown."""
    require_prerequisites()
    base = images.base_archive()
    cluster = LocalCluster(name="joblease-local-node")
    began = time.monotonic()
    cluster.start()
    figures = {"control_plane_seconds": time.monotonic() - began}
    node = RealNode(cluster, extra_images=(base,))
    try:
        began = time.monotonic()
        node.start()
        figures["node_ready_seconds"] = time.monotonic() - began
        cluster.kubectl("apply", "--server-side", "-f", str(CRD), check=True)
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/jobleases.joblease.dev", check=True)
        handle = NodeCluster(cluster, node, figures)
        yield handle
    finally:
        left = node.stop()
        node_dir = node.dir
        cluster.stop()
    assert not left, f"the node left behind: {left}"
    assert not node_dir.exists() or not mounts_under(node_dir)
    print(f"\nnode figures: {json.dumps(figures)}")


@pytest.fixture
def node_ns(node_cluster: NodeCluster) -> Iterator[str]:
    """A fresh namespace in the node cluster (its default ServiceAccount exists)."""
    name = f"n-{secrets.token_hex(4)}"
    node_cluster.kubectl("create", "namespace", name, check=True)
    wait_for(lambda: node_cluster.kubectl("get", "sa", "default", "-n", name).returncode == 0,
             30, "the namespace's default ServiceAccount")
    yield name
    node_cluster.kubectl("delete", "namespace", name, "--wait=false")
