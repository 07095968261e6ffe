"""Fenced writes to PostgreSQL: the token check and the caller's write in ONE transaction.

Why one transaction: reading an "owner" or "token" column, deciding in the application and
then writing cannot stop a delayed request — the stale writer can pass its check before the
new holder's write lands and write afterwards. The comparison must happen under the same row
lock, in the same transaction, as the write it guards; then a stale write either waits for
the lock and is refused, or commits before the newer token is stored and is overwritten by
the newer holder, never after it.

Schema (created by :meth:`PostgresFence.install`, idempotent)::

    CREATE TABLE IF NOT EXISTS joblease_fence (
        resource   text PRIMARY KEY,
        epoch      bigint NOT NULL CHECK (epoch >= 0),
        generation bigint NOT NULL CHECK (generation >= 0),
        updated_at timestamptz NOT NULL DEFAULT now());
    CREATE TABLE IF NOT EXISTS joblease_fence_applied (
        resource        text NOT NULL REFERENCES joblease_fence ON DELETE CASCADE,
        epoch           bigint NOT NULL,
        generation      bigint NOT NULL,
        idempotency_key text NOT NULL,
        applied_at      timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (resource, epoch, generation, idempotency_key));

The transaction :meth:`PostgresFence.write` runs (``$1`` resource, ``$2``/``$3`` the
presented epoch/generation, ``$4`` the idempotency key)::

    BEGIN;  -- READ COMMITTED (the default)
    -- 1. make sure the row exists, then lock it: concurrent writers queue here
    INSERT INTO joblease_fence (resource, epoch, generation) VALUES ($1, $2, $3)
        ON CONFLICT (resource) DO NOTHING;
    SELECT epoch, generation, ($2, $3) < (epoch, generation) AS stale
        FROM joblease_fence WHERE resource = $1 FOR UPDATE;
    -- 2. stale = true: ROLLBACK and refuse (name both tokens)
    -- 3. remember this (token, key); no row returned = a retry of a write already applied:
    --    COMMIT (nothing changed) and report a duplicate, without doing the write again
    INSERT INTO joblease_fence_applied (resource, epoch, generation, idempotency_key)
        VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1;
    -- 4. raise the stored token; keys of lower tokens can never match again (step 2)
    UPDATE joblease_fence SET epoch = $2, generation = $3, updated_at = now()
        WHERE resource = $1 AND (epoch, generation) < ($2, $3);
    DELETE FROM joblease_fence_applied
        WHERE resource = $1 AND (epoch, generation) < ($2, $3);
    -- 5. the caller's own write, on the same connection
    ...;
    COMMIT;

If the caller's write fails, the whole transaction — including the token update and the
applied-key record — rolls back, so a retry is judged exactly like the first attempt.

Called inside a transaction the caller already opened, :meth:`PostgresFence.write` runs as a
savepoint of it; the row lock is then held, and nothing is durable, until the caller commits.
Under REPEATABLE READ or SERIALIZABLE, PostgreSQL may raise a serialization failure instead
of waiting; that propagates and the caller may retry.

A writer frozen inside its transaction (SIGSTOP, a GC pause, a frozen VM) holds the row lock,
and every later writer of the resource, the new holder included, waits behind it for as long
as it stays frozen. So a transaction the fence opens first sets PostgreSQL's
``idle_in_transaction_session_timeout`` for itself (``SET LOCAL``, through ``set_config``):
after ``max_idle_in_transaction`` seconds without a statement from the client, the server
ends the session, rolls the transaction back and releases the lock. The frozen writer, once
it runs again, gets ``psycopg.errors.IdleInTransactionSessionTimeout`` (or a connection
error); its write never happened, and a retry on a new
connection is judged like any other (refused, if the token moved on). Keep the limit below
the lease's duration, so a successor waits less than it needs to keep its own lease. A
transaction the caller opened is the caller's: the fence leaves its settings alone.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from joblease.domain.token import FencingToken
from joblease.fencing import metrics
from joblease.fencing.errors import StaleTokenError
from joblease.fencing.result import Applied, Duplicate

T = TypeVar("T")

DDL = (
    "SELECT pg_advisory_xact_lock(hashtext('joblease_fence_install'))",
    """CREATE TABLE IF NOT EXISTS joblease_fence (
        resource   text PRIMARY KEY,
        epoch      bigint NOT NULL CHECK (epoch >= 0),
        generation bigint NOT NULL CHECK (generation >= 0),
        updated_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS joblease_fence_applied (
        resource        text NOT NULL REFERENCES joblease_fence ON DELETE CASCADE,
        epoch           bigint NOT NULL,
        generation      bigint NOT NULL,
        idempotency_key text NOT NULL,
        applied_at      timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (resource, epoch, generation, idempotency_key))""",
)
"""Statements of :meth:`PostgresFence.install`; the advisory lock serializes concurrent
installers (``CREATE TABLE IF NOT EXISTS`` alone can race on the catalog)."""

_ENSURE_ROW = """INSERT INTO joblease_fence (resource, epoch, generation) VALUES (%s, %s, %s)
    ON CONFLICT (resource) DO NOTHING RETURNING 1"""
_LOCK_ROW = """SELECT epoch, generation, (%s, %s) < (epoch, generation)
    FROM joblease_fence WHERE resource = %s FOR UPDATE"""
_RECORD_KEY = """INSERT INTO joblease_fence_applied (resource, epoch, generation, idempotency_key)
    VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1"""
_RAISE_TOKEN = """UPDATE joblease_fence SET epoch = %s, generation = %s, updated_at = now()
    WHERE resource = %s AND (epoch, generation) < (%s, %s)"""
_PRUNE_KEYS = """DELETE FROM joblease_fence_applied
    WHERE resource = %s AND (epoch, generation) < (%s, %s)"""
_HIGHEST = "SELECT epoch, generation FROM joblease_fence WHERE resource = %s"
_LIMIT_IDLE = "SELECT set_config('idle_in_transaction_session_timeout', %s, true)"

DEFAULT_MAX_IDLE_IN_TRANSACTION = 5.0
"""Seconds a writer may stay silent inside a transaction the fence opened: a fenced write is
a few statements, so a longer silence is a frozen or lost client holding the row lock."""

Statement = tuple[str, tuple[Any, ...]]


class PostgresFence:
    """Fence writes to PostgreSQL tables with the ``joblease_fence`` tables.

    Stateless but for its setting: every call takes the connection to use, so it works with
    a pool, a connection the caller manages, or a transaction the caller has already opened.

    Args:
        max_idle_in_transaction: Seconds after which PostgreSQL ends a session that went
            silent inside a transaction the fence opened (see the module), so a frozen
            predecessor holds the lock at most this long; ``None`` keeps the server's
            setting. Raise it if ``fn`` computes for longer between its statements.

    Raises:
        ValueError: ``max_idle_in_transaction`` is not a positive finite number.
    """

    def __init__(
        self, max_idle_in_transaction: float | None = DEFAULT_MAX_IDLE_IN_TRANSACTION
    ) -> None:
        self._limit_idle = _limit_idle_statement(max_idle_in_transaction)

    def install(self, conn: psycopg.Connection[Any]) -> None:
        """Create the fence tables if they do not exist (safe to call concurrently)."""
        with conn.transaction(), conn.cursor() as cur:
            for statement in DDL:
                cur.execute(statement)

    def write(
        self,
        conn: psycopg.Connection[Any],
        resource: str,
        token: FencingToken,
        idempotency_key: str | None,
        fn: Callable[[psycopg.Cursor[Any]], T],
    ) -> Applied[T] | Duplicate:
        """Run ``fn`` in the same transaction as the fencing check, if ``token`` may write.

        Accepted writes are counted in :mod:`joblease.fencing.metrics` once the transaction
        (or savepoint) is released, refusals when the check refuses (``helper="postgres"``),
        so a worker can publish how often its writes arrive too late.

        Args:
            conn: The connection; ``fn`` gets a cursor on it.
            resource: The fenced resource (what the token is for, e.g. the job id).
            token: The token the writer holds.
            idempotency_key: Identifies retries of one logical write; ``None`` disables
                duplicate detection.
            fn: The caller's write. Not called for a stale token or a duplicate. If it
                raises, nothing of the call is committed and the exception propagates.

        Returns:
            :class:`Applied` with ``fn``'s return value, or :class:`Duplicate`.

        Raises:
            StaleTokenError: ``token`` is lower than the stored one (names both).

        """
        outcome = self._write(conn, resource, token, idempotency_key, fn)
        metrics.count_accepted("postgres", duplicate=isinstance(outcome, Duplicate))
        return outcome

    def _write(
        self,
        conn: psycopg.Connection[Any],
        resource: str,
        token: FencingToken,
        idempotency_key: str | None,
        fn: Callable[[psycopg.Cursor[Any]], T],
    ) -> Applied[T] | Duplicate:
        limit_idle = _when_fence_opens(conn.info.transaction_status, self._limit_idle)
        with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
            for statement in limit_idle:
                cur.execute(*statement)
            created = _execute_one(cur, _ensure_row(resource, token)) is not None
            previous = _check(resource, token, _execute_one(cur, _lock_row(resource, token)))
            if idempotency_key is not None and (
                _execute_one(cur, _record_key(resource, token, idempotency_key)) is None
            ):
                return Duplicate(resource, token, idempotency_key)
            for statement in _raise_token(resource, token):
                cur.execute(*statement)
            with conn.cursor() as user_cursor:
                value = fn(user_cursor)
        return Applied(resource, token, None if created else previous, value)

    def highest(self, conn: psycopg.Connection[Any]) -> Callable[[str], FencingToken | None]:
        """Return a lookup of the stored token per resource on ``conn`` (for inspection)."""

        def lookup(resource: str) -> FencingToken | None:
            with conn.cursor(row_factory=tuple_row) as cur:
                row = _execute_one(cur, (_HIGHEST, (resource,)))
            return None if row is None else FencingToken(int(row[0]), int(row[1]))

        return lookup


class AsyncPostgresFence:
    """:class:`PostgresFence` for ``psycopg.AsyncConnection`` (same SQL, same semantics).

    Args:
        max_idle_in_transaction: As for :class:`PostgresFence`.

    Raises:
        ValueError: As for :class:`PostgresFence`.
    """

    def __init__(
        self, max_idle_in_transaction: float | None = DEFAULT_MAX_IDLE_IN_TRANSACTION
    ) -> None:
        self._limit_idle = _limit_idle_statement(max_idle_in_transaction)

    async def install(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Create the fence tables if they do not exist (safe to call concurrently)."""
        async with conn.transaction(), conn.cursor() as cur:
            for statement in DDL:
                await cur.execute(statement)

    async def write(
        self,
        conn: psycopg.AsyncConnection[Any],
        resource: str,
        token: FencingToken,
        idempotency_key: str | None,
        fn: Callable[[psycopg.AsyncCursor[Any]], Awaitable[T]],
    ) -> Applied[T] | Duplicate:
        """Await ``fn`` in the fencing check's transaction; see :meth:`PostgresFence.write`.

        Raises:
            StaleTokenError: ``token`` is lower than the stored one (names both).

        """
        outcome = await self._write(conn, resource, token, idempotency_key, fn)
        metrics.count_accepted("postgres", duplicate=isinstance(outcome, Duplicate))
        return outcome

    async def _write(
        self,
        conn: psycopg.AsyncConnection[Any],
        resource: str,
        token: FencingToken,
        idempotency_key: str | None,
        fn: Callable[[psycopg.AsyncCursor[Any]], Awaitable[T]],
    ) -> Applied[T] | Duplicate:
        limit_idle = _when_fence_opens(conn.info.transaction_status, self._limit_idle)
        async with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
            for statement in limit_idle:
                await cur.execute(*statement)
            await cur.execute(*_ensure_row(resource, token))
            created = await cur.fetchone() is not None
            await cur.execute(*_lock_row(resource, token))
            previous = _check(resource, token, await cur.fetchone())
            if idempotency_key is not None:
                await cur.execute(*_record_key(resource, token, idempotency_key))
                if await cur.fetchone() is None:
                    return Duplicate(resource, token, idempotency_key)
            for statement in _raise_token(resource, token):
                await cur.execute(*statement)
            async with conn.cursor() as user_cursor:
                value = await fn(user_cursor)
        return Applied(resource, token, None if created else previous, value)


def _limit_idle_statement(seconds: float | None) -> tuple[Statement, ...]:
    """The statement that bounds the fence's own transactions' silence (none for ``None``)."""
    if seconds is None:
        return ()
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
        math.isfinite(seconds) and seconds > 0
    ):
        raise ValueError(
            f"max_idle_in_transaction must be a positive finite number of seconds or None, "
            f"got {seconds!r}")
    return ((_LIMIT_IDLE, (f"{max(1, math.ceil(seconds * 1000))}ms",)),)


