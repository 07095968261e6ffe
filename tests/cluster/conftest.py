"""Fixtures for JobLease tests on the real control plane: the CRD, clients, the operator."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from joblease.sdk.client import LeaseClient
from support.operator_process import OperatorProcess
from support.paths import CRD


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


@pytest.fixture
def start_operator(cluster: object, jl_crd: str, tmp_path: Path
                   ) -> Iterator[Callable[..., OperatorProcess]]:
    """Start operator processes for this test; all are stopped afterwards."""
    started: list[OperatorProcess] = []

    def start(user: str = "admin", extra_env: dict[str, str] | None = None,
              namespaces: list[str] | None = None) -> OperatorProcess:
        """``namespaces``: watch only these (default: cluster-wide, like the chart)."""
        path = cluster.kubeconfig_for(user)  # type: ignore[attr-defined]
        op = OperatorProcess(path, tmp_path / f"operator-{len(started)}.log",
                             extra_env=extra_env, namespaces=namespaces or ())
        started.append(op)
        return op.start()

    yield start
    for op in started:
        op.stop()
