"""Build the cluster binaries from their Go modules into a versioned cache.

Why build at all: this machine (and many CI runners) has no Docker engine, so kind
cannot run; envtest's downloadable binaries need a network path we may not have.
The Go module proxy is always reachable here, so every component is built from
the exact upstream release with ``go build``.

How: for ``k8s.io/kubernetes`` a *consumer module* is written (upstream's go.mod
replaces every staging module with ``./staging/...``, which ``go install`` refuses),
with one ``replace`` per staging module pinned to the matching ``v0.x`` release.
Each command's ``main`` file is copied verbatim from the downloaded module, so no
Go source is maintained here. Built binaries land in
``$JOBLEASE_CACHE_DIR/bin/<release>/`` and are never rebuilt while present.

``KUBEBUILDER_ASSETS`` (envtest's convention) wins over everything: when it is
set, binaries are taken from there and Go is not needed.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v4.3.2"
CONTAINERD_VERSION = "v2.4.2"
BUILDKIT_VERSION = "v0.34.2"
# Prometheus 3.16.0: its Go module is versioned v0.3MM.P for release 3.MM.P.
PROMETHEUS_VERSION = "v0.316.0"
PROMETHEUS_RELEASE = "3.16.0"
# kind and the parts of its node image that are Go modules (issue 32, docs/kind.md).
KIND_VERSION = "v0.33.0"
CRI_TOOLS_VERSION = "v1.37.0"
CNI_PLUGINS_VERSION = "v1.10.0"
# The CoreDNS release kubeadm v1.37.2 deploys (cmd/kubeadm/app/constants: CoreDNSVersion).
COREDNS_VERSION = "v1.14.6"

# The real node's runtime: built together from one module, cached in one folder.
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")
# BuildKit's daemon and client, built from a consumer module (see _build_buildkit).
BUILDKIT_COMMANDS = ("buildkitd", "buildctl")
# Everything a real node needs on top of the control plane.
NODE = ("kubelet", *CONTAINERD_COMMANDS)
# The CNI plugins a kind node runs (kind's base image keeps these four; bridge for a pod
# network without kindnetd), with their package in containernetworking/plugins.
CNI_PLUGINS: dict[str, str] = {
    "bridge": "plugins/main/bridge",
    "loopback": "plugins/main/loopback",
    "ptp": "plugins/main/ptp",
    "host-local": "plugins/ipam/host-local",
    "portmap": "plugins/meta/portmap",
}

# Commands of k8s.io/kubernetes we build, and the upstream file holding their main.
KUBE_COMMANDS: dict[str, str] = {
    "kube-apiserver": "cmd/kube-apiserver/apiserver.go",
    "kube-controller-manager": "cmd/kube-controller-manager/controller-manager.go",
    "kube-scheduler": "cmd/kube-scheduler/scheduler.go",
    "kubectl": "cmd/kubectl/kubectl.go",
    "kubelet": "cmd/kubelet/kubelet.go",
    # A kind node's own: kubeadm sets the node up, kube-proxy runs as its DaemonSet.
    "kubeadm": "cmd/kubeadm/kubeadm.go",
    "kube-proxy": "cmd/kube-proxy/proxy.go",
}

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")

ETCD_MAIN = """package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
\tetcdmain.Main(os.Args)
}
"""


class BuildError(RuntimeError):
    """A component could not be built or found; the message names it and the fix."""


def cache_dir() -> Path:
    """Return the root of joblease's cache (outside any repository)."""
    env = os.environ.get("JOBLEASE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "joblease"


def bin_dir_for(component: str) -> Path:
    """Return the versioned folder that holds a built component."""
    if component == "etcd":
        return cache_dir() / "bin" / f"etcd-{ETCD_VERSION}"
    if component == "kwok":
        return cache_dir() / "bin" / f"kwok-{KWOK_VERSION}"
    if component == "helm":
        return cache_dir() / "bin" / f"helm-{HELM_VERSION}"
    if component == "promtool":
        return cache_dir() / "bin" / f"promtool-{PROMETHEUS_VERSION}"
    if component in CONTAINERD_COMMANDS:
        return cache_dir() / "bin" / f"containerd-{CONTAINERD_VERSION}"
    if component in BUILDKIT_COMMANDS:
        return cache_dir() / "bin" / f"buildkit-{BUILDKIT_VERSION}"
    if component == "kind":
        return cache_dir() / "bin" / f"kind-{KIND_VERSION}"
    if component == "crictl":
        return cache_dir() / "bin" / f"cri-tools-{CRI_TOOLS_VERSION}"
    if component == "coredns":
        return cache_dir() / "bin" / f"coredns-{COREDNS_VERSION}"
    if component in CNI_PLUGINS:
        return cache_dir() / "bin" / f"cni-plugins-{CNI_PLUGINS_VERSION}"
    return cache_dir() / "bin" / f"kubernetes-{KUBERNETES_VERSION}"


@dataclass
class Progress:
    """Reports long work: a live line on a terminal, plain lines elsewhere (CI logs)."""

    stream: object = sys.stderr
    interval: float = 15.0

    def line(self, text: str) -> None:
        """Print one finished line of progress."""
        print(f"[joblease build] {text}", file=self.stream, flush=True)  # type: ignore[call-overload]

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Report ``what`` while it runs, with the elapsed time, then how long it took."""
        started = time.monotonic()
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        done = threading.Event()

        def tick() -> None:
            spinner = "|/-\\"
            i = 0
            while not done.wait(1.0 if tty else self.interval):
                elapsed = _fmt(time.monotonic() - started)
                if tty:
                    print(f"\r[joblease build] {spinner[i % 4]} {what} … {elapsed}", end="",
                          file=self.stream, flush=True)  # type: ignore[call-overload]
                    i += 1
                else:
                    self.line(f"{what} … still running ({elapsed})")

        thread = threading.Thread(target=tick, daemon=True)
        if not tty:
            self.line(f"{what} …")
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            if tty:
                print("\r", end="", file=self.stream)  # type: ignore[call-overload]
            self.line(f"{what}: done in {_fmt(time.monotonic() - started)}")


def _fmt(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


def find_binary(component: str) -> Path | None:
    """Return an existing binary for ``component``: KUBEBUILDER_ASSETS first, then the cache."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and (Path(assets) / component).is_file():
        return Path(assets) / component
    cached = bin_dir_for(component) / component
    return cached if cached.is_file() else None


def ensure_binaries(components: tuple[str, ...] | list[str], progress: Progress | None = None
                    ) -> dict[str, Path]:
    """Return a path for every component, building only what is missing.

    Raises:
        BuildError: Go is missing and a binary is neither in KUBEBUILDER_ASSETS nor cached,
            or ``go build`` failed (its output is in the message).

    """
    progress = progress or Progress()
    found: dict[str, Path] = {}
    missing: list[str] = []
    for name in components:
        path = find_binary(name)
        if path is None:
            missing.append(name)
        else:
            found[name] = path
    if found:
        progress.line("from cache: " + ", ".join(f"{n} ({found[n]})" for n in found))
    if not missing:
        return found
    _require_go(missing)
    with _build_lock(progress):
        # Another process may have built some while we waited for the lock.
        for name in list(missing):
            path = find_binary(name)
            if path is not None:
                found[name] = path
                missing.remove(name)
        _build_missing(missing, found, progress)
    return found


@contextmanager
def _build_lock(progress: Progress) -> Iterator[None]:
    """Serialise builds across processes sharing one cache.

    ``make binaries`` while pytest builds, or two CI jobs on one runner: two ``go build``s
    of one binary waste minutes and race on the output file.
    """
    lock_path = cache_dir() / "build.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress.line(f"another build holds {lock_path}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_missing(missing: list[str], found: dict[str, Path], progress: Progress) -> None:
    if not missing:
        return
    kube = [m for m in missing if m in KUBE_COMMANDS]
    if kube:
        found.update(_build_kube(kube, progress))
    if "etcd" in missing:
        found["etcd"] = _build_etcd(progress)
    for tool, module in (("kwok", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"),
                         ("helm", f"helm.sh/helm/v4/cmd/helm@{HELM_VERSION}"),
                         ("crictl", f"sigs.k8s.io/cri-tools/cmd/crictl@{CRI_TOOLS_VERSION}"),
                         ("coredns", f"github.com/coredns/coredns@{COREDNS_VERSION}")):
        if tool in missing:
            found[tool] = _go_install(tool, module, progress)
    if "promtool" in missing:
        found["promtool"] = _build_promtool(progress)
    if any(m in CONTAINERD_COMMANDS for m in missing):
        found.update(_build_containerd(progress))
    if any(m in BUILDKIT_COMMANDS for m in missing):
        found.update(_build_buildkit(progress))
    if "kind" in missing:
        found["kind"] = _go_install(
            "kind", f"sigs.k8s.io/kind@{KIND_VERSION}", progress)
    if any(m in CNI_PLUGINS for m in missing):
        found.update(_build_cni_plugins(progress))
    unknown = set(missing) - set(found)
    if unknown:
        raise BuildError(f"do not know how to build: {', '.join(sorted(unknown))}")


def _require_go(missing: list[str]) -> None:
    if shutil.which("go") is None:
        raise BuildError(
            f"cannot find {', '.join(missing)}: Go is not installed and no binaries are "
            "configured. Either install Go >= 1.26 (https://go.dev/dl/) so joblease can build "
            "them, or set KUBEBUILDER_ASSETS to a folder holding kube-apiserver, etcd and "
            "kubectl (e.g. from `setup-envtest use 1.37`)."
        )


def _run(cmd: list[str], cwd: Path, what: str, env: dict[str, str] | None = None) -> None:
    full_env = {**os.environ, "CGO_ENABLED": "0", **(env or {})}
    result = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise BuildError(f"{what} failed ({' '.join(cmd)}):\n{result.stderr[-4000:]}")


def _module_dir(module_at_version: str, cwd: Path) -> Path:
    out = subprocess.run(["go", "mod", "download", "-json", module_at_version], cwd=cwd,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise BuildError(f"go mod download {module_at_version} failed:\n{out.stderr[-2000:]}")
    return Path(json.loads(out.stdout)["Dir"])


def _kube_ldflags() -> str:
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    return (f"-s -w -X {pkg}.gitVersion={KUBERNETES_VERSION} -X {pkg}.gitMajor={major} "
            f"-X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean")


def write_kube_module(src: Path) -> None:
    """Write the consumer module that builds k8s.io/kubernetes commands (idempotent)."""
    src.mkdir(parents=True, exist_ok=True)
    if not (src / "go.mod").exists():
        _run(["go", "mod", "init", "joblease.dev/clusterbins"], src, "go mod init")
    upstream = _module_dir(f"k8s.io/kubernetes@{KUBERNETES_VERSION}", src)
    staging = re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/",
                         (upstream / "go.mod").read_text(), re.MULTILINE)
    staging_version = "v0." + KUBERNETES_VERSION.lstrip("v").split(".", 1)[1]
    lines = [f"require k8s.io/kubernetes {KUBERNETES_VERSION}"]
    lines += [f"replace {mod} => {mod} {staging_version}" for mod in staging]
    gomod = (src / "go.mod").read_text()
    if "require k8s.io/kubernetes" not in gomod:
        (src / "go.mod").write_text(gomod + "\n" + "\n".join(lines) + "\n")
    for name, rel in KUBE_COMMANDS.items():
        target = src / "cmd" / name / "main.go"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(upstream / rel, target)
        target.chmod(0o644)


def _build_kube(names: list[str], progress: Progress) -> dict[str, Path]:
    src = cache_dir() / "src" / f"kubernetes-{KUBERNETES_VERSION}"
    out = bin_dir_for("kube-apiserver")
    out.mkdir(parents=True, exist_ok=True)
    with progress.step(f"preparing the k8s.io/kubernetes {KUBERNETES_VERSION} module"):
        write_kube_module(src)
        _run(["go", "mod", "tidy"], src, "go mod tidy (kubernetes)")
    built: dict[str, Path] = {}
    for name in names:
        with progress.step(f"building {name} {KUBERNETES_VERSION}"):
            tmp = out / f".{name}.tmp"
            _run(["go", "build", "-trimpath", "-ldflags", _kube_ldflags(), "-o", str(tmp),
                  f"./cmd/{name}"], src, f"go build {name}")
            tmp.rename(out / name)  # appear only when complete: a killed build leaves no binary
        built[name] = out / name
    return built


def _build_etcd(progress: Progress) -> Path:
    src = cache_dir() / "src" / f"etcd-{ETCD_VERSION}"
    src.mkdir(parents=True, exist_ok=True)
    out = bin_dir_for("etcd")
    out.mkdir(parents=True, exist_ok=True)
    with progress.step(f"building etcd {ETCD_VERSION}"):
        if not (src / "go.mod").exists():
            _run(["go", "mod", "init", "joblease.dev/etcdbin"], src, "go mod init (etcd)")
        (src / "main.go").write_text(ETCD_MAIN)
        _run(["go", "get", f"go.etcd.io/etcd/server/v3@{ETCD_VERSION}"], src, "go get etcd")
        _run(["go", "mod", "tidy"], src, "go mod tidy (etcd)")
        tmp = out / ".etcd.tmp"
        _run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp), "."], src,
             "go build etcd")
        tmp.rename(out / "etcd")
    return out / "etcd"


