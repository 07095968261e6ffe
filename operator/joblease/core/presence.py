"""Which workers of a pool are alive: a ``coordination.k8s.io`` Lease per worker, listed.

A pool's choice (``joblease.domain.pool.PoolView.choose``) gives each job one owner among
the live workers, by rendezvous hashing of the job over their names, and passes the job
to the next in rank turn by turn (``docs/pools.md``). For that every worker must know the
others — idle ones included, which hold nothing the JobLease watch could show. Without a
coordinator, each worker keeps a *presence record*: a ``coordination.k8s.io/v1`` Lease
named after its pool and holder, labelled with the pool, whose ``renewTime`` it moves
every :data:`RENEW_SECONDS` and which lapses :data:`PRESENCE_SECONDS` after the last.

:meth:`Presence.steps`, every round (sans-IO steps; the pools drive them in a thread or
a task):

1. write this worker's record (merge patch of ``spec``; create it on 404): ``renewTime``
   is the API server's time as estimated (``ServerTime``), never the local wall clock;
2. list the pool's records (one label selector) and hand ``{holder: renewTime +
   leaseDurationSeconds}`` to the sink: the view notes each, and forgets the holders that
   left the list (deleted on a clean exit, or gone);
3. sleep :data:`RENEW_SECONDS` (with jitter, so that workers started together spread) —
   the first rounds after 0.5, 1 and 2 s (:data:`WARM_UP`): workers started together list
   before the others announced, and a worker that believes itself alone takes the first
   candidate, as its peers do. A worker that reads its inbox, has just listed a live
   dispatcher and has nothing left to announce (``--until-empty`` asked for after its
   first renewal is announced at the next) skips the warm-up: it takes no turn while the
   dispatcher lives, and each round costs kube-apiserver a write and a list (20 workers
   started together: 60 of each; ``python -m bench.writecost`` prices them).

The list asks for ``resourceVersion=0``: any version kube-apiserver's watch cache holds,
served without a quorum read of etcd (a third less CPU for kube-apiserver, none for etcd).
A record may then be a few milliseconds old; presence is judged in seconds (records lapse
after :data:`PRESENCE_SECONDS`), and no claim depends on it.

A refusal (403: no RBAC on coordination Leases; 404 on the list: no such API) turns
presence off for this pool with one warning: the view then knows only the holders it
sees, which costs wasted writes when many idle workers meet new jobs, never safety.
Every claim stays one conditional write, decided by the protocol alone.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from joblease.core.steps import Call, Sleep, Steps
from joblease.domain.clock import ServerNow
from joblease.domain.lease import parse_time
from joblease.kube.api import MERGE_PATCH, ApiError, ForbiddenError, NotFoundError
from joblease.kube.leases import LeaseCall
from joblease.kube.transact import ServerTime

PRESENCE_SECONDS = 15  # a record lapses this long after its last renewal
RENEW_SECONDS = 5.0  # how often a worker renews its record and re-reads the others'
WARM_UP = (0.5, 1.0, 2.0)  # the first rounds come sooner: workers started together meet
POOL_LABEL = "joblease.dev/pool"
ROLE_LABEL = "joblease.dev/role"  # "dispatcher" on a pool's dispatcher record (issue 30)
DISPATCHER_ROLE = "dispatcher"
SLOTS_ANNOTATION = "joblease.dev/slots"  # a worker's slots (its --concurrency), announced
INBOX_ANNOTATION = "joblease.dev/inbox"  # "1": the worker reads proposals from its inbox
EMPTY_WAIT_ANNOTATION = "joblease.dev/until-empty"  # "1": the worker stops once the pool
# is empty (``--until-empty``): a dispatcher tells it so in its inbox the moment it is
INBOX_ROLE = "inbox"  # a worker's inbox (joblease.core.inbox): no presence record
UNFINISHED_ANNOTATION = "joblease.dev/unfinished"  # the pool's unfinished jobs, as the
# dispatcher last counted them (its record): a worker watching only its own jobs reads it
PATH = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

log = logging.getLogger(__name__)


class PresenceSink(Protocol):
    """Where presence lands (the pool, over its view and its lock)."""

    def workers(self, live: dict[str, datetime]) -> None:
        """The pool's workers as just listed: holder → server time its presence lapses."""

    def dispatcher(self, until: datetime | None, unfinished: int | None = None) -> None:
        """The pool's dispatcher record as just listed: when it lapses (``None``: none).

        ``unfinished``: the pool's unfinished jobs it publishes (``None``: none published).
        """


def pool_key(selector: str | None) -> str:
    """The label value that names a pool: a digest of its label selector (≤ 63 chars)."""
    return hashlib.sha256((selector or "").encode()).hexdigest()[:32]


def record_digest(pool: str, holder: str) -> str:
    """What names a worker's objects in a pool (holders are no valid object names)."""
    return hashlib.sha256(f"{pool}/{holder}".encode()).hexdigest()[:40]


