"""Container images for the real node, made on this machine: no registry, no Docker engine.

Two images are made from Debian's own packages and imported with ``ctr images import``:

* the **pause** image (the pod sandbox): Debian's ``busybox-static`` binary and a shell
  loop that sleeps until SIGTERM. Any process that waits forever will do; busybox is
  one static file, so the image is a few hundred KB and builds in milliseconds.
* the **Python base** (``localhost/joblease-python-base``): Debian bookworm + Python 3.11
  made by ``mmdebstrap`` with the machine's apt sources. It is the ``FROM`` of the
  project's Dockerfile when built here with BuildKit (see :mod:`joblease_localcluster.buildkit`)
  and the image the node tests' worker pods run.

Both are written as docker-archive tarballs (``manifest.json`` + ``config.json`` + one
``layer.tar``), which ``ctr images import`` reads. Layers are written deterministically
(sorted, mtime 0, owner 0:0), so re-making an unchanged rootfs yields the same digests
and a re-import is a no-op. Archives are cached under ``<cache>/images/``.

Why pinned package versions: an image made "from whatever bookworm has today" changes
when Debian publishes a point release; the tests would then run on an interpreter nobody
chose. A version the archive no longer carries fails loudly (mmdebstrap names it), which
is the moment to move the pin.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from joblease_localcluster import build

PAUSE_IMAGE = "localhost/joblease-pause:1"
BASE_SUITE = "bookworm"
# Exact versions from Debian 12 (bookworm); see the module docstring for why they are pinned.
BASE_PACKAGES = ("python3=3.11.2-1+b1", "python3-venv=3.11.2-1+b1",
                 "python-is-python3=3.11.2-1+deb12u1", "ca-certificates=20250419~deb12u2")
BASE_TAG = "3.11.2-" + hashlib.sha256(" ".join(BASE_PACKAGES).encode()).hexdigest()[:8]
BASE_IMAGE = f"localhost/joblease-python-base:{BASE_TAG}"
# The pause process: sleep forever, exit at once on SIGTERM (it is PID 1 of the sandbox,
# which ignores signals it has no handler for).
PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
BUSYBOX = Path("/bin/busybox")
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")


class ImageError(RuntimeError):
    """An image could not be made or imported; the message names the missing tool."""


@dataclass(frozen=True)
class ImageArchive:
    """A docker-archive tarball and the name it imports as."""

    name: str
    path: Path


def _images_dir() -> Path:
    path = build.cache_dir() / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _layer_from_dir(rootfs: Path, layer: Path) -> None:
    """Write ``rootfs`` as a deterministic tar (sorted names, mtime 0, root-owned)."""
    with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tar:
        entries = sorted(rootfs.rglob("*"))
        for path in entries:  # bounded: the files of one small rootfs
            tar.add(path, arcname=str(path.relative_to(rootfs)), recursive=False, filter=_reset)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_archive(name: str, layers: Sequence[Path], config: dict[str, object], out: Path
                  ) -> None:
    """Write a docker-archive of ``layers`` (bottom first).

    Both ``ctr images import`` (the real node's images, the images inside kind's node) and
    ``docker load`` (kind's node image itself) read this format, so one writer serves all.
    """
    diff_ids = [f"sha256:{_sha256(layer)}" for layer in layers]
    image_config = {"architecture": "amd64", "os": "linux", "config": config,
                    "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    names = [f"layer{i}.tar" for i in range(len(layers))]
    manifest = json.dumps([{"Config": "config.json", "RepoTags": [name],
                            "Layers": names}]).encode()
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        for arcname, data in (("config.json", config_bytes), ("manifest.json", manifest)):
            info = _reset(tarfile.TarInfo(arcname))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for arcname, layer in zip(names, layers, strict=True):
            tar.add(layer, arcname=arcname, filter=_reset)
    tmp.rename(out)


def _is_static(binary: Path) -> bool:
    """Whether an ELF file has no program interpreter (statically linked)."""
    try:
        data = binary.read_bytes()[:1 << 16]
    except OSError:
        return False
    return data[:4] == b"\x7fELF" and b"/lib64/ld-linux" not in data and b"ld-linux" not in data


def pause_archive() -> ImageArchive:
    """Return the pause image archive, made from Debian's ``busybox-static`` when missing.

    Raises:
        ImageError: ``/bin/busybox`` is missing or dynamically linked.

    """
    out = _images_dir() / "pause-1.tar"
    if out.is_file():
        return ImageArchive(PAUSE_IMAGE, out)
    if not _is_static(BUSYBOX):
        raise ImageError(f"{BUSYBOX} is missing or not static: the pause image is made from "
                         "Debian's busybox-static (apt-get install busybox-static)")
    with tempfile.TemporaryDirectory(prefix="joblease-pause-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
        for applet in ("sh", "sleep"):
            (rootfs / "bin" / applet).symlink_to("busybox")
        layer = Path(tmp) / "layer.tar"
        _layer_from_dir(rootfs, layer)
        write_archive(PAUSE_IMAGE, [layer], {"Entrypoint": ["/bin/sh", "-c", PAUSE_SCRIPT]}, out)
    return ImageArchive(PAUSE_IMAGE, out)


def extra_ca_files() -> list[Path]:
    """Return the machine's locally added CA certificates (an egress proxy's, for example).

    pip inside a build reaches PyPI through the same network as this machine; when that
    network re-signs TLS with a local CA, the base image must trust it too.
    """
    if not EXTRA_CA_DIR.is_dir():
        return []
    return sorted(p for p in EXTRA_CA_DIR.glob("*.crt") if p.is_file())


def base_archive(progress: build.Progress | None = None) -> ImageArchive:
    """Return the Python base image archive, made with ``mmdebstrap`` when missing (~30 s).

    Raises:
        ImageError: ``mmdebstrap`` is missing or failed (its output is in the message).

    """
    progress = progress or build.Progress()
    out = _images_dir() / f"python-base-{BASE_TAG}.tar"
    if out.is_file():
        return ImageArchive(BASE_IMAGE, out)
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise ImageError("`mmdebstrap` is not installed; it makes the Python base image from "
                         "Debian's packages (apt-get install mmdebstrap)")
    cas = extra_ca_files()
    hooks: list[str] = []
    for ca in cas:
        hooks += ["--customize-hook",
                  f'copy-in {ca} /usr/local/share/ca-certificates/',
                  ]
    if cas:
        hooks += ["--customize-hook", 'chroot "$1" update-ca-certificates']
    with tempfile.TemporaryDirectory(prefix="joblease-base-") as tmp:
        layer = Path(tmp) / "layer.tar"
        cmd = [exe, "--variant=apt", "--mode=root", "--format=tar",
               f"--include={','.join(BASE_PACKAGES)}", *hooks,
               # No apt lists or caches in the image: smaller and no stale indexes.
               "--customize-hook", 'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
               BASE_SUITE, str(layer)]
        with progress.step(f"making {BASE_IMAGE} with mmdebstrap"):
            result = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                    env={**os.environ, "SOURCE_DATE_EPOCH": "0"}, timeout=900)
        if result.returncode != 0:
            raise ImageError(f"mmdebstrap failed ({' '.join(cmd)}):\n{result.stderr[-4000:]}")
        env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "LANG=C.UTF-8"]
        if cas:
            env += ["PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
                    "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"]
        write_archive(BASE_IMAGE, [layer], {"Env": env, "Cmd": ["python3"]}, out)
    return ImageArchive(BASE_IMAGE, out)


def import_archive(ctr: Path, socket: Path, archive: ImageArchive, namespace: str = "k8s.io"
                   ) -> None:
    """Import a docker-archive into containerd's ``namespace`` (the CRI plugin's is k8s.io).

    Raises:
        ImageError: ``ctr`` refused it (its output is in the message).

    """
    result = subprocess.run([str(ctr), "--address", str(socket), "--namespace", namespace,
                             "images", "import", str(archive.path)],
                            capture_output=True, text=True, check=False, timeout=600)
    if result.returncode != 0:
        raise ImageError(f"ctr images import {archive.path} failed:\n{result.stderr[-3000:]}")


def image_size(path: Path) -> int:
    """Return the size in bytes of an image archive (for the figures in the docs)."""
    return path.stat().st_size


__all__ = ["BASE_IMAGE", "PAUSE_IMAGE", "ImageArchive", "ImageError", "base_archive",
           "extra_ca_files", "image_size", "import_archive", "pause_archive", "write_archive"]
