"""1. Claim and renew latency against the floor, interleaved in one loop.

The floor is a bare conditional write: a merge patch carrying ``metadata.resourceVersion``
of a JobLease's status, through the same ``KubeApi`` (same connection, same server), with
a Held-shaped status of the same size as a claim's. Each iteration runs every operation
once, in a shuffled order, so all of them see the same background load.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import random
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import progress, summary
from joblease.domain.lease import LeaseStatus, Observed, Phase
from joblease.kube.api import MERGE_PATCH, KubeApi
from joblease.kube.leases import LeaseStore, lease_path
from joblease.sdk.client import Lease, LeaseClient


def run(kubeconfig: str, namespace: str, iterations: int, results: Path) -> dict[str, Any]:
    api = KubeApi.from_kubeconfig(kubeconfig)
    client = LeaseClient(namespace, api=api)
    client.calibrate()  # once, outside the timings
    store = LeaseStore(api)
    for name in ("floor", "claim-a", "claim-b", "renew"):
        store.create(namespace, name, {"leaseDurationSeconds": 30})
    floor_obs = store.get(namespace, "floor")
    held: Lease = client.claim("renew", "bench-renewer")
    store.create(namespace, "floor-body", {"leaseDurationSeconds": 30})
    held_snapshot = store.get(namespace, "renew").status
    body_obs = store.write_status(store.get(namespace, "floor-body"), held_snapshot)
    cached: dict[str, Observed] = {}

    def floor() -> None:
        nonlocal floor_obs
        now = api.server_now().midpoint
        # a claimed status needs an epoch (CRD rule); the first write sets it, like a claim
        epoch = (floor_obs.status.epoch if floor_obs.status.epoch is not None
                 else int(floor_obs.resource_version))
        status = LeaseStatus(phase=Phase.HELD, holder="bench-floor",
                             generation=floor_obs.status.generation + 1, epoch=epoch,
                             acquire_time=now, renew_time=now,
                             lease_until=now + timedelta(seconds=30))
        patch = {"metadata": {"resourceVersion": floor_obs.resource_version},
                 "status": status.to_dict()}
        body = api.request("PATCH", lease_path(namespace, "floor", "status"), patch,
                           content_type=MERGE_PATCH).body
        floor_obs = Observed.from_object(body)

    def floor_same_body() -> None:
        # the floor again, but carrying exactly the status body a renewal writes
        # (conditions included): separates the payload's cost from the SDK's own
        nonlocal body_obs
        now = api.server_now().midpoint
        status = replace(held_snapshot, renew_time=now, lease_until=now + timedelta(seconds=30))
        patch = {"metadata": {"resourceVersion": body_obs.resource_version},
                 "status": status.to_dict()}
        body = api.request("PATCH", lease_path(namespace, "floor-body", "status"), patch,
                           content_type=MERGE_PATCH).body
        body_obs = Observed.from_object(body)

    def floor_get() -> None:
        api.request("GET", lease_path(namespace, "floor"))

    def renew() -> None:
        held.renew()

    # The claims' releases are untimed: time only the claim itself.
    timed: dict[str, list[float]] = {k: [] for k in
                                     ("floor", "floor_same_body", "floor_get", "claim",
                                      "claim_cached", "renew")}
    cpu: dict[str, list[float]] = {k: [] for k in timed}

    def run_claim(key: str, name: str) -> None:
        if key == "claim_cached":
            cached[name] = store.get(namespace, name)  # a recent read (as from a watch)
            t0, c0 = time.perf_counter(), time.process_time()
            lease = client.claim(name, "bench-claimer", observed=cached[name])
        else:
            t0, c0 = time.perf_counter(), time.process_time()
            lease = client.claim(name, "bench-claimer")
        timed[key].append(time.perf_counter() - t0)
        cpu[key].append(time.process_time() - c0)
        lease.release()

    ops: dict[str, Callable[[], None]] = {
        "floor": floor, "floor_same_body": floor_same_body, "floor_get": floor_get,
        "renew": renew,
        "claim": lambda: run_claim("claim", "claim-a"),
        "claim_cached": lambda: run_claim("claim_cached", "claim-b"),
    }
    for _ in range(3):  # warm-up: connections, caches
        for op in ops.values():
            op()
    for values in (*timed.values(), *cpu.values()):
        values.clear()
    rng = random.Random(6)
    step = max(1, iterations // 5)
    for i in range(iterations):
        order = list(ops)
        rng.shuffle(order)
        for key in order:
            if key.startswith("claim"):
                ops[key]()
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            ops[key]()
            timed[key].append(time.perf_counter() - t0)
            cpu[key].append(time.process_time() - c0)
        if (i + 1) % step == 0:
            progress(f"latency: {i + 1}/{iterations} interleaved iterations")
    # a profile of claims alone, to see what bounds them on the client side
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(min(50, iterations)):
        client.claim("claim-a", "bench-claimer").release()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    results.mkdir(parents=True, exist_ok=True)
    (results / "claim_profile.txt").write_text(text.getvalue())
    api.close()
    out: dict[str, Any] = {k: summary(v) for k, v in timed.items()}
    out["cpu_ms_mean"] = {k: 1000 * sum(v) / max(1, len(v)) for k, v in cpu.items()}
    out["samples"] = timed
    f50, f99 = out["floor"]["p50"], out["floor"]["p99"]
    out["ratios"] = {k: {"p50": out[k]["p50"] / f50, "p99": out[k]["p99"] / f99}
                     for k in ("claim", "claim_cached", "renew", "floor_same_body")}
    return out
