"""5. Operator scale: N JobLeases, one operator process.

1. N JobLeases are created (no status, as `kubectl apply` leaves them) before the
   operator starts; then the operator starts and we time until it has initialized all of
   them (its ``joblease_operator_writes_total{kind="initialized"}`` reaches N).
2. Renewals: R leases are claimed and renewed k times each by this process. The operator's
   writes during the renewals are counted twice: by its own counter, and from
   kube-apiserver's ``apiserver_request_total`` (writes to jobleases minus the ones this
   process sent; the metric has no user label, so we subtract what we know we sent).
3. Expiry: E leases (duration D) are claimed over a few seconds and abandoned. Expiry lag
   per lease = the ``Held=False`` condition's ``lastTransitionTime`` minus ``leaseUntil``.
4. TTL garbage collection: T more JobLeases with ``ttlSecondsAfterFinished: 1`` are
   claimed and completed; how fast the operator deletes them, and its writes per deletion.
5. A pool worker at scale: all but 10 % of the N JobLeases are finished (set-up: one
   status write each, as an admin), then a ``joblease`` pool over the whole selector is
   opened in a process of its own (``bench.pool_scale_worker``): list time, RSS, choice.
Resident memory (VmRSS and the peak VmHWM from /proc) is sampled throughout; etcd's
database size and kube-apiserver's RSS are read after the initialization and at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.support.operator_process import OperatorProcess

from bench.common import (
    WRITE_VERBS,
    apiserver_requests,
    count,
    list_leases,
    proc_rss_mb,
    progress,
    summary,
)
from joblease.domain.lease import Completion, Observed, Phase, parse_time
from joblease.kube.api import MERGE_PATCH, ApiError, KubeApi
from joblease.kube.leases import LeaseStore, lease_path
from joblease.sdk.client import Lease, LeaseClient

RENEW_DURATION = 30
PACED_RATE = 25.0  # claims/s in the paced expiry run: below the operator's write rate
LABELS = {"bench": "scale"}
SELECTOR = "bench=scale"
TTL_LEASES = 500
QUICK_TTL_LEASES = 50
UNFINISHED_SHARE = 0.1  # the pool worker's selector keeps this share of the N unfinished


def cluster_figures(cluster: Any) -> dict[str, float]:
    """etcd's database size (MB, total and in use) and kube-apiserver's RSS (MB), now."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"{cluster.etcd_url}/metrics", timeout=10) as reply:
            for line in reply.read().decode().splitlines():
                name, _, value = line.partition(" ")
                if name == "etcd_mvcc_db_total_size_in_bytes":
                    out["etcd_db_mb"] = float(value) / 2**20
                elif name == "etcd_mvcc_db_total_size_in_use_in_bytes":
                    out["etcd_db_in_use_mb"] = float(value) / 2**20
    except OSError as err:
        progress(f"scale: etcd metrics unreadable: {err}")
    for proc in cluster.processes:
        if proc.name == "kube-apiserver" and proc.pid:
            out["apiserver_rss_mb"], out["apiserver_hwm_mb"] = proc_rss_mb(proc.pid)
    return out


