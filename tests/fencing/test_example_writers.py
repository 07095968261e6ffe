"""The examples' fenced writers against a real PostgreSQL: a session the server ended.

``examples/worker.py`` and ``examples/indexed_worker.py`` run in pods that the node suite
freezes with SIGSTOP. Frozen inside the fenced write, the fence's idle limit makes the server
end the pod's session (safety.md #61); once running again, the writer must retry on a new
connection with the same idempotency key: applied once if its token still stands, refused
as stale if the next holder wrote. Here the session is ended by ``pg_terminate_backend``,
which reaches the writer as the same kind of error at the same place.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from joblease.domain.token import FencingToken
from joblease.fencing import StaleTokenError
from joblease.fencing.postgres import PostgresFence

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
T7, T8 = FencingToken(3, 7), FencingToken(3, 8)


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def end_session(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """End ``conn``'s server session from another connection, as the idle limit does."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))


def write_once(name: str, conn: psycopg.Connection[Any], fence: PostgresFence,
               token: FencingToken, key: str) -> psycopg.Connection[Any]:
    """The example's own write-with-retry, for ``token`` and ``key``."""
    module = load(name)
    if name == "worker":
        return module.write_row(conn, fence, "job-1", token, key)  # type: ignore[no-any-return]

    def insert(cur: psycopg.Cursor[Any]) -> None:
        cur.execute("INSERT INTO report (job, token, writer) VALUES ('job-1', %s, 'x')",
                    (str(token),))

    return module.write_fenced(  # type: ignore[no-any-return]
        conn, fence, "job-1", token, key, insert)


@pytest.mark.parametrize("name", ["worker", "indexed_worker"])
def test_an_ended_session_is_retried_once_applied_once_then_refused_once_stale(
    name: str, fresh_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    fence = PostgresFence(max_idle_in_transaction=1.0)
    conn = psycopg.connect(fresh_dsn, autocommit=True)
    fence.install(conn)
    conn.execute("CREATE TABLE report (job text, token text, writer text)")
    end_session(fresh_dsn, conn)
    conn = write_once(name, conn, fence, T7, "step-1")  # retried on a new connection
    conn = write_once(name, conn, fence, T7, "step-1")  # the same key: not a second row
    with psycopg.connect(fresh_dsn, autocommit=True) as b:
        fence.write(b, "job-1", T8, "b-1", lambda cur: cur.execute(
            "INSERT INTO report (job, token, writer) VALUES ('job-1', %s, 'b')", (str(T8),)))
    end_session(fresh_dsn, conn)
    with pytest.raises(StaleTokenError, match=r"3/7 .* 3/8"):
        write_once(name, conn, fence, T7, "step-2")
    with psycopg.connect(fresh_dsn, autocommit=True) as check:
        rows = check.execute("SELECT token FROM report ORDER BY token").fetchall()
    assert rows == [("3/7",), ("3/8",)]
    conn.close()
