"""The command ``joblease work`` runs per job in the pool chaos test: fenced writes, recorded.

Run as ``python -m tests.faults.pool_job --history DIR --dsn DSN`` by a pool worker, with the
lease in its environment (``JOBLEASE_NAME``, ``JOBLEASE_TOKEN``, ``JOBLEASE_HOLDER``,
``JOBLEASE_GENERATION``). It writes to the fenced PostgreSQL target twice with that token,
sleeping between the writes (so a paused worker's command can write again after a takeover,
and must be refused), and records every write in its own history file
(``docs/history-format.md``). What the job does is in its name:

* ``…-doomed``: exits 1 after its writes, every attempt (its ``maxAttempts`` ends in Failed);
* ``…-flaky``: exits 1 at generation 1, succeeds later (a retry after the backoff);
* otherwise: exits 0 (the worker completes the lease).

A refused (stale) write exits 3 at once: the lease is lost, there is nothing left to do.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import psycopg

from joblease.domain.token import FencingToken
from joblease.fencing.postgres import PostgresFence

from .history import OK, Recorder
from .worker import classify

EXIT_STALE = 3


def fenced_write(conn: psycopg.Connection[tuple[object, ...]], rec: Recorder, name: str,
                 holder: str, token: FencingToken, key: str) -> bool:
    """One recorded fenced write of an ``effects`` row; whether the target accepted it."""
    op = rec.invoke("write", name, holder=holder, token=[token.epoch, token.generation],
                    key=key)
    try:
        PostgresFence().write(conn, name, token, key, lambda cur: cur.execute(
            "INSERT INTO effects (resource, holder, epoch, generation, note) "
            "VALUES (%s, %s, %s, %s, %s)",
            (name, holder, token.epoch, token.generation, key)))
    except Exception as err:
        status, fields = classify(err)
        rec.complete(op, status, **fields)
        return False
    rec.complete(op, OK)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pool-job")
    p.add_argument("--history", required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--work", type=float, default=0.4, help="mean seconds between the writes")
    args = p.parse_args(argv)
    name, holder = os.environ["JOBLEASE_NAME"], os.environ["JOBLEASE_HOLDER"]
    token = FencingToken.parse(os.environ["JOBLEASE_TOKEN"])
    process = f"c-{name}-{token.generation}-{os.getpid()}"
    rec = Recorder(Path(args.history) / f"{process}.jsonl", process)
    rng = random.Random(f"{name}/{token}")
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        for step in (1, 2):
            if not fenced_write(conn, rec, name, holder, token, f"{process}-{step}"):
                return EXIT_STALE
            if step == 1:
                time.sleep(rng.uniform(0.5, 1.5) * args.work)
    if name.endswith("-doomed") or (name.endswith("-flaky") and token.generation == 1):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
