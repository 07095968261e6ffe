"""Work pools under chaos: ``joblease work`` processes killed and paused while draining a batch.

Issue 17, item 5: every job ends Completed or Failed with exactly one completion record, the
fenced target never accepts a stale token, a lost holder's job is retried only after its
backoff, ``maxAttempts`` ends in Failed, higher priorities are claimed first, and the
history passes both checkers. ``tests/faults/pool_chaos.py`` does the run; the seed is
printed (``JOBLEASE_POOL_SEED`` replays one).
"""

from __future__ import annotations

import os
import random

import pytest

from .harness import FaultEnv
from .history import Op
from .pool_chaos import BIG, ChaosPlan, JobSpec, PoolReport, _check_priority, run_pool_chaos


def _seed() -> int:
    return int(os.environ.get("JOBLEASE_POOL_SEED") or random.randrange(1 << 30))


def _assert_pool_promises(result: PoolReport) -> None:
    print(result.line())
    report = result.report
    assert report.ours == [], [str(v) for v in report.ours[:10]]
    assert report.porcupine.result == "ok", report.porcupine.output[-2000:]
    broken = {k: v[:5] for k, v in result.findings.items() if v}
    assert not broken, broken
    doomed = sum(1 for name in result.final if name.endswith("-doomed"))
    # the workers drained the batch and left by themselves: exit 7 when some job is Failed
    expected = 7 if doomed else 0
    assert set(result.codes.values()) == {expected}, (result.codes, result.report.run_dir)
    assert result.figures["retries"] > 0  # flaky and doomed jobs are retried at least
    if result.chaos.kills:
        assert result.figures["retries_after_loss"] > 0  # a killed worker's job came back


def test_pool_chaos_small_batch(fault_env: FaultEnv) -> None:
    seed = _seed()
    print(f"seed={seed}")
    plan = ChaosPlan(jobs=40, workers=4, concurrency=2, chaos_seconds=20, timeout=120)
    _assert_pool_promises(run_pool_chaos(fault_env, seed, plan))


def test_pool_chaos_with_the_dispatcher_killed_mid_drain(fault_env: FaultEnv) -> None:
    """Issue 30's done-when: the dispatcher killed mid-drain (its record left to lapse, 10 s),
    with workers killed and paused as above: the workers fall back to turns within 15 s,
    every job ends once, no attempts overlap (both checkers); the jobs given out before the
    kill are the workers' claims on its proposals (recorded ``proposed``; a dispatcher's
    claim for a worker of an earlier version would be in the history too, counted as a
    window of its holder only from its adoption). About 45 s on two loaded CPUs."""
    seed = _seed()
    print(f"seed={seed}")
    plan = ChaosPlan(jobs=24, workers=3, concurrency=2, chaos_seconds=10, timeout=90,
                     dispatch=True, kill_dispatcher_after=0.3)
    result = run_pool_chaos(fault_env, seed, plan)
    figures = result.figures
    print({k: figures[k] for k in ("dispatched", "own_after_kill", "fallback_s", "reassigned",
                                   "killed_assignee_rerun_s")})
    _assert_pool_promises(result)
    assert figures["dispatched"] > 0  # the dispatcher handed jobs out before its death
    assert figures["own_after_kill"] > 0 and figures["fallback_s"] is not None
    assert figures["fallback_s"] <= 15.0  # the record's 10 s lifetime, then a list
    # killed_assignee_rerun_s is printed, not asserted: here it also waits for the
    # dispatcher's death to be noticed (tests/cluster/test_dispatch.py pins a dead
    # assignee's job with a live dispatcher: given to another, no attempt counted)


@pytest.mark.slow  # about 4 minutes on two shared CPUs: `make pool-chaos` runs the same
def test_pool_chaos_200_jobs_8_workers(fault_env: FaultEnv) -> None:
    seed = _seed()
    print(f"seed={seed}")
    _assert_pool_promises(run_pool_chaos(fault_env, seed, BIG))


def _claim(process: str, lease: str, call_ms: int, ret_ms: int) -> Op:
    return Op(f"{process}:{lease}", process, "claim", lease, {"holder": process},
              call_ms * 1_000_000, None, ret_ms * 1_000_000, None, {"status": "ok"})


@pytest.mark.unit
def test_priority_check_allows_one_workers_concurrent_claims_in_either_order() -> None:
    """Seed 299783829: one worker's two threads recorded low (0) 2 ms before high (10)."""
    jobs = [JobSpec("low", 0, None), JobSpec("high", 10, None)]
    together = [_claim("w2.0", "low", 0, 5), _claim("w2.0", "high", 2, 6)]
    assert _check_priority(together, jobs) == []
    # the same order from two workers, or after the low claim returned, is still a finding
    other = [_claim("w2.0", "low", 0, 5), _claim("w1.0", "high", 2, 6)]
    after = [_claim("w2.0", "low", 0, 5), _claim("w2.0", "high", 7, 9)]
    assert _check_priority(other, jobs) and _check_priority(after, jobs)


@pytest.mark.unit
def test_priority_check_counts_a_dispatchers_proposal_as_giving_the_job_out() -> None:
    """CI run of 2026-12-06 (seed 35971): the dispatcher proposed a high and a low job
    together, to two workers; the one with the high job was paused, so the low one was
    claimed first. Proposed in order, that is the dispatched pool's promise kept; proposed
    out of order, it is a finding."""
    jobs = [JobSpec("low", 0, None), JobSpec("high", 10, None)]
    claims = [_claim("w1.0", "low", 10, 15), _claim("w2.0", "high", 30, 35)]
    assert _check_priority(claims, jobs)  # by claims alone: high was claimed later
    in_order = {"high": 1_000_000, "low": 2_000_000}  # proposed at 1 and 2 ms
    assert _check_priority(claims, jobs, in_order) == []
    out_of_order = {"low": 1_000_000, "high": 2_000_000}
    assert _check_priority(claims, jobs, out_of_order)
