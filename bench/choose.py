"""Micro-benchmark: the cost of one ``PoolView.choose`` with many JobLeases cached.

``python -m bench.choose [--cached N] [--calls C]``. Pure (no API server): a view of N
Available JobLeases, the first 20 held by 20 workers (as in the ``pool`` section's drain),
and C choices by those workers. Prints the mean time per call and how many cached
JobLeases each call examined (``claimable_at`` calls), the number that shows whether a
choice scans the whole cache or only the front of its order.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import joblease.domain.pool as pool_module
from joblease.domain.clock import ServerNow
from joblease.domain.lease import LeaseSpec, LeaseStatus, Observed, Phase, claimable_at
from joblease.domain.pool import PoolView

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
MARGIN = timedelta(milliseconds=250)
WORKERS = 20


def _job(i: int) -> Observed:
    held = i < WORKERS
    status = LeaseStatus(phase=Phase.HELD if held else Phase.AVAILABLE,
                         holder=f"worker-{i}" if held else None, generation=1, epoch=1,
                         lease_until=T0 + timedelta(seconds=60) if held else None)
    return Observed("ns", f"job-{i:05d}", f"uid-{i}", str(100 + i), 1, LeaseSpec(), status,
                    created=T0 + timedelta(milliseconds=i))


def measure(cached: int, calls: int) -> tuple[float, float]:
    """Mean seconds per ``choose`` and mean ``claimable_at`` calls per ``choose``."""
    view = PoolView()
    view.replace([_job(i) for i in range(cached)], "1")
    examined = 0

    def counting(obs: Observed, margin: timedelta) -> datetime | None:
        nonlocal examined
        examined += 1
        return claimable_at(obs, margin)

    now = ServerNow.exact(T0 + timedelta(seconds=1))
    original = pool_module.claimable_at
    pool_module.claimable_at = counting  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        for call in range(calls):
            view.choose(f"worker-{call % WORKERS}", now, MARGIN)
        elapsed = time.perf_counter() - start
    finally:
        pool_module.claimable_at = original
    return elapsed / calls, examined / calls


def collisions(workers: int, per_holder: int, pools: int = 200) -> tuple[int, float]:
    """The window and the mean number of ``workers`` first picks that collide.

    ``workers`` workers each hold one JobLease of 1,000 and choose their next at once, from
    the same view (the worst case: no claim is seen before the others choose); random job
    and worker names per pool, seeded.
    """
    rng = random.Random(f"{workers}/{per_holder}")
    colliding = 0
    window = 0
    for _ in range(pools):
        view = PoolView()
        names = [f"job-{rng.getrandbits(48):x}" for _ in range(1_000)]
        view.replace([replace(_job(i), name=name) for i, name in enumerate(names)], "1")
        window = view.window(per_holder=per_holder)
        now = ServerNow.exact(T0 + timedelta(seconds=1))
        picks = Counter(getattr(view.choose(f"worker-{i}-{rng.getrandbits(32):x}", now, MARGIN,
                                            per_holder=per_holder), "name", None)
                        for i in range(workers))
        colliding += workers - len(picks)
    return window, colliding / pools


def main() -> None:
    """Print the cost of ``choose`` for the sizes asked for."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cached", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--per-holder", type=int, nargs="*", default=[0, 2, 4, 8, 16],
                        help="window slots per active holder whose collisions to print")
    args = parser.parse_args()
    for per_holder in args.per_holder:
        window, colliding = collisions(WORKERS, per_holder)
        print(f"{WORKERS} workers choosing at once, {per_holder:>2} slots per holder: window "
              f"{window:>3}, {colliding:5.2f} of {WORKERS} first picks collide "
              f"({colliding / WORKERS:.1%})")
    for cached in args.cached:
        seconds, examined = measure(cached, args.calls)
        print(f"choose with {cached:>6} cached: {seconds * 1e3:8.3f} ms/call, "
              f"{examined:8.1f} JobLeases examined/call")
    cached = max(args.cached)
    print(f"memory of a pool's view with {cached} unfinished JobLeases cached: "
          f"{view_bytes(cached) / cached:.0f} B per job (tracemalloc: the parsed objects "
          "and the view's indexes; the JSON is dropped once parsed)")


def view_bytes(cached: int) -> int:
    """Bytes a ``PoolView`` holds for ``cached`` JobLeases parsed from realistic JSON."""
    import gc
    import json
    import tracemalloc

    raw = [json.loads(json.dumps(_object(i))) for i in range(cached)]
    gc.collect()
    tracemalloc.start()
    try:
        view = PoolView()
        view.replace([Observed.from_object(obj) for obj in raw], "1")
        del raw
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(view) == cached
    return held


def _object(i: int) -> dict[str, object]:
    """A JobLease as the API server sends it after the operator's initialization."""
    condition = {"status": "False", "reason": "Initialized", "message": "ready to be claimed",
                 "lastTransitionTime": "2026-12-03T12:00:01Z", "observedGeneration": 1}
    return {"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
            "metadata": {"name": f"job-{i:06d}", "namespace": "batch",
                         "uid": f"6f1c8a2e-1d2b-4c3d-9e8f-{i:012d}",
                         "resourceVersion": str(100_000 + i), "generation": 1,
                         "creationTimestamp": "2026-12-03T12:00:00Z",
                         "labels": {"batch": "nightly", "team": "data"}},
            "spec": {"leaseDurationSeconds": 30, "priority": 0, "maxAttempts": 3,
                     "backoff": {"initialSeconds": 10, "factor": 2, "maxSeconds": 300}},
            "status": {"phase": "Available", "generation": 0, "epoch": 100_000 + i,
                       "attempts": 0, "conditions": [{"type": "Held", **condition},
                                                     {"type": "Ready", **condition}]}}


if __name__ == "__main__":
    main()
