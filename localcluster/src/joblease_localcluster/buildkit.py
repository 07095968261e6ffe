"""Build the project's Dockerfile on the real node with BuildKit (no Docker engine, no registry).

``buildkitd`` runs with the **containerd worker** on the node's own containerd, namespace
``k8s.io``: an image it builds lands in the store the kubelet reads, so a pod can run it
with ``imagePullPolicy: Never`` straight away, with no export/import step.

The Dockerfile's ``FROM ${PYTHON_IMAGE}`` is served from a local OCI layout: the Python
base made by ``mmdebstrap`` (:mod:`joblease_localcluster.images`) is exported from
containerd once into ``<cache>/images/oci-<tag>/`` and named to the Dockerfile frontend
with ``--oci-layout base=DIR --opt context:NAME=oci-layout://base@sha256:…``. Elsewhere the
same Dockerfile builds with ``docker build`` against the public ``python:3.11.*-slim``
image (the build arg's default): one Dockerfile, two bases.

Traps handled here:
    * ``# syntax=docker/dockerfile:1.7`` would make the frontend *pull* that image; the
      ``cmdline`` option tells the built-in frontend to parse the file itself.
    * BuildKit runs the first ``runc`` on its PATH: it must be Debian's (with seccomp),
      or every ``RUN`` fails with "seccomp not supported"; PATH is set accordingly.
    * The build cache of the containerd worker lives in the node's (temporary) containerd,
      so it is also exported to ``<cache>/buildkit-cache`` (``type=local``) and imported by
      the next build: a second build of an unchanged tree takes seconds across sessions.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from joblease_localcluster import build, images
from joblease_localcluster.node import RealNode
from joblease_localcluster.process import ManagedProcess


class BuildKitError(RuntimeError):
    """A BuildKit build failed; the message carries buildctl's output tail."""


@dataclass(frozen=True)
class BuiltImage:
    """An image BuildKit stored in the node's containerd, and how long the build took."""

    name: str
    seconds: float
    size_bytes: int


def _layout_digest(layout: Path) -> str:
    index = json.loads((layout / "index.json").read_text())
    digest: str = index["manifests"][0]["digest"]
    return digest


class BuildKit:
    """``buildkitd`` on a :class:`RealNode`'s containerd (start it, build, stop it by PID).

    Args:
        node: the started node whose containerd (namespace ``k8s.io``) receives images.
        progress: where build progress is reported.

    """

    def __init__(self, node: RealNode, progress: build.Progress | None = None) -> None:
        self.node = node
        self.progress = progress or build.Progress()
        self.dir = node.dir / "buildkit"
        self.socket = self.dir / "buildkitd.sock"
        self.binaries: dict[str, Path] = {}
        self.process: ManagedProcess | None = None

    def buildctl(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        """Run ``buildctl`` against our daemon."""
        return subprocess.run([str(self.binaries["buildctl"]), "--addr", f"unix://{self.socket}",
                               *args], capture_output=True, text=True, check=False,
                              timeout=timeout)

    def start(self) -> None:
        """Start buildkitd (containerd worker, namespace k8s.io) and wait until it answers.

        Raises:
            ComponentStartError: buildkitd did not come up (its log tail is in the message).

        """
        self.binaries = build.ensure_binaries(list(build.BUILDKIT_COMMANDS), self.progress)
        self.dir.mkdir(parents=True, exist_ok=True)
        argv = [str(self.binaries["buildkitd"]), "--root", str(self.dir / "root"),
                "--addr", f"unix://{self.socket}", "--oci-worker=false",
                "--containerd-worker=true", f"--containerd-worker-addr={self.node.socket}",
                "--containerd-worker-namespace=k8s.io", "--containerd-worker-net=host",
                "--containerd-worker-snapshotter=overlayfs"]
        self.process = ManagedProcess(
            "buildkitd", argv, self.node.cluster.dir / "logs" / "buildkitd.log",
            lambda: self.buildctl("debug", "workers", timeout=5).returncode == 0,
            start_timeout=60, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        self.node.cluster.logs["buildkitd"] = self.process.log_path
        self.process.start()

    def stop(self) -> None:
        """Stop buildkitd (by its PID); its mounts go with the node's folder."""
        if self.process is not None:
            self.process.stop()

    def base_layout(self) -> Path:
        """Return the Python base as an OCI layout folder (exported from containerd once)."""
        layout = build.cache_dir() / "images" / f"oci-{images.BASE_TAG}"
        if (layout / "index.json").is_file():
            return layout
        tmp_tar = layout.with_suffix(".tar")
        out = self.node.ctr("images", "export", str(tmp_tar), images.BASE_IMAGE)
        if out.returncode != 0:
            raise BuildKitError(f"ctr images export {images.BASE_IMAGE} failed:\n{out.stderr}")
        staging = layout.with_suffix(".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        with tarfile.open(tmp_tar) as tar:
            tar.extractall(staging, filter="data")
        tmp_tar.unlink()
        staging.rename(layout)
        return layout

    def build_dockerfile(self, context: Path, name: str, *, dockerfile: Path | None = None
                         ) -> BuiltImage:
        """Build ``context``'s Dockerfile FROM the local base; store it as ``name``.

        Raises:
            BuildKitError: buildctl failed (its output tail is in the message).

        """
        layout = self.base_layout()
        digest = _layout_digest(layout)
        cache = build.cache_dir() / "buildkit-cache" / urllib.parse.quote(name, safe="")
        cache.mkdir(parents=True, exist_ok=True)
        args = ["build", "--frontend", "dockerfile.v0",
                "--local", f"context={context}",
                "--local", f"dockerfile={(dockerfile or context / 'Dockerfile').parent}",
                "--oci-layout", f"base={layout}",
                "--opt", "cmdline=built-in",  # ignore `# syntax=`: never pull a frontend
                "--opt", f"build-arg:PYTHON_IMAGE={images.BASE_IMAGE}",
                "--opt", f"context:{images.BASE_IMAGE}=oci-layout://base@{digest}",
                "--output", f"type=image,name={name},unpack=true",
                "--import-cache", f"type=local,src={cache}",
                "--export-cache", f"type=local,dest={cache},mode=max"]
        if not (cache / "index.json").is_file():
            args = [a for a in args if not a.startswith("type=local,src=")]
            args.remove("--import-cache")
        began = time.monotonic()
        with self.progress.step(f"buildctl build {name}"):
            out = self.buildctl(*args)
        if out.returncode != 0:
            raise BuildKitError(f"buildctl build {name} failed:\n{out.stderr[-5000:]}")
        seconds = time.monotonic() - began
        return BuiltImage(name, seconds, self.image_size(name))

    def image_size(self, name: str) -> int:
        """Compressed size of ``name`` in containerd (what ``ctr images ls`` shows)."""
        out = self.node.ctr("images", "ls")
        for line in out.stdout.splitlines()[1:]:
            cols = line.split()
            if cols and cols[0] == name:
                size, unit = float(cols[3]), cols[4]
                scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}.get(unit, 1)
                return int(size * scale)
        return 0


__all__ = ["BuildKit", "BuildKitError", "BuiltImage"]