def _go_install(tool: str, module: str, progress: Progress, ldflags: str = "-s -w",
                tags: str = "") -> Path:
    out = bin_dir_for(tool)
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".{tool}.tmp"  # appear only when complete, like the other builds
    shutil.rmtree(staging, ignore_errors=True)
    with progress.step(f"building {tool} ({module})"):
        _run(["go", "install", "-trimpath", *(["-tags", tags] if tags else []),
              "-ldflags", ldflags, module], out, f"go install {tool}",
             env={"GOBIN": str(staging)})
        (staging / tool).rename(out / tool)
        staging.rmdir()
    return out / tool


def _build_promtool(progress: Progress) -> Path:
    """Build promtool (``promtool test rules`` checks the chart's alert rules).

    ``remove_all_sd`` leaves out Prometheus's cloud service-discovery plugins (AWS, Azure,
    GCE, ...), which promtool needs only for ``check service-discovery`` and which are most
    of its build time; rule checks and unit tests do not touch them.
    """
    common = "github.com/prometheus/common/version"
    return _go_install("promtool", f"github.com/prometheus/prometheus/cmd/promtool@"
                       f"{PROMETHEUS_VERSION}", progress, tags="remove_all_sd",
                       ldflags=f"-s -w -X {common}.Version={PROMETHEUS_RELEASE}")


