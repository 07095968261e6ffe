"""The closing table (markdown) and the PNG plot of a results dict."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def _ms(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x * 1000:.1f}"


def _s(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.2f}"


def _s3(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"


def _ok(flag: bool | None) -> str:
    return "n/a" if flag is None else ("yes" if flag else "**no**")


def table(r: dict[str, Any]) -> str:
    rows: list[tuple[str, str, str, str, str, str]] = []
    lat = r.get("latency")
    if lat:
        f = lat["floor"]
        for key, label, target in (("claim", "claim (GET + CAS PATCH)", 1.25),
                                   ("claim_cached", "claim from a cached read (1 PATCH)", None),
                                   ("renew", "renew (1 CAS PATCH)", 1.1)):
            ratio = lat["ratios"][key]
            rows.append((f"{label}, p50 / p99 ms", f"{_ms(lat[key]['p50'])} / "
                         f"{_ms(lat[key]['p99'])}", f"floor {_ms(f['p50'])} / {_ms(f['p99'])}",
                         f"{ratio['p50']:.2f}× / {ratio['p99']:.2f}×",
                         f"≤ {target}×" if target else "info",
                         _ok(ratio["p50"] <= target) if target else "n/a"))
        b, rb = lat["floor_same_body"], lat["ratios"]["floor_same_body"]
        rows.append(("floor carrying the renewal's exact status body, p50 / p99 ms",
                     f"{_ms(b['p50'])} / {_ms(b['p99'])}", f"floor {_ms(f['p50'])} / "
                     f"{_ms(f['p99'])}", f"{rb['p50']:.2f}× / {rb['p99']:.2f}×", "info", "n/a"))
        g = lat["floor_get"]
        rows.append(("bare GET of the same object, p50 / p99 ms",
                     f"{_ms(g['p50'])} / {_ms(g['p99'])}", "", "", "info", "n/a"))
        cpu = lat["cpu_ms_mean"]
        rows.append(("client CPU per operation (this process), mean ms",
                     f"claim {cpu['claim']:.2f}, cached claim {cpu['claim_cached']:.2f}, "
                     f"renew {cpu['renew']:.2f}", f"floor {cpu['floor']:.2f}, GET "
                     f"{cpu['floor_get']:.2f}", "", "info", "n/a"))
    con = r.get("contention")
    if con:
        rows.append((f"contention: {con['workers']} workers, one lease: winner known, "
                     f"p50 / max ms", f"{_ms(con['winner_s']['p50'])} / "
                     f"{_ms(con['winner_s']['max'])}", "", "", "info", "n/a"))
        rows.append(("contention: all workers know the outcome, p50 / max ms",
                     f"{_ms(con['all_known_s']['p50'])} / {_ms(con['all_known_s']['max'])}",
                     "", "", "info", "n/a"))
        rows.append(("contention: writes wasted (409) per round, mean / max",
                     f"{con['wasted_writes']['mean']:.1f} / {con['wasted_writes']['max']:.0f}",
                     "", "", "info", "n/a"))
    thr = r.get("throughput")
    if thr:
        rows.append((f"throughput: {thr['jobs']} jobs, {thr['workers']} workers, claim → "
                     "complete", f"{thr['jobs_per_s']:.1f} jobs/s",
                     f"floor {thr['floor_writes_per_s']:.1f} writes/s "
                     f"(= {thr['floor_writes_per_s'] / 2:.1f} jobs/s at 2 writes/job)",
                     f"{thr['ratio']:.2f}", "≥ 0.7", _ok(thr["ratio"] >= 0.7)))
        rows.append(("throughput, claims decided from a prior read (`claim(observed=…)`)",
                     f"{thr['cached_jobs_per_s']:.1f} jobs/s", "same floor",
                     f"{thr['cached_ratio']:.2f}", "info", "n/a"))
    hand = r.get("handover")
    if hand:
        for duration, d in hand["durations"].items():
            ours, peer = d["ours"], d["peer"]
            met = (ours["p99"] <= 1.5 and ours["p99"] < peer["p99"]
                   if not math.isnan(ours["p99"]) else None)
            rows.append((f"handover after SIGKILL, {duration} s lease: s after leaseUntil, "
                         f"p50 / p99 (n={ours['n']})", f"{_s(ours['p50'])} / {_s(ours['p99'])}"
                         + (f" (margin in force p50 {_s(d['margin']['p50'])})"
                            if d.get("margin") else ""),
                         f"peer (k8s LeaseLock, retry {d['peer_settings']['retry_period']} s) "
                         f"{_s(peer['p50'])} / {_s(peer['p99'])} (n={peer['n']})",
                         f"{ours['p99'] - peer['p99']:+.2f} s at p99",
                         "p99 ≤ 1.5 s and < peer", _ok(met)))
    if r.get("scale"):
        rows += _scale_rows(r["scale"])
    cli = r.get("cli")
    if cli:
        verbs = cli["verbs"]
        floor = verbs["kubectl get jl NAME"]["wall_s"]
        for name, v in verbs.items():
            if name.startswith("kubectl"):
                continue
            wall, cpu = v["wall_s"], v["cpu_s"]
            target = v.get("target_s")
            rows.append((f"CLI `joblease {name}` process, wall p50 / p90 s (CPU p50), "
                         f"n={wall['n']}", f"{_s3(wall['p50'])} / {_s3(wall['p90'])} "
                         f"({_s3(cpu['p50'])})",
                         f"`kubectl get jl NAME` {_s3(floor['p50'])} / {_s3(floor['p90'])}; "
                         f"`kubectl get jl` {_s3(verbs['kubectl get jl']['wall_s']['p50'])}",
                         f"{wall['p50'] / floor['p50']:.1f}×",
                         f"≤ {target} s" if target else "info",
                         _ok(v.get("met")) if target else "n/a"))
    if r.get("pool"):
        rows += _pool_rows(r["pool"])
    head = ("| measurement | joblease | baseline (same run) | ratio | target | met |\n"
            "|---|---|---|---|---|---|")
    body = "\n".join("| " + " | ".join(row) + " |" for row in rows)
    machine = r["machine"]
    note = (f"Mode: {r['mode']}. Absolute times are this machine's: {machine['cpus']} CPUs, "
            f"{machine['platform']}, Python {machine['python']}, shared with other work. "
            f"Load average (1/5/15 min) at start {r['load_start']}, at end {r['load_end']}. "
            f"Run started {r['started']}, took {r['total_seconds'] / 60:.1f} min. "
            "Command: `make bench` (or `python -m bench`).")
    if r.get("failed"):
        note += f" **Sections that failed (see the log): {', '.join(r['failed'])}.**"
    return f"{head}\n{body}\n\n{note}"


TARGET_LEASES = 100_000  # issue 28's targets are stated at this size
RSS_TARGET_MB = 200.0


def _requests(reqs: dict[str, float], per: float = 1.0) -> str:
    if not reqs:
        return "none"
    return ", ".join(f"{k} {v / per:.3g}" for k, v in sorted(reqs.items(), key=lambda kv: -kv[1]))


def _peak_row(label: str, peak: float, n: int) -> tuple[str, str, str, str, str, str]:
    at_target = n >= TARGET_LEASES
    return (f"{label}: operator peak RSS", f"{peak:.0f} MB ({peak * 1024 / n:.1f} KB per lease)",
            "", "", f"≤ {RSS_TARGET_MB:.0f} MB at {TARGET_LEASES:,}",
            _ok(peak <= RSS_TARGET_MB) if at_target else "n/a")


def _idle_pass_row(idle: dict[str, Any], n: int) -> tuple[str, str, str, str, str, str]:
    """One idle reconcile pass's CPU, from the operator's own histogram.

    Operators before issue 28 export no ``joblease_reconcile_pass_cpu_seconds``: for them
    the row says so (and the whole-process row below is the only figure).
    """
    label = f"idle operator over {n} JobLeases: CPU of one reconcile pass (mean)"
    target = f"≤ 1 ms at {TARGET_LEASES:,}"
    passes, ms = idle.get("passes", 0), idle.get("pass_cpu_ms", float("nan"))
    if not passes:
        return (label, "not exported by this operator", "", "", target, "n/a")
    return (label, f"{ms:.3f} ms", f"{passes:.0f} passes in {idle['seconds']:.0f} s", "",
            target, _ok(ms <= 1.0) if n >= TARGET_LEASES else "n/a")


def _scale_rows(sc: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    """Rows of section "scale": the phases of bench/scale.py, every figure with its unit."""
    n = sc["leases"]
    st, idle, rs, rl = sc["start"], sc["idle"], sc["restart"], sc["relist"]
    vis = st["visible"]
    rows = [
        _peak_row(f"start during the creation of {n} JobLeases", st["rss_mb_peak"], n),
        (f"start during creation: {n} created by 8 threads → caught up (all show a status, "
         "the operator knows all)",
         f"{st['caught_up_seconds']:.1f} s after the first creation "
         f"({st['caught_up_rate']:.0f}/s; {st['caught_up_after_created_seconds']:.1f} s "
         "after the last)" + ("" if st["caught_up"] else " **timed out**"),
         f"creation {st['create_seconds']:.1f} s ({st['create_rate']:.0f}/s)",
         f"{st['caught_up_rate'] / st['create_rate']:.2f}", "info", "n/a"),
        (f"creation → status visible (first read showing `status.phase`), p50 / p99 "
         f"({vis['lag_s']['n']} of {vis['samples']} samples)",
         f"{_s(vis['lag_s']['p50'])} / {_s(vis['lag_s']['p99'])} s",
         f"{vis['at_creation']} visible in the POST's answer; {vis['unseen']} never seen",
         "", "info", "n/a"),
        ("operator CPU per creation (process CPU over the phase ÷ N, idle included)",
         f"{st['cpu_ms_per_creation']:.3f} ms", f"{st['cpu_s']:.1f} CPU-s in all", "",
         "≤ 0.2 ms", _ok(st["cpu_ms_per_creation"] <= 0.2)),
        ("operator API requests per creation (kube-apiserver's count minus the bench's)",
         f"{st['requests_per_creation']:.3f} requests", _requests(st["requests"], n), "", "0",
         _ok(st["requests_per_creation"] < 0.5 / n)),
        ("operator writes per creation: JobLease writes, Event posts",
         f"{st['writes_per_creation']['jobleases']:.3f}, "
         f"{st['writes_per_creation']['events']:.3f}", "", "", "info", "n/a"),
        _idle_pass_row(idle, n),
        (f"idle operator over {n} JobLeases: whole-process CPU per second of idle "
         f"({idle['seconds']:.0f} s window)", f"{idle['cpu_ms_per_s']:.2f} ms/s",
         "feed, kopf's pod watch, heartbeat and passes together", "", "info", "n/a"),
        _peak_row(f"restart over {n} initialized JobLeases", rs["rss_mb_peak"], n),
        ("restart: healthy / idle after; CPU",
         f"{rs['launch_seconds']:.1f} s / {rs['idle_seconds']:.1f} s"
         + ("" if rs["settle"]["idle"] else " **not idle**") + f"; {rs['cpu_s']:.1f} CPU-s",
         f"RSS when idle {rs['rss_mb']:.0f} MB",
         "", "info", "n/a"),
        ("restart: API requests (by verb and resource), JobLease writes",
         f"{sum(rs['requests'].values()):.0f} requests, {rs['jobleases_writes']:.0f} writes",
         _requests(rs["requests"]), "", "0 writes", _ok(rs["jobleases_writes"] == 0)),
        _peak_row("forced relist (410)", rl["rss_mb_peak"], n),
        ("forced relist: kube-apiserver down; the operator has listed again (knows of a "
         "JobLease turned Held in etcd meanwhile) / idle (s since the restart began); CPU",
         f"{rl['apiserver_down_seconds']:.1f} s; {_s(rl['relisted_seconds'] or math.nan)} s"
         f" / {rl['idle_seconds']:.1f} s" + ("" if rl["settle"]["idle"] else " **not idle**")
         + f"; {rl['cpu_s']:.1f} CPU-s",
         f"requests since, all clients: {_requests(rl['requests_all_clients'])}"
         + ("" if rl["peak_reset"] else "; peak = RSS samples (VmHWM not resettable)"),
         "", "info", "n/a"),
    ]
    for key, when in (("cluster_after_init", "after creation"), ("cluster_end", "at the end")):
        c = sc.get(key)
        if c:
            rows.append((f"cluster {when}: etcd database, kube-apiserver RSS",
                         f"{c.get('etcd_db_mb', 0):.0f} MB ({c.get('etcd_db_in_use_mb', 0):.0f}"
                         f" in use), {c.get('apiserver_rss_mb', 0):.0f} MB", "", "", "info",
                         "n/a"))
    for key in ("expiry_paced", "expiry"):
        e = sc.get(key)
        if e:
            how = (f"paced, {e['rate']:.0f} claims/s" if key == "expiry_paced"
                   else f"burst, {e['rate']:.0f} claims/s")
            rows.append((f"expiry lag leaseUntil → Expired, p50 / p99 ({e['expired']}/"
                         f"{e['leases']} leases, {how})", f"{_s(e['lag_s']['p50'])} / "
                         f"{_s(e['lag_s']['p99'])} s",
                         f"{e['operator_writes_per_expiry']['jobleases']:.2f} writes + "
                         f"{e['operator_writes_per_expiry']['events']:.2f} Events per "
                         "transition (claim or expiry)", "", "p99 ≤ 2 s",
                         _ok(e["lag_s"]["p99"] <= 2.0)))
    for e in sc.get("expiry_due_at_once", []):
        bound = e["bound_s"] + 0.5
        rows.append((f"expiry lag, {e['leases']} due at once ({e['due_together']} with one "
                     f"leaseUntil; {e['expired']} expired), p50 / p99",
                     f"{_s(e['lag_s']['p50'])} / {_s(e['lag_s']['p99'])} s",
                     f"expiry writes {_rate(e['write_rate'])}/s → write-rate bound "
                     f"{_s(e['bound_s'])} s", "", f"p99 ≤ bound + 0.5 s = {_s(bound)} s",
                     "n/a" if math.isnan(bound) else _ok(e["lag_s"]["p99"] <= bound)))
    ttl = sc.get("ttl")
    if ttl:
        rows.append((f"TTL garbage collection ({ttl['leases']} finished, TTL 1 s)",
                     f"{ttl['rate']:.0f} deletions/s ({ttl['deleted']:.0f} in "
                     f"{ttl['seconds_after_due']:.1f} s after due)",
                     f"{ttl['writes_per_deletion']:.2f} JobLease writes per deletion", "",
                     "info", "n/a"))
    pw = sc.get("pool_worker")
    if pw:
        rows.append((f"pool worker, {pw['selector_size']} in its selector "
                     f"({pw['cached']} unfinished): list, RSS",
                     f"{pw['list_seconds']:.1f} s, {pw['rss_mb_after']:.0f} MB "
                     f"({pw['kb_per_cached']:.2f} KB per cached job)",
                     f"full list of all {pw['selector_size']}: "
                     f"{pw['full_list_seconds']:.1f} s", "", "info", "n/a"))
        rows.append((f"pool choice over {pw['cached']} cached", f"{pw['choose_ms']:.3f} ms",
                     "", "", "< 1 ms", _ok(pw["choose_ms"] < 1.0)))
    rn = sc["renewals"]
    rows.append((f"operator writes per renewal ({rn['renewals']} renewals)",
                 f"{rn['writes_per_renewal']:.3f}",
                 f"counter {rn['operator_writes_counter']:.0f}, kube-apiserver "
                 f"{rn['operator_writes_apiserver']:.0f}", "", "0",
                 _ok(rn["writes_per_renewal"] == 0)))
    rows.append((f"operator peak RSS over the whole scale run (N = {n})",
                 f"{sc['rss_mb_peak']:.0f} MB", f"at the end {sc['rss_mb_end']:.0f} MB", "",
                 "info", "n/a"))
    return rows


def _rate(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.1f}"


def _pool_rows(pool: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    """Rows of section "pool": the drain against both floors, the trickle, the order, the
    workers' cost, and PostgreSQL."""
    d, lat, pg, t, met = (pool["drain"], pool["latency"], pool["postgres"], pool["targets"],
                          pool["met"])
    jobs, workers, floor = pool["jobs"], pool["workers"], pool["floor_writes_per_s"]
    real, rb, ra = (pool["floor_real_jobs_per_s"], pool["floor_real_before"],
                    pool["floor_real_after"])
    steady, per, spawn = d["steady"], d["per_worker"], pool["spawn_cost"]
    created, claimed = lat["created"], lat["claimed"]
    expiry = lat["after_expiry"]["s_after_lease_until"]
    one, many = pool["order"]["one"], pool["order"]["many"]
    product = pool.get("product", {})
    rows = [
        ("pool: product measured (the `joblease` the workers import)",
         f"commit {product.get('commit', '?')}", f"`{product.get('joblease', '?')}`", "",
         "info", "n/a"),
        (f"pool: floor with the pool's bodies: claim + completion as `decide_claim` / "
         f"`decide_complete` write them (two conditions each), {workers} processes, one "
         "watcher open",
         f"{real:.1f} jobs/s ({rb['jobs'] + ra['jobs']} jobs; before {rb['jobs_per_s']:.1f},"
         f" after {ra['jobs_per_s']:.1f})",
         f"bare floor {floor / 2:.1f} jobs/s ({floor:.1f} writes/s)"
         + (f"; the client's CPU per job {rb['cpu_s_per_job'] * 1000:.1f} ms"
            if not math.isnan(rb.get("cpu_s_per_job", math.nan)) else ""),
         f"{real / (floor / 2):.2f} of the bare floor", "info", "n/a"),
        (f"pool: drain {jobs} jobs with {workers} `joblease work` processes (command `true`)",
         f"{_rate(d['jobs_per_s'])} jobs/s (wall {d['wall_seconds']:.1f} s: "
         f"{d.get('before_first_claim_s', math.nan):.1f} s to the first claim, "
         f"{d.get('after_last_completion_s', math.nan):.1f} s from the last completion to the "
         "last exit)",
         f"floor with the pool's bodies {real:.1f} jobs/s; bare floor {floor:.1f} writes/s "
         f"(= {floor / 2:.1f} jobs/s; before {pool['floor_before']['writes_per_s']:.0f}, "
         f"after {pool['floor_after']['writes_per_s']:.0f})",
         f"{pool['ratio_real']:.2f} (bodies) / {pool['ratio']:.2f} (bare)",
         f"≥ {t['ratio']}", f"{_ok(met['ratio_real'])} / {_ok(met['ratio'])}"),
        ("pool: drain rate while all workers were busy",
         f"{_rate(steady['jobs_per_s'])} jobs/s ({steady['jobs']} jobs in "
         f"{steady['seconds']:.1f} s)", "same floors",
         f"{steady['jobs_per_s'] / real:.2f} / {steady['jobs_per_s'] / (floor / 2):.2f}",
         "info", "n/a"),
        ("pool: drain, wasted (409) writes per job", f"{d['wasted_per_job']:.3f}",
         f"{d['status_writes_per_job']:.2f} status writes per job (kube-apiserver's count)",
         "", f"≤ {t['wasted_per_job']}", _ok(met["wasted_per_job"])),
        ("pool: watch events sent per job (kube-apiserver's `apiserver_watch_events_total`)",
         f"drain {d['events_per_job']:.1f} ({workers} watchers); trickle "
         f"{lat['events_per_job']:.1f} ({lat.get('workers', workers)} watchers)",
         f"floor with the pool's bodies, one watcher: {rb['events_per_job']:.2f} / "
         f"{ra['events_per_job']:.2f}, of which to other watchers (kube-controller-manager) "
         f"{rb.get('others_per_job', math.nan):.2f}; decoding one event costs the watcher "
         f"{rb.get('watcher_cpu_s_per_event', math.nan) * 1000:.2f} ms of CPU", "", "info",
         "n/a"),
        ("pool: drain, jobs per worker, max / min", f"{per['max']} / {per['min']}",
         f"{per['workers_used']} of {workers} workers completed jobs", f"{per['spread']:.2f}",
         f"≤ {t['spread']}", _ok(met["spread"])),
        ("pool: drain, a worker's cycle (server clock), claim → completion / completion → "
         "next claim (a free worker waiting for its next job), p50 ms",
         f"{_ms(d['cycle']['held_s']['p50'])} / {_ms(d['cycle']['between_s']['p50'])}",
         f"p99 {_ms(d['cycle']['held_s']['p99'])} / {_ms(d['cycle']['between_s']['p99'])}",
         "", "info", "n/a"),
        ("pool: drain, workers' CPU per job (commands, their sentinels or supervisor, "
         "start-up included), ms",
         f"{d['worker_cpu_s_per_job'] * 1000:.1f}"
         + (f" ({d['worker_cpu_s_per_job_net'] * 1000:.1f} without the {workers} workers' "
            f"start-up, {spawn['worker']['cpu_s'] * 1000:.0f} ms each)"
            if "worker_cpu_s_per_job_net" in d else ""),
         f"PostgreSQL workers {pg.get('worker_cpu_s_per_job', math.nan) * 1000:.1f}; one "
         f"start of `true` {spawn['command']['cpu_s'] * 1000:.1f}, of `python -c pass` "
         f"{spawn['python']['cpu_s'] * 1000:.1f} (wall {spawn['python']['wall_s'] * 1000:.1f})",
         "", f"≤ {t['cpu_per_job_s'] * 1000:.0f}", _ok(met["cpu_per_job"])),
        (f"pool: trickle, {lat['jobs']} jobs at {lat['rate']:.0f}/s to "
         f"{lat.get('workers', workers)} idle workers: ready → claimed (`acquireTime`), "
         f"p50 / p99 s", f"{_s3(claimed['p50'])} / {_s3(claimed['p99'])}",
         f"→ command started {_s3(created['p50'])} / {_s3(created['p99'])}", "",
         f"p99 ≤ {t['latency_p99']} s", _ok(met["latency_p99"])),
        ("pool: trickle, wasted (409) writes per job", f"{lat['wasted_per_job']:.2f}"
         + (" (first half {:.2f}, second half {:.2f})".format(*lat["wasted_per_job_halves"])
            if "wasted_per_job_halves" in lat else ""),
         f"{lat['status_writes_per_job']:.2f} status writes per job", "",
         f"≤ {t['trickle_wasted_per_job']}", _ok(met["trickle_wasted_per_job"])),
        (f"pool: order, one worker, {one['jobs']} jobs of random priorities created in "
         f"{one['create_seconds']:.1f} s: jobs started out of (priority, creation) order",
         f"{one['displaced']} of {one['jobs']}",
         f"at most {one['max_late']} places late, {one['max_early']} early", "",
         "0", _ok(met["displaced_one"])),
        (f"pool: order, {many['workers']} workers, {many['jobs']} jobs: places late, "
         "max / p99", f"{many['max_late']} / {many['late']['p99']:.0f}",
         f"mean {many['late']['mean']:.1f}; {many['displaced']} displaced", "", "info", "n/a"),
        (f"pool: holder gone, lease expired → a worker's command starts, s after leaseUntil, "
         f"p50 / max (n={expiry['n']})", f"{_s(expiry['p50'])} / {_s(expiry['max'])}",
         "the margin (0.25 s + clock error) is part of it", "", "info", "n/a")]
    rows += _dispatched_rows(pool)
    label = (f"PostgreSQL `FOR UPDATE SKIP LOCKED` queue: {jobs} jobs, {workers} processes, "
             "same command")
    if "jobs_per_s" not in pg:
        return [*rows, (label, f"not measured: {pg.get('error', '?')}", "", "", "info", "n/a")]
    return [*rows, (label, f"{pg['jobs_per_s']:.1f} jobs/s",
                    f"joblease pool {_rate(d['jobs_per_s'])} jobs/s",
                    f"{pool['versus_postgres']:.2f}× (joblease ÷ PostgreSQL)",
                    "info: the price of being Kubernetes-native", "n/a")]


