"""An HA control plane on 127.0.0.1: an etcd cluster, several kube-apiservers, a load balancer.

Production clusters run several kube-apiservers behind a TCP load balancer on an etcd
cluster of three or five members. ``HACluster`` reproduces that shape with the same
upstream binaries as :class:`~joblease_localcluster.cluster.LocalCluster`, so the lease
protocol can be tested where "the API server" is several processes (and several clocks):

    etcd m0, m1, m2 (one raft cluster) → kube-apiserver-0..N-1 (all on every member)
      → load balancer (:mod:`joblease_localcluster.lb`, round-robin per connection)
      → the kubeconfig's ``server`` → controller-manager, scheduler, clients

It subclasses ``LocalCluster`` and changes only how etcd and the API servers start, so
everything else (identities, kubeconfigs, kwok, ``stop()``, ``restart()``) is shared.
Every API server uses the same serving certificate (SAN 127.0.0.1): a client verifies the
address it dialled, the load balancer's, which is also 127.0.0.1.

Guarantees: as ``LocalCluster``; in addition ``start()`` returns only once every etcd
member reports healthy, every API server's own ``/readyz`` and ``/readyz`` through the
load balancer answered ok.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import ssl
import sys
import time
import urllib.request
from typing import Any

from joblease_localcluster.cluster import ADMIN, LocalCluster, _http_ok
from joblease_localcluster.process import ComponentStartError, ManagedProcess, free_port

LB_NAME = "load-balancer"


class HACluster(LocalCluster):
    """A local control plane with ``etcd_members`` etcd members and ``apiservers`` servers.

    Args:
        apiservers: How many kube-apiservers (>= 1) behind the load balancer.
        etcd_members: How many etcd members (odd, >= 1) in one raft cluster.
        **kwargs: As :class:`LocalCluster`.
    """

    def __init__(self, *, apiservers: int = 3, etcd_members: int = 3, **kwargs: Any) -> None:
        if apiservers < 1 or etcd_members < 1 or etcd_members % 2 == 0:
            raise ValueError("need >= 1 API server and an odd number of etcd members")
        super().__init__(**kwargs)
        self.apiserver_count = apiservers
        self.etcd_count = etcd_members
        self.apiserver_ports: list[int] = []
        self.etcd_client_urls: list[str] = []
        self.etcd_ids: dict[str, str] = {}  # raft member id (decimal) → component name
        self.lb_port: int | None = None
        self.startup_seconds: float | None = None
        self._apiservers_started = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start everything (see the module doc); records :attr:`startup_seconds`."""
        began = time.monotonic()
        super().start()
        self.startup_seconds = time.monotonic() - began

    def apiserver_url(self, index: int) -> str:
        """One API server's own URL (bypassing the load balancer)."""
        return f"https://127.0.0.1:{self.apiserver_ports[index]}"

    def process(self, name: str) -> ManagedProcess:
        """The running component called ``name`` (``etcd-0``, ``kube-apiserver-1``, …)."""
        for proc in self.processes:
            if proc.name == name:
                return proc
        raise KeyError(f"no component {name!r}")

    def kill(self, name: str) -> int:
        """SIGKILL one component we started (a crash); returns its PID. No restart."""
        proc = self.process(name)
        pid = proc.pid
        if pid is None or not proc.running():
            raise RuntimeError(f"{name} is not running")
        os.kill(pid, signal.SIGKILL)
        proc.stop()  # reaps it
        return pid

    def etcd_leader(self, timeout: float = 30.0) -> str:
        """The component name of the current etcd leader (asks the live members, bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, url in enumerate(self.etcd_client_urls):
                if not self.process(f"etcd-{i}").running():
                    continue
                try:
                    status = _etcd_status(url)
                except (OSError, ValueError):
                    continue
                leader = str(status.get("leader", "0"))
                if leader != "0" and leader in self.etcd_ids:
                    return self.etcd_ids[leader]
            time.sleep(0.2)
        raise TimeoutError(f"no etcd leader within {timeout:.0f}s")

    def state(self) -> dict[str, Any]:
        """As ``LocalCluster.state()``, plus the HA layout."""
        data = super().state()
        data.update(apiservers=[self.apiserver_url(i) for i in range(len(self.apiserver_ports))],
                    etcd=self.etcd_client_urls, load_balancer=self.server)
        return data

    # -- components (overrides) ------------------------------------------------------------

    def _start_etcd(self) -> None:
        # All members must run before any reports healthy (no quorum alone), so start them
        # all first, then wait for each one's /health.
        members = [(f"etcd-{i}", free_port(), free_port()) for i in range(self.etcd_count)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{peer}"
                           for i, (_, _, peer) in enumerate(members))
        token = f"joblease-{secrets.token_hex(4)}"
        started: list[tuple[ManagedProcess, str]] = []
        for i, (name, client, peer) in enumerate(members):
            url = f"http://127.0.0.1:{client}"
            argv = [str(self._binaries["etcd"]), f"--name=m{i}",
                    f"--data-dir={self.dir / name}",
                    f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-cluster={initial}", "--initial-cluster-state=new",
                    f"--initial-cluster-token={token}",
                    "--unsafe-no-fsync", "--log-level=warn"]
            log = self.dir / "logs" / f"{name}.log"
            proc = ManagedProcess(name, argv, log, lambda: True,
                                  ports={"client": client, "peer": peer},
                                  start_timeout=self.start_timeout, detach=self.detach)
            self.logs[name] = log
            self.processes.append(proc)
            proc.start()
            started.append((proc, url))
            self.etcd_client_urls.append(url)
        deadline = time.monotonic() + self.start_timeout
        for proc, url in started:
            proc.health = _etcd_health(url)
            while not _safe(proc.health):
                if not proc.running():
                    raise ComponentStartError(proc.name, "exited during start-up", proc.log_path)
                if time.monotonic() > deadline:
                    raise ComponentStartError(proc.name, "no quorum / not healthy in time",
                                              proc.log_path)
                time.sleep(0.1)
        for i, url in enumerate(self.etcd_client_urls):
            member = str(_etcd_status(url)["header"]["member_id"])
            self.etcd_ids[member] = f"etcd-{i}"
        self._etcd_url = ",".join(self.etcd_client_urls)  # --etcd-servers takes a list

    def _start_apiserver(self) -> None:
        for _ in range(self.apiserver_count):
            super()._start_apiserver()  # goes through _launch below, named per index
            assert self._apiserver_port is not None
            self.apiserver_ports.append(self._apiserver_port)
        self._start_lb()

    def _launch(self, name: str, argv: list[str], health: Any, ports: dict[str, int]
                ) -> ManagedProcess:
        if name == "kube-apiserver":
            name = f"kube-apiserver-{self._apiservers_started}"
            self._apiservers_started += 1
            health = self._readyz(ports["secure-port"])
        return super()._launch(name, argv, health, ports)

    def _start_lb(self) -> None:
        port = free_port()
        argv = [sys.executable, "-m", "joblease_localcluster.lb", f"--port={port}",
                *[f"--backend=127.0.0.1:{p}" for p in self.apiserver_ports]]
        self.lb_port = port
        self._apiserver_port = port  # from here on `server` (and every kubeconfig) is the LB
        proc = ManagedProcess(LB_NAME, argv, self.dir / "logs" / f"{LB_NAME}.log",
                              self._readyz(port), ports={"port": port},
                              start_timeout=self.start_timeout, detach=self.detach,
                              env={"PYTHONPATH": _package_root()})
        self.logs[LB_NAME] = proc.log_path
        self.processes.append(proc)
        proc.start()

    def _readyz(self, port: int) -> Any:
        assert self._certs is not None
        context = ssl.create_default_context(cafile=str(self._certs.ca.cert))
        token = self.identities[ADMIN].token
        return lambda: _http_ok(f"https://127.0.0.1:{port}/readyz", context=context,
                                token=token, expect=b"ok")


def _package_root() -> str:
    """The folder holding ``joblease_localcluster`` (the load balancer needs only it)."""
    return str(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _safe(check: Any) -> bool:
    try:
        return bool(check())
    except Exception:
        return False


def _etcd_health(url: str) -> Any:
    return lambda: _http_ok(f"{url}/health", expect=b'"health":"true"')


def _etcd_status(url: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/v3/maintenance/status", data=b"{}",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=2) as response:
        data: dict[str, Any] = json.loads(response.read())
        return data


def tcp_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


__all__ = ["LB_NAME", "HACluster", "tcp_open"]
