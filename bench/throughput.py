"""3. Throughput: J jobs, W workers, claim → complete, against the floor's write rate.

Each job costs the protocol one read and two conditional writes (claim = GET + PATCH,
complete = PATCH from the cached version). The floor does the same number of writes — two
per job — as bare conditional merge patches from W threads, each on its own object with
its cached resourceVersion (no conflicts, no reads). The two alternate in segments so both
see the same background load; the ratio is jobs/s ÷ (floor writes/s ÷ 2).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.common import floor_write, progress
from joblease.domain.lease import Observed
from joblease.kube.api import KubeApi
from joblease.kube.leases import LeaseStore
from joblease.sdk.client import LeaseClient

SEGMENTS = 4


def run(kubeconfig: str, namespace: str, jobs: int, workers: int) -> dict[str, Any]:
    apis = [KubeApi.from_kubeconfig(kubeconfig) for _ in range(workers)]
    clients = [LeaseClient(namespace, api=a, calibrate=False) for a in apis]
    for c in clients:
        c.margin()  # clock known before timing
    store = LeaseStore(apis[0])
    names = [f"job-{i:05d}" for i in range(jobs)]
    cached_names = [f"jobc-{i:05d}" for i in range(jobs)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: store.create(namespace, n, {"leaseDurationSeconds": 30}),
                      names + cached_names))
        floor_objs = list(pool.map(
            lambda i: store.create(namespace, f"floor-{i:03d}", {}), range(workers)))
    progress(f"throughput: created {jobs} jobs and {workers} floor objects")

    def protocol_segment(segment: list[str], cached: bool = False) -> float:
        # cached: each claim decides from a version read before the segment (untimed), as
        # a worker fed by a watch or list would: the claim is then one write, no read
        seen: dict[str, Observed] = {}
        if cached:
            with ThreadPoolExecutor(8) as pool:
                seen = dict(zip(segment, pool.map(lambda n: store.get(namespace, n), segment),
                                strict=True))
        todo: queue.Queue[str] = queue.Queue()
        for n in segment:
            todo.put(n)
        errors: list[str] = []

        def work(client: LeaseClient, i: int) -> None:
            for _ in range(len(segment)):
                try:
                    name = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    client.claim(name, f"w{i}", observed=seen.get(name)).complete("ok")
                except Exception as err:  # counted, reported
                    errors.append(f"{name}: {err}")

        t0 = time.perf_counter()
        threads = [threading.Thread(target=work, args=(c, i)) for i, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        if errors:
            raise RuntimeError(f"throughput: {len(errors)} jobs failed, e.g. {errors[:3]}")
        return time.perf_counter() - t0

    def floor_segment(writes: int) -> float:
        per = [writes // workers + (1 if i < writes % workers else 0) for i in range(workers)]

        def work(i: int) -> None:
            obs: Observed = floor_objs[i]
            api = apis[i]
            for _ in range(per[i]):
                obs = floor_write(api, namespace, obs, f"w{i}")
            floor_objs[i] = obs

        t0 = time.perf_counter()
        threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        return time.perf_counter() - t0

    size = max(1, jobs // SEGMENTS)
    segments = [names[i:i + size] for i in range(0, jobs, size)]
    cached_segments = [cached_names[i:i + size] for i in range(0, jobs, size)]
    protocol_s = floor_s = cached_s = 0.0
    floor_writes = 0
    for k, segment in enumerate(segments):
        floor_s += floor_segment(2 * len(segment))
        floor_writes += 2 * len(segment)
        protocol_s += protocol_segment(segment)
        cached_s += protocol_segment(cached_segments[k], cached=True)
        progress(f"throughput: segment {k + 1}/{len(segments)} ({len(segment)} jobs): floor "
                 f"so far {floor_writes / floor_s:.0f} writes/s, protocol so far "
                 f"{sum(len(s) for s in segments[:k + 1]) / protocol_s:.0f} jobs/s")
    for a in apis:
        a.close()
    jobs_per_s = jobs / protocol_s
    floor_rate = floor_writes / floor_s
    cached_rate = jobs / cached_s
    return {"jobs": jobs, "workers": workers, "protocol_seconds": protocol_s,
            "cached_jobs_per_s": cached_rate, "cached_ratio": cached_rate / (floor_rate / 2),
            "jobs_per_s": jobs_per_s, "floor_writes": floor_writes, "floor_seconds": floor_s,
            "floor_writes_per_s": floor_rate, "ratio": jobs_per_s / (floor_rate / 2)}
