"""A dispatched worker's inbox: the jobs a pool's dispatcher proposes to it (issue 30).

The dispatcher no longer claims *for* a worker (a claim, then the worker's adoption: three
status writes per job). It **proposes**: it writes the names of the next jobs for a worker,
with the version it judged each by, into that worker's *inbox*, a ``coordination.k8s.io``
Lease named ``joblease-inbox-<digest of pool and worker>`` (:func:`inbox_name`), labelled
with the pool and ``joblease.dev/role=inbox``, annotation
:data:`~joblease.domain.dispatch.PROPOSALS_ANNOTATION`. The worker watches only that one
object (a field selector on its name) and claims each proposed job **itself**, with the
usual compare-and-swap, from the state the proposal carries (:func:`proposed_observed`),
or after reading it within its pool's selector (:func:`read_proposed`) when that claim is
refused or the proposal cannot be claimed from. So a job costs two status writes (the
worker's claim and its
completion) plus an inbox write that is no status write, and a proposal that was never
claimed wrote nothing on the job: taking it back counts no attempt, with no adoption write
to prove it.

**Safety never depends on an inbox.** A proposal is a hint: the worker claims with the
protocol's own decision, and its write vouches for what it was told (JSON-patch ``test``
operations: the version, the uid, its pool's labels, the status the decision read), so the
API server applies it to no other job and no other state; refused, it reads the job
through its own pool's label selector (a job of another pool, or one that does not exist,
is not found). A stale or forged proposal costs a refused write and a read. Who may write
an inbox is the chart's presence policy: a Lease labelled ``joblease.dev/role`` is written
by the operator only, and names it as holder.

A worker that stops once the pool is empty (``--until-empty``, announced in its presence
record) cannot tell from its own narrow view: the dispatcher marks its inbox
(:data:`~joblease.domain.dispatch.POOL_EMPTY_ANNOTATION`) the moment it counts no
unfinished job, and unmarks it when one arrives. The mark is a hint as the record's count
is: a worker that stops on it stops taking work, nothing else.

An inbox carries no ``renewTime``: workers of an earlier version, which list every Lease of
the pool as presence records, cannot read it as a live worker. Workers of this version list
presence records with ``joblease.dev/role!=inbox``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Protocol

from joblease.core.feed import WATCH_SECONDS, retry_pause
from joblease.core.presence import (
    INBOX_ROLE,
    PATH,
    POOL_LABEL,
    ROLE_LABEL,
    pool_key,
    record_digest,
)
from joblease.core.steps import Call, Sleep, Steps, Watch
from joblease.domain.dispatch import (
    POOL_EMPTY_ANNOTATION,
    PROPOSALS_ANNOTATION,
    Proposal,
    decode_proposals,
    encode_proposals,
)
from joblease.domain.lease import Observed
from joblease.kube.api import MERGE_PATCH, ApiError, ForbiddenError, NotFoundError
from joblease.kube.leases import LeaseCall, Page, list_call

WORKER_ANNOTATION = "joblease.dev/worker"  # whom an inbox is for (its name is a digest)

log = logging.getLogger(__name__)


def inbox_name(pool: str, holder: str) -> str:
    """The inbox's object name for ``holder`` in pool digest ``pool``."""
    return f"joblease-inbox-{record_digest(pool, holder)}"


class InboxSink(Protocol):
    """Where a worker's inbox lands (its pool's engine)."""

    def inbox(self, proposals: tuple[Proposal, ...], pool_empty: bool = False) -> None:
        """The proposals the inbox holds now, in the order to claim (empty: none).

        ``pool_empty``: the dispatcher marked the inbox: it counts no unfinished job.
        """

    def inbox_refused(self) -> None:
        """The API server refused the worker its inbox (403): no proposal will be seen."""


