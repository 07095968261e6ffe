"""A work pool's claim of the lease it chose, written once for both pools.

``joblease.sdk.Pool`` and ``joblease.aio.AsyncPool`` choose from their ``PoolView`` in
their own way (a thread waiting on a condition, a task waiting on an event: the only part
written twice); what happens once a lease is chosen is this one operation:

1. claim the chosen lease with one conditional write decided from the cached version
   (``max_conflicts=1``: no read first) through the client's public ``claim()``;
2. if it is refused — 409 (someone was faster), held, resting, finished or gone on the
   server — answer the refusal: the pool sets the name aside until the watch brings a
   newer version and chooses again at once, so a lost race costs one request (a claim
   that itself wrote Failed, the attempts being used up, carries what it wrote);
3. if the write's answer is lost, retry *the same name with the same claim id* from a
   fresh read (pausing 50 ms, doubling to 2 s), so a write that did land is adopted
   rather than refused or orphaned; give up with the ``UnavailableError`` once the
   caller's end would pass during the pause (the claim, if it landed, expires on its own).

Safety never rests on the cache: every claim is the same compare-and-swap as any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from joblease.core.inbox import proposed_observed, read_proposed
from joblease.core.steps import ClaimBy, Sleep, Steps
from joblease.domain.dispatch import Proposal
from joblease.domain.errors import LeaseLostError, LeaseNotFoundError, LeaseUnavailableError
from joblease.domain.lease import PROPOSED_CLAIM_PREFIX, Observed
from joblease.kube.api import ApiError, ConflictError, UnavailableError
from joblease.kube.identity import new_claim_id
from joblease.kube.transact import MAX_CONFLICTS, ContentionError


class PooledLease(Protocol):
    """What a pool needs of the leases its client's ``claim()`` returns (``Lease``)."""

    @property
    def observed(self) -> Observed | None:
        """The JobLease as the claim wrote it (the pool's view learns it)."""


FIRST_PAUSE = 0.05
LOST_ANSWER_PAUSE_MAX = 2.0
REFUSED = (LeaseUnavailableError, LeaseNotFoundError, ConflictError, ContentionError)
# Adopting a dispatcher's claim (a resume and one renewal) refused: the dispatcher took it
# back meanwhile (stale, lost), it was deleted. The pool sets it aside and chooses again.
ADOPTION_REFUSED = (LeaseLostError, LeaseNotFoundError)


def claim_chosen(chosen: Observed, holder: str, end: float | None,
                 monotonic: Callable[[], float], prefix: str = "") -> Steps[Any]:
    """Claim ``chosen`` for ``holder`` (steps 1-3): the lease, or the refusal (choose again).

    Raises:
        UnavailableError: the answer was lost and ``end`` (local monotonic) came first.
        ApiError: refused for another reason (``ForbiddenError``: the admission policy).

    ``prefix`` marks the claim id (``PROPOSED_CLAIM_PREFIX``: made on a proposal).
    """
    claim_id = prefix + new_claim_id()
    observed: Observed | None = chosen
    pause = FIRST_PAUSE
    while True:
        try:
            return (yield ClaimBy(chosen.name, holder, claim_id, observed,
                                  1 if observed is not None else MAX_CONFLICTS))  # 1
        except REFUSED as refusal:
            return refusal  # 2
        except UnavailableError:  # 3
            if end is not None and monotonic() + pause >= end:
                raise
            yield Sleep(pause)
            pause = min(LOST_ANSWER_PAUSE_MAX, pause * 2)
            observed = None


def claim_proposed(namespace: str, selector: str | None, proposal: Proposal, holder: str,
                   end: float | None, monotonic: Callable[[], float]
                   ) -> Steps[tuple[Observed | None, Any]]:
    """Claim a job a dispatcher proposed, as a chosen one: unread if it may, else read first.

    A proposal that carries the job's state is claimed from it with no read, the write
    vouching for that state (``inbox.proposed_observed``: the API server refuses it unless
    the job is that very version, in this pool, as told). Refused by a conflict — a stale
    proposal, or a state that was not the job's — it is read within the pool's selector and
    decided again from what was read, as a proposal without a state is.

    Returns ``(the job as decided from, claim_chosen's outcome)``, or ``(None, the reason)``
    when it could not be read as a job of this pool (not found, or the read failed: the
    dispatcher proposes it again while it stands). A worker runs only what this claim won.
    """
    told = proposed_observed(namespace, selector, proposal)
    if told is not None:
        outcome = yield from claim_chosen(told, holder, end, monotonic, PROPOSED_CLAIM_PREFIX)
        if not isinstance(outcome, (ConflictError, ContentionError)):
            return told, outcome
    try:
        read = yield from read_proposed(namespace, selector, proposal.name)
    except ApiError as err:
        return None, err
    if read is None:
        return None, LeaseNotFoundError(proposal.name, namespace)
    return read, (yield from claim_chosen(read, holder, end, monotonic,
                                          PROPOSED_CLAIM_PREFIX))
