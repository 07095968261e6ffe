"""Fixtures for tests on the real node: the cluster's live in ``node_support`` (importable by
name); the fenced PostgreSQL target is here, shared by the modules that write through it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from node_support import node_cluster, node_ns  # noqa: F401  (fixtures)

from support.postgres import PostgresServer


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    """The fenced target, one per module (127.0.0.1; the host-network workers reach it there)."""
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
