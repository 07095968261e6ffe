"""One index of an Indexed Job: waits for its index's token, writes fenced rows, exits 0.

The Job's pod template carries ``joblease.dev/lease=<prefix>`` and
``joblease.dev/lease-per-index: "true"`` (``examples/indexed-job.yaml``): the operator holds
the JobLease ``<prefix>-<index>`` for the one pod of this index that may write now, and
annotates that pod with the token. This script never talks to the API server: it reads the
token from ``/etc/joblease/annotations`` and presents it to PostgreSQL, whose fence (one
fenced resource per index: the lease name) refuses a predecessor of the same index — a pod
that was deleted but still runs, a frozen one that resumed — once a newer generation wrote.

Each step reads the token, does the step's work, then writes with the token it read: a
pause in the middle resumes straight into a write with the old token, which is the case
the fence exists for (the file is never the check). After ``JOBLEASE_STEPS`` rows it exits 0:
the pod Succeeds, the Job counts the index, and the operator completes the lease with this
pod's token. Refused by the fence, it exits 3: the pod Fails (the Job may retry the index;
the lease was not this pod's any more).

A pause inside the fenced write holds the fence's row lock: the index's next pod would wait
behind it. The fence bounds that (``max_idle_in_transaction``, one second: the transaction
is one INSERT); the server ends the frozen session, and once running again this pod retries
on a new connection with the same idempotency key (refused as stale, or applied once).

The pod is Ready only while this process beats (``/tmp/heartbeat``, the readiness probe in
the Job's template): the operator renews only for a Ready pod, so a frozen process lets the
lease lapse.

Environment: ``JOBLEASE_LEASE_PREFIX``, ``JOB_COMPLETION_INDEX`` (set by the Job controller),
``DATABASE_URL``, ``JOBLEASE_STEPS`` (default 10), ``JOBLEASE_STEP_SECONDS`` (default 1).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from joblease.domain.token import FencingToken
from joblease.fencing import StaleTokenError
from joblease.fencing.postgres import PostgresFence
from joblease.pod.downward import TokenFile

HEARTBEAT = Path("/tmp/heartbeat")
REFUSED = 3
SESSION_ENDED = (psycopg.errors.IdleInTransactionSessionTimeout, psycopg.OperationalError)
TABLE = ("CREATE TABLE IF NOT EXISTS indexed_rows (lease text, step int, generation bigint, "
         "token text, writer text, at timestamptz DEFAULT clock_timestamp())")


def beat() -> None:
    """Show the readiness probe that this process is running (not paused, not stuck)."""
    HEARTBEAT.touch()


def say(message: str) -> None:
    """Print one line stamped with the wall clock (to line it up with the database's rows)."""
    print(f"{time.time():.3f} {message}", flush=True)


def wait_for_token(tokens: TokenFile) -> FencingToken:
    """Stay Ready without a token until the operator gives this pod its index's token."""
    while (held := tokens.read()) is None:
        beat()
        time.sleep(0.2)
    return held.token


def work(seconds: float) -> None:
    """The step's work (here: time passing, beating)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(min(0.2, seconds))
        beat()


def connect() -> psycopg.Connection[Any]:
    """A new autocommit connection to the database the job writes to."""
    return psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)


def write_fenced(conn: psycopg.Connection[Any], fence: PostgresFence, lease: str,
                 token: FencingToken, key: str,
                 insert: Callable[[psycopg.Cursor[Any]], None]) -> psycopg.Connection[Any]:
    """One fenced write; once more on a new connection if the server ended the session.

    Returns the connection to go on with. The same idempotency key makes the retry safe.
    """
    try:
        fence.write(conn, lease, token, key, insert)
        return conn
    except SESSION_ENDED as err:
        say(f"the database ended the session mid-write ({err}); retrying")
        conn.close()
    conn = connect()
    fence.write(conn, lease, token, key, insert)
    return conn


def main() -> int:
    """Write ``JOBLEASE_STEPS`` fenced rows for this index, then exit 0."""
    lease = f"{os.environ['JOBLEASE_LEASE_PREFIX']}-{os.environ['JOB_COMPLETION_INDEX']}"
    steps = int(os.environ.get("JOBLEASE_STEPS", "10"))
    step_seconds = float(os.environ.get("JOBLEASE_STEP_SECONDS", "1"))
    writer = os.environ.get("POD_NAME", "?")
    tokens, fence = TokenFile(), PostgresFence(max_idle_in_transaction=1.0)
    beat()
    conn = connect()
    try:
        fence.install(conn)
        conn.execute(TABLE)
        token = wait_for_token(tokens)
        say(f"holding {lease} with token {token}")
        for step in range(steps):
            current = tokens.read()
            if current is None:  # lapsed (e.g. this pod was not Ready): wait to be given it
                token = wait_for_token(tokens)
            elif current.token != token:
                token = current.token
                say(f"now holding {lease} with token {token}")
            work(step_seconds)

            def insert(cur: psycopg.Cursor[Any], step: int = step,
                       token: FencingToken = token) -> None:
                cur.execute("INSERT INTO indexed_rows (lease, step, generation, token, writer) "
                            "VALUES (%s, %s, %s, %s, %s)",
                            (lease, step, token.generation, str(token), writer))

            try:
                conn = write_fenced(conn, fence, lease, token, f"step-{step}", insert)
            except StaleTokenError as err:
                say(f"refused by the fence: {err}")
                return REFUSED
            say(f"wrote step {step} with token {token}")
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
