"""Pure figures of the pool bench (``bench.pool``): no I/O, no imports of joblease.

Kept apart so that the unit tests can check them without a cluster (and without putting the
repository's root on ``sys.path``: they load this file by its path).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any


def places_late(ideal: Sequence[str], starts: Sequence[tuple[float, str]]) -> list[int]:
    """How many places late each job started, in the order the jobs started.

    Args:
        ideal: Every job's name in the pool's order (priority, creation, revision).
        starts: ``(start time, name)`` of the jobs that started. Jobs that started at the
            same instant count in their ideal order: a tie on the timestamp's resolution
            is no evidence of disorder.

    Returns:
        For the k-th job to start: k minus its place in ``ideal`` (negative: early).
    """
    place = {name: i for i, name in enumerate(ideal)}
    ordered = sorted(starts, key=lambda s: (s[0], place[s[1]]))
    return [k - place[name] for k, (_, name) in enumerate(ordered)]


@dataclass(frozen=True)
class Span:
    """One job of the urgent section as the server recorded it (seconds, one clock).

    Attributes:
        acquired: Its claim's ``acquireTime``.
        completed: Its completion's time; ``None`` if it had not completed.
        priority: Its ``spec.priority``.
        name: Its name (to tell which claims were decided before an urgent job was seen).
        holder: Who claimed it.
    """

    acquired: float
    completed: float | None
    priority: int
    name: str = ""
    holder: str | None = None


def urgent_wait(created: float, acquired: float, urgent_priority: int,
                others: Sequence[Span], slots: int, decided_unseen: Collection[str] = ()
                ) -> dict[str, float | int | bool]:
    """An urgent job's wait from the instant a worker freed to its claim (issue 30).

    Why from a freeing and not from its creation: an urgent job created while every slot is
    busy must wait for one to free whoever decides; what the pool adds is the time from that
    instant to the claim. The freeing is the first completion at or after ``created``. A
    completion between the create request's sending and the job becoming visible may have
    been refilled with a queued job before the urgent one was seen: the figure then errs
    long, never short.

    A worker that was between two jobs at ``created`` counts as busy when its next job was
    decided before the decider had the urgent job in view (``decided_unseen``: the
    dispatcher's recorded proposals say so): its slot was given away before the urgent
    job could be seen, as a slot still running its job is, so the wait counts from the next
    freeing. Only a worker that held nothing at ``created`` is excused so (one slot each,
    as in the bench; a worker of more slots is never excused), and a lower job decided
    *with* the urgent job in view never is.

    Args:
        created: When the create request was sent (same clock as the server's, one machine).
        acquired: The urgent job's ``acquireTime``.
        urgent_priority: Its priority (to count lower jobs claimed before it).
        others: Every other job of the pool that was claimed.
        slots: The workers' slots in all (every worker busy: this many held at ``created``).
        decided_unseen: Names of jobs among ``others`` whose claim was decided before the
            urgent job was in the decider's view.

    Returns:
        ``wait_s``: the claim minus the freeing (minus ``created`` if a slot was already
        free then); ``busy``: slots held at ``created``; ``slot_free``: whether one was
        free; ``freed_after_s``: the freeing minus ``created``; ``lower_claimed_between``:
        claims of lower-priority jobs decided after the freeing and before the urgent claim;
        ``decided_unseen``: how many slots counted busy at ``created`` only because their
        next job was decided before the urgent job was seen.
    """
    def running(s: Span) -> bool:
        return s.completed is None or s.completed > created

    held = [s for s in others if s.acquired <= created and running(s)]
    holding = {s.holder for s in held}
    excused = len({s.holder for s in others
                   if s.name in decided_unseen and s.acquired > created and running(s)
                   and s.holder is not None and s.holder not in holding})
    busy = len(held) + excused
    freed = min((s.completed for s in others
                 if s.completed is not None and s.completed >= created), default=math.nan)
    slot_free = busy < slots
    start = created if slot_free or math.isnan(freed) else freed
    lower = sum(1 for s in others
                if s.priority < urgent_priority and start < s.acquired < acquired)
    return {"wait_s": acquired - start, "busy": busy, "slot_free": slot_free,
            "freed_after_s": freed - created, "lower_claimed_between": lower,
            "decided_unseen": excused}


CONTROL_PLANE = ("kube-apiserver", "etcd")


def cpu_budget(windows: Sequence[dict[str, Any]], jobs: int, clients_s: float,
               dispatcher_s: float = 0.0) -> dict[str, float]:
    """Where the host's CPU went per job in one phase, in ms (``bench.common.CpuWindow``s).

    ``clients_s`` and ``dispatcher_s`` are CPU seconds per job measured by the phase itself
    (the workers or floor processes; the dispatcher's threads). ``rest`` is the host's busy
    CPU not named: the bench's own process, other users of the machine. ``capacity`` is
    what the host's CPUs could give per job in the phase's time; ``busy_fraction`` the
    share of it used.
    """
    ms = 1000 / jobs
    busy = sum(float(w["host_busy_cpu_s"]) for w in windows)
    host = sum(float(w["host_cpu_s"]) for w in windows)
    by_process: dict[str, float] = {}
    for window in windows:
        for name, seconds in window["processes_cpu_s"].items():
            by_process[name] = by_process.get(name, 0.0) + float(seconds) * ms
    out = {name: by_process.get(name, 0.0) for name in CONTROL_PLANE}
    out["other control plane"] = sum(v for n, v in by_process.items() if n not in CONTROL_PLANE)
    out.update({"clients": clients_s * 1000, "dispatcher": dispatcher_s * 1000})
    out["rest"] = busy * ms - sum(out.values())
    out.update({"busy": busy * ms, "capacity": host * ms,
                "busy_fraction": busy / host if host else math.nan})
    return out
