"""2. Contention: N workers claim one lease at the same instant.

Each worker is a thread with its own ``LeaseClient`` (own connection, own clock estimate),
warmed up, then released together by a barrier. Measured: time from the barrier to the
winner's successful claim, time until every worker knows the outcome (won, or refused
with the winner's name), and the wasted writes — the PATCHes the API server rejected with
409, counted from kube-apiserver's own ``apiserver_request_total``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.common import apiserver_requests, count, progress, summary
from joblease.domain.errors import LeaseHeldError
from joblease.kube.api import KubeApi
from joblease.kube.leases import LeaseStore
from joblease.sdk.client import LeaseClient


def run(cluster: Any, kubeconfig: str, namespace: str, workers: int, rounds: int
        ) -> dict[str, Any]:
    clients = [LeaseClient(namespace, api=KubeApi.from_kubeconfig(kubeconfig), calibrate=False)
               for _ in range(workers)]
    admin = LeaseStore(KubeApi.from_kubeconfig(kubeconfig))
    winner_s: list[float] = []
    all_known_s: list[float] = []
    wasted: list[float] = []
    other_errors = 0
    for r in range(rounds):
        name = f"contended-{r}"
        admin.create(namespace, name, {"leaseDurationSeconds": 30})
        for c in clients:
            c.get(name)  # warm: connection up, server clock known
        barrier = threading.Barrier(workers + 1)
        done: list[tuple[str, float]] = []
        lock = threading.Lock()

        def worker(i: int, client: LeaseClient, name: str = name,
                   barrier: threading.Barrier = barrier,
                   done: list[tuple[str, float]] = done, lock: threading.Lock = lock) -> None:
            barrier.wait(timeout=60)
            try:
                client.claim(name, f"worker-{i}")
                what = "won"
            except LeaseHeldError:
                what = "refused"
            except Exception as err:
                what = f"error: {err}"
            with lock:
                done.append((what, time.perf_counter()))

        threads = [threading.Thread(target=worker, args=(i, c), daemon=True)
                   for i, c in enumerate(clients)]
        for t in threads:
            t.start()
        before = apiserver_requests(cluster)
        barrier.wait(timeout=60)
        t0 = time.perf_counter()
        for t in threads:
            t.join(timeout=120)
        after = apiserver_requests(cluster)
        wins = [at for what, at in done if what == "won"]
        other_errors += sum(1 for what, _ in done if what.startswith("error"))
        if len(wins) != 1:
            raise RuntimeError(f"contention round {r}: {len(wins)} winners: {done}")
        winner_s.append(wins[0] - t0)
        all_known_s.append(max(at for _, at in done) - t0)
        conflicts = (count(after, verbs=("PATCH",), resource="jobleases", code="409")
                     - count(before, verbs=("PATCH",), resource="jobleases", code="409"))
        wasted.append(conflicts)
        progress(f"contention: round {r + 1}/{rounds}: winner after "
                 f"{winner_s[-1] * 1000:.0f} ms, all {workers} know after "
                 f"{all_known_s[-1] * 1000:.0f} ms, {conflicts:.0f} writes wasted (409)")
    for c in clients:
        c.api.close()
    admin.api.close()
    return {"workers": workers, "rounds": rounds, "winner_s": summary(winner_s),
            "all_known_s": summary(all_known_s), "wasted_writes": summary(wasted),
            "errors": other_errors}
