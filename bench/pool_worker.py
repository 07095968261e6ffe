"""Processes for the pool benchmark's two baselines, started together by ``bench.pool``.

    python -m bench.pool_worker floor --kubeconfig K --namespace N --name OBJ --writes N
    python -m bench.pool_worker postgres --dsn DSN --holder H
    python -m bench.pool_worker floor-real --kubeconfig K --namespace N --names A,B,...
    python -m bench.pool_worker watch --kubeconfig K --namespace N --selector S

Each process sets up (imports, connection, first request) and prints ``READY``, then
waits for one line on stdin, so that the W processes start their timed work together and
no interpreter start-up is timed. It prints one JSON line when done: ``start`` and ``end``
(``time.time()``: every process runs on this machine, one clock), its ``count`` and the
CPU it used meanwhile (``cpu_s``, all its threads).

* ``floor``: ``writes`` bare conditional status writes (``bench.common.floor_write``) on
  its own JobLease from its cached version: no reads, no conflicts.
* ``floor-real``: for each of its JobLeases (read once before ``READY``), the pool's own
  two writes with their real bodies: the claim ``decide_claim`` makes (``Held`` and
  ``Finished`` conditions, claim id) written by ``status_write_call`` from the cached
  version, then the completion ``decide_complete`` makes from the claim's answer (both
  conditions again, the completion record). No choosing, no command, no renewal thread:
  what a pool's jobs cost the API server, nothing of the worker's own.
* ``watch``: one open watch of a label selector (the floor-real's one watcher), counting
  its events; ``READY`` once open, then on any stdin line prints ``{"count": n}``.
* ``postgres``: the queue a user would build instead of a work pool: claim the next ready
  job with ``FOR UPDATE SKIP LOCKED`` (one transaction), run the same no-op command as a
  subprocess, mark the job done (a second transaction); until no job is ready.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable

MAX_JOBS = 1_000_000  # bounds the postgres loop; the table is far smaller
NOOP = ("true",)

CLAIM_SQL = """
UPDATE jobs SET state = 'running', holder = %s, started = clock_timestamp()
WHERE id = (SELECT id FROM jobs WHERE state = 'ready'
            ORDER BY priority DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id
"""
DONE_SQL = "UPDATE jobs SET state = 'done', done = clock_timestamp() WHERE id = %s AND holder = %s"


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _timed_after_go(work: Callable[[], int]) -> None:
    """READY, wait for the go line, run ``work``, report its start, end and count."""
    _say("READY")
    if not sys.stdin.readline():
        return  # the bench went away before the start: nothing to do
    start, cpu = time.time(), time.process_time()
    count = work()
    _say(json.dumps({"start": start, "end": time.time(), "count": count,
                     "cpu_s": time.process_time() - cpu}))


def floor(args: argparse.Namespace) -> None:
    from bench.common import floor_write
    from joblease.kube.api import KubeApi
    from joblease.kube.leases import LeaseStore

    api = KubeApi.from_kubeconfig(args.kubeconfig)
    obs = LeaseStore(api).get(args.namespace, args.name)  # the cache; untimed
    api.server_now()  # clock known before timing, as a worker's would be

    def write_all() -> int:
        nonlocal obs
        for _ in range(args.writes):
            obs = floor_write(api, args.namespace, obs, args.name)
        return int(args.writes)

    _timed_after_go(write_all)
    api.close()


def floor_real(args: argparse.Namespace) -> None:
    from datetime import timedelta

    from joblease.domain.lease import Claim, decide_claim, decide_complete
    from joblease.kube.api import KubeApi
    from joblease.kube.identity import new_claim_id
    from joblease.kube.leases import LeaseStore, status_write_call

    api = KubeApi.from_kubeconfig(args.kubeconfig)
    store = LeaseStore(api)
    names = [n for n in args.names.split(",") if n]
    cached = {n: store.get(args.namespace, n) for n in names}  # the cache; untimed
    api.server_now()
    margin = timedelta(seconds=0.25)
    command = " ".join(NOOP)

    def one(name: str) -> None:
        claim_id = new_claim_id()
        claimed = decide_claim(cached[name], args.holder, api.server_now(), margin, claim_id)
        assert claimed is not None
        obs = store.call(status_write_call(cached[name], claimed.status))
        claim = Claim(args.holder, claimed.status.token(), claim_id)
        done = decide_complete(obs, claim, f"exit 0: {command}", api.server_now(), margin)
        assert done is not None
        store.call(status_write_call(obs, done.status))

    def work() -> int:
        for name in names:
            one(name)
        return 2 * len(names)

    _timed_after_go(work)
    api.close()


def watch(args: argparse.Namespace) -> None:
    import threading

    from joblease.kube.api import KubeApi
    from joblease.kube.leases import lease_path

    api = KubeApi.from_kubeconfig(args.kubeconfig)
    path = lease_path(args.namespace)
    listed = api.request("GET", path, query={"labelSelector": args.selector, "limit": "1"})
    version = str(listed.body["metadata"]["resourceVersion"])
    stream = api.watch(path, {"labelSelector": args.selector, "resourceVersion": version,
                              "timeoutSeconds": "1800"}, timeout=1900)
    seen = [0]

    def count() -> None:
        for _ in stream:
            seen[0] += 1

    threading.Thread(target=count, daemon=True).start()
    cpu = time.process_time()
    _say("READY")
    sys.stdin.readline()
    # the CPU of reading and decoding the events (the set-up before READY excluded)
    _say(json.dumps({"count": seen[0], "cpu_s": time.process_time() - cpu}))
    stream.close()
    api.close()


def postgres(args: argparse.Namespace) -> None:
    import psycopg

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")

        def drain() -> int:
            done = 0
            for _ in range(MAX_JOBS):
                row = conn.execute(CLAIM_SQL, (args.holder,)).fetchone()
                if row is None:
                    break
                subprocess.run(NOOP, check=True)
                conn.execute(DONE_SQL, (row[0], args.holder))
                done += 1
            return done

        _timed_after_go(drain)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pool_worker")
    sub = parser.add_subparsers(dest="mode", required=True)
    f = sub.add_parser("floor")
    f.add_argument("--kubeconfig", required=True)
    f.add_argument("--namespace", required=True)
    f.add_argument("--name", required=True)
    f.add_argument("--writes", type=int, required=True)
    p = sub.add_parser("postgres")
    p.add_argument("--dsn", required=True)
    p.add_argument("--holder", required=True)
    r = sub.add_parser("floor-real")
    r.add_argument("--kubeconfig", required=True)
    r.add_argument("--namespace", required=True)
    r.add_argument("--names", required=True, help="comma-separated JobLeases, one job each")
    r.add_argument("--holder", required=True)
    w = sub.add_parser("watch")
    w.add_argument("--kubeconfig", required=True)
    w.add_argument("--namespace", required=True)
    w.add_argument("--selector", required=True)
    args = parser.parse_args(argv)
    {"floor": floor, "postgres": postgres, "floor-real": floor_real,
     "watch": watch}[args.mode](args)


if __name__ == "__main__":
    main()