def _build_containerd(progress: Progress) -> dict[str, Path]:
    """Build containerd, its runc shim and ctr with one ``go install`` (one module, one cache).

    The three must come from the same release: the shim's ttrpc API and ctr's client
    follow containerd's. runc itself is *not* built here: the module's runc lacks seccomp
    without cgo + libseccomp, so the node uses Debian's ``runc`` package instead.
    """
    out = bin_dir_for("containerd")
    out.mkdir(parents=True, exist_ok=True)
    staging = out / ".containerd.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    module = "github.com/containerd/containerd/v2/cmd"
    packages = [f"{module}/{name}@{CONTAINERD_VERSION}" for name in CONTAINERD_COMMANDS]
    with progress.step(f"building containerd {CONTAINERD_VERSION} (+ shim, ctr)"):
        _run(["go", "install", "-trimpath", "-ldflags",
              f"-s -w -X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}",
              *packages], out, "go install containerd", env={"GOBIN": str(staging)})
        for name in CONTAINERD_COMMANDS:
            (staging / name).rename(out / name)
        staging.rmdir()
    return {name: out / name for name in CONTAINERD_COMMANDS}


def _build_buildkit(progress: Progress) -> dict[str, Path]:
    """Build buildkitd and buildctl from a consumer module requiring moby/buildkit.

    ``go install github.com/moby/buildkit/cmd/buildkitd@VERSION`` is refused because
    BuildKit's go.mod has ``exclude`` directives; a module of our own that requires it
    resolves the same versions and builds both commands.
    """
    src = cache_dir() / "src" / f"buildkit-{BUILDKIT_VERSION}"
    src.mkdir(parents=True, exist_ok=True)
    out = bin_dir_for("buildkitd")
    out.mkdir(parents=True, exist_ok=True)
    pkg = "github.com/moby/buildkit"
    with progress.step(f"building buildkitd + buildctl {BUILDKIT_VERSION}"):
        if not (src / "go.mod").exists():
            _run(["go", "mod", "init", "joblease.dev/buildkitbins"], src, "go mod init (buildkit)")
        # A blank import of both commands' packages keeps `go mod tidy` from dropping them.
        (src / "tools.go").write_text(
            "//go:build tools\n\npackage tools\n\nimport (\n"
            f'\t_ "{pkg}/cmd/buildctl"\n\t_ "{pkg}/cmd/buildkitd"\n)\n')
        _run(["go", "get", f"{pkg}@{BUILDKIT_VERSION}"], src, "go get buildkit")
        _run(["go", "mod", "tidy"], src, "go mod tidy (buildkit)")
        ldflags = f"-s -w -X {pkg}/version.Version={BUILDKIT_VERSION}"
        for name in BUILDKIT_COMMANDS:
            tmp = out / f".{name}.tmp"
            _run(["go", "build", "-trimpath", "-ldflags", ldflags, "-o", str(tmp),
                  f"{pkg}/cmd/{name}"], src, f"go build {name}")
            tmp.rename(out / name)
    return {name: out / name for name in BUILDKIT_COMMANDS}


