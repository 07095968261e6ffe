"""50 processes claim the same job at the same instants, round after round."""

from __future__ import annotations

import random
from collections import Counter

from .harness import FaultEnv, run_race
from .history import load


def test_fifty_processes_exactly_one_holder_per_generation(fault_env: FaultEnv) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    report = run_race(fault_env, random.Random(seed), seed, procs=50, rounds=3)
    print(report.line())
    claims = [o for o in load(report.run_dir / "history") if o.op == "claim"]
    won = Counter(int(o.result["generation"]) for o in claims if o.ok)
    assert len(claims) == 150
    assert won and all(n == 1 for n in won.values()), won
    assert sorted(won) == list(range(1, len(won) + 1)), won  # no generation skipped
    assert len(won) >= 2  # at least two rounds had a winner
    assert report.ours == [] and report.porcupine.result == "ok", report.porcupine.output