def record_name(pool: str, holder: str) -> str:
    """The record's object name."""
    return f"joblease-worker-{record_digest(pool, holder)}"


def records_selector(pool: str) -> str:
    """The label selector of a pool's presence and dispatcher records (not its inboxes)."""
    return f"{POOL_LABEL}={pool},{ROLE_LABEL}!={INBOX_ROLE}"


def micro_time(when: datetime) -> str:
    """A ``MicroTime`` (RFC 3339 with microseconds, UTC), as coordination Leases store it."""
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class PresenceCounts:
    """What presence has done (tests, bug reports)."""

    renewals: int = 0
    lists: int = 0
    failures: int = 0


class Presence:
    """This worker's presence record in one pool, and the pool's other workers.

    Args:
        namespace: The pool's namespace (the records live there).
        selector: The pool's label selector (its records share one label).
        holder: This worker's holder name (every thread of a worker shares it).
        seconds: How long a record lives without renewal.
        every: Seconds between renewals.
        slots: The worker's slots, announced to a dispatcher (``None``: not announced, so
            no dispatcher assigns it work: a worker that would not adopt it).

    Attributes:
        enabled: ``False`` once the API server refused presence (see the module doc).
        counts: What happened so far.
    """

    def __init__(self, namespace: str, selector: str | None, holder: str, *,
                 seconds: int = PRESENCE_SECONDS, every: float = RENEW_SECONDS,
                 slots: int | None = None) -> None:
        self.namespace = namespace
        self.slots = slots
        self.pool = pool_key(selector)
        self.holder = holder
        self.seconds = seconds
        self.every = every
        self.enabled = True
        self.reads_inbox = slots is not None  # announced with the slots: proposals welcome
        self.waits_for_empty = False  # announced once a claim asks to stop when empty
        self._announce_again = False
        self.counts = PresenceCounts()
        self.name = record_name(self.pool, holder)
        self._path = PATH.format(namespace=namespace)

    def steps(self, sink: PresenceSink) -> Steps[None]:
        """Renew, list, sleep — until stopped or refused (steps 1-3 of the module doc)."""
        rounds = 0
        while self.enabled:
            try:
                now = yield from self._renew_steps()  # 1
                items = yield from self._list_steps()  # 2
                sink.workers(live_records(items))
                until = dispatcher_until(items)
                sink.dispatcher(until, dispatcher_unfinished(items))
                if (self.reads_inbox and not self._announce_again and until is not None
                        and until > now.latest):
                    rounds = max(rounds, len(WARM_UP))  # 3: no warm-up (see the module doc)
            except (ForbiddenError, NotFoundError) as err:
                self._refused(err)
                return
            except ApiError as err:
                self.counts.failures += 1
                log.debug("presence of %r in pool %s: %s; again soon", self.holder,
                          self.pool, err)
            pause = WARM_UP[rounds] if rounds < len(WARM_UP) else self.every
            rounds += 1
            yield Sleep(pause * random.uniform(0.8, 1.2))  # 3

    def stop_reading_inbox(self) -> None:
        """The worker cannot read its inbox (refused): announce so at the next renewal.

        A dispatcher then claims for it and it adopts, as a worker of an earlier version,
        instead of proposing jobs it would never see.
        """
        if self.reads_inbox:
            self.reads_inbox, self._announce_again = False, True

    def wait_for_empty(self) -> None:
        """A claim asks to stop once the pool is empty: announce so at the next renewal.

        A narrow worker sees only its own jobs; its dispatcher, which sees them all, then
        marks its inbox the moment the pool empties (its record says so only at its next
        renewal, and this worker reads that only at its next list: seconds later).
        """
        if not self.waits_for_empty:
            self.waits_for_empty, self._announce_again = True, True

    def leave_steps(self) -> Steps[None]:
        """Delete this worker's record (a clean exit: the others re-rank at their next list)."""
        if not self.enabled:
            return
        try:
            yield Call(LeaseCall("DELETE", f"{self._path}/{self.name}", _raw), 2.0)
        except ApiError as err:
            log.debug("presence of %r: leaving: %s", self.holder, err)

    def _renew_steps(self) -> Steps[ServerNow]:
        now: ServerNow = yield ServerTime()
        spec = {"holderIdentity": self.holder, "leaseDurationSeconds": self.seconds,
                "renewTime": micro_time(now.midpoint)}
        annotations: dict[str, str | None] = {}
        if self.slots is not None:
            annotations = {SLOTS_ANNOTATION: str(self.slots),
                           INBOX_ANNOTATION: "1" if self.reads_inbox else None,
                           EMPTY_WAIT_ANNOTATION: "1" if self.waits_for_empty else None}
        patch: dict[str, Any] = {"spec": spec}
        if annotations and (self.counts.renewals == 0 or self._announce_again):
            patch["metadata"] = {"annotations": annotations}  # announced once, then renewed
            self._announce_again = False
        try:
            yield Call(LeaseCall("PATCH", f"{self._path}/{self.name}", _raw,
                                 body=patch, content_type=MERGE_PATCH))
        except NotFoundError:
            announced = {k: v for k, v in annotations.items() if v is not None}
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "labels": {POOL_LABEL: self.pool},
                                 **({"annotations": announced} if announced else {})},
                    "spec": {**spec, "acquireTime": spec["renewTime"]}}
            yield Call(LeaseCall("POST", self._path, _raw, body=body))
        self.counts.renewals += 1
        return now

    def _list_steps(self) -> Steps[list[dict[str, Any]]]:
        body: dict[str, Any] = yield Call(LeaseCall(
            "GET", self._path, _raw, query={"labelSelector": records_selector(self.pool),
                                            "resourceVersion": "0"}))
        self.counts.lists += 1
        return list(body.get("items") or [])

    def _refused(self, err: ApiError) -> None:
        self.enabled = False
        log.warning("pool presence is off for %r (%s): workers learn of each other only "
                    "from the leases they hold; grant get/list/create/patch/delete on "
                    "leases.coordination.k8s.io to fix (docs/pools.md)", self.holder, err)


