"""Fixtures of the HA suite: one HA control plane per session (3 etcd, 3 API servers, LB)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from joblease_localcluster.ha import HACluster

from .scenarios import install_crd


@pytest.fixture(scope="session")
def ha_cluster() -> Iterator[HACluster]:
    cluster = HACluster(apiservers=3, etcd_members=3)
    cluster.start()
    try:
        print(f"HA cluster start-up {cluster.startup_seconds:.1f}s")
        install_crd(cluster)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ha_namespace(ha_cluster: HACluster) -> Iterator[str]:
    name = f"ha-{secrets.token_hex(3)}"
    ha_cluster.kubectl("create", "namespace", name, check=True)
    try:
        yield name
    finally:
        ha_cluster.kubectl("delete", "namespace", name, "--wait=false")
