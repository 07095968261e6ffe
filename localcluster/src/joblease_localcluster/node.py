"""A real node for the local cluster: containerd + Debian's runc + the kubelet, as root.

kwok simulates pods but writes no files and runs no processes, so it cannot prove what
users rely on: a downward API file that changes when the pod's annotations do, ``kubectl
logs``, a worker process that SIGSTOP really pauses. :class:`RealNode` adds a node that
does all of that to a running :class:`~joblease_localcluster.cluster.LocalCluster`.

Everything lives in one temporary folder (containerd's root/state/socket, runc's state,
the kubelet's ``--root-dir``, ``--cert-dir`` and pod logs) and one cgroup folder of its
own (``cgroupRoot``), so two nodes on one machine do not collide, and ``stop()`` can
prove it left nothing: it stops the kubelet and containerd by the PIDs it started, kills
the containers' shims found by *our* socket path in their command line, unmounts every
mount below the folder (deepest first) and removes the folder and the cgroups.

Node identity is the real one: the kubelet authenticates with a client certificate
``CN=system:node:localhost, O=system:nodes`` (the API server runs the Node authorizer and
the NodeRestriction admission plugin), serves on 127.0.0.1 only, refuses anonymous
requests and asks the API server (webhook) whether a caller may use it. No admin
credential is on the node.

Traps this machine showed (``docs`` and the shared notes): the process lacks
``CAP_SYS_RESOURCE`` (``restrict_oom_score_adj``), the host is on cgroup v1
(``failCgroupV1: false``), only Debian's runc has seccomp, and a loopback-only CNI
configuration is what makes the node Ready without any CNI binary (pods use the host
network).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from joblease_localcluster import build, certs, images
from joblease_localcluster.process import ManagedProcess, free_port, pid_matches, stop_pid

NODE_NAME = "localhost"
RUNC = Path("/usr/sbin/runc")
CGROUP_FS = Path("/sys/fs/cgroup")
# Bounded teardown: mounts below our folder and cgroup folders are few dozen at most.
MAX_TEARDOWN_ROUNDS = 5


class NodeUnavailableError(RuntimeError):
    """This machine cannot run a real node; the message names what is missing and the fix."""


def missing_prerequisites() -> list[str]:
    """Return what this machine lacks to run a real node, each with how to get it.

    Empty means: root, Debian's runc, a static busybox, mmdebstrap, overlayfs and a
    cgroup hierarchy are all there. Checked before anything starts so a test fails with
    this list rather than with a kubelet log.
    """
    missing: list[str] = []
    if os.geteuid() != 0:
        missing.append("root: containerd and the kubelet mount filesystems and create "
                       "cgroups (run as root, e.g. `sudo -E make test`, or in CI)")
    if not RUNC.is_file():
        missing.append(f"{RUNC}: Debian's runc (with seccomp): apt-get install runc")
    if not images._is_static(images.BUSYBOX):
        missing.append("a static /bin/busybox for the pause image: apt-get install busybox-static")
    if not any(Path(d, "mmdebstrap").is_file() for d in os.get_exec_path()):
        missing.append("mmdebstrap for the Python base image: apt-get install mmdebstrap")
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "overlay" not in filesystems:
        missing.append("overlayfs in the kernel (containerd's snapshotter): modprobe overlay")
    if not CGROUP_FS.is_dir():
        missing.append("cgroups mounted at /sys/fs/cgroup")
    return missing


def require_prerequisites() -> None:
    """Raise :class:`NodeUnavailableError` listing everything missing (never a skip)."""
    missing = missing_prerequisites()
    if missing:
        raise NodeUnavailableError("a real node cannot run on this machine; missing:\n  - "
                                   + "\n  - ".join(missing))


def mounts_under(folder: Path) -> list[str]:
    """Return the mount points at or below ``folder``, deepest first (from mountinfo)."""
    prefix = str(folder.resolve())
    found: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def _cgroup_hierarchies() -> list[Path]:
    """Return the cgroup v1 hierarchy roots (cgroup v2: the one unified root)."""
    roots: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split()
        sep = parts.index("-")
        if parts[sep + 1] in ("cgroup", "cgroup2"):
            roots.append(Path(parts[4]))
    return roots


def _remove_cgroup_tree(path: Path) -> None:
    """Remove an (empty of processes) cgroup folder and its children, deepest first."""
    if not path.is_dir():
        return
    children = sorted((p for p in path.rglob("*") if p.is_dir()),
                      key=lambda p: len(p.parts), reverse=True)
    for child in [*children, path]:
        with contextlib.suppress(OSError):
            child.rmdir()


@dataclass
class NodeFigures:
    """Timings for the docs: how long the node took to come up."""

    containerd_seconds: float = 0.0
    images_seconds: float = 0.0
    node_ready_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class RealNode:
    """containerd + kubelet joined to a running local cluster as Node ``localhost``.

    Args:
        cluster: the started :class:`LocalCluster` (duck-typed: ``dir``, ``server``,
            ``ca_file``, ``token_for``, ``kubectl``, ``_certs``, ``detach``).
        progress: where build and image progress is reported.
        start_timeout: seconds each of containerd and the kubelet may take.
        extra_images: more docker-archives to import before the node is Ready.

    """

    def __init__(self, cluster: Any, *, progress: build.Progress | None = None,
                 start_timeout: float = 120.0,
                 extra_images: tuple[images.ImageArchive, ...] = ()) -> None:
        self.cluster = cluster
        self.progress = progress or build.Progress()
        self.start_timeout = start_timeout
        self.extra_images = extra_images
        self.processes: list[ManagedProcess] = []
        self.figures = NodeFigures()
        self.dir = Path(cluster.dir) / "node"
        self.cgroup_name = f"joblease-{Path(cluster.dir).name}"
        self.binaries: dict[str, Path] = {}

    # -- paths ----------------------------------------------------------------------------

    @property
    def socket(self) -> Path:
        """The gRPC socket of containerd (also the kubelet's runtime endpoint)."""
        return self.dir / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's ``--root-dir`` (pod volumes live below it)."""
        return self.dir / "kubelet"

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this node's containerd, in the CRI namespace ``k8s.io``."""
        return subprocess.run([str(self.binaries["ctr"]), "--address", str(self.socket),
                               "--namespace", "k8s.io", *args], capture_output=True, text=True,
                              check=False, timeout=timeout)

    def import_image(self, archive: images.ImageArchive) -> None:
        """Import a docker-archive where the kubelet finds it (pods: imagePullPolicy Never)."""
        images.import_archive(self.binaries["ctr"], self.socket, archive)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start containerd and the kubelet, import the images, wait for Node Ready.

        Raises:
            NodeUnavailableError: root, runc, busybox-static, mmdebstrap or overlayfs is
                missing (the message lists each with the fix).
            ComponentStartError: containerd or the kubelet did not come up (log tail).

        """
        require_prerequisites()
        self.binaries = build.ensure_binaries(list(build.NODE), self.progress)
        pause = images.pause_archive()
        try:
            began = time.monotonic()
            self._write_files(pause.name)
            self._start_containerd()
            self.figures.containerd_seconds = time.monotonic() - began
            began = time.monotonic()
            for archive in (pause, *self.extra_images):
                self.import_image(archive)
            self.figures.images_seconds = time.monotonic() - began
            began = time.monotonic()
            self._make_cgroup_root()
            self._start_kubelet()
            self.figures.node_ready_seconds = time.monotonic() - began
        except BaseException:
            self.stop()
            raise

    def stop(self) -> list[str]:
        """Stop everything this node started; return what was left and could not go.

        Order: the kubelet (so it restarts nothing), the containers' tasks through
        containerd, containerd, the shims still serving our socket, then every mount
        below our folder, the cgroups and the folder itself.
        """
        for proc in reversed(self.processes):
            if proc.name == "containerd" and proc.running():
                self._kill_tasks()
            proc.stop()
        self.processes.clear()
        self._kill_shims()
        self._unmount_all()
        for root in _cgroup_hierarchies():
            _remove_cgroup_tree(root / self.cgroup_name)
        self._remove_container_log_links()
        return self.leftovers()

    def state(self) -> dict[str, Any]:
        """Describe the running node for ``joblease-localcluster down`` (JSON-able)."""
        return {"dir": str(self.dir), "ctr": str(self.binaries["ctr"]),
                "processes": [{"name": p.name, "pid": p.pid, "argv0": p.argv[0]}
                              for p in self.processes]}

    def leftovers(self) -> list[str]:
        """Return mounts, cgroups and shim processes of this node that still exist."""
        left = [f"mount {m}" for m in mounts_under(self.dir)] if self.dir.exists() else []
        left += [f"cgroup {root / self.cgroup_name}" for root in _cgroup_hierarchies()
                 if (root / self.cgroup_name).exists()]
        left += [f"process {pid}" for pid in self._shim_pids()]
        return left

    # -- containerd -----------------------------------------------------------------------

    def _write_files(self, pause_image: str) -> None:
        c = self.cluster._certs
        node = self.dir
        for sub in ("containerd/root", "containerd/state", "runc", "cni", "kubelet", "pki",
                    "pod-logs", "plugins"):
            (node / sub).mkdir(parents=True, exist_ok=True)
        (node / "cni" / "10-loopback.conflist").write_text(json.dumps(
            {"cniVersion": "1.0.0", "name": "host", "plugins": [{"type": "loopback"}]}))
        root, state = node / "containerd" / "root", node / "containerd" / "state"
        config = f"""version = 3
root = '{root}'
state = '{state}'
imports = []
[grpc]
  address = '{self.socket}'
[ttrpc]
  address = '{self.socket}.ttrpc'
[debug]
  level = 'info'
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{pause_image}'
[plugins.'io.containerd.cri.v1.runtime']
  # This machine lacks CAP_SYS_RESOURCE: without this every sandbox fails to start.
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '{RUNC}'
        Root = '{node / "runc"}'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{node / "cni"}']
    conf_dir = '{node / "cni"}'
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
[plugins.'io.containerd.internal.v1.opt']
  path = '{node / "plugins" / "opt"}'
[plugins.'io.containerd.nri.v1.nri']
  disable = true
"""
        (node / "containerd.toml").write_text(config)
        # The kubelet's identity: what the Node authorizer and NodeRestriction recognise.
        pair = certs.make_client_cert(c.ca, node / "pki", "kubelet-client",
                                      f"system:node:{NODE_NAME}", ["system:nodes"])
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": self.cluster.server, "certificate-authority": str(c.ca.cert)}}],
            "users": [{"name": "node", "user": {"client-certificate": str(pair.cert),
                                                "client-key": str(pair.key)}}],
            "contexts": [{"name": "node", "context": {"cluster": "local", "user": "node"}}],
            "current-context": "node"}
        (node / "kubelet.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        self.kubelet_port, self.kubelet_healthz = free_port(), free_port()
        kubelet_config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "failSwapOn": False, "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_name}",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": "127.0.0.1", "port": self.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.kubelet_healthz,
            "podLogsDir": str(node / "pod-logs"),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(c.ca.cert)}},
            "authorization": {"mode": "Webhook"},
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "registerNode": True,
            "volumePluginDir": str(node / "plugins" / "volume"),
            "localStorageCapacityIsolation": True,
        }
        (node / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config))

    def _start_containerd(self) -> None:
        argv = [str(self.binaries["containerd"]), "--config", str(self.dir / "containerd.toml")]
        # The shim and runc are found on PATH: ours first, then Debian's runc.
        path = f"{self.binaries['containerd-shim-runc-v2'].parent}:/usr/sbin:/usr/bin:/sbin:/bin"
        proc = ManagedProcess("containerd", argv, self.cluster.dir / "logs" / "containerd.log",
                              lambda: self.ctr("version", timeout=5).returncode == 0,
                              start_timeout=self.start_timeout,
                              detach=bool(getattr(self.cluster, "detach", False)),
                              env={"PATH": path})
        self.processes.append(proc)
        self.cluster.logs["containerd"] = proc.log_path
        proc.start()

    def _kill_tasks(self) -> None:
        """SIGKILL every container task, then delete tasks and containers (bounded)."""
        for _ in range(MAX_TEARDOWN_ROUNDS):
            listed = self.ctr("tasks", "list", "--quiet", timeout=30)
            ids = listed.stdout.split() if listed.returncode == 0 else []
            if not ids:
                break
            for task in ids:
                self.ctr("tasks", "kill", "--signal", "SIGKILL", "--all", task, timeout=30)
            time.sleep(0.5)
            for task in ids:
                self.ctr("tasks", "delete", "--force", task, timeout=30)
        listed = self.ctr("containers", "list", "--quiet", timeout=30)
        for container in listed.stdout.split() if listed.returncode == 0 else []:
            self.ctr("containers", "delete", container, timeout=30)

    def _shim_pids(self) -> list[int]:
        """PIDs of containerd-shim processes serving *our* socket (by their command line)."""
        marker = str(self.socket).encode()
        pids: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline.split(b"\0", 1)[0] and marker in cmdline:
                pids.append(int(entry.name))
        return pids

    def _kill_shims(self) -> None:
        for _ in range(MAX_TEARDOWN_ROUNDS):
            pids = self._shim_pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)

    # -- kubelet --------------------------------------------------------------------------

    def _make_cgroup_root(self) -> None:
        """Create our cgroupRoot in every hierarchy (the kubelet refuses a missing one)."""
        for root in _cgroup_hierarchies():
            with contextlib.suppress(OSError):
                (root / self.cgroup_name).mkdir(exist_ok=True)

    def _node_ready(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.cluster.ca_file))
        request = urllib.request.Request(f"{self.cluster.server}/api/v1/nodes/{NODE_NAME}")
        request.add_header("Authorization", f"Bearer {self.cluster.token_for('admin')}")
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            node = json.loads(response.read())
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in node.get("status", {}).get("conditions", []))

    def _start_kubelet(self) -> None:
        argv = [str(self.binaries["kubelet"]), f"--config={self.dir / 'kubelet.yaml'}",
                f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}",
                f"--root-dir={self.kubelet_root}", f"--cert-dir={self.dir / 'pki'}",
                f"--hostname-override={NODE_NAME}", "--v=1"]
        proc = ManagedProcess("kubelet", argv, self.cluster.dir / "logs" / "kubelet.log",
                              self._node_ready, ports={"port": self.kubelet_port},
                              start_timeout=self.start_timeout,
                              detach=bool(getattr(self.cluster, "detach", False)),
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        self.processes.append(proc)
        self.cluster.logs["kubelet"] = proc.log_path
        proc.start()

    # -- teardown helpers -----------------------------------------------------------------

    def _unmount_all(self) -> None:
        """Unmount every mount below our folder, deepest first; lazily if busy (bounded)."""
        if not self.dir.exists():
            return
        for attempt in range(MAX_TEARDOWN_ROUNDS):
            points = mounts_under(self.dir)
            if not points:
                return
            for point in points:
                flags = ["-l"] if attempt >= 2 else []
                subprocess.run(["umount", *flags, point], capture_output=True, check=False,
                               timeout=30)

    def _remove_container_log_links(self) -> None:
        """Remove the kubelet's /var/log/containers links that point into our folder.

        That folder is a constant in the kubelet (not configurable); only links whose
        target is below our pod-logs folder are ours.
        """
        logs = Path("/var/log/containers")
        if not logs.is_dir():
            return
        ours = str(self.dir / "pod-logs")
        for link in logs.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(ours):
                    link.unlink()


def stop_detached_node(state: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Stop a node that ``joblease-localcluster up --node`` left running (another process).

    The same order as :meth:`RealNode.stop`, with the recorded PIDs (each signalled only if
    ``/proc/PID/cmdline`` still names the recorded binary): the kubelet, the containers'
    tasks through containerd, containerd, the shims serving *our* socket, every mount below
    the node's folder, its cgroups and ``/var/log/containers`` links. It must run before the
    cluster's folder is removed: a folder with mounts below it cannot be.

    Returns:
        The processes stopped, and what is still left (mounts, cgroups, shims).

    """
    node_dir = Path(state["dir"])
    node = RealNode(_FolderOnly(node_dir.parent))
    node.binaries = {"ctr": Path(state["ctr"])}
    recorded = {p["name"]: p for p in state.get("processes", [])}
    stopped: list[str] = []

    def stop(name: str) -> None:
        entry = recorded.get(name)
        if entry and stop_pid(int(entry["pid"]), str(entry["argv0"])):
            stopped.append(f"{name} (pid {entry['pid']})")

    stop("kubelet")
    containerd = recorded.get("containerd")
    if containerd and pid_matches(int(containerd["pid"]), str(containerd["argv0"])):
        node._kill_tasks()
    stop("containerd")
    node._kill_shims()
    node._unmount_all()
    for root in _cgroup_hierarchies():
        _remove_cgroup_tree(root / node.cgroup_name)
    node._remove_container_log_links()
    return stopped, node.leftovers()


@dataclass(frozen=True)
class _FolderOnly:
    """The one thing :class:`RealNode` needs of a cluster to tear a node down: its folder."""

    dir: Path


__all__ = ["NODE_NAME", "NodeUnavailableError", "RealNode", "missing_prerequisites",
           "mounts_under", "require_prerequisites", "stop_detached_node"]
