"""A kind node image made on this machine: no registry, every part from a module or Debian.

kind's own ``kind build node-image`` starts its published base image and pulls the
control-plane images from a registry; neither is reachable here. This module makes the
same image from parts (docs/kind.md has the table, with what each is made from):

* the **root filesystem**: ``mmdebstrap`` of Debian with the packages kind's base image
  installs (systemd, iptables, conntrack, ...) and Debian's ``runc`` (with seccomp);
* kind's **base files** (entrypoint, containerd and kubelet units, containerd's config)
  copied verbatim from the ``sigs.k8s.io/kind`` module, so no kind file is kept here;
* **binaries** built from their Go modules by :mod:`joblease_localcluster.build`:
  containerd + shim + ctr, crictl, the CNI plugins, kubeadm, kubelet, kubectl;
* **images** under containerd's store in ``/var/lib/containerd`` (what kind's build does
  with ``ctr images import``): kube-apiserver, kube-controller-manager, kube-scheduler,
  kube-proxy and etcd wrapping the same binaries the local control plane runs, tagged as
  ``kubeadm config images list`` names them; pause from Debian's busybox-static.

Each part is cached under ``<cache>/kind/`` and reported with a progress line, as
``make test`` reports its builds. A part that cannot be made raises :class:`PartMissing`
naming it and why, so ``make e2e-kind`` fails with that name, never silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from joblease_localcluster import build, images
from joblease_localcluster.images import write_archive
from joblease_localcluster.process import ManagedProcess

# bookworm, not kind's trixie: trixie's systemd (257) refuses to boot on a cgroup v1 host,
# and this machine and CI's are cgroup v1 (bookworm's systemd 252 boots there).
NODE_SUITE = "bookworm"
# What kind v0.33.0's images/base/Dockerfile installs with apt, plus Debian's runc (kind
# builds runc with cgo + libseccomp; the module's runc without cgo lacks seccomp).
NODE_PACKAGES = (
    "systemd", "conntrack", "iptables", "nftables", "iproute2", "ethtool", "util-linux",
    "mount", "kmod", "libseccomp2", "pigz", "fuse-overlayfs", "nfs-common", "open-iscsi",
    "e2fsprogs", "bash", "ca-certificates", "curl", "jq", "procps", "runc",
)
NODE_IMAGE_REPO = "localhost/joblease-kind-node"
# The pod network when kindnetd's image is not made: the bridge plugin, one node.
POD_SUBNET = "10.244.0.0/16"
BRIDGE_CONFLIST = {
    "cniVersion": "1.0.0", "name": "kind-bridge",
    "plugins": [
        {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
         "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]],
                  "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}
# Binaries and where kind's node image keeps them.
NODE_BINARIES = {
    "containerd": "usr/local/bin", "containerd-shim-runc-v2": "usr/local/bin",
    "ctr": "usr/local/bin", "crictl": "usr/local/bin",
    "kubeadm": "usr/bin", "kubelet": "usr/bin", "kubectl": "usr/bin",
    **{plugin: "opt/cni/bin" for plugin in build.CNI_PLUGINS},
}
# The image's entrypoint, in front of kind's. Without --privileged (the docker shim) docker
# mounts the cgroup v1 hierarchies read-only, and kind's entrypoint then fails at once
# ("mkdir: cannot create directory '/sys/fs/cgroup/cpu//kubelet': Read-only file system").
# A bind remount makes each writable (a plain `remount,rw` answers "mount point is busy").
ENTRYPOINT_WRAPPER = """#!/bin/sh
# joblease (docs/kind.md): the cgroup mounts writable, as --privileged would leave them.
set -eu
if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
  for hierarchy in /sys/fs/cgroup/*/; do
    mount -o remount,bind,rw "$hierarchy"
  done
fi
exec "$@"
"""
ENTRYPOINT = ["/usr/local/bin/joblease-cgroup-rw", "/usr/local/bin/entrypoint", "/sbin/init"]
CONTROL_PLANE_IMAGES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
# The etcd image's tag: the release the local control plane runs, in kubeadm's form.
ETCD_TAG = build.ETCD_VERSION.lstrip("v") + "-0"


class PartMissing(RuntimeError):  # noqa: N818 - reads as the sentence it reports
    """A part of the node image cannot be made here; the message names it and why."""

    def __init__(self, part: str, why: str) -> None:
        self.part = part
        self.why = why
        super().__init__(f"kind node image: part {part!r} cannot be made: {why}")


def kind_dir() -> Path:
    """Return the cache folder of the kind parts (root filesystem, image archives)."""
    path = build.cache_dir() / "kind"
    path.mkdir(parents=True, exist_ok=True)
    return path


def kind_module() -> Path:
    """Return the unpacked ``sigs.k8s.io/kind`` module (downloaded once by Go)."""
    src = build.cache_dir() / "src" / f"kind-{build.KIND_VERSION}"
    src.mkdir(parents=True, exist_ok=True)
    return build._module_dir(f"sigs.k8s.io/kind@{build.KIND_VERSION}", src)


# -- image archives -------------------------------------------------------------------


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def binary_layer(files: dict[str, Path], layer: Path) -> None:
    """Write a layer holding ``files`` (path in the image → file here), plus ``/tmp``."""
    with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in files} | {"tmp"})
        for folder in dirs:  # bounded: a handful of folders
            parts = Path(folder).parts
            for depth in range(1, len(parts) + 1):
                info = _reset(tarfile.TarInfo("/".join(parts[:depth])))
                info.type = tarfile.DIRTYPE
                info.mode = 0o1777 if folder == "tmp" else 0o755
                if info.name not in tar.getnames():
                    tar.addfile(info)
        for arcname, source in sorted(files.items()):
            tar.add(source, arcname=arcname, filter=_reset)


def binary_image(name: str, files: dict[str, Path], config: dict[str, object],
                 base_layers: Sequence[Path] = ()) -> Path:
    """Return (making once) an archive of ``base_layers`` + a layer holding ``files``."""
    key = hashlib.sha256(json.dumps([name, sorted((k, str(v)) for k, v in files.items()),
                                     config, [str(b) for b in base_layers]]).encode())
    out = kind_dir() / "images" / f"{name.rsplit('/', 1)[-1].replace(':', '-')}-" \
                                  f"{key.hexdigest()[:8]}.tar"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="joblease-kind-img-") as tmp:
        layer = Path(tmp) / "layer.tar"
        binary_layer(files, layer)
        write_archive(name, [*base_layers, layer], config, out)
    return out


# -- kubeadm's list of images ---------------------------------------------------------


def kubeadm_images(kubeadm: Path) -> list[str]:
    """Return the images kubeadm needs for our Kubernetes version (registry names).

    Raises:
        PartMissing: kubeadm could not list them (its output is in the message).

    """
    out = subprocess.run([str(kubeadm), "config", "images", "list", "--kubernetes-version",
                          build.KUBERNETES_VERSION], capture_output=True, text=True,
                         check=False, timeout=120)
    if out.returncode != 0:
        raise PartMissing("kubeadm", f"`kubeadm config images list` failed: {out.stderr[-800:]}")
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def image_for(required: list[str], short: str) -> str:
    """Return the entry of kubeadm's list whose repository ends in ``/short``."""
    for ref in required:
        if ref.rsplit(":", 1)[0].rsplit("/", 1)[-1] == short:
            return ref
    raise PartMissing(short, f"kubeadm's image list names no {short}: {required}")


# -- the root filesystem --------------------------------------------------------------


@contextmanager
def _step(progress: build.Progress, what: str) -> Iterator[None]:
    with progress.step(what):
        yield


def node_rootfs_tar(progress: build.Progress) -> Path:
    """Return (making once, ~2 min) the Debian root filesystem tar of a kind node.

    Raises:
        PartMissing: mmdebstrap is missing or failed.

    """
    key = hashlib.sha256(" ".join((NODE_SUITE, *NODE_PACKAGES)).encode()).hexdigest()[:8]
    out = kind_dir() / f"node-rootfs-{NODE_SUITE}-{key}.tar"
    if out.is_file():
        return out
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise PartMissing("root filesystem", "mmdebstrap is not installed (.ci/os-packages kind)")
    cmd = [exe, "--variant=minbase", "--mode=root", "--format=tar",
           f"--include={','.join(NODE_PACKAGES)}",
           "--customize-hook", 'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
           NODE_SUITE, str(out.with_suffix(".tmp"))]
    with _step(progress, f"making the kind node's root filesystem ({NODE_SUITE}) with "
                         "mmdebstrap"):
        result = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                env={**os.environ, "SOURCE_DATE_EPOCH": "0"}, timeout=1800)
    if result.returncode != 0:
        raise PartMissing("root filesystem", f"mmdebstrap failed:\n{result.stderr[-3000:]}")
    out.with_suffix(".tmp").rename(out)
    return out


# -- containerd's store inside the image ----------------------------------------------


def import_into_store(store: Path, archives: Sequence[Path], progress: build.Progress) -> None:
    """Import ``archives`` into a containerd store folder (the node's /var/lib/containerd).

    The cached containerd runs on that folder for the import only (its socket and state in
    a temporary folder), as kind's build runs containerd inside its build container; the
    images are not unpacked (the node's containerd unpacks on first use).
    """
    binaries = build.ensure_binaries(list(build.CONTAINERD_COMMANDS), progress)
    with tempfile.TemporaryDirectory(prefix="jl-kind-ctd-", dir="/tmp") as tmp:
        sock = Path(tmp) / "c.sock"
        config = Path(tmp) / "config.toml"
        config.write_text(f"version = 3\nroot = '{store}'\nstate = '{tmp}/state'\n"
                          f"[grpc]\n  address = '{sock}'\n[ttrpc]\n  address = '{sock}.ttrpc'\n"
                          "[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n")

        def ctr(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(binaries["ctr"]), "--address", str(sock),
                                   "--namespace", "k8s.io", *args], capture_output=True,
                                  text=True, check=False, timeout=600)

        proc = ManagedProcess("containerd (image import)",
                              [str(binaries["containerd"]), "--config", str(config)],
                              Path(tmp) / "containerd.log",
                              lambda: ctr("version").returncode == 0, start_timeout=60)
        proc.start()
        try:
            for archive in archives:  # bounded: the dozen images of one node
                with _step(progress, f"importing {archive.name} into the node's containerd"):
                    out = ctr("images", "import", "--no-unpack", "--all-platforms",
                              str(archive))
                if out.returncode != 0:
                    raise PartMissing(archive.name, f"ctr images import failed: {out.stderr}")
        finally:
            proc.stop()


# -- assembly -------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeImage:
    """A node image archive and the name ``kind create cluster --image`` takes."""

    name: str
    archive: Path
    seconds: float


def _copy_base_files(module: Path, rootfs: Path) -> None:
    """Copy kind's images/base/files into the root filesystem, with the Dockerfile's modes."""
    files = module / "images" / "base" / "files"
    for source in sorted(p for p in files.rglob("*") if p.is_file()):
        rel = source.relative_to(files)
        target = rootfs / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(0o755 if rel.parts[:3] == ("usr", "local", "bin") or
                     rel.parts[:2] == ("kind", "bin") else 0o644)
    for folder in (rootfs / "kind", rootfs / "kind" / "bin"):
        folder.chmod(0o755)


def _cri_base_spec(ctr: Path, rootfs: Path) -> None:
    """Write /etc/containerd/cri-base.json as kind's Dockerfile does (``ctr oci spec`` + jq).

    The product-files hook makes each pod see its own product_uuid; rlimits are dropped so
    containers inherit the node's (setting them needs CAP_SYS_RESOURCE, which is missing).
    """
    out = subprocess.run([str(ctr), "oci", "spec"], capture_output=True, text=True,
                         check=False, timeout=60)
    if out.returncode != 0:
        raise PartMissing("cri-base.json", f"ctr oci spec failed: {out.stderr}")
    spec = json.loads(out.stdout)
    hooks = spec.setdefault("hooks", {}).setdefault("createContainer", [])
    hooks.append({"path": "/kind/bin/mount-product-files.sh"})
    spec.get("process", {}).pop("rlimits", None)
    (rootfs / "etc" / "containerd" / "cri-base.json").write_text(json.dumps(spec, indent=2))


def _chroot(rootfs: Path, *argv: str) -> None:
    out = subprocess.run(["chroot", str(rootfs), *argv], capture_output=True, text=True,
                         check=False, timeout=300)
    if out.returncode != 0:
        raise PartMissing("root filesystem", f"chroot {' '.join(argv)} failed: {out.stderr}")


def _systemd_as_kind_does(rootfs: Path) -> None:
    """The systemd clean-up of kind's base Dockerfile: no units a container cannot run."""
    lib = rootfs / "lib" / "systemd" / "system"
    for pattern in ("sysinit.target.wants/systemd-tmpfiles-setup.service",
                    "multi-user.target.wants/*", "local-fs.target.wants/*",
                    "sockets.target.wants/*udev*", "sockets.target.wants/*initctl*",
                    "basic.target.wants/*"):
        for path in lib.glob(pattern):
            path.unlink()
    for path in (rootfs / "etc" / "systemd" / "system").glob("*.wants/*"):
        path.unlink()
    with (rootfs / "etc" / "systemd" / "journald.conf").open("a") as conf:
        conf.write("ReadKMsg=no\n")
    init = rootfs / "sbin" / "init"
    if not init.is_symlink() and not init.exists():
        init.symlink_to("/usr/lib/systemd/systemd")
    (rootfs / "etc" / "kubernetes" / "manifests").mkdir(parents=True, exist_ok=True)
    _chroot(rootfs, "systemctl", "enable", "kubelet.service", "containerd.service",
            "undo-mount-hacks.service")
    _chroot(rootfs, "systemctl", "mask", "systemd-binfmt.service")


def _install_binaries(rootfs: Path, binaries: dict[str, Path]) -> None:
    for name, folder in NODE_BINARIES.items():
        target = rootfs / folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(binaries[name], target)
        target.chmod(0o755)


def _pod_network(rootfs: Path) -> None:
    """A bridge CNI configuration in the image (kind's default kindnetd is not made here)."""
    net_d = rootfs / "etc" / "cni" / "net.d"
    net_d.mkdir(parents=True, exist_ok=True)
    (net_d / "10-bridge.conflist").write_text(json.dumps(BRIDGE_CONFLIST, indent=2) + "\n")


def containerd_config(text: str, pause: str) -> str:
    """Return kind's containerd config with our pause image and ``restrict_oom_score_adj``.

    kind's build rewrites the sandbox image the same way. ``restrict_oom_score_adj = true``:
    the node container has no ``CAP_SYS_RESOURCE`` (the docker shim drops it), so, as on
    the real node, containerd must not try to lower a container's OOM score below its own.
    """
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        indent = line[:len(line) - len(line.lstrip())]
        if stripped.startswith("sandbox_image"):
            line = f'{indent}sandbox_image = "{pause}"'
        elif stripped.startswith("restrict_oom_score_adj"):
            line = f"{indent}restrict_oom_score_adj = true"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _containerd_config(rootfs: Path, pause: str) -> None:
    config = rootfs / "etc" / "containerd" / "config.toml"
    config.write_text(containerd_config(config.read_text(), pause))


def component_images(binaries: dict[str, Path], required: list[str], rootfs_layer: Path
                     ) -> list[Path]:
    """Return the archives of the images kubeadm's list names that are built here."""
    made: list[Path] = []
    for name in CONTROL_PLANE_IMAGES:
        made.append(binary_image(image_for(required, name),
                                 {f"usr/local/bin/{name}": binaries[name]}, {}))
    # kube-proxy runs iptables: its image is the node's own Debian root plus the binary.
    made.append(binary_image(image_for(required, "kube-proxy"),
                             {"usr/local/bin/kube-proxy": binaries["kube-proxy"]}, {},
                             base_layers=[rootfs_layer]))
    # kubeadm v1.37 names etcd 3.7.0; the local control plane (and so the suite) runs
    # build.ETCD_VERSION, which kubeadm supports: the kind config sets its tag (ETCD_TAG).
    etcd_repo = image_for(required, "etcd").rsplit(":", 1)[0]
    made.append(binary_image(f"{etcd_repo}:{ETCD_TAG}",
                             {"usr/local/bin/etcd": binaries["etcd"]}, {}))
    pause = image_for(required, "pause")
    made.append(pause_image(pause))
    coredns = build.find_binary("coredns")
    if coredns is not None:  # upstream's image: the binary at /coredns, its entrypoint
        # (node_image builds it first; without it kubeadm's DNS Deployment cannot start)
        made.append(binary_image(image_for(required, "coredns"), {"coredns": coredns},
                                 {"Entrypoint": ["/coredns"]}))
    return made


def pause_image(name: str) -> Path:
    """The pause image from Debian's busybox-static, under kubeadm's name for it."""
    if not images._is_static(images.BUSYBOX):
        raise PartMissing("pause", f"{images.BUSYBOX} is missing or not static "
                                   "(apt-get install busybox-static)")
    with tempfile.TemporaryDirectory(prefix="joblease-kind-pause-") as tmp:
        sh = Path(tmp) / "sh"
        os.symlink("busybox", sh)
        sleep = Path(tmp) / "sleep"
        os.symlink("busybox", sleep)
        return binary_image(name, {"bin/busybox": images.BUSYBOX, "bin/sh": sh,
                                   "bin/sleep": sleep},
                            {"Entrypoint": ["/bin/sh", "-c", images.PAUSE_SCRIPT]})


def node_image(progress: build.Progress | None = None) -> NodeImage:
    """Return (making what is missing) the kind node image archive for ``docker load``.

    Raises:
        PartMissing: a part cannot be made (the message names it and why).
        BuildError: a Go build failed.

    """
    progress = progress or build.Progress()
    began = time.monotonic()
    wanted = [*NODE_BINARIES, "kube-apiserver", "kube-controller-manager", "kube-scheduler",
              "kube-proxy", "etcd", "coredns"]
    binaries = build.ensure_binaries(wanted, progress)
    module = kind_module()
    required = kubeadm_images(binaries["kubeadm"])
    progress.line("kubeadm needs: " + ", ".join(required))
    with_coredns = build.find_binary("coredns") is not None
    key = hashlib.sha256(json.dumps([required, sorted(NODE_PACKAGES), build.KIND_VERSION,
                                     BRIDGE_CONFLIST, with_coredns, ENTRYPOINT_WRAPPER]
                                    ).encode()).hexdigest()[:10]
    name = f"{NODE_IMAGE_REPO}:{build.KUBERNETES_VERSION}-{key}"
    out = kind_dir() / f"node-{build.KUBERNETES_VERSION}-{key}.tar"
    if out.is_file():
        return NodeImage(name, out, time.monotonic() - began)
    rootfs_tar = node_rootfs_tar(progress)
    archives = component_images(binaries, required, rootfs_tar)
    with tempfile.TemporaryDirectory(prefix="joblease-kind-node-", dir=kind_dir()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        rootfs.mkdir()
        with _step(progress, "assembling the node's root filesystem"):
            subprocess.run(["tar", "-xpf", str(rootfs_tar), "-C", str(rootfs)], check=True,
                           timeout=600)
            _copy_base_files(module, rootfs)
            _install_binaries(rootfs, binaries)
            _systemd_as_kind_does(rootfs)
            _pod_network(rootfs)
            _containerd_config(rootfs, image_for(required, "pause"))
            _cri_base_spec(binaries["ctr"], rootfs)
            wrapper = rootfs / ENTRYPOINT[0].lstrip("/")
            wrapper.write_text(ENTRYPOINT_WRAPPER)
            wrapper.chmod(0o755)
            (rootfs / "kind").mkdir(exist_ok=True)
            (rootfs / "kind" / "version").write_text(build.KUBERNETES_VERSION + "\n")
        import_into_store(rootfs / "var" / "lib" / "containerd", archives, progress)
        layer = Path(tmp) / "layer.tar"
        with _step(progress, "writing the node image archive"):
            subprocess.run(["tar", "--numeric-owner", "--xattrs", "--sort=name", "--mtime=@0",
                            "-C", str(rootfs), "-cf", str(layer), "."], check=True,
                           timeout=1200)
            write_archive(name, [layer], {
                "Entrypoint": ENTRYPOINT,
                "Env": ["container=docker",
                        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "StopSignal": "SIGRTMIN+3"}, out)
    return NodeImage(name, out, time.monotonic() - began)


__all__ = ["NODE_IMAGE_REPO", "NODE_PACKAGES", "NodeImage", "PartMissing", "binary_image",
           "image_for", "kubeadm_images", "node_image", "write_archive"]