def live_records(items: list[dict[str, Any]]) -> dict[str, datetime]:
    """``{holder: the server time its record lapses}`` of listed worker records.

    Unreadable records are skipped, and so is a dispatcher's record (:func:`role`): a
    dispatcher is no worker.
    """
    live: dict[str, datetime] = {}
    for item in items:
        if role(item) is not None:
            continue
        read = record_until(item)
        if read is not None and read[1] > live.get(read[0], read[1] - timedelta(seconds=1)):
            live[read[0]] = read[1]
    return live


def announced_slots(items: list[dict[str, Any]]) -> dict[str, int]:
    """``{holder: slots}`` of the listed worker records that announce their slots."""
    slots: dict[str, int] = {}
    for holder, notes in _worker_annotations(items):
        value = notes.get(SLOTS_ANNOTATION)
        try:
            if value is not None:
                slots[holder] = max(0, int(value))
        except (TypeError, ValueError):
            continue
    return slots


def inbox_readers(items: list[dict[str, Any]]) -> set[str]:
    """The listed workers that read proposals from their inbox (the others adopt claims)."""
    return {holder for holder, notes in _worker_annotations(items)
            if notes.get(INBOX_ANNOTATION) == "1"}


def empty_waiters(items: list[dict[str, Any]]) -> set[str]:
    """The listed workers that stop once the pool is empty (``--until-empty``)."""
    return {holder for holder, notes in _worker_annotations(items)
            if notes.get(EMPTY_WAIT_ANNOTATION) == "1"}


def _worker_annotations(items: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(holder, annotations)`` of each readable worker record listed (no role label)."""
    for item in items:
        if role(item) is not None or not isinstance(item, dict):
            continue
        read = record_until(item)
        annotations = (item.get("metadata") or {}).get("annotations") or {}
        if read is not None and isinstance(annotations, dict):
            yield read[0], annotations


def dispatcher_until(items: list[dict[str, Any]]) -> datetime | None:
    """When the latest listed dispatcher record lapses (``None``: there is none)."""
    times = [read[1] for item in items if role(item) == DISPATCHER_ROLE
             and (read := record_until(item)) is not None]
    return max(times, default=None)


def dispatcher_unfinished(items: list[dict[str, Any]]) -> int | None:
    """The pool's unfinished jobs the latest listed dispatcher record publishes, if any."""
    latest: tuple[datetime, Any] | None = None
    for item in items:
        read = record_until(item) if role(item) == DISPATCHER_ROLE else None
        if read is not None and (latest is None or read[1] > latest[0]):
            latest = (read[1], item)
    if latest is None:
        return None
    value = ((latest[1].get("metadata") or {}).get("annotations") or {}).get(
        UNFINISHED_ANNOTATION)
    try:
        return None if value is None else max(0, int(value))
    except (TypeError, ValueError):
        return None


def role(item: Any) -> str | None:
    """A listed record's role label (``dispatcher``), ``None`` for a worker's record."""
    if not isinstance(item, dict):
        return None
    labels = (item.get("metadata") or {}).get("labels") or {}
    value = labels.get(ROLE_LABEL) if isinstance(labels, dict) else None
    return str(value) if value is not None else None


def record_until(item: Any) -> tuple[str, datetime] | None:
    """A record's ``(holderIdentity, renewTime + leaseDurationSeconds)``; ``None``: unreadable."""
    spec = item.get("spec") if isinstance(item, dict) else None
    try:
        holder = str(spec["holderIdentity"])  # type: ignore[index]
        until = parse_time(str(spec["renewTime"])) + timedelta(  # type: ignore[index]
            seconds=int(spec["leaseDurationSeconds"]))  # type: ignore[index]
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return holder, until


def _raw(body: dict[str, Any]) -> dict[str, Any]:
    return body
