"""What a pool worker lists and watches: the whole pool, or, while a dispatcher lives, its own.

Issue 30: with turns every worker decodes every event of every job. While the pool's
dispatcher record is live, a worker that announced its slots chooses no job that opted in to
dispatch (``PoolEngine.dispatched``): it only adopts what is claimed for it. It then needs
two parts of the pool only, as a kubelet needs only the pods bound to it:

* the jobs it holds — ``status.holder=<itself>`` (its assignments, adopted or not, and what
  it claimed by turns) — only while it reads no inbox: a worker that claims from proposals
  learns nothing from the echo of its own writes (:attr:`Scope.own`);
* the jobs that did not opt in — ``spec.dispatch.enabled!=true`` — which it still takes by
  turns, so this part must be complete (an absent field matches ``!=true``: the cluster
  test ``test_dispatch_feed`` checks it on the real API server).

A :class:`Scope` names those field selectors, one list+watch stream each; a
:class:`StreamMerge` folds the streams into one view keyed by name. The rule deciding the
scope (``PoolEngine.wanted_scope``) and the folding are written once here and in the engine;
the thread and the asyncio pool only run one feed per field selector.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from joblease.core.steps import Call, Steps
from joblease.domain.lease import Observed, Phase
from joblease.domain.pool import is_newer
from joblease.kube.api import ApiError
from joblease.kube.leases import Page, list_call

log = logging.getLogger(__name__)

NOT_DISPATCHED = "spec.dispatch.enabled!=true"
# the pool's unfinished jobs: an absent phase (not yet initialised) matches, as for ``!=true``
UNFINISHED = f"status.phase!={Phase.COMPLETED.value},status.phase!={Phase.FAILED.value}"


def unfinished_probe(namespace: str, selector: str | None) -> Steps[bool | None]:
    """Whether the pool has an unfinished job, asked of the API server: one list, ``limit=1``.

    Why: a narrow worker sees only its own jobs, and the dispatcher's word that the pool is
    empty may be a dead dispatcher's last (``PoolEngine.decide``, ``ConfirmEmpty``). One
    page of at most one object, whatever the pool's size. ``None``: no answer (a failed
    or refused list), which the engine counts as unfinished: a worker stops on a
    confirmed 0 only.
    """
    try:
        page: Page = yield Call(list_call(namespace, selector, 1, "", UNFINISHED))
    except ApiError as err:
        log.info("JobLease pool %r: could not ask whether it is empty (%s)", selector, err)
        return None
    return bool(page.items)


def escape_field_value(value: str) -> str:
    """``value`` escaped for a field selector, as ``fields.EscapeValue`` does in Kubernetes."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


@dataclass(frozen=True)
class Scope:
    """The part of a pool a worker's feed lists and watches.

    Attributes:
        holder: ``None``: the whole pool (one stream). Else the worker whose own jobs and
            the jobs that did not opt in are watched (two streams): the narrow scope.
        pending: Nothing yet (no stream): a worker that may be dispatched waits for its
            presence's first list to say which scope it needs (:data:`PENDING`).
        own: Narrow only: whether the worker's own jobs are watched too. A worker that
            reads its inbox claims every dispatched job itself, from a proposal, and its
            holdings renew and complete them; the pool's count comes from the dispatcher's
            record. ``status.holder=<itself>`` would only echo its own writes back (2 of a
            drained job's 6 watch events), so it is not watched. A worker that adopts
            what a dispatcher claimed *for* it (it reads no inbox) must watch it.
    """

    holder: str | None = None
    pending: bool = False
    own: bool = True

    @property
    def narrow(self) -> bool:
        """Whether the scope is only the worker's own jobs and those not dispatched."""
        return self.holder is not None

    def fields(self) -> tuple[str | None, ...]:
        """One extra field selector per stream (``None``: the pool's whole selection)."""
        if self.pending:
            return ()
        if self.holder is None:
            return (None,)
        if not self.own:
            return (NOT_DISPATCHED,)
        return (f"status.holder={escape_field_value(self.holder)}", NOT_DISPATCHED)


FULL = Scope()
# Why a scope of no stream: a worker that announced its slots would otherwise list and
# watch the whole pool from the instant it starts until its presence lists the dispatcher's
# record, then switch: 20 workers starting on a 1,000-job pool decoded 20,000 listed jobs
# and every event meanwhile, to throw them away (issue 30's CPU per job).
PENDING = Scope(pending=True)


class StreamMerge:
    """Several list+watch streams of one pool folded into one view keyed by name.

    A name is in the view while *any* stream holds it; its version is the newest any stream
    delivered (the view keeps the newer of two, ``PoolView.apply``). Why a plain union of
    events is not enough: a job that leaves one stream's selection (a DELETED event, which
    carries the *old* content) may still be in the other's, and the two streams' events
    arrive in no agreed order — forgetting it on that DELETED would drop a job the other
    stream still shows (a job this worker holds, say, that it releases).

    The view changes only once every stream has listed (:meth:`listed` returns the union
    then), so a switch of scope shows the old scope's view until the new one is complete:
    a job held across the switch never leaves the view.

    Args:
        count: How many streams.
    """

    def __init__(self, count: int) -> None:
        self._streams: list[dict[str, Observed] | None] = [None] * count

    @property
    def complete(self) -> bool:
        """Whether every stream has listed (the view is the union from then on)."""
        return all(stream is not None for stream in self._streams)

    def listed(self, index: int, items: Iterable[Observed]) -> list[Observed] | None:
        """Stream ``index`` listed ``items``; the whole view once every stream has listed.

        A re-list of one stream (after a 410) also answers the whole union: the names it
        no longer shows leave the view unless another stream holds them.
        """
        self._streams[index] = {obs.name: obs for obs in items}
        if not self.complete:
            return None
        union: dict[str, Observed] = {}
        for stream in self._streams:
            assert stream is not None
            for name, obs in stream.items():
                held = union.get(name)
                if held is None or is_newer(obs, held):
                    union[name] = obs
        return list(union.values())

    def event(self, index: int, kind: str, obs: Observed) -> tuple[str, Observed] | None:
        """Stream ``index``'s watch event; what the view must apply (``None``: nothing yet).

        Before every stream has listed, events only update their stream's list (the view
        still shows the old scope).
        """
        stream = self._streams[index]
        if stream is None:
            return None
        if kind != "DELETED":
            stream[obs.name] = obs
            return (kind, obs) if self.complete else None
        mine = stream.get(obs.name)
        if mine is not None and mine.uid == obs.uid:
            del stream[obs.name]
        if not self.complete:
            return None
        other = self._held_elsewhere(index, obs)
        return ("MODIFIED", other) if other is not None else ("DELETED", obs)

    def _held_elsewhere(self, index: int, obs: Observed) -> Observed | None:
        """Another stream's version of ``obs``'s incarnation, if one still holds it."""
        for at, stream in enumerate(self._streams):
            other = None if at == index or stream is None else stream.get(obs.name)
            if other is not None and other.uid == obs.uid:
                return other
        return None

