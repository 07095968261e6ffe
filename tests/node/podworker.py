"""What the node tests run inside real containers (from the working tree, mounted read-only).

``watch SECONDS``: print one JSON line each time the token in the downward API file changes
(``t`` = host wall clock, ``gen`` from the file, ``env`` = the same annotation as an env
var, fixed at container start). Creates ``/tmp/ready`` for the readiness probe.

``seed``: run under ``joblease run``; append one fenced row per 0.2 s to PostgreSQL with
the token ``joblease run`` put in the environment, print each outcome as JSON, and exit 3
at the first refusal.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from joblease.pod.downward import TokenFile

MAX_SECONDS = 900.0


def say(**fields: object) -> None:
    print(json.dumps({"t": time.time(), **fields}), flush=True)


def watch(seconds: float) -> int:
    Path("/tmp/ready").touch()
    tokens = TokenFile(poll=0.02)
    deadline = time.monotonic() + min(seconds, MAX_SECONDS)
    last: object = "unset"
    while time.monotonic() < deadline:
        current = tokens.read()
        gen = str(current.token.generation) if current else None
        if gen != last:
            last = gen
            say(gen=gen, env=os.environ.get("JL_ENV_GENERATION"))
        time.sleep(0.02)
    return 0


def seed() -> int:
    import psycopg

    from joblease.domain.token import FencingToken
    from joblease.fencing import StaleTokenError
    from joblease.fencing.postgres import PostgresFence

    job = os.environ["JOBLEASE_NAME"]
    token = FencingToken(int(os.environ["JOBLEASE_EPOCH"]), int(os.environ["JOBLEASE_GENERATION"]))
    fence = PostgresFence()
    deadline = time.monotonic() + MAX_SECONDS
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        fence.install(conn)
        say(event="start", gen=token.generation)
        while time.monotonic() < deadline:
            try:
                fence.write(conn, job, token, None, lambda cur: cur.execute(
                    "INSERT INTO report (job, generation, writer) VALUES (%s, %s, %s)",
                    (job, token.generation, os.environ.get("POD_NAME", "?"))))
                say(event="wrote", gen=token.generation)
            except StaleTokenError as err:
                say(event="refused", gen=token.generation, error=str(err))
                return 3
            time.sleep(0.2)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["watch"]:
        return watch(float(argv[1]) if len(argv) > 1 else 600)
    if argv[:1] == ["seed"]:
        return seed()
    print(f"usage: podworker.py watch [SECONDS] | seed (got {argv})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
