"""Fixtures for tests on the real node; they live in ``node_support`` (importable by name)."""

from node_support import node_cluster, node_ns  # noqa: F401  (fixtures)
