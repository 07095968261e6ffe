"""kill -9 the operator, kube-apiserver and etcd mid-run and restart them."""

from __future__ import annotations

import random

import pytest

from .harness import CRASH_COMPONENTS, FaultEnv, run_crash


@pytest.mark.parametrize("component", CRASH_COMPONENTS)
def test_crash_and_restart_keeps_safety_and_resumes(fault_env: FaultEnv,
                                                    component: str) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed} component={component}")
    report = run_crash(fault_env, random.Random(seed), seed, component)
    print(report.line(), report.notes)
    assert report.ours == [], [str(v) for v in report.ours]
    assert report.porcupine.result == "ok", report.porcupine.output
    # work resumed: every job completed exactly once (checked above: never reopened/lost)
    assert set(report.notes["final"].values()) == {"Completed"}, report.notes
