"""PostgresFence against a real PostgreSQL: the A/B story told at the target."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from joblease.domain.token import FencingToken
from joblease.fencing import Applied, Duplicate, StaleTokenError
from joblease.fencing.postgres import AsyncPostgresFence, PostgresFence

T7 = FencingToken(4711, 7)
T8 = FencingToken(4711, 8)
FENCE = PostgresFence()


@pytest.fixture
def conn(fresh_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(fresh_dsn) as c:
        FENCE.install(c)
        with c.transaction():
            c.execute("CREATE TABLE job_output (job text PRIMARY KEY, value text, token text)")
            c.execute(
                "CREATE TABLE write_log (seq bigserial PRIMARY KEY, job text,"
                " epoch bigint, generation bigint, value text)"
            )
        yield c


def put(value: str, token: FencingToken, job: str = "job-1") -> Callable[[Any], str]:
    """The caller's write: upsert the job's output and append to the log."""

    def fn(cur: psycopg.Cursor[Any]) -> str:
        cur.execute(
            "INSERT INTO job_output VALUES (%s, %s, %s) ON CONFLICT (job)"
            " DO UPDATE SET value = excluded.value, token = excluded.token",
            (job, value, str(token)),
        )
        cur.execute(
            "INSERT INTO write_log (job, epoch, generation, value) VALUES (%s, %s, %s, %s)",
            (job, token.epoch, token.generation, value),
        )
        return value

    return fn


def output(conn: psycopg.Connection[Any], job: str = "job-1") -> tuple[Any, ...] | None:
    with conn.transaction():
        return conn.execute("SELECT value, token FROM job_output WHERE job = %s", (job,)).fetchone()


def log_count(conn: psycopg.Connection[Any]) -> int:
    with conn.transaction():
        row = conn.execute("SELECT count(*) FROM write_log").fetchone()
    assert row is not None
    return int(row[0])


def stored(conn: psycopg.Connection[Any], job: str = "job-1") -> FencingToken | None:
    with conn.transaction():
        return FENCE.highest(conn)(job)


def test_delayed_write_of_the_old_holder_is_refused(conn: psycopg.Connection[Any]) -> None:
    first = FENCE.write(conn, "job-1", T7, "a-1", put("A", T7))
    assert first == Applied("job-1", T7, None, "A")
    second = FENCE.write(conn, "job-1", T8, "b-1", put("B", T8))
    assert second == Applied("job-1", T8, T7, "B")

    with pytest.raises(StaleTokenError) as refused:
        FENCE.write(conn, "job-1", T7, "a-2", put("A-late", T7))

    assert (refused.value.presented, refused.value.highest) == (T7, T8)
    assert "4711/7" in str(refused.value) and "4711/8" in str(refused.value)
    assert "'job-1'" in str(refused.value)
    assert output(conn) == ("B", "4711/8")
    assert stored(conn) == T8
    assert log_count(conn) == 2


def test_stale_writer_waiting_on_the_row_lock_is_refused_after_the_commit(
    conn: psycopg.Connection[Any], fresh_dsn: str
) -> None:
    """B holds the fence row mid-transaction; A's write, arriving meanwhile, waits, then loses."""
    FENCE.write(conn, "job-1", T7, "a-1", put("A", T7))
    b_inside, release_b = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def slow_b(cur: psycopg.Cursor[Any]) -> str:
        b_inside.set()
        release_b.wait(10)
        return put("B", T8)(cur)

    def holder_b() -> None:
        try:
            with psycopg.connect(fresh_dsn) as c:
                FENCE.write(c, "job-1", T8, "b-1", slow_b)
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    thread = threading.Thread(target=holder_b)
    thread.start()
    assert b_inside.wait(10)
    watcher = threading.Thread(target=release_when_blocked, args=(fresh_dsn, release_b))
    watcher.start()
    with (
        psycopg.connect(fresh_dsn) as late,
        pytest.raises(StaleTokenError, match=r"4711/7 .* 4711/8"),
    ):
        FENCE.write(late, "job-1", T7, "a-2", put("A-late", T7))
    thread.join(10)
    watcher.join(10)
    assert errors == []
    assert output(conn) == ("B", "4711/8")