class Inbox:
    """A worker's inbox, read and watched (see the module doc).

    Args:
        namespace: The pool's namespace.
        selector: The pool's label selector.
        holder: The worker's holder name.
        watch_seconds: How long each watch runs before the server ends it.

    Attributes:
        name: The inbox's object name.
        enabled: ``False`` once the API server refused to let the worker read it (no
            ``watch`` on Leases: the dispatcher then takes its proposals back, unclaimed).
        events: Inbox versions delivered (a worker's decoded events, counted by the bench).
    """

    def __init__(self, namespace: str, selector: str | None, holder: str, *,
                 watch_seconds: int = WATCH_SECONDS) -> None:
        self.namespace = namespace
        self.name = inbox_name(pool_key(selector), holder)
        self.watch_seconds = watch_seconds
        self.enabled = True
        self.events = 0
        self._path = PATH.format(namespace=namespace)
        self._version: str | None = None

    def steps(self, sink: InboxSink) -> Steps[None]:
        """Read the inbox, then watch it and resume, until stopped or refused.

        A 410 reads it again at once; other failures are retried after the feed's backoff;
        a 403 turns the inbox off with one warning, and the worker announces that it reads
        none (the dispatcher then claims for it, and it adopts).
        """
        failures = 0
        while True:
            try:
                if self._version is None:
                    yield from self._read_steps(sink)
                yield from self._watch_steps(sink)
                failures = 0
            except ForbiddenError as err:
                self.enabled = False
                sink.inbox(())
                sink.inbox_refused()
                log.warning("the inbox of %s is refused (%s): the dispatcher will claim for "
                            "this worker instead; grant watch on leases.coordination.k8s.io "
                            "to receive proposals", self.name, err)
                return
            except ApiError as err:
                if err.status == 410:
                    self._version = None
                    continue
                pause = retry_pause(failures)
                failures += 1
                log.debug("inbox %s: %s; again in %.1fs", self.name, err, pause)
                yield Sleep(pause)

    def _query(self) -> dict[str, str]:
        return {"fieldSelector": f"metadata.name={self.name}"}

    def _read_steps(self, sink: InboxSink) -> Steps[None]:
        body: dict[str, Any] = yield Call(LeaseCall("GET", self._path, _raw, query=self._query()))
        items = [item for item in body.get("items") or [] if isinstance(item, dict)]
        sink.inbox(read_inbox(items[0]) if items else (),
                   pool_empty=bool(items) and says_pool_empty(items[0]))
        self._version = str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _watch_steps(self, sink: InboxSink) -> Steps[None]:
        query = {**self._query(), "resourceVersion": self._version or "",
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(self.watch_seconds)}
        yield Watch(self._path, query, lambda kind, obj: self._deliver(kind, obj, sink),
                    self.watch_seconds)

    def _deliver(self, kind: str, obj: Any, sink: InboxSink) -> None:
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
        if kind in ("ADDED", "MODIFIED"):
            self.events += 1
            sink.inbox(read_inbox(obj), pool_empty=says_pool_empty(obj))
        elif kind == "DELETED":
            self.events += 1
            sink.inbox(())
        if isinstance(version, str) and version:
            self._version = version


def read_inbox(obj: Any) -> tuple[Proposal, ...]:
    """The proposals an inbox object holds (none, if it is unreadable)."""
    annotations = _annotations(obj)
    return () if annotations is None else decode_proposals(
        annotations.get(PROPOSALS_ANNOTATION))


def says_pool_empty(obj: Any) -> bool:
    """Whether an inbox object carries the dispatcher's mark that the pool is empty."""
    annotations = _annotations(obj)
    return annotations is not None and annotations.get(POOL_EMPTY_ANNOTATION) == "true"


