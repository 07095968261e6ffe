"""A throwaway, real PostgreSQL server for tests: initdb + pg_ctl in a temporary folder.

Reusable by any suite (fencing, fault injection, pods)::

    with PostgresServer() as pg:
        pg.create_database("app")
        psycopg.connect(pg.dsn("app"))

The server listens on 127.0.0.1 only (TCP on a free port, its Unix socket inside the
temporary folder), trusts connections for the superuser ``postgres`` and runs with
``fsync=off``: it is for tests, and is deleted on :meth:`PostgresServer.stop`.

PostgreSQL refuses to run as root. When the tests run as root, ``initdb``/``pg_ctl`` run as an
unprivileged user (``nobody`` by default, via ``runuser`` or else ``setpriv``) who owns the
temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from joblease_localcluster.process import free_port

SUPERUSER = "postgres"
_BIN_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/15/bin")


class PostgresUnavailableError(RuntimeError):
    """PostgreSQL cannot be started here (missing binaries, no way to drop root, ...)."""


def _find_binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for directory in _BIN_DIRS:
        candidate = Path(directory) / name
        if candidate.is_file():
            return str(candidate)
    raise PostgresUnavailableError(f"{name} not on PATH or in {_BIN_DIRS}: install PostgreSQL 15")


def _drop_privileges_prefix(user: str) -> list[str]:
    """Command prefix that runs a program as ``user`` when we are root, else nothing."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(user)
    except KeyError as e:
        raise PostgresUnavailableError(f"running as root and user {user!r} does not exist") from e
    if shutil.which("runuser"):
        return ["runuser", "-u", user, "--"]
    if shutil.which("setpriv"):
        entry = pwd.getpwnam(user)
        return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]
    raise PostgresUnavailableError(
        "running as root, and PostgreSQL refuses root: need runuser or setpriv to switch "
        f"to {user!r} (or run the tests as an unprivileged user)"
    )


class PostgresServer:
    """One PostgreSQL cluster in a temporary folder, started and stopped by the test process.

    Args:
        user: Unprivileged OS user to run the server as when the tests run as root.
        start_attempts: Retries on a port race (the free port is picked before binding).
    """

    def __init__(self, user: str = "nobody", start_attempts: int = 3) -> None:
        self._user = user
        self._attempts = start_attempts
        self._prefix: list[str] = []
        self._root: Path | None = None
        self.port = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> PostgresServer:
        """Create the cluster and start the server; raise PostgresUnavailableError on failure."""
        if self._root is not None:
            raise RuntimeError("PostgresServer already started")
        self._prefix = _drop_privileges_prefix(self._user)
        self._root = Path(tempfile.mkdtemp(prefix="joblease-pg-"))
        try:
            self._own_root()
            self._initdb()
            self._start_server()
        except BaseException:
            self._remove_root()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its folder; safe to call twice."""
        if self._root is None:
            return
        try:
            if (self._data / "postmaster.pid").exists():
                self._stop_server()
        finally:
            self._remove_root()

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- connecting ------------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq connection string for ``dbname`` over TCP on 127.0.0.1."""
        if self._root is None:
            raise RuntimeError("PostgresServer not started")
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={dbname}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` (a plain identifier) and return its DSN."""
        self._admin(f'CREATE DATABASE "{_checked_name(name)}"')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name``, disconnecting any sessions still using it."""
        self._admin(f'DROP DATABASE IF EXISTS "{_checked_name(name)}" WITH (FORCE)')

    def _admin(self, statement: str) -> None:
        import psycopg  # local: the module stays importable without the optional dependency

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(statement.encode())

    # -- internals -------------------------------------------------------------------------

    @property
    def _data(self) -> Path:
        assert self._root is not None
        return self._root / "data"

    @property
    def log_path(self) -> Path:
        """The server log (kept until stop; included in start errors)."""
        assert self._root is not None
        return self._root / "server.log"

    def _own_root(self) -> None:
        assert self._root is not None
        if self._prefix:
            entry = pwd.getpwnam(self._user)
            os.chown(self._root, entry.pw_uid, entry.pw_gid)

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self._prefix, *argv], capture_output=True, text=True, timeout=120, check=False
        )
        if result.returncode != 0:
            raise PostgresUnavailableError(
                f"{' '.join(argv[:2])} failed ({result.returncode}) as "
                f"{self._user if self._prefix else 'current user'}:\n"
                f"{result.stdout}{result.stderr}{self._log_tail()}"
            )
        return result

    def _initdb(self) -> None:
        self._run(
            _find_binary("initdb"), "-D", str(self._data), "-U", SUPERUSER, "-A", "trust",
            "-E", "UTF8", "--no-locale", "--no-sync",
        )  # fmt: skip

    def _start_server(self) -> None:
        assert self._root is not None
        for attempt in range(1, self._attempts + 1):
            self.port = free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} "
                f"-c unix_socket_directories={self._root} -c fsync=off "
                "-c full_page_writes=off -c synchronous_commit=off"
            )
            try:
                self._run(
                    _find_binary("pg_ctl"), "-D", str(self._data), "-l", str(self.log_path),
                    "-w", "-t", "60", "-o", options, "start",
                )  # fmt: skip
                return
            except PostgresUnavailableError:
                if attempt == self._attempts:
                    raise

    def _stop_server(self) -> None:
        try:
            self._run(_find_binary("pg_ctl"), "-D", str(self._data), "-m", "fast", "-w", "stop")
        except (PostgresUnavailableError, subprocess.TimeoutExpired):
            self._kill_postmaster()

    def _kill_postmaster(self) -> None:
        """Last resort: SIGQUIT the postmaster we started (its PID is in postmaster.pid)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self._data / "postmaster.pid").read_text().splitlines()[0])
            os.kill(pid, signal.SIGQUIT)

    def _remove_root(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-20:]
        except (OSError, AssertionError):
            return ""
        return "\n--- server.log (tail) ---\n" + "\n".join(lines)


def _checked_name(name: str) -> str:
    """Return ``name`` if it is a plain identifier, safe to quote into CREATE/DROP DATABASE."""
    if not (name.isascii() and name.replace("_", "a").isalnum() and not name[:1].isdigit()):
        raise ValueError(f"not a plain database name: {name!r}")
    return name