Row = tuple[str, str, str, str, str, str]


def _dispatched_rows(pool: dict[str, Any]) -> list[Row]:
    """Rows of issue 30's dispatched order, urgent wait and trickle (``pool.dispatched``)."""
    d = pool.get("dispatched") or {}
    t, met = pool["targets"], pool["met"]
    rows: list[Row] = []
    drain, real = d.get("drain"), pool.get("floor_real_jobs_per_s")
    if drain is not None and real:
        rows.append(_dispatched_drain_row(drain, real, pool["workers"], t))
    budget = pool.get("cpu_budget") or {}
    if "dispatched" in budget:
        rows.append(_cpu_budget_row(budget, pool["workers"]))
    order, urgent, trickle = d.get("order"), d.get("urgent"), d.get("trickle")
    if order is not None:
        label = (f"pool, dispatched: order, {pool['workers']} workers, "
                 f"{pool.get('order', {}).get('many', {}).get('jobs', '?')} jobs of random "
                 "priorities created at once: places late, max / p99")
        rows.append(_not_measured(label, order) if "error" in order else _order_row(
            label, order, pool.get("order", {}).get("many"), t, met))
    if urgent is not None:
        label = ("pool, dispatched: an urgent job (a priority above all queued) created while "
                 "every worker runs `{}`: claimed after a worker frees, p50 / max s "
                 "(n={})".format(urgent.get("body", "?"), urgent.get("rounds", "?")))
        rows.append(_not_measured(label, urgent) if "error" in urgent else (
            label, f"{_s3(urgent['wait_s']['p50'])} / {_s3(urgent['wait_s']['max'])}",
            f"every slot busy at its creation in {urgent['all_busy_rounds']} of "
            f"{urgent['rounds']} rounds ({urgent.get('decided_unseen', '?')} slots counted "
            "busy as their next job was chosen before the urgent one was in view); lower "
            f"jobs claimed between the freeing and its claim: "
            f"{urgent['lower_claimed_between']}", "",
            f"≤ {t['urgent_wait_s']} s (every round)", _ok(met.get("urgent_wait"))))
    killed = d.get("killed_assignee")
    if killed is not None:
        label = ("pool, dispatched: a worker SIGKILLed, then a job proposed to it: claimed by "
                 "another worker, s after its creation")
        rows.append(_not_measured(label, killed) if "error" in killed else (
            label, f"{killed['rerun_s']:.1f}",
            f"generation {killed['generation']}, attempts {killed['attempts']}; taken back "
            f"{killed.get('taken_back', '?')} time(s)", "",
            f"≤ {t.get('killed_rerun_s', 16)} s, no attempt counted",
            _ok(met.get("killed_rerun"))))
    if trickle is not None:
        rows += _dispatched_trickle_rows(trickle, pool.get("latency", {}), t, met)
    return rows


