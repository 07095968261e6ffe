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

Environment: ``JOBLEASE_JOB`` (the lease name, also the fenced resource), ``DATABASE_URL``,
``JOBLEASE_STEP_SECONDS`` (the work of one step, default 5).
Exit codes: 0 the token moved away (another pod holds it now), 4 refused by the fence.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psycopg

from joblease.fencing import StaleTokenError
from joblease.fencing.postgres import PostgresFence
from joblease.pod.downward import TokenFile

HEARTBEAT = Path("/tmp/heartbeat")


def beat() -> None:
    """Show the readiness probe that this process is running (not paused, not stuck)."""
    HEARTBEAT.touch()


def main() -> int:
    """Wait for the token, then do one fenced step after another until it moves away."""
    job, tokens, fence = os.environ["JOBLEASE_JOB"], TokenFile(), PostgresFence()
    step_seconds = float(os.environ.get("JOBLEASE_STEP_SECONDS", "5"))
    beat()
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        fence.install(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS report (job text, token text, writer text, "
                     "at timestamptz DEFAULT clock_timestamp())")
        held = tokens.read()
        while held is None:  # standby: stay Ready so the operator may pick this pod
            beat()
            time.sleep(0.5)
            held = tokens.read()
        print(f"holding {job} with token {held}", flush=True)
        while True:
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
                fence.write(conn, job, held.token, None, lambda cur: cur.execute(
                    "INSERT INTO report (job, token, writer) VALUES (%s, %s, %s)",
                    (job, str(held.token), os.environ.get("POD_NAME", "?"))))
            except StaleTokenError as err:
                print(f"refused by the fence: {err}", flush=True)
                return 4
            print(f"wrote a row with token {held.token}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
