"""A pod-delegated worker: waits for its token in the downward API file, writes fenced.

The pod carries the label ``joblease.dev/lease=<job>``; the operator holds the lease for
it and annotates the pod with the token. This script never talks to the API server: it
reads the token from ``/etc/joblease/annotations`` and presents it to PostgreSQL, whose
fence refuses a write from a predecessor whose token is older (a paused or partitioned
pod that still believes it holds the lease).

Each step reads the token, does the step's work, then writes: a pause that lands in the
work (a GC pause, SIGSTOP, a frozen VM) resumes straight into a write with the token read
before it. That is the case the fence exists for, and why the file is never the check.

The pod is Ready only while this process beats (``/tmp/heartbeat``, see the Deployment's
readiness probe): the operator renews a delegated lease only for a Ready pod, so a frozen
process lets the lease expire and the other replica takes over with the next generation.

A pause can also land inside the fenced write, with the fence's row lock held: the next
holder would wait behind the frozen pod for as long as it stays frozen. The fence bounds
that (``max_idle_in_transaction``, one second here: the transaction is one INSERT); the
server then ends this pod's session, and once running again it retries the write on a new
connection with the same idempotency key, so the retry is refused as stale, or applied at
most once.

Environment: ``JOBLEASE_JOB`` (the lease name, also the fenced resource), ``DATABASE_URL``,
``JOBLEASE_STEP_SECONDS`` (the work of one step, default 5).
Exit codes: 0 the token moved away (another pod holds it now), 4 refused by the fence.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

import psycopg

from joblease.domain.token import FencingToken
from joblease.fencing import StaleTokenError
from joblease.fencing.postgres import PostgresFence
from joblease.pod.downward import TokenFile

HEARTBEAT = Path("/tmp/heartbeat")
SESSION_ENDED = (psycopg.errors.IdleInTransactionSessionTimeout, psycopg.OperationalError)


def beat() -> None:
    """Show the readiness probe that this process is running (not paused, not stuck)."""
    HEARTBEAT.touch()


def connect() -> psycopg.Connection[tuple[object, ...]]:
    """A new autocommit connection to the database the job writes to."""
    return psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)


def write_row(conn: psycopg.Connection[tuple[object, ...]], fence: PostgresFence, job: str,
              token: FencingToken, key: str) -> psycopg.Connection[tuple[object, ...]]:
    """One fenced INSERT; once more on a new connection if the server ended the session.

    Returns the connection to go on with. The retry carries the same idempotency key, so a
    write that did commit before the session ended is not applied twice.
    """
    def insert(cur: psycopg.Cursor[tuple[object, ...]]) -> None:
        cur.execute("INSERT INTO report (job, token, writer) VALUES (%s, %s, %s)",
                    (job, str(token), os.environ.get("POD_NAME", "?")))

    try:
        fence.write(conn, job, token, key, insert)
        return conn
    except SESSION_ENDED as err:
        print(f"the database ended the session mid-write ({err}); retrying", flush=True)
        conn.close()
    conn = connect()
    fence.write(conn, job, token, key, insert)
    return conn


def main() -> int:
    """Wait for the token, then do one fenced step after another until it moves away."""
    job, tokens = os.environ["JOBLEASE_JOB"], TokenFile()
    fence = PostgresFence(max_idle_in_transaction=1.0)
    step_seconds = float(os.environ.get("JOBLEASE_STEP_SECONDS", "5"))
    beat()
    conn = connect()
    try:
        fence.install(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS report (job text, token text, writer text, "
                     "at timestamptz DEFAULT clock_timestamp())")
        held = tokens.read()
        while held is None:  # standby: stay Ready so the operator may pick this pod
            beat()
            time.sleep(0.5)
            held = tokens.read()
        print(f"holding {job} with token {held}", flush=True)
        for step in itertools.count(1):
            beat()
            current = tokens.read()
            if current is None or current.token != held.token:
                print(f"token changed to {current}; stopping", flush=True)
                return 0
            work_until = time.monotonic() + step_seconds
            while time.monotonic() < work_until:  # the step's work, with the token read above
                time.sleep(0.5)
                beat()
            try:
                conn = write_row(conn, fence, job, held.token, f"step-{step}")
            except StaleTokenError as err:
                print(f"refused by the fence: {err}", flush=True)
                return 4
            print(f"wrote a row with token {held.token}", flush=True)
        return 0  # not reached: itertools.count never ends
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