def _annotations(obj: Any) -> dict[str, Any] | None:
    """An inbox object's annotations, if it is shaped as one (any object may arrive)."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return annotations if isinstance(annotations, dict) else None


def read_proposed(namespace: str, selector: str | None, name: str
                  ) -> Steps[Observed | None]:
    """The proposed job as it is now, if it is a job of this pool (``None``: not found).

    One list with the pool's label selector and the job's name as field selector: the API
    server answers only a job of this pool, so a proposal naming any other object reads
    nothing.
    """
    page: Page = yield Call(list_call(namespace, selector, 1, "", f"metadata.name={name}"))
    for item in page.items:
        try:
            obs = Observed.from_object(item)
        except Exception as err:  # any shape: not a job to claim, never a crash
            log.warning("proposed JobLease %s is unreadable (%s)", name, err)
            return None
        if obs.name == name:
            return obs
    return None


# What a worker's claim from a proposal has the API server check (``Observed.vouched``):
# every status field the claim decision reads, where the proposal carries it, and the spec
# fields that could turn a claim into a Failed verdict or change its lease
VOUCHED_STATUS = ("phase", "holder", "generation", "epoch", "leaseUntil", "attempts",
                  "claimId", "notBefore")
VOUCHED_SPEC = ("leaseDurationSeconds", "maxAttempts")


def proposed_observed(namespace: str, selector: str | None, proposal: Proposal
                      ) -> Observed | None:
    """The proposed job as its proposal tells it, to claim unread; ``None``: read it first.

    The version is vouched for (``Observed.vouched``): the claim's write applies only if the
    object is at that resourceVersion and uid, carries every label of the pool's selector,
    and holds the status (and lease spec) the decision read. So a proposal cannot make a
    worker claim a job outside its pool, or decide from a status the job does not have: it
    costs a refused write (then the job is read, as without a state). Only a selector of
    plain ``key=value`` terms can be checked this way; any other is read first.
    """
    labels = equality_labels(selector)
    state = proposal.state
    if state is None or labels is None:
        return None
    try:
        uid, spec, status = state["uid"], state["spec"], state["status"]
        if not (isinstance(uid, str) and uid and isinstance(spec, dict)
                and isinstance(status, dict)):
            return None
        obs = Observed.from_object({
            "metadata": {"name": proposal.name, "namespace": namespace, "uid": uid,
                         "resourceVersion": proposal.resource_version},
            "spec": spec, "status": status})
    except Exception as err:  # any shape: read the job instead, never a crash
        log.debug("proposal of %s carries an unreadable state (%s)", proposal.name, err)
        return None
    if not _schema_shaped(obs):
        return None  # the API server's schema guarantees this of what it stores, not of this
    tests = [("/metadata/resourceVersion", proposal.resource_version), ("/metadata/uid", uid)]
    tests += [(f"/metadata/labels/{_pointer(key)}", value) for key, value in labels.items()]
    tests += [(f"/status/{key}", status[key]) for key in VOUCHED_STATUS if key in status]
    tests += [(f"/spec/{key}", spec[key]) for key in VOUCHED_SPEC if key in spec]
    return replace(obs, vouched=tuple(tests))


def _schema_shaped(obs: Observed) -> bool:
    """Whether a told job keeps the CRD schema's bounds that the claim decision relies on.

    A real object was checked by the API server's schema; a told one was not, and a value
    out of those bounds (a negative generation, a condition that is no object, a backoff
    factor below 1) would make the decision raise an error that is no refusal.
    """
    status, spec, backoff = obs.status, obs.spec, obs.spec.backoff
    return (status.generation >= 0 and status.attempts >= 0 and (status.epoch or 0) >= 0
            and spec.lease_duration_seconds >= 1
            and (spec.max_attempts is None or spec.max_attempts >= 1)
            and (backoff is None or (backoff.factor >= 1 and backoff.initial_seconds >= 0
                                     and backoff.max_seconds >= 0))
            and all(_condition_shaped(c) for c in status.conditions))


def _condition_shaped(condition: Any) -> bool:
    """Whether a told condition has what a claim's decision reads of one (``set_condition``)."""
    return isinstance(condition, dict) and all(
        isinstance(condition.get(key), str) for key in ("type", "status", "lastTransitionTime"))


