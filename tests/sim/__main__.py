"""``make sim``: run seeded simulations for as long as asked; report; shrink any failure.

    python -m tests.sim --minutes 10          # as many seeds as fit
    python -m tests.sim --seeds 2000 --first 5000
    python -m tests.sim --replay 1234         # one seed, with its trace

Progress every few seconds; one summary line at the end (seeds, operations, faults,
violations per oracle, operations per minute; pool claims with the 409s they wasted per
claimed job, and the operator's claims for pods). Exit 1 on any violation, after printing
the seed, the smallest configuration that still fails with it and its trace.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from .sim import ORACLES, Simulation, shrink


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim")
    parser.add_argument("--seeds", type=int, default=None, help="how many seeds (default: time)")
    parser.add_argument("--minutes", type=float, default=1.0, help="run for this long")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--replay", type=int, default=None, help="run one seed with its trace")
    args = parser.parse_args(argv)
    if args.replay is not None:
        sim = Simulation(args.replay, trace=True).run()
        print("\n".join(sim.trace))
        print(sim.summary())
        return 1 if sim.oracles.violations else 0
    started = last = time.monotonic()
    end = started + args.minutes * 60
    seeds = ops = pool_claims = pool_409s = delegated = 0
    faults: Counter[str] = Counter()
    violations: Counter[str] = Counter()
    failing: list[int] = []
    seed = args.first
    while (seeds < args.seeds) if args.seeds is not None else time.monotonic() < end:
        sim = Simulation(seed).run()
        seeds, ops = seeds + 1, ops + sim.ops
        pool_claims, pool_409s = pool_claims + sim.pool_claims, pool_409s + sim.pool_conflicts
        delegated += sim.delegated_claims
        faults.update(sim.config.faults.counts)
        violations.update(sim.oracles.violations)
        if sim.oracles.violations:
            failing.append(seed)
        seed += 1
        if time.monotonic() - last > 5:
            last = time.monotonic()
            print(f"[sim {last - started:6.1f}s] seeds {seeds} (at {seed}), operations {ops}, "
                  f"violations {sum(violations.values())}", flush=True)
    elapsed = time.monotonic() - started
    per_oracle = " ".join(f"{o}={violations.get(o, 0)}" for o in ORACLES)
    print(f"sim: seeds {seeds} ({args.first}..{seed - 1}), operations {ops}, faults "
          f"{sum(faults.values())} ({dict(faults)}), violations {per_oracle}, "
          f"{ops / elapsed * 60:,.0f} operations/minute in {elapsed:.1f}s; pool claims "
          f"{pool_claims}, {pool_409s / max(1, pool_claims):.2f} wasted 409s per claimed job; "
          f"claims for pods {delegated}", flush=True)
    for bad in failing[:3]:
        small = shrink(bad)
        print(f"\nFAILED seed {bad}; smallest failing configuration: {small.config}")
        print("\n".join(small.trace[-40:]))
        print("\n".join(small.oracles.messages))
        print(f"replay: python -m tests.sim --replay {bad}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
