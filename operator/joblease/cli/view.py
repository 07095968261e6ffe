"""What ``joblease ls`` / ``describe`` / ``completion`` show, computed without any I/O.

The CLI reads the objects, the Events and the server-clock estimate; this module only turns
them into a JSON-able report and into text. Keeping it pure lets unit tests pin every rule
("past its end" means *certainly* past on the server clock, oldest held first, newest
Failed first) without an API server, and keeps it cheap to import.

Times are judged on the API server's clock, as everywhere in joblease: ``now`` is the
interval the server's time is known to lie in. A lease is shown past its end only when
``leaseUntil`` is before the interval's *earliest* point, so a slow local clock or an
uncalibrated estimate can make the list late, never wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from joblease.domain.clock import ServerNow
from joblease.domain.lease import Observed, Phase
from joblease.domain.time import format_time

PHASES = tuple(p.value for p in Phase)
NO_STATUS = "New"  # created, not yet initialized by the operator (no status at all)


def _time(value: datetime | None) -> str | None:
    return format_time(value) if value is not None else None


def _age(since: datetime | None, now: ServerNow) -> float | None:
    return None if since is None else (now.midpoint - since).total_seconds()


def human_seconds(seconds: float | None) -> str:
    """``kubectl``-style short durations (``45s``, ``3m12s``, ``2h5m``); ``-`` if unknown."""
    if seconds is None:
        return "-"
    sign, s = ("-" if seconds < 0 else ""), abs(seconds)
    if s < 10:
        return f"{sign}{s:.1f}s"
    whole = int(s)
    if whole < 60:
        return f"{sign}{whole}s"
    if whole < 3600:
        return f"{sign}{whole // 60}m{whole % 60}s"
    if whole < 86400:
        return f"{sign}{whole // 3600}h{whole % 3600 // 60}m"
    return f"{sign}{whole // 86400}d{whole % 86400 // 3600}h"


def lease_row(obs: Observed, now: ServerNow) -> dict[str, Any]:
    """One JobLease as a row of the overview (JSON-able)."""
    st = obs.status
    left = (None if st.lease_until is None
            else (st.lease_until - now.midpoint).total_seconds())
    return {"name": obs.name, "namespace": obs.namespace,
            "phase": st.phase.value if obs.has_status else NO_STATUS,
            "holder": st.holder, "token": str(st.token()) if st.epoch is not None else None,
            "generation": st.generation, "attempts": st.attempts,
            "acquireTime": _time(st.acquire_time), "leaseUntil": _time(st.lease_until),
            "finishTime": _time(st.finish_time), "secondsLeft": left,
            "heldSeconds": _age(st.acquire_time, now) if st.phase is Phase.HELD else None}


def past_end(obs: Observed, now: ServerNow) -> bool:
    """Held, and ``leaseUntil`` is certainly past on the server's clock.

    Such a lease is expired in fact but not yet marked so: the operator marks ``Expired``
    within about a second, so one that stays here means the operator is down or lagging.
    """
    st = obs.status
    return (st.phase is Phase.HELD and st.lease_until is not None
            and st.lease_until < now.earliest)


def overview(objects: Iterable[dict[str, Any]], now: ServerNow, *, top: int = 5,
             selector: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    """Counts by phase and the lists worth a human's look, for ``joblease ls``.

    Args:
        objects: Raw JobLease objects (as listed).
        now: The server's current time as an interval.
        top: How many leases each list shows (the counts are always complete).
        selector: The label selector used, echoed back.
        namespace: The namespace listed (``None``: all), echoed back.
    """
    observed = [Observed.from_object(o) for o in objects]
    counts = {p: 0 for p in (*PHASES, NO_STATUS)}
    for obs in observed:
        counts[obs.status.phase.value if obs.has_status else NO_STATUS] += 1
    held = [o for o in observed if o.status.phase is Phase.HELD and o.has_status]
    far = datetime.max.replace(tzinfo=now.earliest.tzinfo)
    oldest = sorted(held, key=lambda o: (o.status.acquire_time or far, o.name))
    late = sorted((o for o in held if past_end(o, now)),
                  key=lambda o: (o.status.lease_until or far, o.name))
    failed = sorted((o for o in observed if o.status.phase is Phase.FAILED),
                    key=lambda o: (o.status.finish_time or far, o.name), reverse=True)
    return {"namespace": namespace, "selector": selector, "total": len(observed),
            "byPhase": counts, "serverTime": format_time(now.midpoint),
            "clockErrorSeconds": now.error.total_seconds(),
            "oldestHeld": [lease_row(o, now) for o in oldest[:top]],
            "pastEnd": [lease_row(o, now) for o in late[:top]], "pastEndCount": len(late),
            "recentFailed": [lease_row(o, now) for o in failed[:top]]}


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


def render_overview(data: dict[str, Any]) -> str:
    """The text form of :func:`overview`."""
    where = data["namespace"] or "all namespaces"
    if data["selector"]:
        where += f", selector {data['selector']}"
    phases = "  ".join(f"{p} {n}" for p, n in data["byPhase"].items()
                       if n or p != NO_STATUS)
    lines = [f"{data['total']} JobLeases in {where} (server time {data['serverTime']}, "
             f"±{data['clockErrorSeconds']:.2f}s)", f"  {phases}"]
    if data["byPhase"][NO_STATUS]:
        lines.append(f"  {data['byPhase'][NO_STATUS]} without status: the operator has not "
                     "initialized them (is it running?)")
    sections = (
        ("oldest held", data["oldestHeld"], ("HOLDER", "TOKEN", "HELD FOR", "LEFT"),
         lambda r: (r["holder"] or "-", r["token"] or "-", human_seconds(r["heldSeconds"]),
                    human_seconds(r["secondsLeft"]))),
        (f"past their end, not yet marked Expired ({data['pastEndCount']})", data["pastEnd"],
         ("HOLDER", "TOKEN", "LEASE UNTIL", "OVER BY"),
         lambda r: (r["holder"] or "-", r["token"] or "-", r["leaseUntil"] or "-",
                    human_seconds(-r["secondsLeft"] if r["secondsLeft"] is not None
                                  else None))),
        ("recent Failed", data["recentFailed"], ("ATTEMPTS", "LAST HOLDER", "FINISHED"),
         lambda r: (str(r["attempts"]), r["holder"] or "-", r["finishTime"] or "-")),
    )
    for title, rows, header, cells in sections:
        lines.append("")
        if not rows:
            lines.append(f"{title}: none")
            continue
        lines.append(f"{title}:")
        name_col = ("NAMESPACE/NAME",) if data["namespace"] is None else ("NAME",)
        table = [(*name_col, *header)]
        for r in rows:
            name = r["name"] if data["namespace"] is not None else f"{r['namespace']}/{r['name']}"
            table.append((name, *cells(r)))
        lines.extend("  " + line for line in _table(table))
    return "\n".join(lines)


def describe(raw: dict[str, Any], events: Sequence[dict[str, Any]], now: ServerNow, *,
             last_events: int = 10) -> dict[str, Any]:
    """Everything a human asks about one JobLease, for ``joblease describe``.

    ``secondsLeft`` is ``leaseUntil`` minus the server's time (midpoint estimate, error in
    ``clockErrorSeconds``); negative once past. ``certainlyPastEnd`` uses the interval's
    earliest point, so it is never true early.
    """
    obs = Observed.from_object(raw)
    st, spec = obs.status, obs.spec
    meta = raw.get("metadata", {})
    left = (None if st.lease_until is None
            else (st.lease_until - now.midpoint).total_seconds())
    shown = list(events)[-last_events:] if last_events > 0 else []
    return {
        "name": obs.name, "namespace": obs.namespace, "uid": obs.uid,
        "labels": meta.get("labels") or {},
        "created": meta.get("creationTimestamp"),
        "phase": st.phase.value if obs.has_status else NO_STATUS,
        "holder": st.holder, "epoch": st.epoch, "generation": st.generation,
        "token": str(st.token()) if st.epoch is not None else None,
        "claimId": st.claim_id, "attempts": st.attempts, "maxAttempts": spec.max_attempts,
        "priority": spec.priority, "notBefore": _time(st.not_before),
        "reason": st.reason, "message": st.message,
        "leaseDurationSeconds": spec.lease_duration_seconds,
        "acquireTime": _time(st.acquire_time), "renewTime": _time(st.renew_time),
        "leaseUntil": _time(st.lease_until), "finishTime": _time(st.finish_time),
        "completion": st.completion.to_dict() if st.completion else None,
        "serverTime": format_time(now.midpoint),
        "clockErrorSeconds": now.error.total_seconds(), "secondsLeft": left,
        "certainlyPastEnd": past_end(obs, now),
        "conditions": list(st.conditions),
        "events": [_event_row(e) for e in shown], "eventsTotal": len(events),
    }


def _event_row(event: dict[str, Any]) -> dict[str, Any]:
    source = event.get("source") or {}
    series = event.get("series") or {}
    return {"type": event.get("type"), "reason": event.get("reason"),
            "count": series.get("count") or event.get("count") or 1,
            "last": (series.get("lastObservedTime") or event.get("lastTimestamp")
                     or event.get("eventTime")),
            "from": event.get("reportingComponent") or source.get("component"),
            "message": event.get("message") or event.get("note")}


def render_describe(data: dict[str, Any]) -> str:
    """The text form of :func:`describe` (``kubectl describe`` layout)."""
    def field(label: str, value: Any) -> str:
        return f"{label + ':':<16}{'-' if value in (None, '') else value}"

    left = data["secondsLeft"]
    if data["phase"] != Phase.HELD.value or left is None:
        left_text = "-"
    elif data["certainlyPastEnd"]:
        left_text = (f"none: ended {human_seconds(-left)} ago on the server clock (not yet "
                     "marked Expired: is the operator running?)")
    else:
        left_text = f"{human_seconds(left)} (±{data['clockErrorSeconds']:.2f}s, server clock)"
    labels = ",".join(f"{k}={v}" for k, v in sorted(data["labels"].items()))
    attempts = str(data["attempts"]) + (f" of {data['maxAttempts']}" if data["maxAttempts"]
                                        else "")
    lines = [field("Name", data["name"]), field("Namespace", data["namespace"]),
             field("Labels", labels), field("UID", data["uid"]),
             field("Phase", data["phase"]), field("Holder", data["holder"]),
             field("Token", (f"{data['token']} (epoch {data['epoch']}, generation "
                             f"{data['generation']})") if data["token"] else None),
             field("Claim id", data["claimId"]), field("Attempts", attempts),
             field("Priority", data["priority"]), field("Not before", data["notBefore"]),
             field("Reason", " ".join(x for x in (data["reason"], data["message"]) if x)),
             field("Duration", f"{data['leaseDurationSeconds']}s"),
             field("Acquired", data["acquireTime"]), field("Renewed", data["renewTime"]),
             field("Lease until", data["leaseUntil"]), field("Time left", left_text),
             field("Finished", data["finishTime"])]
    if data["completion"]:
        c = data["completion"]
        lines.append(field("Completion", f"generation {c.get('generation')} by "
                           f"{c.get('holder')!r}: {c.get('result') or '(no result)'}"))
    for cond in data["conditions"]:
        lines.append(field("Condition", f"{cond.get('type')}={cond.get('status')} "
                           f"{cond.get('reason') or ''} {cond.get('message') or ''}".rstrip()))
    lines.append(field("Server time", f"{data['serverTime']} (±"
                       f"{data['clockErrorSeconds']:.2f}s)"))
    if not data["events"]:
        lines.append("Events:         <none>")
    else:
        more = data["eventsTotal"] - len(data["events"])
        lines.append("Events:" + (f" (last {len(data['events'])} of {data['eventsTotal']})"
                                  if more else ""))
        table = [("TYPE", "REASON", "LAST SEEN", "COUNT", "FROM", "MESSAGE")]
        table += [(e["type"] or "-", e["reason"] or "-", e["last"] or "-", str(e["count"]),
                   e["from"] or "-", e["message"] or "") for e in data["events"]]
        lines.extend("  " + line for line in _table(table))
    return "\n".join(lines)


# --- shell completion -------------------------------------------------------------------
