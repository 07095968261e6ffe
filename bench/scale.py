"""5. Operator scale: N JobLeases, one operator process, through restarts.

Every phase works the same on today's operator (which writes a status into every new
JobLease) and on one whose JobLeases are born with a defaulted status (which writes
nothing): "caught up", "idle" and "visible" are judged from outside (bench/opwatch.py).

1. **Start during creation**: the operator is started over an empty namespace, then N
   JobLeases are created by 8 threads while it runs. Measured until it has caught up (every
   JobLease shows ``status.phase`` on the API server and the operator knows all N): its
   peak RSS, its CPU per creation (process CPU over the phase ÷ N, its idle CPU included),
   its API requests per creation (kube-apiserver's ``apiserver_request_total`` for
   JobLeases, Events and Pods minus the bench's own POSTs and LISTs: the metric has no user
   label), and the time from creation to a visible status (a sample of about 500).
2. **Restart over N initialized JobLeases**: SIGTERM, a new process, until it is healthy,
   knows all N and is idle: its peak RSS, CPU seconds, API requests by verb and resource,
   and the JobLease writes meanwhile (0 expected: none of them needs anything).
3. **Idle**: the restarted operator's CPU over a window with nothing due (default 30 s) ÷
   the window: CPU per second of idle, an upper bound of one idle pass's CPU when passes
   run at least once a second. After the restart, because today's operator is still
   posting the `Created` Events it queued during creation (10/s) long after phase 1.
4. **Forced relist (410)**: kube-apiserver is restarted and, while it is down, etcd's
   history is compacted past every resourceVersion (``LocalCluster.etcd_compact``), so the
   operator's watch cannot resume and must list all N again: its peak RSS (``VmHWM`` reset
   first) and CPU, the time until it has listed again (one JobLease turned Held straight in
   etcd meanwhile: its count of Held ones moves only then) and until it is idle. kube-apiserver's
   request counts restart with it and include kube-controller-manager's relists, so they
   are reported as "all clients".
5. Renewals: R leases are claimed and renewed k times each by this process; the operator's
   writes meanwhile (its counter, and kube-apiserver's count minus ours).
6. Expiry: E leases (duration D) claimed at 25/s and abandoned (paced), E claimed as fast as
   8 threads go (burst), then bursts *due at once* (default 500 and 5,000): read first,
   then claimed with one common ``leaseUntil`` a little after the last claim is expected.
   Expiry lag per lease = the ``Held=False`` condition's ``lastTransitionTime`` minus
   ``leaseUntil``; for the bursts due at once also the operator's expiry write rate
   (from the transition times, 10th to 90th percentile) and the write-rate bound (E ÷ that
   rate): the p99 is compared with the bound + 0.5 s.
7. TTL garbage collection: T more JobLeases with ``ttlSecondsAfterFinished: 1`` are
   claimed and completed; how fast the operator deletes them, and its writes per deletion.
8. A pool worker at scale: all but 10 % of the N JobLeases are finished (set-up: one
   status write each, as an admin), then a ``joblease`` pool over the whole selector is
   opened in a process of its own (``bench.pool_scale_worker``): list time, RSS, choice.
etcd's database size and kube-apiserver's RSS are read after phase 1 and at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import (
    WRITE_VERBS,
    apiserver_requests,
    count,
    list_leases,
    proc_rss_mb,
    progress,
    summary,
)
from bench.opwatch import (
    SAMPLE_LABEL,
    SAMPLES,
    Operator,
    VisibleSampler,
    idle_cpu,
    operator_requests,
    unstatused,
    wait_idle,
)
from joblease.domain.errors import format_time
from joblease.domain.lease import (
    Completion,
    LeaseStatus,
    Observed,
    Phase,
    decide_claim,
    parse_time,
)
from joblease.kube.api import MERGE_PATCH, ApiError, KubeApi
from joblease.kube.leases import GROUP, PLURAL, LeaseStore, lease_path
from joblease.kube.transport import Transport
from joblease.sdk.client import Lease, LeaseClient

RENEW_DURATION = 30
PACED_RATE = 25.0  # claims/s in the paced expiry run: below the operator's write rate
ALIGNED_CLAIM_RATE = 100.0  # claims/s assumed when choosing a burst's common leaseUntil
LABELS = {"bench": "scale"}
SELECTOR = "bench=scale"
TTL_LEASES = 500
QUICK_TTL_LEASES = 50
UNFINISHED_SHARE = 0.1  # the pool worker's selector keeps this share of the N unfinished
RELIST_TIMEOUT = 120.0  # s more than the phase timeout for the operator to list again

__all__ = ["LABELS", "Operator", "run"]


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


def _jl_writes(totals: dict[tuple[str, str, str, str], float],
               verbs: tuple[str, ...] = WRITE_VERBS) -> float:
    return count(totals, verbs=verbs, resource="jobleases")


def _event_writes(totals: dict[tuple[str, str, str, str], float]) -> float:
    return count(totals, verbs=WRITE_VERBS, resource="events")


def run(cluster: Any, kubeconfig: str, namespace: str, leases: int, renew_leases: int,
        renew_rounds: int, expire_leases: int, duration: int, log_dir: Path,
        reconcile_timeout: float, bursts: tuple[int, ...] = (500, 5000),
        idle_seconds: float = 30.0) -> dict[str, Any]:
    api = KubeApi.from_kubeconfig(kubeconfig)
    names = [f"s-{i:06d}" for i in range(leases)]
    # the renewed ones get 30 s leases: renewals are counted, not raced against expiry
    durations = {n: RENEW_DURATION if i < renew_leases else duration
                 for i, n in enumerate(names)}
    out: dict[str, Any] = {"leases": leases}
    # watching only this namespace: the other sections' leftovers are not its business
    op = Operator(kubeconfig, log_dir / "operator-scale.log", namespace)
    peaks: list[float] = []
    try:
        progress("scale: phase 1/8: the operator started, then N JobLeases created")
        out["start"] = _start_during_creation(cluster, op, kubeconfig, namespace, names,
                                              durations, reconcile_timeout)
        peaks.append(out["start"]["rss_mb_peak"])
        out["create_rate"] = out["start"]["create_rate"]
        out["cluster_after_init"] = cluster_figures(cluster)
        progress("scale: phase 2/8: the operator restarted over N initialized JobLeases")
        out["restart"] = _restart(cluster, op, leases, reconcile_timeout)
        peaks.append(out["restart"]["rss_mb_peak"])
        # after the restart, not after creation: today's operator is still posting its
        # queued `Created` Events then (10/s), which is not the cost of an idle pass
        progress(f"scale: phase 3/8: the operator idle for {idle_seconds:.0f}s")
        out["idle"] = idle_cpu(op, idle_seconds)
        progress(f"scale: idle: {out['idle']['cpu_ms_per_s']:.1f} ms of CPU per second; "
                 f"{out['idle']['pass_cpu_ms']:.3f} ms per reconcile pass "
                 f"({out['idle']['passes']:.0f} passes)")
        progress("scale: phase 4/8: a forced relist (kube-apiserver restarted, etcd "
                 "compacted)")
        # the last name: no later phase claims it (the pool worker's set-up finishes it)
        out["relist"] = _forced_relist(cluster, op, namespace, leases, reconcile_timeout,
                                       names[-1])
        peaks.append(out["relist"]["rss_mb_peak"])
        api.close()  # its pooled connections went with the old kube-apiserver
        api = KubeApi.from_kubeconfig(kubeconfig)
        progress("scale: phase 5/8: renewals")
        out["renewals"] = _renewals(cluster, op, kubeconfig, namespace,
                                    names[:renew_leases], renew_rounds)
        progress("scale: phase 6/8: expiry (paced, burst, bursts due at once)")
        first = renew_leases
        out["expiry_paced"] = _expiry(cluster, op, kubeconfig, namespace,
                                      names[first:first + expire_leases], duration, PACED_RATE)
        first += expire_leases
        out["expiry"] = _expiry(cluster, op, kubeconfig, namespace,
                                names[first:first + expire_leases], duration, None)
        first += expire_leases
        out["expiry_due_at_once"] = []
        for size in bursts:
            chunk = names[first:first + size]
            first += len(chunk)
            if chunk:
                out["expiry_due_at_once"].append(
                    _expiry(cluster, op, kubeconfig, namespace, chunk, duration, None,
                            aligned=True))
        progress("scale: phase 7/8: TTL garbage collection")
        out["ttl"] = _ttl(cluster, op, kubeconfig, namespace,
                          TTL_LEASES if leases >= 1000 else QUICK_TTL_LEASES)
        progress("scale: phase 8/8: a pool worker over all N")
        out["pool_worker"] = _pool_at_scale(api, kubeconfig, namespace, leases)
        out["cluster_end"] = cluster_figures(cluster)
        rss, _ = op.rss_mb()
        out["rss_mb_end"] = rss
        out["rss_mb_peak"] = max([*peaks, op.peak_rss_mb])
        values = op.metrics()
        out["operator_expiry_lag_histogram"] = {
            k: v for k, v in values.items() if k.startswith("joblease_expiry_lag_seconds")}
    finally:
        op.stop()
        api.close()
    return out


def _create(store: LeaseStore, namespace: str, names: list[str], durations: dict[str, int],
            sampler: VisibleSampler) -> float:
    """Create ``names`` with 8 threads (every k-th a sample); the seconds it took."""
    step = max(1, len(names) // SAMPLES)
    samples = set(names[::step])
    t0 = time.monotonic()

    def create(name: str) -> None:
        labels = {**LABELS, SAMPLE_LABEL: "1"} if name in samples else LABELS
        obs = store.create(namespace, name, {"leaseDurationSeconds": durations[name]}, labels)
        if name in samples:
            sampler.created(name, obs.has_status)

    with ThreadPoolExecutor(8) as pool:
        for i, _ in enumerate(pool.map(create, names)):
            if (i + 1) % max(1, len(names) // 10) == 0:
                progress(f"scale: created {i + 1}/{len(names)} JobLeases "
                         f"({time.monotonic() - t0:.0f}s)")
    return time.monotonic() - t0


def _start_during_creation(cluster: Any, op: Operator, kubeconfig: str, namespace: str,
                           names: list[str], durations: dict[str, int], timeout: float
                           ) -> dict[str, Any]:
    leases = len(names)
    launch = op.launch()
    progress(f"scale: operator healthy {launch:.1f}s after its start; creating {leases}")
    api = KubeApi.from_kubeconfig(kubeconfig)
    store = LeaseStore(api)
    sampler = VisibleSampler(kubeconfig, namespace, timeout + leases / 50)
    time.sleep(1.0)  # the sampler's watch is open before the first creation
    op.new_peak()
    before, cpu0, t0 = apiserver_requests(cluster), op.cpu(), time.monotonic()
    sampler_lists = sampler.lists  # its first LIST came before ``before``
    created = _create(store, namespace, names, durations, sampler)
    progress(f"scale: created {leases} in {created:.1f}s ({leases / created:.0f}/s); "
             "waiting until every one shows a status and the operator knows all")
    ours_lists, caught = 0, False
    deadline, last_report = t0 + timeout, 0.0
    known: float | None = None
    checked = 0.0
    while time.monotonic() < deadline:
        op.alive()
        op.rss_mb()
        # the samples first; the field selector (a scan of all N) only when they are done,
        # or every 10 s should the samples' watch have missed one
        if sampler.pending() == 0 or time.monotonic() - checked >= 10:
            checked = time.monotonic()
            ours_lists += 1
            if not unstatused(api, namespace):
                known = op.known()
                if known is not None and known >= leases:
                    caught = True
                    break
        if time.monotonic() - last_report >= 10:
            last_report = time.monotonic()
            rss, _ = op.rss_mb()
            progress(f"scale: catching up {time.monotonic() - t0:.0f}s: "
                     f"{sampler.pending()} samples without a status, operator knows "
                     f"{known}, RSS {rss:.0f} MB")
        time.sleep(1.0)
    seconds, cpu = time.monotonic() - t0, op.cpu() - cpu0
    after = apiserver_requests(cluster)
    rss, hwm = op.rss_mb()
    visible = sampler.stop()
    requests = operator_requests(before, after)
    # ours: every POST of a JobLease, the field-selector checks and the sampler's LISTs
    requests["POST jobleases"] = requests.get("POST jobleases", 0.0) - leases
    requests["LIST jobleases"] = (requests.get("LIST jobleases", 0.0) - ours_lists
                                  - (sampler.lists - sampler_lists))
    requests = {k: v for k, v in requests.items() if v}
    settle = wait_idle(op, leases, timeout, "after creation")
    writes = {"jobleases": _jl_writes(after) - _jl_writes(before) - leases,
              "events": _event_writes(after) - _event_writes(before)}
    progress(f"scale: caught up {seconds:.1f}s after the first creation ({caught}); "
             f"operator CPU {1000 * cpu / leases:.3f} ms and "
             f"{sum(requests.values()) / leases:.3f} API requests per creation; RSS "
             f"{rss:.0f} MB, peak {max(hwm, op.peak_rss_mb):.0f} MB; visible status p99 "
             f"{visible['lag_s']['p99']:.2f}s")
    api.close()
    return {"launch_seconds": launch, "create_seconds": created,
            "create_rate": leases / created, "caught_up": caught,
            "caught_up_seconds": seconds, "caught_up_rate": leases / seconds,
            "caught_up_after_created_seconds": seconds - created, "known": known,
            "cpu_s": cpu, "cpu_ms_per_creation": 1000 * cpu / leases,
            "requests": requests, "requests_per_creation": sum(requests.values()) / leases,
            "writes_per_creation": {k: v / leases for k, v in writes.items()},
            "visible": visible, "rss_mb_caught_up": rss,
            "rss_mb_peak": max(hwm, op.peak_rss_mb), "settle": settle}


def _restart(cluster: Any, op: Operator, leases: int, timeout: float) -> dict[str, Any]:
    op.stop()
    before = apiserver_requests(cluster)
    launch = op.launch()
    progress(f"scale: restarted operator healthy after {launch:.1f}s")
    settle = wait_idle(op, leases, timeout, "restart")
    after = apiserver_requests(cluster)
    cpu, (rss, hwm) = op.cpu(), op.rss_mb()
    requests = operator_requests(before, after)
    writes = _jl_writes(after) - _jl_writes(before)
    seconds = time.monotonic() - op.started
    progress(f"scale: restart over {leases}: idle {seconds:.1f}s after the start "
             f"({settle['idle']}), CPU {cpu:.1f}s, peak RSS {max(hwm, op.peak_rss_mb):.0f} MB, "
             f"{sum(requests.values()):.0f} API requests, {writes:.0f} JobLease writes")
    return {"launch_seconds": launch, "idle_seconds": seconds, "settle": settle,
            "cpu_s": cpu, "rss_mb": rss, "rss_mb_peak": max(hwm, op.peak_rss_mb),
            "requests": requests, "jobleases_writes": writes}


def _forced_relist(cluster: Any, op: Operator, namespace: str, leases: int, timeout: float,
                   probe: str) -> dict[str, Any]:
    """Restart kube-apiserver over a compacted etcd; wait for the operator's relist and idle.

    Which requests are the operator's cannot be told from kube-apiserver's metrics here
    (kube-controller-manager's garbage collector lists every resource again too), so while
    kube-apiserver is down the JobLease ``probe`` is also turned Held straight in etcd
    (:func:`_hold_in_etcd`): no watch event ever tells of it, and the operator's count of
    Held JobLeases (its ``joblease_leases`` gauge) becomes 1 only once it has listed again.
    (A deletion would not do: kopf does not notice objects gone from a relist.)
    """
    peak_reset = op.new_peak()
    cpu0, t0 = op.cpu(), time.monotonic()
    compacted: list[int] = []
    probed: list[bool] = []

    def while_down() -> None:
        probed.append(_hold_in_etcd(cluster, namespace, probe))
        compacted.append(cluster.etcd_compact())

    down = cluster.restart("kube-apiserver", while_down=while_down)
    progress(f"scale: kube-apiserver back after {down:.1f}s (etcd compacted to revision "
             f"{compacted[0] if compacted else '?'}, {probe} made Held behind its back: "
             f"{probed}); waiting for the operator to list again")
    relisted: float | None = None
    deadline = time.monotonic() + RELIST_TIMEOUT + timeout
    last_report = time.monotonic()
    while time.monotonic() < deadline:
        op.alive()
        op.rss_mb()
        held = op.phase_count("Held")
        if held is not None and held >= 1:
            relisted = time.monotonic() - t0
            break
        if time.monotonic() - last_report >= 10:
            last_report = time.monotonic()
            progress(f"scale: relist: {time.monotonic() - t0:.0f}s, operator knows {held} Held")
        time.sleep(1.0)
    settle = wait_idle(op, leases, timeout, "relist")
    seconds, cpu = time.monotonic() - t0, op.cpu() - cpu0
    since = apiserver_requests(cluster)  # kube-apiserver's counters restarted with it
    # pods are left out: kube-controller-manager and kube-scheduler list them again too
    requests = {k: v for k, v in operator_requests({}, since).items() if " pods" not in k}
    rss, hwm = op.rss_mb()
    peak = max(hwm, op.peak_rss_mb) if peak_reset else op.peak_rss_mb
    progress(f"scale: relist: the operator knew of the Held probe {relisted}s after the "
             f"restart began; idle after {seconds:.1f}s, CPU {cpu:.1f}s, peak RSS {peak:.0f} MB")
    return {"apiserver_down_seconds": down, "compacted_revision": compacted[0] if compacted
            else None, "probe_written": bool(probed and probed[0]),
            "relisted_seconds": relisted, "idle_seconds": seconds, "settle": settle,
            "cpu_s": cpu, "rss_mb": rss, "rss_mb_peak": peak, "peak_reset": peak_reset,
            "requests_all_clients": requests,
            "jobleases_lists_all_clients": requests.get("LIST jobleases", 0.0)}


def _hold_in_etcd(cluster: Any, namespace: str, name: str) -> bool:
    """Turn one JobLease Held (by ``relist-probe``, for a day) by writing etcd directly."""
    key = f"/registry/{GROUP}/{PLURAL}/{namespace}/{name}"
    raw = cluster.etcd_get(key)
    if raw is None:
        return False
    obj = json.loads(raw)
    old = LeaseStatus.from_dict(obj.get("status") or {})
    now = datetime.now(UTC)
    status = replace(old, phase=Phase.HELD, holder="relist-probe",
                     generation=old.generation + 1,
                     epoch=old.epoch if old.epoch is not None else 1, acquire_time=now,
                     renew_time=now, lease_until=now + timedelta(days=1))
    obj["status"] = {**(obj.get("status") or {}), **status.to_dict()}
    cluster.etcd_put(key, json.dumps(obj).encode())
    return True


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
            duration: int, rate: float | None, aligned: bool = False) -> dict[str, Any]:
    """Claim and abandon ``names``: at ``rate`` claims/s, as fast as 8 threads go, or
    (``aligned``) all with one common ``leaseUntil``, so that they are due at once."""
    client = LeaseClient(namespace, kubeconfig=kubeconfig)
    client.calibrate()  # once, before anything is timed
    basis = _read_all(client.api, namespace, names) if aligned else {}
    before_api, before_op = apiserver_requests(cluster), op.writes("expired")
    t0 = time.monotonic()
    due: str | None = None
    if aligned:
        due = _claim_aligned(client, basis)
    elif rate is None:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: client.claim(n, "abandoner"), names))
    else:
        for i, name in enumerate(names):
            time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            client.claim(name, "abandoner")
    achieved = len(names) / max(1e-9, time.monotonic() - t0)
    claimed_api = apiserver_requests(cluster)
    progress(f"scale: claimed {len(names)} leases at {achieved:.0f}/s and abandoned them"
             + (f", all due at {due}" if due else f" (duration {duration}s)"))
    deadline = time.monotonic() + duration + 120 + (len(names) / 10 if aligned else 0)
    expired = 0.0
    while time.monotonic() < deadline:
        expired = op.writes("expired") - before_op
        op.rss_mb()
        if expired >= len(names):
            break
        time.sleep(0.5)
    time.sleep(1.0)
    after_api = apiserver_requests(cluster)
    items = list(_read_all(client.api, namespace, names, raw=True).values())
    lags: list[float] = []
    ended: list[float] = []  # the expiries' server times, s since the epoch
    together = 0
    for item in items:
        status = item.get("status") or {}
        held = next((c for c in status.get("conditions", []) if c.get("type") == "Held"), None)
        if status.get("phase") == "Expired" and held and status.get("leaseUntil"):
            at = parse_time(held["lastTransitionTime"])
            lag = at - parse_time(status["leaseUntil"])
            lags.append(lag.total_seconds())
            ended.append(at.timestamp())
            together += status["leaseUntil"] == due
    client.api.close()
    # Expiries start while claims are still being sent (paced run), so count the whole
    # window and subtract our own writes: one PATCH per claim (its GET is not a write).
    ours = len(names)
    op_jl = _jl_writes(after_api) - _jl_writes(before_api) - ours
    # the operator posts an Event for every claim it sees and every expiry it writes
    op_events = _event_writes(after_api) - _event_writes(before_api)
    out = {"leases": len(names), "rate": achieved, "expired": len(lags),
           "lag_s": summary(lags), "lag_samples": lags, "claims_sent": ours,
           "claim_writes_apiserver": _jl_writes(claimed_api) - _jl_writes(before_api),
           "operator_writes_per_expiry": {"jobleases": op_jl / max(1, len(lags)),
                                          "events": op_events / max(1, len(lags) + ours)}}
    if aligned:
        out.update(_write_rate_bound(ended, len(names)), due=due, due_together=together)
    progress(f"scale: {len(lags)}/{len(names)} expired; lag p50 "
             f"{summary(lags)['p50']:.2f}s p99 {summary(lags)['p99']:.2f}s"
             + (f"; expiry writes {out['write_rate']:.0f}/s, bound {out['bound_s']:.2f}s, "
                f"{together} of them due together" if aligned else ""))
    return out


def _read_all(api: Transport, namespace: str, names: list[str], raw: bool = False
              ) -> dict[str, Any]:
    """GET each of ``names`` (8 threads; a list of all N would read 100,000)."""
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(
            lambda n: api.request("GET", lease_path(namespace, n)).body, names))
    return {b["metadata"]["name"]: (b if raw else Observed.from_object(b)) for b in bodies}


def _claim_aligned(client: LeaseClient, basis: dict[str, Observed]) -> str:
    """Claim every lease of ``basis`` with one common ``leaseUntil``; that time (RFC 3339).

    The claims are the SDK's decisions (``decide_claim``) with ``leaseUntil`` moved to a time
    chosen for ``ALIGNED_CLAIM_RATE`` claims/s plus 3 s, so every claim is written before
    it (renewTime ≤ leaseUntil is a CRD rule); a claim written later than that (a slower
    machine) gets ``now + 1 s`` and is not counted as due together.
    """
    store = LeaseStore(client.api)
    due = (client.api.server_now().midpoint
           + timedelta(seconds=3 + len(basis) / ALIGNED_CLAIM_RATE))

    def claim(obs: Observed) -> None:
        for _ in range(5):
            now = client.api.server_now()
            decided = decide_claim(obs, "abandoner", now, timedelta(0))
            assert decided is not None, obs.name  # a fresh claim, never an adoption
            until = max(due, now.midpoint + timedelta(seconds=1))
            try:
                store.write_status(obs, replace(decided.status, lease_until=until))
                return
            except ApiError:  # moved meanwhile: read and decide again
                obs = Observed.from_object(client.api.request(
                    "GET", lease_path(obs.namespace, obs.name)).body)
        raise RuntimeError(f"could not claim {obs.name}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(claim, basis.values()))
    return format_time(due)  # as the status carries it: compared to count those due together


def _write_rate_bound(ended: list[float], leases: int) -> dict[str, float]:
    """The expiry write rate (10th to 90th percentile of the expiries' times) and the
    write-rate bound: the time writing all ``leases`` expiries takes at that rate."""
    ended = sorted(ended)
    if len(ended) < 10:
        return {"write_rate": float("nan"), "bound_s": float("nan")}
    low, high = ended[len(ended) // 10], ended[(len(ended) * 9) // 10]
    rate = (len(ended) * 0.8) / max(high - low, 1e-3)
    return {"write_rate": rate, "bound_s": leases / rate}


def _ttl(cluster: Any, op: Operator, kubeconfig: str, namespace: str, count: int
         ) -> dict[str, Any]:
    """Finish ``count`` JobLeases with a 1 s TTL; time their deletion by the operator."""
    api = KubeApi.from_kubeconfig(kubeconfig)
    store = LeaseStore(api)
    names = [f"ttl-{i:05d}" for i in range(count)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: store.create(namespace, n, {"leaseDurationSeconds": 30,
                                                            "ttlSecondsAfterFinished": 1}),
                      names))
    _wait_statused(api, namespace, names, 300)  # no claim races an initialization
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


def _wait_statused(api: KubeApi, namespace: str, names: list[str], timeout: float) -> None:
    """Wait until every one of ``names`` shows ``status.phase`` (whoever put it there)."""
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending and time.monotonic() < deadline:
        items = _read_all(api, namespace, pending, raw=True)
        pending = [n for n, b in items.items() if not (b.get("status") or {}).get("phase")]
        if pending:
            time.sleep(0.2)


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