def _cpu_budget_row(budget: dict[str, dict[str, float]], workers: int) -> Row:
    """Everyone's CPU per job in the dispatched drain beside the floor with bodies: what
    bounds the drain's ratio on a host whose CPUs the floor already fills."""
    def parts(b: dict[str, float]) -> str:
        return (f"{b['kube-apiserver']:.1f} / {b['etcd']:.1f} / "
                f"{b['other control plane']:.1f} / {b['clients']:.1f} / "
                f"{b['dispatcher']:.1f} / {b['rest']:.1f} = {b['busy']:.1f} of "
                f"{b['capacity']:.1f} ({100 * b['busy_fraction']:.0f} % busy)")

    return ("pool, dispatched: the host's CPU per job, ms: kube-apiserver / etcd / the rest "
            "of the control plane / workers (start-ups, commands, supervisors) / dispatcher / "
            "the rest of the host = busy, of what the CPUs could give",
            parts(budget["dispatched"]),
            f"floor with the pool's bodies (clients: its {workers} processes): "
            f"{parts(budget['floor'])}", "", "info", "n/a")


def _order_row(label: str, order: dict[str, Any], turns: dict[str, Any] | None,
               t: dict[str, Any], met: dict[str, Any]) -> Row:
    claims = order.get("dispatch", {})
    return (label, f"{order['max_late']} / {order['late']['p99']:.0f}",
            f"mean {order['late']['mean']:.1f}; {order['displaced']} displaced"
            + (f"; by turns {turns['max_late']} / {turns['late']['p99']:.0f}"
               if turns else "")
            + (f"; claimed by the dispatcher {claims['claimed_by_dispatcher']}, by turns "
               f"{claims['claimed_by_workers']}" if claims else ""), "",
            f"max ≤ {t['dispatched_max_late']}", _ok(met.get("dispatched_max_late")))


