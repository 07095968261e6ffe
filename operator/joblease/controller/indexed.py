"""Indexed Jobs: one pod-delegated lease per completion index, granted by its JobLease.

The pure rules the delegation pass (``joblease.controller.pods``) applies to pods of an
Indexed Job (``docs/indexed-jobs.md`` has the threat model):

* *Who may hold* ``<prefix>-<i>``: only a pod whose completion index is ``i`` by every
  record the Job controller wrote (``joblease.kube.pods.completion_index``; the lease name
  is then derived, never taken from the pod) and whose controlling Job is an owner of that
  JobLease. The owner reference is the grant: whoever created the JobLease chose the Job.
  A pod creator can name a lease in a label; it cannot make a lease name its Job.
* *How a holder finishes*: its pod ``Succeeded`` completes the lease with that pod's token
  (the Job counts the index as done); ``Failed`` releases it as a failed attempt
  (``maxAttempts`` and ``backoff`` as for any JobLease). Both are the protocol's own
  decisions (``decide_complete``, ``decide_release``) under the pod's claim: if the lease
  already moved on (expired and claimed for a replacement), they are refused like any stale
  holder's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import timedelta

from joblease.domain.clock import ServerNow
from joblease.domain.lease import Claim, Observed, Transition, decide_complete, decide_release
from joblease.kube.pods import PodInfo

Decide = Callable[[Observed, ServerNow], Transition | None]


def granted(pod: PodInfo, job_owners: Collection[str]) -> bool:
    """Whether a lease owned by the Jobs ``job_owners`` (uids) may be held for ``pod``.

    A per-index pod needs its own controlling Job among the owners; a plain delegating
    pod (no per-index label) is not this module's business and passes.
    """
    if not pod.per_index:
        return True
    return bool(pod.lease) and bool(pod.job_uid) and pod.job_uid in job_owners


def finishing_decision(pod: PodInfo, claim: Claim, margin: timedelta) -> Decide:
    """What to write for a holder pod that has finished: complete or release as failed."""
    if pod.phase == "Succeeded":
        result = f"pod {pod.name} succeeded"
        return lambda obs, now: decide_complete(obs, claim, result, now, margin)
    return lambda obs, now: decide_release(obs, claim, now, margin, failed=True)
