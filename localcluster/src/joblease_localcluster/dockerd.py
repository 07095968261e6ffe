"""Debian's ``dockerd`` as a process of ours, for kind (issue 32, docs/kind.md).

There is no systemd on this machine or CI's, and the engine must not change the host's
networking: the other tests bind 127.0.0.1 and the machine reaches its package registries
through the host's own routes. So the daemon is started with:

* its data root, exec root (the containerd it starts, its sockets), pidfile and socket in
  one folder under the cache: nothing in ``/var/lib/docker`` or ``/var/run``, and two
  daemons (two folders) never meet;
* ``--iptables=false --ip-masq=false --ip-forward=false``: dockerd otherwise rewrites the
  host's filter and nat tables (its ``DOCKER`` chains, a MASQUERADE rule, and the FORWARD
  chain's policy set to DROP while it turns on ``net.ipv4.ip_forward``). kind's nodes
  talk to each other on one bridge (layer 2, no forwarding) and the kubeconfig reaches
  the API server through ``docker-proxy`` (the userland proxy listens on 127.0.0.1 and
  connects to the node's bridge address), so none of that is needed; a container then
  has no route out, which an offline cluster does not miss;
* ``--bridge=none``: no ``docker0``; kind makes its own network (``kind``);
* ``--config-file`` pointing at our own empty file, so an ``/etc/docker/daemon.json``
  of the machine cannot change any of the above.

The daemon is stopped by the PID we started (SIGTERM; it stops its containers and its
containerd), never by name.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from joblease_localcluster import build
from joblease_localcluster.node import _cgroup_hierarchies, mounts_under
from joblease_localcluster.process import ManagedProcess

DOCKERD = Path("/usr/sbin/dockerd")
DOCKER = Path("/usr/bin/docker")
# The flags that keep the host's network as it is (see the module docstring).
NETWORK_FLAGS = ("--iptables=false", "--ip-masq=false", "--ip-forward=false", "--bridge=none")
CGROUP_PARENT = "/joblease-docker"
KIND_NETWORK = "kind"


class DockerUnavailableError(RuntimeError):
    """dockerd cannot run here; the message names what is missing and the fix."""


def engine_dir() -> Path:
    """Return the folder of joblease's Docker engine (data root, sockets, log)."""
    return build.cache_dir() / "docker"


def dockerd_argv(folder: Path) -> list[str]:
    """Return dockerd's command line for an engine living in ``folder``."""
    return [str(DOCKERD), "--host", f"unix://{folder / 'docker.sock'}",
            "--data-root", str(folder / "root"), "--exec-root", str(folder / "run"),
            "--pidfile", str(folder / "dockerd.pid"), "--config-file", str(folder / "daemon.json"),
            "--storage-driver", "overlay2", "--exec-opt", "native.cgroupdriver=cgroupfs",
            "--cgroup-parent", CGROUP_PARENT, *NETWORK_FLAGS]


class DockerEngine:
    """dockerd started and stopped by us; ``env`` points the docker CLI (and kind) at it."""

    def __init__(self, folder: Path | None = None, start_timeout: float = 60.0) -> None:
        self.dir = folder or engine_dir()
        self.start_timeout = start_timeout
        self.process: ManagedProcess | None = None

    @property
    def host(self) -> str:
        """``DOCKER_HOST`` for this engine."""
        return f"unix://{self.dir / 'docker.sock'}"

    def env(self) -> dict[str, str]:
        """Environment for the docker CLI and kind: this engine, no user config."""
        return {"DOCKER_HOST": self.host, "DOCKER_CONFIG": str(self.dir / "client")}

    def docker(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run Debian's docker CLI against this engine."""
        return subprocess.run([str(DOCKER), *args], capture_output=True, text=True,
                              check=False, timeout=timeout, env={**os.environ, **self.env()})

    def start(self) -> None:
        """Start dockerd and wait until ``docker info`` answers.

        Raises:
            DockerUnavailableError: Debian's docker.io is not installed, or we are not root.
            ComponentStartError: dockerd did not come up (its log tail is in the message).

        """
        if not DOCKERD.is_file() or not DOCKER.is_file():
            raise DockerUnavailableError(
                f"{DOCKERD} / {DOCKER} missing: install Debian's docker.io "
                "(`.ci/os-packages kind` does, as root)")
        if os.geteuid() != 0:
            raise DockerUnavailableError("dockerd needs root (run `sudo -E make e2e-kind`)")
        (self.dir / "client").mkdir(parents=True, exist_ok=True)
        config = self.dir / "daemon.json"
        if not config.is_file():
            config.write_text("{}\n")
        self.process = ManagedProcess(
            "dockerd", dockerd_argv(self.dir), self.dir / "dockerd.log",
            lambda: self.docker("info", timeout=10).returncode == 0,
            start_timeout=self.start_timeout, stop_timeout=60,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        self.process.start()

    def stop(self) -> list[str]:
        """Stop dockerd by the PID we started; remove what it leaves; return what is left.

        dockerd stops its containers and its containerd, but leaves kind's network bridge
        (a ``br-…`` link on the host), the bind mount of the host's network namespace in
        its exec root, and its empty ``--cgroup-parent`` folders (all measured here).
        """
        if self.process is not None and self.process.running():
            self.docker("network", "rm", KIND_NETWORK, timeout=60)
            self.process.stop()
        for point in mounts_under(self.dir / "run"):
            subprocess.run(["umount", point], capture_output=True, check=False, timeout=30)
        for hierarchy in _cgroup_hierarchies():
            with contextlib.suppress(OSError):
                (hierarchy / CGROUP_PARENT.lstrip("/")).rmdir()
        return self.leftovers()

    def leftovers(self) -> list[str]:
        """Mounts below the exec root and cgroup folders of ours that still exist."""
        left = [f"mount {m}" for m in mounts_under(self.dir / "run")] \
            if (self.dir / "run").exists() else []
        left += [f"cgroup {h / CGROUP_PARENT.lstrip('/')}" for h in _cgroup_hierarchies()
                 if (h / CGROUP_PARENT.lstrip("/")).exists()]
        return left


__all__ = ["DOCKER", "DOCKERD", "NETWORK_FLAGS", "DockerEngine", "DockerUnavailableError",
           "dockerd_argv", "engine_dir"]