def _dispatched_drain_row(drain: dict[str, Any], real: float, workers: int,
                         t: dict[str, Any]) -> Row:
    """The dispatched drain: its rate against the floor with bodies, and its wall time's parts.

    The last part is how long ``--until-empty`` workers took to exit after the last
    completion (safety.md #62: told by their inbox, not by the record seconds later).
    """
    ratio = drain["jobs_per_s"] / real
    dispatcher = (drain.get("dispatch") or {}).get("dispatcher_cpu_s_per_job", math.nan)
    return (f"pool, dispatched: drain {drain['jobs']} jobs with {workers} `joblease work "
            "--until-empty` processes (command `true`)",
            f"{_rate(drain['jobs_per_s'])} jobs/s (wall {drain['wall_seconds']:.1f} s: "
            f"{drain.get('before_first_claim_s', math.nan):.1f} s to the first claim, "
            f"{drain.get('after_last_completion_s', math.nan):.1f} s from the last completion "
            "to the last exit)",
            f"floor with the pool's bodies {real:.1f} jobs/s; workers' CPU "
            f"{drain['worker_cpu_s_per_job'] * 1000:.1f} ms per job"
            + (f" ({drain['worker_cpu_s_per_job_net'] * 1000:.1f} without the {workers} "
               "workers' start-up)" if "worker_cpu_s_per_job_net" in drain else "")
            + f", the dispatcher's {dispatcher * 1000:.2f} ms", f"{ratio:.2f}",
            f"≥ {t['ratio']}",
            _ok(ratio >= t["ratio"]))


