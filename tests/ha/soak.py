"""Long randomized HA soak: ``python -m tests.ha.soak --runs N`` (repository root).

Each run starts a fresh workload on one HA control plane and injects one random fault:
kill -9 an API server, kill -9 the etcd leader, or a Date-skewed API server (offset drawn
from ±2 s, ±30 s, ±10 min). The fault suite's checker judges every history on the honest
clock. Prints one line per run and a summary line; exits 1 on any fencing violation, or
on any violation at all where the clock assumption held.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from joblease_localcluster.ha import HACluster

from .scenarios import SkewedFront, Workload, fencing, install_crd

MAX_SKEW = 2.5


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tests.ha.soak")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--seconds", type=float, default=8.0, help="workload per run")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    totals = {"runs": 0, "operations": 0, "claims": 0, "fencing": 0, "timing": 0,
              "unexpected": 0}
    with HACluster(apiservers=3, etcd_members=3) as cluster, \
            tempfile.TemporaryDirectory(prefix="joblease-ha-soak-") as tmp:
        install_crd(cluster)
        print(f"HA start-up {cluster.startup_seconds:.1f}s", flush=True)
        for run in range(args.runs):
            ns = f"soak-{run}-{rng.randrange(1 << 16)}"
            cluster.kubectl("create", "namespace", ns, check=True)
            kind = rng.choice(["apiserver", "etcd-leader", "skew"])
            offset = rng.choice([2.0, -2.0, 30.0, -30.0, 600.0, -600.0])
            seed = rng.randrange(1 << 20)
            run_dir = Path(tmp) / f"run-{run}"
            if kind == "skew":
                with SkewedFront(cluster, offset) as kubeconfig:
                    w = Workload(kubeconfig, ns, run_dir, skew=MAX_SKEW, seed=seed).start()
                    time.sleep(args.seconds)
                    w.stop()
                    violations, ops = w.judge()
                restart = None
            else:
                w = Workload(cluster.kubeconfig, ns, run_dir, seed=seed).start()
                time.sleep(args.seconds / 2)
                victim = ("kube-apiserver-" + str(rng.randrange(3)) if kind == "apiserver"
                          else cluster.etcd_leader())
                cluster.kill(victim)
                time.sleep(args.seconds / 2)
                w.stop()
                violations, ops = w.judge()
                restart = victim
            fence = len(fencing(violations))
            timing = len(violations) - fence
            held = kind != "skew" or abs(offset) <= MAX_SKEW
            totals["runs"] += 1
            totals["operations"] += ops
            totals["claims"] += w.stats["claims"]
            totals["fencing"] += fence
            totals["timing"] += timing
            totals["unexpected"] += fence + (timing if held else 0)
            print(f"run {run} kind={kind}{f' offset={offset:+.0f}s' if kind == 'skew' else ''}"
                  f" seed={seed} operations={ops} claims={w.stats['claims']} "
                  f"unknown={w.stats['unknown']} fencing-violations={fence} "
                  f"timing-violations={timing}", flush=True)
            for v in violations:
                print(f"  {v}", flush=True)
            if restart is not None:
                cluster.restart(restart)
                cluster.etcd_leader()
            cluster.kubectl("delete", "namespace", ns, "--wait=false")
    print("summary " + " ".join(f"{k}={v}" for k, v in totals.items()), flush=True)
    return 1 if totals["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
