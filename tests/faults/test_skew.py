"""Workers and the operator with wall clocks moved ±10 min and ±1 h (libfaketime)."""

from __future__ import annotations

import random

import pytest

from .harness import FaultEnv, run_pause


def _outcome(report):  # type: ignore[no-untyped-def]
    n = report.notes
    return (n["a_lost"]["event"], n["probe"], n["b_done"], report.ours,
            report.porcupine.result)


@pytest.mark.parametrize("skew", ["+10m", "-10m", "+1h", "-1h"])
def test_skewed_clocks_same_results_as_unskewed(fault_env: FaultEnv, skew: str) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed} skew={skew}")
    fault_env.operator.restart(skew=skew)
    skewed = run_pause(fault_env, random.Random(seed), seed, skew=skew, kind="skew")
    print(skewed.line(), skewed.notes.get("skew_a"), skewed.notes.get("skew_b"))
    fault_env.operator.restart(skew=None)
    plain = run_pause(fault_env, random.Random(seed), seed + 1, kind="pause")
    print(plain.line())
    assert _outcome(skewed) == _outcome(plain) == (
        "lost", {"write": False, "renew": False, "complete": False}, "completed", [], "ok")
