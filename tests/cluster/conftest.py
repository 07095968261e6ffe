"""Fixtures for JobLease tests on the real control plane: the CRD, clients, the operator."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from joblease.sdk.client import LeaseClient

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "joblease.dev_jobleases.yaml"


@pytest.fixture(scope="session")
def jl_crd(cluster: object) -> str:
    """Install the canonical CRD once per session and wait until it is Established."""
    kubectl = cluster.kubectl  # type: ignore[attr-defined]
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD), check=True)
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            "crd/jobleases.joblease.dev", check=True)
    return "jobleases.joblease.dev"


@pytest.fixture
def make_client(cluster: object, jl_crd: str, namespace: str
                ) -> Iterator[Callable[..., LeaseClient]]:
    """Build LeaseClients (each its own connection and clock) for the test's namespace."""
    made: list[LeaseClient] = []

    def make(user: str = "admin", **kwargs: object) -> LeaseClient:
        path = cluster.kubeconfig_for(user)  # type: ignore[attr-defined]
        client = LeaseClient(namespace, kubeconfig=str(path), **kwargs)  # type: ignore[arg-type]
        made.append(client)
        return client

    yield make
    for client in made:
        client.api.close()


@pytest.fixture
def leases(make_client: Callable[..., LeaseClient]) -> LeaseClient:
    """An admin LeaseClient in the test's namespace."""
    return make_client()


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OperatorProcess:
    """The operator as a real process (``python -m joblease``) with its metrics endpoint."""

    def __init__(self, kubeconfig: Path, log: Path, extra_env: dict[str, str] | None = None,
                 namespaces: list[str] | None = None) -> None:
        self.metrics_port, self.health_port = free_port(), free_port()
        self.log = log
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), **(extra_env or {})}
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "joblease", "--metrics-port", str(self.metrics_port),
             "--health-addr", f"127.0.0.1:{self.health_port}",
             *(f"--namespace={ns}" for ns in namespaces or [])],
            env=env, stdout=self._log_file, stderr=subprocess.STDOUT)
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 30) -> None:
        """Wait until kopf's /healthz answers (the operator is watching)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited {self.proc.returncode}: "
                                   f"{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{self.health_port}/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"operator not healthy in {timeout}s: {self.log.read_text()[-3000:]}")

    def metrics(self) -> dict[str, float]:
        """Scrape /metrics into {'name{labels}': value}."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                values[key] = float(value)
        return values

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log_file.close()


@pytest.fixture
def start_operator(cluster: object, jl_crd: str, tmp_path: Path
                   ) -> Iterator[Callable[..., OperatorProcess]]:
    """Start operator processes for this test; all are stopped afterwards."""
    started: list[OperatorProcess] = []

    def start(user: str = "admin", extra_env: dict[str, str] | None = None,
              namespaces: list[str] | None = None) -> OperatorProcess:
        """``namespaces``: watch only these (default: cluster-wide, like the chart)."""
        path = cluster.kubeconfig_for(user)  # type: ignore[attr-defined]
        op = OperatorProcess(path, tmp_path / f"operator-{len(started)}.log", extra_env,
                             namespaces)
        started.append(op)
        return op

    yield start
    for op in started:
        op.stop()