def equality_labels(selector: str | None) -> dict[str, str] | None:
    """The labels a selector of ``key=value`` terms requires; ``None`` for any other selector.

    ``None`` (not ``{}``) for a term of any other kind (``!=``, ``in``, ``notin``, a bare
    key, ``!key``): a claim must not apply to a job outside the pool, so a selector that
    JSON-patch ``test`` operations cannot express is not checked this way at all.
    """
    labels: dict[str, str] = {}
    for term in (selector or "").split(","):
        term = term.strip()
        if not term:
            continue
        if "!" in term or "(" in term or " " in term or "=" not in term:
            return None
        key, _, value = term.partition("==") if "==" in term else term.partition("=")
        key, value = key.strip(), value.strip()
        if not key or "=" in value:
            return None
        labels[key] = value
    return labels


def _pointer(key: str) -> str:
    """``key`` as one JSON-pointer token (RFC 6901: ``~`` and ``/`` escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def write_inbox_steps(namespace: str, pool: str, holder: str, identity: str,
                      proposals: Iterable[Proposal], pool_empty: bool = False) -> Steps[None]:
    """Write ``holder``'s inbox: a merge patch of its proposals, or its creation.

    ``pool_empty`` marks it (the pool has no unfinished job); ``False`` removes a mark.
    No precondition: only the pool's one dispatcher writes inboxes (a deposed one's late
    write is at worst a stale hint, which costs the worker a read).
    """
    path = PATH.format(namespace=namespace)
    name = inbox_name(pool, holder)
    annotations: dict[str, str | None] = {PROPOSALS_ANNOTATION: encode_proposals(proposals),
                                          POOL_EMPTY_ANNOTATION: "true" if pool_empty else None}
    try:
        yield Call(LeaseCall("PATCH", f"{path}/{name}", _raw,
                             body={"metadata": {"annotations": annotations}},
                             content_type=MERGE_PATCH))
    except NotFoundError:
        yield Call(LeaseCall("POST", path, _raw, body={
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name,
                         "labels": {POOL_LABEL: pool, ROLE_LABEL: INBOX_ROLE},
                         "annotations": {**{k: v for k, v in annotations.items()
                                             if v is not None}, WORKER_ANNOTATION: holder}},
            "spec": {"holderIdentity": identity}}))


def list_inboxes_steps(namespace: str, pool: str) -> Steps[set[str]]:
    """The workers the pool's inboxes are for, whoever wrote them (one list request).

    Why: a dispatcher that takes over from one that died inherits its inboxes. Those of
    workers gone since would stay for ever, and those of live workers would keep proposing
    what the dead dispatcher decided until written again; the new one rewrites or deletes
    each (``Dispatcher``). An inbox without the worker annotation is skipped (not ours).
    """
    body: dict[str, Any] = yield Call(LeaseCall(
        "GET", PATH.format(namespace=namespace), _raw,
        query={"labelSelector": f"{POOL_LABEL}={pool},{ROLE_LABEL}={INBOX_ROLE}"}))
    workers: set[str] = set()
    for item in body.get("items") or []:
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
            continue
        notes = meta.get("annotations")
        worker = notes.get(WORKER_ANNOTATION) if isinstance(notes, dict) else None
        if isinstance(worker, str) and worker and meta.get("name") == inbox_name(pool, worker):
            workers.add(worker)
    return workers


def delete_inbox_steps(namespace: str, pool: str, holder: str) -> Steps[None]:
    """Delete ``holder``'s inbox (its worker left); a missing one is fine."""
    path = PATH.format(namespace=namespace)
    try:
        yield Call(LeaseCall("DELETE", f"{path}/{inbox_name(pool, holder)}", _raw))
    except NotFoundError:
        return


def _raw(body: dict[str, Any]) -> dict[str, Any]:
    return body
