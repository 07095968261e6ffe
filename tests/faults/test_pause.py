"""SIGSTOP a holder past its lease: the old holder is refused everywhere and stops itself."""

from __future__ import annotations

import random

from .harness import FaultEnv, run_pause


def test_paused_holder_is_refused_and_notices(fault_env: FaultEnv) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    report = run_pause(fault_env, random.Random(seed), seed)
    print(report.line())
    n = report.notes
    assert n["a_lost"]["event"] == "lost", n
    assert n["probe"] == {"write": False, "renew": False, "complete": False}, n
    assert n["b_done"] == "completed", n
    assert report.ours == [], [str(v) for v in report.ours]
    assert report.porcupine.result == "ok", report.porcupine.output
