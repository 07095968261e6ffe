"""``python -m tests.faults.soak --runs N [--seed S] [--kinds a,b]``: randomized fault runs.

Starts its own local control plane, PostgreSQL and operator, then performs N runs, each a
fault kind and parameters drawn from ``random.Random(seed + i)``; prints one line per run
and, at the end, the summary line (totals and per kind). ``--seed`` (or ``JOBLEASE_SOAK_SEED``)
replays a soak; ``--run-seed`` replays one run. Exit 1 if any checker found a violation or
the two checkers disagreed.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path

_TESTS_DIR = str(Path(__file__).resolve().parents[1])
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from joblease_localcluster.cluster import LocalCluster  # noqa: E402
from support.postgres import PostgresServer  # noqa: E402

from .harness import KINDS, FaultEnv, Operator, Summary, install_crd, install_target  # noqa: E402
from .harness import run_random as run_one  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="soak")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--seed", type=int, default=int(os.environ.get("JOBLEASE_SOAK_SEED", "0"))
                   or secrets.randbelow(1 << 30))
    p.add_argument("--run-seed", type=int, default=None, help="replay one run")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--max-minutes", type=float, default=600.0)
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    print(f"soak seed={args.seed} runs={args.runs} kinds={','.join(kinds)}", flush=True)
    summary, bad = Summary(), 0
    stop_at = time.monotonic() + args.max_minutes * 60
    with tempfile.TemporaryDirectory(prefix="joblease-soak-") as tmp, LocalCluster() as cluster:
        install_crd(cluster)
        pg = PostgresServer().start()
        operator = Operator(cluster.kubeconfig, Path(tmp) / "operator.log")
        try:
            dsn = pg.create_database("soak")
            install_target(dsn)
            operator.start()
            namespace = "soak"
            cluster.kubectl("create", "namespace", namespace)
            env = FaultEnv(cluster, namespace, dsn, operator, Path(tmp))
            seeds = [args.run_seed] if args.run_seed is not None else \
                [args.seed * 1000 + i for i in range(args.runs)]
            for run_seed in seeds:
                if time.monotonic() > stop_at:
                    print("soak: --max-minutes reached; stopping early", flush=True)
                    break
                rng = random.Random(run_seed)
                kind = rng.choice(kinds)
                try:
                    report = run_one(env, rng, run_seed, kind)
                except Exception as err:  # a run that could not finish is reported, not hidden
                    print(f"run kind={kind} seed={run_seed} ERROR {type(err).__name__}: {err}",
                          flush=True)
                    bad += 1
                    continue
                summary.add(report)
                print(report.line(), flush=True)
                for v in report.ours:
                    print(f"  violation: {v}", flush=True)
                if report.ours or report.porcupine.violation or not report.agree:
                    bad += 1
        finally:
            operator.stop()
            pg.stop()
    print(summary.line(), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
