"""A work pool's view of its JobLeases: which one to claim next, and when to look again.

Pure: the caller (``joblease.sdk.pool``, ``joblease.aio``, the simulator) feeds it the list
and the watch events of one label selector and asks it to choose. Nothing here talks to
the API server, so the sync and the async client share every decision, and the simulator
runs the very same code.

Choosing
--------
1. A JobLease is a candidate when :func:`~joblease.domain.lease.claimable_at` says a claim
   may succeed by now (the earliest server time): not finished, not held or held past
   ``leaseUntil + margin``, and past its backoff (``notBefore``).
2. Candidates are ordered by ``spec.priority`` (higher first), then by creation (older
   first), then by name: FIFO within a priority.
3. Workers must not herd onto the first candidate: each worker takes the one of the first
   ``spread`` candidates *of the top priority* that ranks highest under rendezvous hashing
   of (worker, job). Different workers thus usually pick different jobs without talking to
   each other, a worker's choice is stable while the window does not change, and a lower
   priority is never chosen while a higher one has a candidate.
4. A name the caller just failed to claim (409, refused) is set aside until the watch
   reports a newer version of it than the one the claim was decided from, so a worker does
   not ask twice about what it already knows is taken (and does not skip a version it has
   not tried).

How often workers collide
-------------------------
Without talking to each other, ``N`` workers choosing among a window of ``W`` candidates
pick like ``N`` independent uniform draws (rendezvous hashing), so the birthday bound
applies: a worker's first pick collides with another's with probability
``1 - (1 - 1/W)**(N - 1)`` (about ``(N - 1) / W``; 8 workers over a full window of 32:
about 20 %). A collision costs the loser one 409 and an immediate second choice. A wider
``spread`` means fewer collisions and a looser FIFO; ``tests/unit/test_pool_view.py``
measures the rate against this bound.

Waiting
-------
:meth:`PoolView.next_wake` is the earliest server time at which a non-candidate may become
one (a holder's ``leaseUntil + margin``, a backoff's end); the caller sleeps until then or
until the watch reports a change, whichever comes first.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from joblease.domain.clock import ServerNow
from joblease.domain.lease import EARLIEST_TIME, Observed, claimable_at

DEFAULT_SPREAD = 32


def _rank(worker: str, name: str) -> bytes:
    """Rendezvous (highest random weight) score of ``name`` for ``worker``."""
    return hashlib.blake2b(f"{worker}\0{name}".encode(), digest_size=8).digest()


def _order_key(obs: Observed) -> tuple[int, datetime, str]:
    return (-obs.spec.priority, obs.created or EARLIEST_TIME, obs.name)


@dataclass
class PoolView:
    """The cached JobLeases of one pool (one namespace and label selector).

    Attributes:
        resource_version: The list's or the last watch event's ``resourceVersion``, from
            which a watch resumes (``None`` before the first list, or after a 410: re-list).
    """

    resource_version: str | None = None
    _items: dict[str, Observed] = field(default_factory=dict)
    _set_aside: dict[str, str] = field(default_factory=dict)

    def replace(self, items: Iterable[Observed], resource_version: str) -> None:
        """Start over from a list (the first one, or after the watch's history expired)."""
        self._items = {obs.name: obs for obs in items}
        self._set_aside = {name: rv for name, rv in self._set_aside.items()
                           if name in self._items
                           and self._items[name].resource_version == rv}
        self.resource_version = resource_version

    def apply(self, event_type: str, obs: Observed) -> None:
        """Fold one watch event (ADDED, MODIFIED, DELETED) into the view.

        Events of one watch stream arrive in resourceVersion order, but the view may already
        hold a later version the caller learned itself (:meth:`learn`), so an event older
        than the cached version is ignored. A DELETED that names another incarnation (uid)
        than the cached one is stale and ignored too. ``BOOKMARK`` events carry no object:
        pass their resourceVersion to :meth:`bookmark`.
        """
        current = self._items.get(obs.name)
        if event_type == "DELETED":
            if current is not None and current.uid == obs.uid:
                self._items.pop(obs.name, None)
                self._set_aside.pop(obs.name, None)
        elif current is None or _newer(obs, current):
            self._items[obs.name] = obs
            if self._set_aside.get(obs.name) != obs.resource_version:
                self._set_aside.pop(obs.name, None)
        self.bookmark(obs.resource_version)

    def bookmark(self, resource_version: str) -> None:
        """Remember where the watch stands (a BOOKMARK event, or any event's version)."""
        if resource_version:
            self.resource_version = resource_version

    def learn(self, obs: Observed) -> None:
        """Fold a version the caller read or wrote itself (a claim's answer, a fresh GET).

        Only a name the view holds is updated: if the watch already removed it (deleted,
        or no longer matching the selector, e.g. finished), that removal came after the
        caller's write, and re-adding the older version would keep a ghost in the view.
        """
        current = self._items.get(obs.name)
        if current is not None and _newer(obs, current):
            self._items[obs.name] = obs
            if self._set_aside.get(obs.name) != obs.resource_version:
                self._set_aside.pop(obs.name, None)

    def set_aside(self, name: str, tried: str | None = None) -> None:
        """Skip ``name`` until a version other than ``tried`` arrives (a claim of it failed).

        ``tried`` is the resourceVersion the failed claim was decided from (default: the
        cached one). If the view already holds another version, nothing is set aside: that
        version has not been tried yet (a 409 is often caused by the very event that the
        watch has delivered meanwhile, such as the operator's first status write).
        """
        current = self._items.get(name)
        if current is None:
            return
        version = current.resource_version if tried is None else tried
        if version == current.resource_version:
            self._set_aside[name] = version

    def is_set_aside(self, name: str) -> bool:
        """Whether ``name`` is skipped until a newer version of it arrives."""
        return name in self._set_aside

    def get(self, name: str) -> Observed | None:
        """The cached version of ``name``."""
        return self._items.get(name)

    def __len__(self) -> int:
        return len(self._items)

    def unfinished(self) -> int:
        """How many cached JobLeases are not Completed or Failed."""
        return sum(1 for obs in self._items.values() if not obs.status.phase.finished)

    def candidates(self, now: ServerNow, margin: timedelta) -> list[Observed]:
        """The JobLeases a claim may take now (step 1), best first (step 2)."""
        ready = [obs for name, obs in self._items.items()
                 if name not in self._set_aside and _ready(obs, now, margin)]
        return sorted(ready, key=_order_key)

    def choose(self, worker: str, now: ServerNow, margin: timedelta,
               spread: int = DEFAULT_SPREAD, exclude: Collection[str] = ()
               ) -> Observed | None:
        """The candidate ``worker`` should try (steps 1-4), or ``None`` if there is none.

        ``exclude``: names the caller's other threads are claiming right now. Threads of one
        worker share its name, hence its rendezvous ranking; without this they would all
        race for the same lease.
        """
        ready = [obs for name, obs in self._items.items()
                 if name not in self._set_aside and name not in exclude
                 and _ready(obs, now, margin)]
        if not ready:
            return None
        first = heapq.nsmallest(max(1, spread), ready, key=_order_key)  # O(n log spread)
        top = first[0].spec.priority
        window = [obs for obs in first if obs.spec.priority == top]
        return max(window, key=lambda obs: _rank(worker, obs.name))

    def next_wake(self, now: ServerNow, margin: timedelta) -> datetime | None:
        """The earliest server time a non-candidate may become claimable (``None``: never).

        Set-aside names are not counted: only the watch brings them back.
        """
        times = [at for name, obs in self._items.items() if name not in self._set_aside
                 and (at := claimable_at(obs, margin)) is not None and at > now.earliest]
        return min(times, default=None)


def _ready(obs: Observed, now: ServerNow, margin: timedelta) -> bool:
    at = claimable_at(obs, margin)
    return at is not None and now.earliest >= at


def _newer(obs: Observed, current: Observed) -> bool:
    """Whether ``obs`` is the same or a later version than ``current`` (any incarnation).

    resourceVersions are opaque strings by contract; the API server's are etcd revisions,
    global to the cluster, so a numeric comparison orders them even across a delete and
    re-create (a learned version of the old incarnation must not replace the new one). An
    unparsable one is taken as newer.
    """
    try:
        return int(obs.resource_version) >= int(current.resource_version)
    except ValueError:
        return True