class Operator(OperatorProcess):
    """The operator (``tests/support``'s process) plus what the scale run reads from it."""

    def __init__(self, kubeconfig: str, log: Path, namespace: str,
                 extra_env: dict[str, str] | None = None) -> None:
        super().__init__(kubeconfig, log, namespaces=[namespace], extra_env=extra_env)
        self.start(wait=False)  # not waited for: the run times initialization from here
        self.started = time.monotonic()
        self.peak_rss_mb = 0.0

    def metrics(self) -> dict[str, float]:
        """The operator's metrics, or nothing while it does not answer yet."""
        try:
            return super().metrics()
        except OSError:
            return {}

    def rss_mb(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MB."""
        rss, hwm = proc_rss_mb(self.pid)
        self.peak_rss_mb = max(self.peak_rss_mb, hwm)
        return rss, hwm

    def writes(self, kind: str | None = None) -> float:
        values = self.metrics()
        return sum(v for k, v in values.items()
                   if k.startswith("joblease_operator_writes_total{")
                   and (kind is None or f'kind="{kind}"' in k))


def _jl_writes(totals: dict[tuple[str, str, str, str], float],
               verbs: tuple[str, ...] = WRITE_VERBS) -> float:
    return count(totals, verbs=verbs, resource="jobleases")


def _event_writes(totals: dict[tuple[str, str, str, str], float]) -> float:
    return count(totals, verbs=WRITE_VERBS, resource="events")


def run(cluster: Any, kubeconfig: str, namespace: str, leases: int, renew_leases: int,
        renew_rounds: int, expire_leases: int, duration: int, log_dir: Path,
        reconcile_timeout: float) -> dict[str, Any]:
    api = KubeApi.from_kubeconfig(kubeconfig)
    store = LeaseStore(api)
    names = [f"s-{i:05d}" for i in range(leases)]
    t0 = time.monotonic()
    # the renewed ones get 30 s leases: renewals are counted, not raced against expiry
    durations = {n: RENEW_DURATION if i < renew_leases else duration
                 for i, n in enumerate(names)}
    with ThreadPoolExecutor(8) as pool:
        for i, _ in enumerate(pool.map(
                lambda n: store.create(namespace, n, {"leaseDurationSeconds": durations[n]},
                                       LABELS),
                names)):
            if (i + 1) % max(1, leases // 10) == 0:
                progress(f"scale: created {i + 1}/{leases} JobLeases "
                         f"({time.monotonic() - t0:.0f}s)")
    out: dict[str, Any] = {"leases": leases, "create_seconds": time.monotonic() - t0}
    out["create_rate"] = leases / out["create_seconds"]
    before_start = apiserver_requests(cluster)
    # watching only this namespace: the other sections' leftovers are not its business
    op = Operator(kubeconfig, log_dir / "operator-scale.log", namespace)
    try:
        out.update(_reconcile(op, leases, reconcile_timeout))
        out["cluster_after_init"] = cluster_figures(cluster)
        after_init = apiserver_requests(cluster)
        initialized = out["initialized"]
        out["init_writes_per_lease"] = {
            "jobleases": _jl_writes(after_init) - _jl_writes(before_start),
            "events": _event_writes(after_init) - _event_writes(before_start)}
        if initialized:
            out["init_writes_per_lease"] = {k: v / initialized
                                            for k, v in out["init_writes_per_lease"].items()}
        out["renewals"] = _renewals(cluster, op, kubeconfig, namespace,
                                    names[:renew_leases], renew_rounds)
        first = renew_leases
        out["expiry_paced"] = _expiry(cluster, op, kubeconfig, namespace,
                                      names[first:first + expire_leases], duration, PACED_RATE)
        first += expire_leases
        out["expiry"] = _expiry(cluster, op, kubeconfig, namespace,
                                names[first:first + expire_leases], duration, None)
        out["ttl"] = _ttl(cluster, op, kubeconfig, namespace,
                          TTL_LEASES if leases >= 1000 else QUICK_TTL_LEASES)
        out["pool_worker"] = _pool_at_scale(api, kubeconfig, namespace, leases)
        out["cluster_end"] = cluster_figures(cluster)
        rss, hwm = op.rss_mb()
        out["rss_mb_end"], out["rss_mb_peak"] = rss, max(hwm, op.peak_rss_mb)
        values = op.metrics()
        out["operator_expiry_lag_histogram"] = {
            k: v for k, v in values.items() if k.startswith("joblease_expiry_lag_seconds")}
    finally:
        op.stop()
        api.close()
    return out


def _reconcile(op: Operator, leases: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    done = 0.0
    last_report = 0.0
    while time.monotonic() < deadline:
        if op.proc.poll() is not None:
            raise RuntimeError(f"operator exited {op.proc.returncode}")
        done = op.writes("initialized")
        op.rss_mb()
        if done >= leases:
            break
        if time.monotonic() - last_report > 10:
            last_report = time.monotonic()
            rss, _ = op.rss_mb()
            progress(f"scale: operator initialized {done:.0f}/{leases} "
                     f"({time.monotonic() - op.started:.0f}s, RSS {rss:.0f} MB)")
        time.sleep(0.5)
    seconds = time.monotonic() - op.started
    rss, hwm = op.rss_mb()
    progress(f"scale: {done:.0f}/{leases} reconciled {seconds:.1f}s after the operator started"
             f" (RSS {rss:.0f} MB, peak {hwm:.0f} MB)")
    return {"initialized": done, "reconcile_seconds": seconds, "reconciled_all": done >= leases,
            "rss_mb_after_reconcile": rss}


def _renewals(cluster: Any, op: Operator, kubeconfig: str, namespace: str, names: list[str],
              rounds: int) -> dict[str, Any]:
    client = LeaseClient(namespace, kubeconfig=kubeconfig)
    client.calibrate()  # once, before anything is timed
    with ThreadPoolExecutor(8) as pool:
        held: list[Lease] = list(pool.map(lambda n: client.claim(n, "renewer"), names))
    time.sleep(1.0)  # let the operator see the claims before we start counting
    before_api, before_op = apiserver_requests(cluster), op.writes()
    sent = 0
    for r in range(rounds):
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda lease: lease.renew(), held))
        sent += len(held)
        op.rss_mb()
        if r + 1 < rounds:
            time.sleep(1.0)
    time.sleep(1.0)  # the operator sees the last renewals
    after_api, after_op = apiserver_requests(cluster), op.writes()
    api_writes = _jl_writes(after_api) - _jl_writes(before_api)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda lease: lease.release(), held))
    client.api.close()
    operator_writes_api = api_writes - sent
    progress(f"scale: {sent} renewals; operator writes meanwhile: {after_op - before_op:.0f} "
             f"(its counter), {operator_writes_api:.0f} (kube-apiserver's count minus ours)")
    return {"renewals": sent, "operator_writes_counter": after_op - before_op,
            "operator_writes_apiserver": operator_writes_api,
            "writes_per_renewal": max(after_op - before_op, operator_writes_api) / sent}


def _expiry(cluster: Any, op: Operator, kubeconfig: str, namespace: str, names: list[str],
            duration: int, rate: float | None) -> dict[str, Any]:
    """Claim and abandon ``names``: at ``rate`` claims/s, or as fast as 8 threads go."""
    client = LeaseClient(namespace, kubeconfig=kubeconfig)
    client.calibrate()  # once, before anything is timed
    before_api, before_op = apiserver_requests(cluster), op.writes("expired")
    t0 = time.monotonic()
    if rate is None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: client.claim(n, "abandoner"), names))
    else:
        for i, name in enumerate(names):
            time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            client.claim(name, "abandoner")
    achieved = len(names) / max(1e-9, time.monotonic() - t0)
    claimed_api = apiserver_requests(cluster)
    progress(f"scale: claimed {len(names)} leases of {duration}s at {achieved:.0f}/s and "
             "abandoned them")
    deadline = time.monotonic() + duration + 120
    expired = 0.0
    while time.monotonic() < deadline:
        expired = op.writes("expired") - before_op
        op.rss_mb()
        if expired >= len(names):
            break
        time.sleep(0.5)
    time.sleep(1.0)
    after_api = apiserver_requests(cluster)
    wanted = set(names)
    lags: list[float] = []
    with ThreadPoolExecutor(8) as pool:  # only these: a list of all N would read 100,000
        items = list(pool.map(
            lambda n: client.api.request("GET", lease_path(namespace, n)).body, sorted(wanted)))
    for item in items:
        status = item.get("status") or {}
        held = next((c for c in status.get("conditions", []) if c.get("type") == "Held"), None)
        if status.get("phase") == "Expired" and held and status.get("leaseUntil"):
            lag = parse_time(held["lastTransitionTime"]) - parse_time(status["leaseUntil"])
            lags.append(lag.total_seconds())
    client.api.close()
    # Expiries start while claims are still being sent (paced run), so count the whole
    # window and subtract our own writes: one PATCH per claim (its GET is not a write).
    ours = len(names)
    op_jl = _jl_writes(after_api) - _jl_writes(before_api) - ours
    # the operator posts an Event for every claim it sees and every expiry it writes
    op_events = _event_writes(after_api) - _event_writes(before_api)
    progress(f"scale: {len(lags)}/{len(names)} expired; lag p50 "
             f"{summary(lags)['p50']:.2f}s p99 {summary(lags)['p99']:.2f}s")
    return {"leases": len(names), "rate": achieved, "expired": len(lags), "lag_s": summary(lags),
            "lag_samples": lags, "claims_sent": ours,
            "claim_writes_apiserver": _jl_writes(claimed_api) - _jl_writes(before_api),
            "operator_writes_per_expiry": {"jobleases": op_jl / max(1, len(lags)),
                                           "events": op_events / max(1, len(lags) + ours)}}


def _ttl(cluster: Any, op: Operator, kubeconfig: str, namespace: str, count: int
         ) -> dict[str, Any]:
    """Finish ``count`` JobLeases with a 1 s TTL; time their deletion by the operator."""
    api = KubeApi.from_kubeconfig(kubeconfig)
    store = LeaseStore(api)
    names = [f"ttl-{i:05d}" for i in range(count)]
    before_init = op.writes("initialized")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: store.create(namespace, n, {"leaseDurationSeconds": 30,
                                                            "ttlSecondsAfterFinished": 1}),
                      names))
    deadline = time.monotonic() + 300
    while op.writes("initialized") - before_init < count and time.monotonic() < deadline:
        time.sleep(0.2)
    client = LeaseClient(namespace, kubeconfig=kubeconfig)
    # sampled before the completions: the first deletions start 1 s after the first one
    before_api, before_deleted = apiserver_requests(cluster), op.writes("deleted")
    ours = 2 * count  # a claim and a completion each
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: client.claim(n, "ttl").complete(), names))
    due = time.monotonic() + 1.0  # the last completion's TTL ends about now + 1 s
    deadline = time.monotonic() + 300
    deleted = 0.0
    while time.monotonic() < deadline:
        deleted = op.writes("deleted") - before_deleted
        if deleted >= count:
            break
        time.sleep(0.1)
    seconds = time.monotonic() - due
    after_api = apiserver_requests(cluster)
    deletes = _jl_writes(after_api, ("DELETE",)) - _jl_writes(before_api, ("DELETE",))
    writes = _jl_writes(after_api) - _jl_writes(before_api) - ours
    client.api.close()
    api.close()
    progress(f"scale: TTL deleted {deleted:.0f}/{count} in {seconds:.1f}s after the last was "
             f"due ({deleted / max(seconds, 1e-9):.0f}/s), {writes / max(1.0, deleted):.2f} "
             "JobLease writes per deletion")
    return {"leases": count, "deleted": deleted, "seconds_after_due": seconds,
            "rate": deleted / max(seconds, 1e-9), "deletes": deletes,
            "writes_per_deletion": writes / max(1.0, deleted)}


def _pool_at_scale(api: KubeApi, kubeconfig: str, namespace: str, leases: int
                   ) -> dict[str, Any]:
    """Finish all but a tenth of the N, then open a pool worker over all of them."""
    t0 = time.monotonic()
    items = list_leases(api, namespace)
    listed = time.monotonic() - t0
    scale = [i for i in items if i["metadata"].get("labels", {}).get("bench") == "scale"]
    del items
    open_ = [i for i in scale
             if (i.get("status") or {}).get("phase") not in ("Completed", "Failed")]
    keep = int(leases * UNFINISHED_SHARE)
    finish = open_[keep:]  # empty when enough are finished already
    progress(f"scale: a full list of {len(scale)} took {listed:.1f}s; finishing {len(finish)} "
             "(set-up, one status write each)")
    t1 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        for i, _ in enumerate(pool.map(lambda item: _finish(api, namespace, item), finish)):
            if (i + 1) % 10_000 == 0:
                progress(f"scale: finished {i + 1}/{len(finish)} "
                         f"({time.monotonic() - t1:.0f}s)")
    progress(f"scale: finished {len(finish)} in {time.monotonic() - t1:.0f}s")
    del scale, open_, finish
    out = subprocess.run([sys.executable, "-m", "bench.pool_scale_worker", kubeconfig,
                          namespace, SELECTOR], capture_output=True, text=True, timeout=900,
                         check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the pool worker failed: {out.stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    figures["selector_size"] = leases
    figures["full_list_seconds"] = listed
    progress(f"scale: pool worker over {leases} ({figures['cached']} unfinished): listed in "
             f"{figures['list_seconds']:.1f}s, RSS {figures['rss_mb_after']:.0f} MB "
             f"({figures['kb_per_cached']:.2f} KB per cached job), choice "
             f"{figures['choose_ms']:.3f} ms")
    return figures


def _finish(api: KubeApi, namespace: str, item: dict[str, Any]) -> None:
    """Complete one JobLease in one status write (set-up only: no claim, no lease)."""
    obs = Observed.from_object(item)
    for _ in range(5):
        st = obs.status
        now = api.server_now().midpoint
        epoch = st.epoch if st.epoch is not None else int(obs.resource_version)
        gen = st.generation + 1 if st.phase is not Phase.HELD else st.generation
        status = replace(st, phase=Phase.COMPLETED, holder="bench", generation=gen,
                         epoch=epoch, lease_until=None, finish_time=now,
                         completion=Completion(gen, "bench", now, "set-up")).to_dict()
        patch = {"metadata": {"resourceVersion": obs.resource_version}, "status": status}
        try:
            api.request("PATCH", lease_path(namespace, obs.name, "status"), patch,
                        content_type=MERGE_PATCH)
            return
        except ApiError:  # moved meanwhile (the operator): read and try again
            obs = Observed.from_object(api.request("GET", lease_path(namespace, obs.name)).body)
