"""A pod-delegated worker: waits for its token in the downward API file, writes fenced.

The pod carries the label ``joblease.dev/lease=<job>``; the operator holds the lease for
it and annotates the pod with the token. This script never talks to the API server: it
reads the token from ``/etc/joblease/annotations`` and presents it to PostgreSQL, whose
fence refuses a write from a predecessor whose token is older (a paused or partitioned
pod that still believes it holds the lease).

Environment: ``JOBLEASE_JOB`` (the lease name, also the fenced resource), ``DATABASE_URL``.
"""

from __future__ import annotations

import os
import sys
import time

import psycopg

from joblease.downward import TokenFile
from joblease.fencing import StaleTokenError
from joblease.fencing.postgres import PostgresFence


def main() -> int:
    """Wait for the token, then append one fenced row per tick until the token changes."""
    job, tokens, fence = os.environ["JOBLEASE_JOB"], TokenFile(), PostgresFence()
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        fence.install(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS report (job text, token text, at timestamptz"
                     " DEFAULT now())")
        held = tokens.wait(timeout=3600)
        print(f"holding {job} with token {held}", flush=True)
        while True:
            current = tokens.read()
            if current is None or current.token != held.token:
                print(f"token changed to {current}; stopping", flush=True)
                return 0
            try:
                fence.write(conn, job, held.token, None, lambda cur: cur.execute(
                    "INSERT INTO report (job, token) VALUES (%s, %s)", (job, str(held.token))))
            except StaleTokenError as err:
                print(f"refused by the fence: {err}", flush=True)
                return 4
            time.sleep(5)


if __name__ == "__main__":
    sys.exit(main())
