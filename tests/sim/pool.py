"""Work pools in the simulator: jobs, a lagging watch that feeds the real ``PoolView``, and
the oracles' own rules for priority (i) and backoff (j).

The pool workers themselves (``sim.PoolWorker``) run the real ``PoolView`` (choice,
set-aside, next wake) and claim through the real ``LeaseClient.claim`` (``transact`` and
``decide_claim``). What a worker knows of the pool comes only from its watch, which here
lags (a per-worker delay), stalls (a hung stream delivers nothing for a while) and drops
(the stream ends: it resumes from its resourceVersion, or — history expired, 410 — the
worker re-lists and starts its view over). Events of one stream always arrive in order
and none is skipped silently, as on a real watch.

The oracles' rules are written here again, from the CRD's description of ``spec.priority``
and ``spec.backoff``, not imported from ``joblease.domain``: a bug there must not hide
itself by changing the oracle too.
"""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from joblease.domain.clock import ServerNow
from joblease.domain.lease import Observed, Phase, parse_time
from joblease.domain.pool import PoolView

if TYPE_CHECKING:
    from .sim import Simulation

POOL_LABEL = ("joblease.dev/pool", "sim")
BACKOFFS: list[dict[str, Any] | None] = [
    None, {"initialSeconds": 1, "factor": 2, "maxSeconds": 4},
    {"initialSeconds": 2, "factor": 1.5, "maxSeconds": 8},
    {"initialSeconds": 0, "factor": 2, "maxSeconds": 1}]


def draw_jobs(rng: random.Random, count: int) -> list[tuple[str, dict[str, Any]]]:
    """``count`` pool jobs: random priorities, maxAttempts, backoff and durations."""
    jobs = []
    for index in range(count):
        spec: dict[str, Any] = {"leaseDurationSeconds": rng.choice([2, 3, 5]),
                                "priority": rng.choice([0, 0, 1, 2, 5])}
        attempts = rng.choice([None, 1, 2, 3, 5])
        if attempts is not None:
            spec["maxAttempts"] = attempts
        backoff = rng.choice(BACKOFFS)
        if backoff is not None:
            spec["backoff"] = dict(backoff)
        jobs.append((f"pool-{index}", spec))
    return jobs


def in_pool(obj: dict[str, Any]) -> bool:
    """Whether an object matches the pool's label selector."""
    key, value = POOL_LABEL
    return bool((obj["metadata"].get("labels") or {}).get(key) == value)


class PoolWatch:
    """One worker's list-and-watch of the pool, folded into a real ``PoolView``.

    ``lag``: seconds between a change on the server and its event reaching this worker.
    ``sync`` delivers what has arrived by now; with small probabilities the stream stalls
    for a while, or drops (resumed, or re-listed after a 410).
    """

    STALL, DROP = 0.01, 0.01

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        rng = sim.world.rng
        self.lag = rng.choice([0.0, 0.005, 0.05, 0.3, 1.0])
        self.stalled_until = 0.0
        self.view = PoolView()
        self.seen = 0
        self.relists = 0
        self.relist()

    def relist(self) -> None:
        """A fresh list (the first, or after the watch's history expired): start over."""
        server = self.sim.server
        items = [Observed.from_object(o) for o in server.list() if in_pool(o)]
        self.view.replace(items, str(server.revision))
        self.seen = len(server.events)
        self.relists += 1

    def sync(self) -> None:
        """Deliver every event that has reached this worker by now, in order."""
        sim, rng = self.sim, self.sim.world.rng
        now = sim.world.now
        if rng.random() < self.STALL:
            self.stalled_until = now + rng.uniform(0.2, 3.0)
        if rng.random() < self.DROP:
            if rng.random() < 0.5:
                self.relist()  # 410 Gone: the resourceVersion is too old to resume from
            return  # else resumed from its resourceVersion: nothing lost, nothing new yet
        if now < self.stalled_until:
            return
        stamps, events = sim.event_times, sim.server.events
        while self.seen < len(stamps) and stamps[self.seen] + self.lag <= now:
            event = events[self.seen]
            self.seen += 1
            if in_pool(event.obj):
                self.view.apply(event.type, sim.observed_event(self.seen - 1))

    def next_arrival(self) -> float | None:
        """The true time the next pending pool event reaches this worker (``None``: none)."""
        stamps, events = self.sim.event_times, self.sim.server.events
        for index in range(self.seen, len(stamps)):
            if in_pool(events[index].obj):
                return max(stamps[index] + self.lag, self.stalled_until)
        return None


# -- the oracles' own rules -----------------------------------------------------------------

def backoff_seconds(initial: float, factor: float, maximum: float, attempts: int) -> float:
    """``initialSeconds * factor^(attempts-1)``, at most ``maxSeconds`` (the CRD's words)."""
    if attempts <= 0 or initial <= 0:
        return 0.0
    if (attempts - 1) * math.log(factor) >= math.log(maximum / initial):
        return float(maximum)  # also where the power itself would overflow a float
    return float(min(initial * factor ** (attempts - 1), maximum))


def rest_end(status: dict[str, Any], spec: dict[str, Any]) -> datetime | None:
    """Until when a stored JobLease rests after an attempt that ended without completion.

    ``status.notBefore`` as stored; for a lease still Held whose holder's lease ran out
    (nobody marked it Expired yet), ``leaseUntil`` plus the backoff its expiry earns.
    """
    backoff = spec.get("backoff")
    if status.get("phase") == "Held" and status.get("holder") and status.get("leaseUntil"):
        if not backoff:
            return None
        seconds = backoff_seconds(backoff.get("initialSeconds", 10), backoff.get("factor", 2),
                                  backoff.get("maxSeconds", 300),
                                  int(status.get("attempts", 0)) + 1)
        return parse_time(status["leaseUntil"]) + timedelta(seconds=seconds)
    text = status.get("notBefore")
    return parse_time(text) if text else None


def claimable_in_view(obs: Observed, now: ServerNow, margin: timedelta) -> bool:
    """Whether a claim of the cached ``obs`` may succeed at the earliest server time ``now``.

    Not finished; not held, or held past ``leaseUntil + margin``; past its rest.
    """
    st = obs.status
    if st.phase in (Phase.COMPLETED, Phase.FAILED):
        return False
    if st.phase == Phase.HELD and st.holder and st.lease_until is not None \
            and now.earliest < st.lease_until + margin:
        return False
    backoff = obs.spec.backoff
    if st.phase == Phase.HELD and st.holder and st.lease_until is not None:
        if backoff is None:
            return True
        seconds = backoff_seconds(backoff.initial_seconds, backoff.factor,
                                  backoff.max_seconds, st.attempts + 1)
        return now.earliest >= st.lease_until + timedelta(seconds=seconds)
    return st.not_before is None or now.earliest >= st.not_before