def _build_cni_plugins(progress: Progress) -> dict[str, Path]:
    """Build the CNI plugins a kind node needs with one ``go install`` (one module).

    kind's base image downloads the release tarball and keeps four plugins; here the same
    release is built from its module, plus ``bridge`` (a single-node pod network when
    kindnetd's image cannot be built: docs/kind.md).
    """
    out = bin_dir_for("bridge")
    out.mkdir(parents=True, exist_ok=True)
    staging = out / ".cni.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    module = "github.com/containernetworking/plugins"
    packages = [f"{module}/{pkg}@{CNI_PLUGINS_VERSION}" for pkg in CNI_PLUGINS.values()]
    with progress.step(f"building CNI plugins {CNI_PLUGINS_VERSION} ({', '.join(CNI_PLUGINS)})"):
        _run(["go", "install", "-trimpath", "-ldflags",
              f"-s -w -X {module}/pkg/utils/buildversion.BuildVersion={CNI_PLUGINS_VERSION}",
              *packages], out, "go install CNI plugins", env={"GOBIN": str(staging)})
        for name in CNI_PLUGINS:
            (staging / name).rename(out / name)
        staging.rmdir()
    return {name: out / name for name in CNI_PLUGINS}


def main(argv: list[str] | None = None) -> int:
    """Build (or find) the named components; default: the control plane."""
    names = argv if argv else list(CONTROL_PLANE)
    started = time.monotonic()
    try:
        paths = ensure_binaries(names)
    except BuildError as err:
        print(f"joblease: {err}", file=sys.stderr)
        return 1
    for name in names:
        print(f"{name}\t{paths[name]}")
    Progress().line(f"all ready in {_fmt(time.monotonic() - started)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
