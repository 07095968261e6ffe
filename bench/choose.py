"""Micro-benchmark: the cost of one ``PoolView.choose`` with many JobLeases cached.

``python -m bench.choose [--cached N] [--calls C]``. Pure (no API server): a view of N
Available JobLeases, the first 20 held by 20 workers (as in the ``pool`` section's drain),
and C choices by those workers. Prints the mean time per call and how many cached
JobLeases each call examined (``claimable_at`` calls), the number that shows whether a
choice scans the whole cache or only the front of its order.
"""

from __future__ import annotations

import argparse
import time
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


def main() -> None:
    """Print the cost of ``choose`` for the sizes asked for."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cached", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    for cached in args.cached:
        seconds, examined = measure(cached, args.calls)
        print(f"choose with {cached:>6} cached: {seconds * 1e3:8.3f} ms/call, "
              f"{examined:8.1f} JobLeases examined/call")


if __name__ == "__main__":
    main()