def _when_fence_opens(
    status: TransactionStatus, statements: tuple[Statement, ...]
) -> tuple[Statement, ...]:
    """``statements`` if the fence's transaction is a new one, none in the caller's own."""
    return statements if status == TransactionStatus.IDLE else ()


def _ensure_row(resource: str, token: FencingToken) -> Statement:
    if not resource:
        raise ValueError("a fenced resource needs a non-empty name")
    return _ENSURE_ROW, (resource, token.epoch, token.generation)


def _lock_row(resource: str, token: FencingToken) -> Statement:
    return _LOCK_ROW, (token.epoch, token.generation, resource)


def _record_key(resource: str, token: FencingToken, key: str) -> Statement:
    return _RECORD_KEY, (resource, token.epoch, token.generation, key)


def _raise_token(resource: str, token: FencingToken) -> tuple[Statement, Statement]:
    e, g = token.epoch, token.generation
    return (_RAISE_TOKEN, (e, g, resource, e, g)), (_PRUNE_KEYS, (resource, e, g))


def _check(resource: str, token: FencingToken, locked: tuple[Any, ...] | None) -> FencingToken:
    """Turn the locked row into the stored token, refusing ``token`` if it is lower."""
    if locked is None:  # the row was inserted or exists; only a concurrent DELETE gets here
        raise RuntimeError(f"fence row for {resource!r} vanished while being locked")
    stored = FencingToken(int(locked[0]), int(locked[1]))
    if locked[2]:
        metrics.count_refused("postgres")  # the decision; the rollback follows
        raise StaleTokenError(resource, token, stored)
    return stored


def _execute_one(
    cur: psycopg.Cursor[tuple[Any, ...]], statement: Statement
) -> tuple[Any, ...] | None:
    cur.execute(*statement)
    return cur.fetchone()