def _dispatched_trickle_rows(trickle: dict[str, Any], turns: dict[str, Any],
                             t: dict[str, Any], met: dict[str, Any]) -> list[Row]:
    label = ("pool, dispatched: trickle, {} jobs at {}/s to {} idle workers: ready → claimed "
             "(`acquireTime`), p50 / p99 s".format(trickle.get("jobs", "?"),
                                                   f"{trickle.get('rate', math.nan):.0f}",
                                                   trickle.get("workers", "?")))
    if "error" in trickle:
        return [_not_measured(label, trickle)]
    claimed, created = trickle["claimed"], trickle["created"]
    by_turns = turns.get("claimed", {}).get("p99", math.nan)
    return [
        (label, f"{_s3(claimed['p50'])} / {_s3(claimed['p99'])}",
         f"→ command started {_s3(created['p50'])} / {_s3(created['p99'])}; by turns p99 "
         f"{_s3(by_turns)}", "", f"p99 ≤ {t['dispatched_latency_p99']} s",
         _ok(met.get("dispatched_latency_p99"))),
        ("pool, dispatched: trickle, watch events sent per job (all watchers): JobLeases + "
         "coordination Leases (inboxes, presence, the dispatcher's record)",
         f"{trickle['events_per_job']:.1f} + {trickle.get('lease_events_per_job', 0.0):.1f}",
         f"by turns {turns.get('events_per_job', math.nan):.1f} (JobLeases); "
         f"{trickle['status_writes_per_job']:.2f} status writes and "
         f"{trickle['wasted_per_job']:.2f} refused per job", "",
         f"≤ {t['dispatched_trickle_events_per_job']}", _ok(met.get("dispatched_trickle_events")))]


