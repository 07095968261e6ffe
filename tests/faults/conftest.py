"""Fixtures of the fault suite: CRD, PostgreSQL target, operator process, a FaultEnv."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parents[1])
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from support.postgres import PostgresServer  # noqa: E402

from .harness import FaultEnv, Operator, install_crd, install_target  # noqa: E402


@pytest.fixture(scope="session")
def faults_postgres() -> Iterator[str]:
    server = PostgresServer().start()
    try:
        dsn = server.create_database("faults")
        install_target(dsn)
        yield dsn
    finally:
        server.stop()


@pytest.fixture
def fault_env(cluster: object, namespace: str, faults_postgres: str,
              tmp_path: Path) -> Iterator[FaultEnv]:
    install_crd(cluster)
    operator = Operator(Path(cluster.kubeconfig), tmp_path / "operator.log")  # type: ignore[attr-defined]
    operator.start()
    try:
        yield FaultEnv(cluster, namespace, faults_postgres, operator, tmp_path)
    finally:
        operator.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from .harness import SESSION
    if SESSION.per_kind:
        terminalreporter.write_line("faults " + SESSION.line())
