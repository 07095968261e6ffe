"""A real Kubernetes control plane on 127.0.0.1, for tests, the demo and development.

``LocalCluster`` starts upstream binaries (built by :mod:`joblease_localcluster.build`)
in a fresh temporary folder, in dependency order, each on ports it picks itself:

    etcd → kube-apiserver → kube-controller-manager → kube-scheduler → (kwok)

and stops them in reverse order. Nothing is mocked: CRDs, resourceVersion conflicts,
RBAC, admission and namespace finalization are the real thing, which is why the
project's protocol tests run here rather than against a fake.

Guarantees:
    * ``start()`` returns a cluster whose ``/readyz`` answered ok, or raises (BuildError,
      CertError, ComponentStartError) after stopping whatever it had started and removing
      its folder.
    * ``stop()`` leaves no process and no folder behind (unless ``keep_dir=True``).
    * Every server listens on 127.0.0.1 only.

Identities (static tokens in ``--token-auth-file``): ``admin`` (group ``system:masters``)
and two ordinary users, ``alice`` and ``bob`` (group ``system:authenticated`` only, so
RBAC denies them everything a test does not grant).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import yaml

from joblease_localcluster import build, certs
from joblease_localcluster.process import ComponentStartError, ManagedProcess, free_port, stop_pid

CONTEXT = "joblease-local"
ADMIN = "admin"
ORDINARY_USERS = ("alice", "bob")
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_STAGE_DIRS = ("kustomize/stage/node/fast", "kustomize/stage/node/heartbeat",
                   "kustomize/stage/pod/fast")


@dataclass(frozen=True)
class Identity:
    """A user of the local cluster: a bearer token and the groups it authenticates with."""

    name: str
    token: str
    groups: tuple[str, ...]


class ClusterHandle(Protocol):
    """What tests may rely on, whichever cluster is behind it.

    Implemented by :class:`LocalCluster` and by the test suite's handle for an existing
    cluster (kind, via ``JOBLEASE_E2E_KUBECONFIG``), so tests are written once.
    """

    kubeconfig: Path
    server: str
    logs: dict[str, Path]

    def kubeconfig_for(self, user: str) -> Path:
        """Return a kubeconfig holding only ``user`` (``admin``, ``alice``, ``bob``)."""
        ...

    def username(self, user: str) -> str:
        """Return the name RBAC knows ``user`` by."""
        ...

    def rbac_subject(self, user: str) -> dict[str, str]:
        """Return the RoleBinding subject that grants ``user`` a role."""
        ...

    def kubectl(self, *args: str, user: str = ADMIN, check: bool = False,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run kubectl as ``user``."""
        ...


def _default_identities() -> dict[str, Identity]:
    ids = [
        Identity(ADMIN, secrets.token_hex(16), ("system:masters",)),
        Identity("system:kube-controller-manager", secrets.token_hex(16), ()),
        Identity("system:kube-scheduler", secrets.token_hex(16), ()),
        Identity("system:kwok", secrets.token_hex(16), ("system:masters",)),
    ]
    ids += [Identity(u, secrets.token_hex(16), ("system:authenticated",))
            for u in ORDINARY_USERS]
    return {i.name: i for i in ids}


def _http_ok(url: str, context: ssl.SSLContext | None = None, token: str | None = None,
             expect: bytes | None = None) -> bool:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=2, context=context) as response:
        body: bytes = response.read()
        return bool(response.status == 200 and (expect is None or expect in body))


