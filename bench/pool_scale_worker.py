"""One pool worker at scale, in a process of its own: list time, RSS, cached jobs, choice.

``python -m bench.pool_scale_worker KUBECONFIG NAMESPACE SELECTOR`` prints one JSON line:
the seconds from opening the pool to its first complete list (``Pool.unfinished``: the
server-side filter leaves finished JobLeases out, the list is paged), how many JobLeases it
caches, its resident memory before and after (``VmRSS``, MB), and the mean time of one
choice (``PoolView.choose``, what ``claim_next`` does before it writes) over the cache.
A process of its own so that the RSS is a worker's, not the benchmark's.
"""

from __future__ import annotations

import json
import os
import sys
import time

from bench.common import proc_rss_mb
from joblease.sdk.client import LeaseClient


def main(argv: list[str]) -> int:
    kubeconfig, namespace, selector = argv
    client = LeaseClient(namespace, kubeconfig=kubeconfig)
    client.calibrate()
    before = proc_rss_mb(os.getpid())[0]
    t0 = time.monotonic()
    with client.pool(selector) as pool:
        cached = pool.unfinished(timeout=600)
        listed = time.monotonic() - t0
        after = proc_rss_mb(os.getpid())[0]
        view, margin = pool._view, client.margin()  # the choice claim_next makes, timed alone
        calls = 200
        start = time.perf_counter()
        for call in range(calls):
            view.choose(f"bench-worker-{call % 20}", client.api.server_now(), margin, 1)
        choose_ms = (time.perf_counter() - start) / calls * 1000
    print(json.dumps({"list_seconds": listed, "cached": cached, "rss_mb_before": before,
                      "rss_mb_after": after, "choose_ms": choose_ms,
                      "kb_per_cached": (after - before) * 1024 / max(1, cached)}))
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
