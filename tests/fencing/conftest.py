"""Fixtures for the fencing suite: one real PostgreSQL 15 per session, a fresh database per test.

The server comes from ``tests/support/postgres.py`` (reusable by other suites). If it cannot
start — binaries missing, running as root without a way to switch user — the tests using it
error with the reason; they are not skipped, because a skipped fencing test hides exactly
the guarantee this suite exists to check.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# `tests/` is not a package; make `support` importable however pytest was invoked.
_TESTS_DIR = str(Path(__file__).resolve().parents[1])
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from support.postgres import PostgresServer  # noqa: E402

_db_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server on 127.0.0.1 for the whole session; stopped and deleted after."""
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """DSN of a database shared by the session (tests must use distinct resource names)."""
    return postgres_server.create_database("joblease_test")


@pytest.fixture
def fresh_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """DSN of a database created for this test alone, dropped afterwards."""
    name = f"fence_{next(_db_numbers)}"
    dsn = postgres_server.create_database(name)
    try:
        yield dsn
    finally:
        postgres_server.drop_database(name)