def _insecure() -> ssl.SSLContext:
    # Only for the controller-manager's and scheduler's own health ports, whose
    # self-signed serving certificates they generate at start; nothing secret is read.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def kwok_stages_file() -> Path:
    """Return kwok's stage configuration, assembled once from its Go module and cached.

    The bare ``kwok`` binary exits with "no stages found": the stages ship as YAML in the
    module's ``kustomize/stage/`` folders, concatenated here into one ``--config`` file.
    """
    target = build.cache_dir() / "data" / f"kwok-stages-{build.KWOK_VERSION}.yaml"
    if target.is_file():
        return target
    if shutil.which("go") is None:
        raise build.BuildError("kwok's stages come from its Go module: install Go >= 1.26")
    with tempfile.TemporaryDirectory(prefix="joblease-kwok-") as tmp:
        out = subprocess.run(["go", "mod", "download", "-json",
                              f"sigs.k8s.io/kwok@{build.KWOK_VERSION}"],
                             cwd=tmp, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise build.BuildError(f"go mod download sigs.k8s.io/kwok failed:\n{out.stderr[-2000:]}")
    module = Path(json.loads(out.stdout)["Dir"])
    documents: list[str] = []
    for rel in KWOK_STAGE_DIRS:
        for path in sorted((module / rel).glob("*.yaml")):
            if path.name != "kustomization.yaml":
                documents.append(path.read_text().strip())
    if not documents:
        raise build.BuildError(f"no kwok stages found under {module}/kustomize/stage")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_target = target.with_suffix(".tmp")
    tmp_target.write_text("\n---\n".join(documents) + "\n")
    tmp_target.rename(target)
    return target


class LocalCluster:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler (and kwok) on 127.0.0.1.

    Use as a context manager, or call ``start()`` and ``stop()``.

    Args:
        kwok: also start kwok, which simulates Nodes annotated
            ``kwok.x-k8s.io/node=fake`` (see :meth:`create_fake_node`) and their Pods.
        name: the kubeconfig context name prefix.
        base_dir: where the temporary folder is created (default: the system temp dir).
        detach: start processes in their own sessions so they outlive this Python
            process (``joblease-localcluster up``).
        keep_dir: keep the folder (logs, data) after ``stop()``, for post-mortems.
        start_timeout: seconds each component may take to become healthy.
        progress: where build progress is reported.

    """

    def __init__(self, *, kwok: bool = False, name: str = CONTEXT,
                 base_dir: Path | None = None, detach: bool = False, keep_dir: bool = False,
                 start_timeout: float = 90.0, progress: build.Progress | None = None) -> None:
        self.with_kwok = kwok
        self.name = name
        self.base_dir = base_dir
        self.detach = detach
        self.keep_dir = keep_dir
        self.start_timeout = start_timeout
        self.progress = progress
        self.identities = _default_identities()
        self.processes: list[ManagedProcess] = []
        self.logs: dict[str, Path] = {}
        self.ready_seconds: float | None = None
        self._dir: Path | None = None
        self._binaries: dict[str, Path] = {}
        self._apiserver_port: int | None = None
        self._etcd_url = ""
        self._certs: certs.ClusterCerts | None = None

    # -- public handle -----------------------------------------------------------------

    @property
    def dir(self) -> Path:
        """The cluster's temporary folder (data, certificates, logs, kubeconfigs)."""
        if self._dir is None:
            raise RuntimeError("the cluster is not started")
        return self._dir

    @property
    def server(self) -> str:
        """kube-apiserver's URL, ``https://127.0.0.1:PORT``."""
        if self._apiserver_port is None:
            raise RuntimeError("the cluster is not started")
        return f"https://127.0.0.1:{self._apiserver_port}"

    @property
    def etcd_url(self) -> str:
        """The client URL of etcd (http on 127.0.0.1): its /metrics give the database's size."""
        return self._etcd_url

    @property
    def ca_file(self) -> Path:
        """The CA that signed kube-apiserver's serving certificate."""
        return self.dir / "pki" / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        """The kubeconfig with every identity; current context ``<name>`` is the admin."""
        return self.dir / "kubeconfig"

    def token_for(self, user: str) -> str:
        """Return the bearer token of ``user`` (``admin``, ``alice``, ``bob``)."""
        try:
            return self.identities[user].token
        except KeyError:
            raise KeyError(f"no identity {user!r}; known: {', '.join(self.identities)}"
                           ) from None

    def kubeconfig_for(self, user: str) -> Path:
        """Return a kubeconfig file holding only ``user``'s credentials."""
        path = self.dir / f"kubeconfig-{user}"
        if not path.is_file():
            self._write_kubeconfig(path, [user], current=user)
        return path

    def username(self, user: str) -> str:
        """Return the name RBAC knows ``user`` by (here the same; see the e2e handle)."""
        return self.identities[user].name

    def rbac_subject(self, user: str) -> dict[str, str]:
        """Return the RoleBinding subject that grants ``user`` a role."""
        return {"kind": "User", "name": self.username(user),
                "apiGroup": "rbac.authorization.k8s.io"}

    def kubectl(self, *args: str, user: str = ADMIN, check: bool = False,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the kubectl built with the cluster (no version skew) as ``user``."""
        kubectl = self._binaries.get("kubectl") or build.find_binary("kubectl")
        if kubectl is None:
            raise build.BuildError(
                "kubectl is not built; run `joblease-localcluster build kubectl`")
        return subprocess.run([str(kubectl), "--kubeconfig", str(self.kubeconfig_for(user)),
                               *args], capture_output=True, text=True, check=check,
                              timeout=timeout)

    def create_fake_node(self, name: str = "kwok-node-0") -> str:
        """Create a Node that kwok simulates (it turns Ready and runs Pods bound to it)."""
        if not self.with_kwok:
            raise RuntimeError("create_fake_node needs LocalCluster(kwok=True)")
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                             "labels": {"type": "kwok", "kubernetes.io/hostname": name}},
                "spec": {}}
        path = self.dir / f"node-{name}.json"
        path.write_text(json.dumps(node))
        self.kubectl("apply", "-f", str(path), check=True)
        return name

    def state(self) -> dict[str, Any]:
        """Describe the running cluster for ``joblease-localcluster down`` (JSON-able)."""
        return {
            "name": self.name, "dir": str(self.dir), "kubeconfig": str(self.kubeconfig),
            "server": self.server, "keep_dir": self.keep_dir,
            "processes": [{"name": p.name, "pid": p.pid, "argv0": p.argv[0],
                           "log": str(p.log_path)} for p in self.processes],
        }

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Build what is missing, then start every component and wait for ``/readyz``.

        Raises:
            BuildError: a binary is missing and cannot be built (e.g. Go not installed).
            CertError: ``openssl`` is missing or failed.
            ComponentStartError: a component exited or did not become healthy (its log
                tail is in the message); everything started so far has been stopped.

        """
        if self._dir is not None:
            raise RuntimeError("the cluster was already started")
        wanted = [*build.CONTROL_PLANE, *(["kwok"] if self.with_kwok else [])]
        self._binaries = build.ensure_binaries(wanted, self.progress)
        stages = kwok_stages_file() if self.with_kwok else None
        self._dir = Path(tempfile.mkdtemp(prefix="joblease-cluster-", dir=self.base_dir))
        try:
            self._certs = certs.make_cluster_certs(self.dir / "pki")
            self._write_token_file()
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig(self.kubeconfig, list(self.identities), current=ADMIN)
            self._start_controller_manager()
            self._start_scheduler()
            if stages is not None:
                self._start_kwok(stages)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every component in reverse order, then remove the folder."""
        errors: list[str] = []
        for proc in reversed(self.processes):
            try:
                proc.stop()
            except Exception as err:  # keep stopping the others
                errors.append(f"{proc.name}: {err}")
        if self._dir is not None and not self.keep_dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        if errors:
            raise RuntimeError("could not stop: " + "; ".join(errors))

    def restart(self, component: str, *, kill: bool = False,
                while_down: Callable[[], object] | None = None) -> float:
        """Stop one running component and start it again with the same command line.

        Same ports, same data folder (etcd keeps its data), same log file (appended). With
        ``kill=True`` the process gets SIGKILL (a crash) instead of SIGTERM. ``while_down``
        is called between the stop and the start (e.g. :meth:`etcd_compact`, so that no
        client of kube-apiserver can resume a watch across the restart). Returns once
        the component's health check passes again, with the seconds it was down.

        Raises:
            KeyError: no such component was started.
            ComponentStartError: it did not come back.

        """
        index = next((i for i, p in enumerate(self.processes) if p.name == component), None)
        if index is None:
            raise KeyError(f"no component {component!r}; started: "
                           f"{', '.join(p.name for p in self.processes)}")
        old = self.processes[index]
        began = time.monotonic()
        if kill and old.running() and old.pid is not None:
            os.kill(old.pid, signal.SIGKILL)
        old.stop()
        if while_down is not None:
            while_down()
        new = ManagedProcess(old.name, old.argv, old.log_path, old.health, ports=old.ports,
                             start_timeout=old.start_timeout, stop_timeout=old.stop_timeout,
                             detach=old.detach, env=old.env)
        self.processes[index] = new
        new.start()
        return time.monotonic() - began

    def etcd_compact(self) -> int:
        """Write one marker key to etcd, then compact etcd's history up to that write.

        Why: a watch can resume from a resourceVersion only while etcd (or kube-apiserver's
        watch cache) still has it. Called while kube-apiserver is down (``restart(...,
        while_down=cluster.etcd_compact)``), every resourceVersion a client held is older
        than both the compaction and the restarted watch cache, so each watch gets 410 Gone
        and must list again: the forced relist the benchmark measures. The marker lives
        outside ``/registry``, so kube-apiserver never reads it. Returns the revision
        compacted to.
        """
        marker = base64.b64encode(b"/joblease-localcluster/compact-marker").decode()
        value = base64.b64encode(str(time.time()).encode()).decode()
        put = self._etcd_call("/v3/kv/put", {"key": marker, "value": value})
        revision = int(put["header"]["revision"])
        self._etcd_call("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def etcd_get(self, key: str) -> bytes | None:
        """Read one key straight from etcd (``None`` if absent).

        With :meth:`etcd_put`, for a change that must be *seen*: an object changed while
        kube-apiserver is down (``/registry/<group>/<plural>/<namespace>/<name>`` holds a
        custom resource as JSON) sends no watch event to anyone, so only a client that lists
        again finds out.
        """
        encoded = base64.b64encode(key.encode()).decode()
        kvs = self._etcd_call("/v3/kv/range", {"key": encoded}).get("kvs") or []
        return base64.b64decode(kvs[0]["value"]) if kvs else None

    def etcd_put(self, key: str, value: bytes) -> int:
        """Write one key straight into etcd; the revision of the write."""
        body = {"key": base64.b64encode(key.encode()).decode(),
                "value": base64.b64encode(value).decode()}
        return int(self._etcd_call("/v3/kv/put", body)["header"]["revision"])

    def _etcd_call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to etcd's JSON gateway (http on 127.0.0.1) and return the decoded answer."""
        if not self._etcd_url:
            raise RuntimeError("etcd is not started")
        request = urllib.request.Request(f"{self._etcd_url}{path}",
                                         data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            answer: dict[str, Any] = json.loads(reply.read())
        return answer

    # -- components --------------------------------------------------------------------

    def _launch(self, name: str, argv: list[str], health: Any, ports: dict[str, int]
                ) -> ManagedProcess:
        log = self.dir / "logs" / f"{name}.log"
        proc = ManagedProcess(name, argv, log, health, ports=ports,
                              start_timeout=self.start_timeout, detach=self.detach)
        self.logs[name] = log
        self.processes.append(proc)
        proc.start()
        return proc

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        data = self.dir / "etcd"
        self._etcd_url = f"http://127.0.0.1:{client}"
        argv = [str(self._binaries["etcd"]), "--name=default", f"--data-dir={data}",
                f"--listen-client-urls={self._etcd_url}",
                f"--advertise-client-urls={self._etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync", "--log-level=warn"]
        self._launch("etcd", argv, lambda: _http_ok(f"{self._etcd_url}/health",
                                                    expect=b'"health":"true"'),
                     {"client": client, "peer": peer})

    def _start_apiserver(self) -> None:
        assert self._certs is not None
        c = self._certs
        port = free_port()
        self._apiserver_port = port
        argv = [str(self._binaries["kube-apiserver"]),
                f"--etcd-servers={self._etcd_url}",
                "--bind-address=127.0.0.1", f"--secure-port={port}",
                # 127.0.0.1 is refused as advertise address unless nothing reconciles the
                # `kubernetes` Endpoints; otherwise it would point at the host's own NIC.
                "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
                f"--tls-cert-file={c.apiserver.cert}", f"--tls-private-key-file={c.apiserver.key}",
                f"--client-ca-file={c.ca.cert}",
                f"--token-auth-file={self.dir / 'tokens.csv'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={c.service_accounts.cert}",
                f"--service-account-signing-key-file={c.service_accounts.key}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # Node authorizer + NodeRestriction: a kubelet (RealNode, node.py) acts
                # as system:node:<name> and may touch only its own Node and pods.
                "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                "--kubelet-preferred-address-types=Hostname,InternalIP",
                f"--kubelet-client-certificate={c.kubelet_client.cert}",
                f"--kubelet-client-key={c.kubelet_client.key}",
                # Why: on SIGTERM kube-apiserver otherwise waits for every open watch to end
                # (kube-controller-manager's and kube-scheduler's never do), so a graceful
                # stop or restart() with those still running hit the 20 s stop timeout and
                # ended in SIGKILL (a restart took 25 s, measured). With a grace period the
                # watches are closed after it and the server exits by itself (restart 5 s).
                "--shutdown-watch-termination-grace-period=2s"]
        context = ssl.create_default_context(cafile=str(c.ca.cert))
        token = self.identities[ADMIN].token
        proc = self._launch(
            "kube-apiserver", argv,
            lambda: _http_ok(f"{self.server}/readyz", context=context, token=token,
                             expect=b"ok"),
            {"secure-port": port})
        self.ready_seconds = proc.started_seconds

    def _start_controller_manager(self) -> None:
        assert self._certs is not None
        c = self._certs
        port = free_port()
        kubeconfig = self.dir / "kubeconfig-controller-manager"
        self._write_kubeconfig(kubeconfig, ["system:kube-controller-manager"],
                               current="system:kube-controller-manager")
        argv = [str(self._binaries["kube-controller-manager"]),
                f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port}",
                f"--service-account-private-key-file={c.service_accounts.key}",
                f"--root-ca-file={c.ca.cert}",
                # Each controller acts as its own ServiceAccount with its bootstrap role,
                # as in kubeadm clusters, instead of one all-powerful identity.
                "--use-service-account-credentials=true",
                f"--cluster-signing-cert-file={c.ca.cert}",
                f"--cluster-signing-key-file={c.ca.key}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--controllers=*"]
        self._launch("kube-controller-manager", argv,
                     lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", context=_insecure()),
                     {"secure-port": port})

    def _start_scheduler(self) -> None:
        port = free_port()
        kubeconfig = self.dir / "kubeconfig-scheduler"
        self._write_kubeconfig(kubeconfig, ["system:kube-scheduler"],
                               current="system:kube-scheduler")
        argv = [str(self._binaries["kube-scheduler"]), f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port}"]
        self._launch("kube-scheduler", argv,
                     lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", context=_insecure()),
                     {"secure-port": port})

    def _start_kwok(self, stages: Path) -> None:
        port = free_port()
        kubeconfig = self.dir / "kubeconfig-kwok"
        self._write_kubeconfig(kubeconfig, ["system:kwok"], current="system:kwok")
        argv = [str(self._binaries["kwok"]), f"--kubeconfig={kubeconfig}",
                f"--config={stages}", "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--cidr=10.0.0.1/24", "--node-ip=10.0.0.1",
                f"--server-address=127.0.0.1:{port}"]
        self._launch("kwok", argv, lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"),
                     {"server-address": port})

    # -- files -------------------------------------------------------------------------

    def _write_token_file(self) -> None:
        # Format: token,user,uid,"group1,group2"
        lines = [f'{i.token},{i.name},{i.name},"{",".join(i.groups)}"'
                 for i in self.identities.values()]
        path = self.dir / "tokens.csv"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)

    def _context_name(self, user: str) -> str:
        return self.name if user == ADMIN else f"{self.name}-{user}"

    def _write_kubeconfig(self, path: Path, users: list[str], current: str) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": self.name, "cluster": {
                "server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": u, "user": {"token": self.token_for(u)}} for u in users],
            "contexts": [{"name": self._context_name(u),
                          "context": {"cluster": self.name, "user": u}} for u in users],
            "current-context": self._context_name(current),
            "preferences": {},
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)


def stop_detached(state: dict[str, Any]) -> list[str]:
    """Stop the processes a detached cluster recorded, in reverse order, remove its folder.

    Each PID is signalled only if ``/proc/PID/cmdline`` still names the recorded binary,
    so a PID reused by an unrelated program after a reboot is never touched.

    Returns:
        The components that were found running and stopped.

    """
    stopped: list[str] = []
    for entry in reversed(state.get("processes", [])):
        pid, argv0 = entry.get("pid"), entry.get("argv0")
        if isinstance(pid, int) and isinstance(argv0, str) and stop_pid(pid, argv0):
            stopped.append(f"{entry.get('name')} (pid {pid})")
    folder = state.get("dir")
    if folder and not state.get("keep_dir"):
        shutil.rmtree(folder, ignore_errors=True)
    return stopped


__all__ = ["ADMIN", "CONTEXT", "ClusterHandle", "ComponentStartError", "Identity", "LocalCluster",
           "kwok_stages_file", "stop_detached"]