def release_when_blocked(dsn: str, release: threading.Event) -> None:
    """Set ``release`` once a session waits on a lock (the late writer queued on the row)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for _ in range(200):
            row = c.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ).fetchone()
            if row is not None and row[0] >= 1:
                break
            time.sleep(0.05)
    release.set()


def test_duplicate_is_a_noop_and_a_new_key_is_applied(conn: psycopg.Connection[Any]) -> None:
    calls: list[str] = []

    def counted(cur: psycopg.Cursor[Any]) -> str:
        calls.append("x")
        return put("A", T7)(cur)

    assert isinstance(FENCE.write(conn, "job-1", T7, "k1", counted), Applied)
    assert FENCE.write(conn, "job-1", T7, "k1", counted) == Duplicate("job-1", T7, "k1")
    assert calls == ["x"]
    assert log_count(conn) == 1

    assert isinstance(FENCE.write(conn, "job-1", T7, "k2", counted), Applied)
    assert isinstance(FENCE.write(conn, "job-1", T7, None, counted), Applied)
    assert log_count(conn) == 3


def test_retry_of_an_applied_write_after_takeover_is_stale_not_duplicate(
    conn: psycopg.Connection[Any],
) -> None:
    FENCE.write(conn, "job-1", T7, "k1", put("A", T7))
    FENCE.write(conn, "job-1", T8, "k1", put("B", T8))
    with pytest.raises(StaleTokenError):
        FENCE.write(conn, "job-1", T7, "k1", put("A", T7))
    with conn.transaction():
        keys = conn.execute("SELECT epoch, generation FROM joblease_fence_applied").fetchall()
    assert keys == [(4711, 8)]  # keys of superseded tokens are pruned


def test_newer_epoch_beats_any_generation_of_an_older_one(conn: psycopg.Connection[Any]) -> None:
    old = FencingToken(4711, 900)
    new = FencingToken(5000, 1)
    FENCE.write(conn, "job-1", old, "k", put("old", old))
    assert isinstance(FENCE.write(conn, "job-1", new, "k", put("new", new)), Applied)
    with pytest.raises(StaleTokenError) as refused:
        FENCE.write(conn, "job-1", FencingToken(4711, 901), "k", put("late", old))
    assert refused.value.highest == new
    assert output(conn) == ("new", "5000/1")


def test_failed_caller_write_rolls_back_the_token(conn: psycopg.Connection[Any]) -> None:
    FENCE.write(conn, "job-1", T7, "k", put("A", T7))

    def broken(cur: psycopg.Cursor[Any]) -> None:
        put("B", T8)(cur)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        FENCE.write(conn, "job-1", T8, "k", broken)
    assert stored(conn) == T7
    assert output(conn) == ("A", "4711/7")
    # Nothing was recorded, so the retry is judged like the first attempt: applied.
    assert FENCE.write(conn, "job-1", T8, "k", put("B", T8)) == Applied("job-1", T8, T7, "B")


def test_fence_joins_a_transaction_the_caller_opened(conn: psycopg.Connection[Any]) -> None:
    FENCE.write(conn, "job-1", T8, "k", put("B", T8))
    with conn.transaction():
        conn.execute("INSERT INTO job_output VALUES ('other', 'x', '-')")
        with pytest.raises(StaleTokenError):
            FENCE.write(conn, "job-1", T7, "k", put("A", T7))
    # The stale write rolled back to its savepoint only; the caller's own work committed.
    assert output(conn, "other") == ("x", "-")
    assert output(conn) == ("B", "4711/8")


def test_install_is_idempotent(conn: psycopg.Connection[Any]) -> None:
    FENCE.write(conn, "job-1", T7, "k", put("A", T7))
    FENCE.install(conn)
    assert stored(conn) == T7


def test_racing_writers_never_accept_a_lower_token_after_a_higher_one(
    conn: psycopg.Connection[Any], fresh_dsn: str
) -> None:
    threads, writes_each = 20, 15
    accepted: list[FencingToken] = []
    refused: list[StaleTokenError] = []
    failures: list[BaseException] = []
    guard = threading.Lock()
    start = threading.Barrier(threads)

    def writer(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            with psycopg.connect(fresh_dsn) as c:
                start.wait(10)
                for i in range(writes_each):
                    token = FencingToken(rnd.choice((4711, 4800)), rnd.randint(1, 30))
                    try:
                        FENCE.write(c, "job-1", token, f"{seed}-{i}", put(f"{seed}-{i}", token))
                    except StaleTokenError as e:
                        with guard:
                            refused.append(e)
                    else:
                        with guard:
                            accepted.append(token)
        except BaseException as e:
            failures.append(e)

    workers = [threading.Thread(target=writer, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert failures == []
    assert len(accepted) + len(refused) == threads * writes_each

    with conn.transaction():
        rows = conn.execute("SELECT epoch, generation FROM write_log ORDER BY seq").fetchall()
    log = [FencingToken(int(e), int(g)) for e, g in rows]
    assert sorted(log) == sorted(accepted)
    assert all(a <= b for a, b in itertools.pairwise(log)), "accepted tokens went backwards"
    for error in refused:
        assert error.presented < error.highest
        assert error.highest in log, "a refusal cited a token that was never accepted"
    assert stored(conn) == max(log)
    final = output(conn)
    assert final is not None and final[1] == str(max(log))


def test_async_variant_has_the_same_semantics(fresh_dsn: str) -> None:
    fence = AsyncPostgresFence()

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(fresh_dsn) as c:
            await fence.install(c)
            async with c.transaction():
                await c.execute("CREATE TABLE out (job text PRIMARY KEY, token text)")

            def write(token: FencingToken) -> Callable[[psycopg.AsyncCursor[Any]], Any]:
                async def fn(cur: psycopg.AsyncCursor[Any]) -> str:
                    await cur.execute(
                        "INSERT INTO out VALUES ('job-1', %s) ON CONFLICT (job)"
                        " DO UPDATE SET token = excluded.token",
                        (str(token),),
                    )
                    return str(token)

                return fn

            assert await fence.write(c, "job-1", T7, "k", write(T7)) == Applied(
                "job-1", T7, None, "4711/7"
            )
            assert await fence.write(c, "job-1", T7, "k", write(T7)) == Duplicate("job-1", T7, "k")
            assert isinstance(await fence.write(c, "job-1", T8, "k", write(T8)), Applied)
            with pytest.raises(StaleTokenError, match=r"4711/7 .* 4711/8"):
                await fence.write(c, "job-1", T7, "k2", write(T7))
            async with c.transaction():
                cur = await c.execute("SELECT token FROM out")
                assert await cur.fetchall() == [("4711/8",)]

    asyncio.run(scenario())


def _pg_counts() -> tuple[float, float, float]:
    from prometheus_client import REGISTRY

    def value(name: str, labels: dict[str, str]) -> float:
        found = REGISTRY.get_sample_value(name, labels)
        assert found is not None, f"{name}{labels} is not exported"
        return found

    return (value("joblease_fencing_accepted_total", {"helper": "postgres", "result": "applied"}),
            value("joblease_fencing_accepted_total",
                  {"helper": "postgres", "result": "duplicate"}),
            value("joblease_fencing_refused_total", {"helper": "postgres"}))


def test_counters_move_on_applied_duplicate_refused_and_not_on_a_failed_write(
        conn: psycopg.Connection[Any]) -> None:
    before = _pg_counts()
    FENCE.write(conn, "job-m", T7, "a", put("seven", T7, "job-m"))
    FENCE.write(conn, "job-m", T7, "a", put("seven", T7, "job-m"))  # duplicate
    FENCE.write(conn, "job-m", T8, "b", put("eight", T8, "job-m"))
    with pytest.raises(StaleTokenError):
        FENCE.write(conn, "job-m", T7, "c", put("late", T7, "job-m"))

    def fails(cur: psycopg.Cursor[Any]) -> None:
        raise RuntimeError("the caller's write failed")

    with pytest.raises(RuntimeError):
        FENCE.write(conn, "job-m", T8, "d", fails)  # rolled back: neither accepted nor refused
    after = _pg_counts()
    assert tuple(a - b for a, b in zip(after, before, strict=True)) == (2, 1, 1)


def test_async_counters_move_like_the_sync_ones(fresh_dsn: str) -> None:
    fence = AsyncPostgresFence()

    async def noop(cur: psycopg.AsyncCursor[Any]) -> None:
        return None

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(fresh_dsn) as c:
            await fence.install(c)
            await fence.write(c, "job-am", T8, "k", noop)
            await fence.write(c, "job-am", T8, "k", noop)
            with pytest.raises(StaleTokenError):
                await fence.write(c, "job-am", T7, "k", noop)

    before = _pg_counts()
    asyncio.run(scenario())
    after = _pg_counts()
    assert tuple(a - b for a, b in zip(after, before, strict=True)) == (1, 1, 1)


@pytest.mark.parametrize("autocommit", [False, True], ids=["implicit", "autocommit"])
def test_a_writer_frozen_in_its_transaction_holds_the_next_holder_up_only_to_the_limit(
    conn: psycopg.Connection[Any], fresh_dsn: str, autocommit: bool
) -> None:
    """A freezes holding the fence row (SIGSTOP mid-write); B's write waits about the limit.

    Without the limit B waits for as long as A stays frozen: CI saw the successor pod of the
    user journey write nothing for a minute (safety.md #61). Here B's ``lock_timeout`` of 10 s
    turns that wait into a failure; the server ends A's session after 1 s instead, and A's
    retry after it runs again is refused like any stale write.
    """
    fence = PostgresFence(max_idle_in_transaction=1.0)
    inside, thaw = threading.Event(), threading.Event()
    outcome: list[object] = []

    def frozen(cur: psycopg.Cursor[Any]) -> str:
        inside.set()
        thaw.wait(30)  # the server hears nothing from A while it holds the row lock
        return put("A", T7)(cur)

    def writer_a() -> None:
        try:
            with psycopg.connect(fresh_dsn, autocommit=autocommit) as c:
                outcome.append(fence.write(c, "job-1", T7, "a-1", frozen))
        except Exception as e:  # the assertions below say which one it must be
            outcome.append(e)

    thread = threading.Thread(target=writer_a)
    thread.start()
    assert inside.wait(10)
    began = time.monotonic()
    with psycopg.connect(fresh_dsn, options="-c lock_timeout=10s") as b:
        assert isinstance(fence.write(b, "job-1", T8, "b-1", put("B", T8)), Applied)
    waited = time.monotonic() - began
    thaw.set()
    thread.join(10)
    assert 0.5 < waited < 5, f"B waited {waited:.2f}s behind the frozen writer"
    assert len(outcome) == 1 and isinstance(
        outcome[0], psycopg.errors.IdleInTransactionSessionTimeout), outcome
    with (
        psycopg.connect(fresh_dsn) as retry,
        pytest.raises(StaleTokenError, match=r"4711/7 .* 4711/8"),
    ):
        fence.write(retry, "job-1", T7, "a-1", put("A", T7))
    assert output(conn) == ("B", "4711/8")
    assert log_count(conn) == 1


def test_async_writer_frozen_in_its_transaction_holds_the_next_up_only_to_the_limit(
    conn: psycopg.Connection[Any], fresh_dsn: str
) -> None:
    """The frozen-writer story of the sync test, told with ``AsyncPostgresFence``."""
    fence = AsyncPostgresFence(max_idle_in_transaction=1.0)

    def put_async(value: str, token: FencingToken) -> Callable[[Any], Any]:
        async def fn(cur: psycopg.AsyncCursor[Any]) -> str:
            await cur.execute("INSERT INTO job_output VALUES ('job-1', %s, %s) ON CONFLICT (job)"
                              " DO UPDATE SET value = excluded.value, token = excluded.token",
                              (value, str(token)))
            return value

        return fn

    async def scenario() -> float:
        inside, thaw = asyncio.Event(), asyncio.Event()

        async def frozen(cur: psycopg.AsyncCursor[Any]) -> str:
            inside.set()
            await thaw.wait()
            return str(await put_async("A", T7)(cur))

        async def writer_a() -> object:
            async with await psycopg.AsyncConnection.connect(fresh_dsn) as c:
                return await fence.write(c, "job-1", T7, "a-1", frozen)

        task = asyncio.create_task(writer_a())
        await asyncio.wait_for(inside.wait(), 10)
        began = time.monotonic()
        async with await psycopg.AsyncConnection.connect(
                fresh_dsn, options="-c lock_timeout=10s") as b:
            assert isinstance(await fence.write(b, "job-1", T8, "b-1", put_async("B", T8)),
                              Applied)
        waited = time.monotonic() - began
        thaw.set()
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            await asyncio.wait_for(task, 10)
        async with await psycopg.AsyncConnection.connect(fresh_dsn) as retry:
            with pytest.raises(StaleTokenError, match=r"4711/7 .* 4711/8"):
                await fence.write(retry, "job-1", T7, "a-1", put_async("A", T7))
        return waited

    waited = asyncio.run(scenario())
    assert 0.5 < waited < 5, f"B waited {waited:.2f}s behind the frozen writer"
    assert output(conn) == ("B", "4711/8")


def _idle_limit(cur: Any) -> str:
    row = cur.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    return str(row[0])


def test_the_limit_holds_in_the_fences_own_transaction_only(
    conn: psycopg.Connection[Any],
) -> None:
    """Set for the fenced transaction, gone after it; a caller's transaction keeps its own."""
    fence = PostgresFence(max_idle_in_transaction=1.5)
    before = _idle_limit(conn.cursor())
    conn.commit()
    seen = fence.write(conn, "job-1", T7, None, _idle_limit)
    assert isinstance(seen, Applied) and seen.value == "1500ms"
    assert _idle_limit(conn.cursor()) == before
    conn.commit()
    with conn.transaction():
        conn.execute("SET LOCAL idle_in_transaction_session_timeout = '42s'")
        seen = fence.write(conn, "job-1", T8, None, _idle_limit)
        assert isinstance(seen, Applied) and seen.value == "42s"
    kept = PostgresFence(max_idle_in_transaction=None).write(conn, "job-1", T8, "k", _idle_limit)
    assert isinstance(kept, Applied) and kept.value == before


@pytest.mark.parametrize("fence_class", [PostgresFence, AsyncPostgresFence])
@pytest.mark.parametrize("limit", [0, -1.0, float("nan"), float("inf"), True, "5"])
def test_a_bad_idle_limit_is_refused_naming_it(fence_class: Any, limit: Any) -> None:
    with pytest.raises(ValueError, match=r"max_idle_in_transaction .* got "):
        fence_class(max_idle_in_transaction=limit)