def _not_measured(label: str, section: dict[str, Any]) -> Row:
    return (label, f"not measured: {section['error']}", "", "", "see the log", "n/a")


def plot(r: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    lat = r.get("latency")
    if lat:
        ax = axes[0]
        for key in ("floor", "floor_same_body", "claim", "claim_cached", "renew", "floor_get"):
            data = sorted(x * 1000 for x in lat["samples"].get(key, []))
            if data:
                ax.plot(data, [(i + 1) / len(data) for i in range(len(data))], label=key)
        ax.set_xscale("log")
        from matplotlib.ticker import ScalarFormatter

        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("latency, ms (this machine)")
        ax.set_ylabel("CDF")
        ax.set_title("claim / renew vs the floor (interleaved)")
        ax.legend()
    hand = r.get("handover")
    if hand:
        ax = axes[1]
        for who, marker in (("ours", "o"), ("peer", "s")):
            for duration, d in hand["durations"].items():
                ys = d["samples"][who]
                ax.scatter([float(duration) + (0.3 if who == "peer" else -0.3)] * len(ys), ys,
                           marker=marker, alpha=0.5,
                           color="C0" if who == "ours" else "C1",
                           label=("joblease" if who == "ours" else "k8s LeaseLock")
                           if duration == next(iter(hand["durations"])) else None)
        ax.axhline(1.5, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("lease duration, s")
        ax.set_ylabel("handover: s after leaseUntil")
        ax.set_title("handover after SIGKILL")
        ax.legend()
    sc = r.get("scale")
    if sc and sc["expiry"]["lag_samples"]:
        ax = axes[2]
        for key, label in (("expiry_paced", "paced claims"), ("expiry", "burst of claims")):
            if sc.get(key):
                ax.hist(sc[key]["lag_samples"], bins=30, alpha=0.6, label=label)
        ax.legend()
        ax.axvline(2.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("expiry lag, s")
        ax.set_title(f"expiry lag with {sc['leases']} JobLeases")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
