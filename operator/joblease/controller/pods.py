"""Pod-delegated leases: the operator holds a JobLease on behalf of a labelled pod.

A pod labelled ``joblease.dev/lease=<name>`` asks the operator to hold the JobLease
``<name>`` in the pod's namespace for it — only if the JobLease itself opted in with
``spec.podDelegation.enabled`` (optionally only for pods running as
``spec.podDelegation.serviceAccountName``). Without that opt-in anyone allowed to create a
pod could make the operator, which is exempt from the holder-only policy, claim any lease
for them (a confused deputy). The pod needs no API credentials at all: it reads its token
from a downward API volume (``joblease.pod.downward``). For each opted-in lease:

1. If no pod holds it, claim it for one eligible pod (Ready, not being deleted, the right
   ServiceAccount; the oldest first, then by name) as holder
   ``pod:<namespace>/<name>/<uid>``; if the API server refuses one pod's claim, try the next.
2. While the holder pod stays eligible, renew whenever a third of the duration has passed,
   after reading the pod *now* (not from the watch) to check it still exists with that uid,
   label and readiness.
3. When the holder pod is not Ready, is being deleted or lost its label, stop renewing and
   let the lease expire: its process may still be running, and its ``lease-until``
   annotation must stay true. Only when the pod object is gone (a real kubelet removes it
   after its containers stopped) is the lease released at once, so the next pod need not
   wait.
4. Mirror the token into annotations: the holder pod gets ``joblease.dev/holder``,
   ``epoch``, ``generation`` and ``lease-until``; every other labelled pod gets none.

Indexed Jobs (``docs/indexed-jobs.md``): a pod that also carries
``joblease.dev/lease-per-index=true`` asks for ``<label>-<completion index>``, and gets it only
if that JobLease is owned by the pod's own Job (``ownerReferences``, written by whoever
created the lease: the grant), read live before every claim and renewal
(:func:`joblease.controller.indexed.granted`). When such a holder pod has finished, the
operator finishes the lease for it: ``Succeeded`` completes it with the pod's token,
``Failed`` releases it as a failed attempt. Both at once, not at the next renewal: no
process of a finished pod runs, and the index's next pod should not wait.

Every lease write is the same compare-and-swap as everyone else's
(``joblease.kube.transact``), decided by the pure protocol, so a worker that claims the
lease directly, or a second operator replica, is refused in the usual way. Annotations can
lag (the kubelet refreshes the file within about a minute): targets must still fence.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial

from joblease.controller import indexed, metrics
from joblease.controller.reconciler import LeaseView, write_basis
from joblease.core.steps import transact
from joblease.domain.clock import ServerNow
from joblease.domain.errors import LeaseError
from joblease.domain.lease import (
    Claim,
    Observed,
    Phase,
    Transition,
    decide_claim,
    decide_release,
    decide_renew,
    is_expired,
)
from joblease.domain.time import format_time, seconds_until_expiry, seconds_until_renewal
from joblease.kube.api import ApiError, ForbiddenError, InvalidError
from joblease.kube.leases import LeaseStore
from joblease.kube.pods import ANNOTATION_PREFIX, TOKEN_ANNOTATIONS, PodInfo, PodStore

log = logging.getLogger("joblease.operator.pods")
HOLDER_PREFIX = "pod:"
# Nothing due for a while: look again in a second (pods change without waking this loop;
# the runtime's loop caps every wait at 1 s anyway, so a longer value would not act).
IDLE_WAKEUP = 1.0
SOON = 0.05

Decide = Callable[[Observed, ServerNow], Transition | None]


class PodView:
    """Labelled pods seen on the watch (thread-safe)."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._lock = threading.Lock()

    def put(self, pod: PodInfo) -> None:
        """Store the newest version of a pod (a pod that lost its label is forgotten)."""
        with self._lock:
            if pod.lease:
                self._pods[(pod.namespace, pod.name)] = pod
            else:
                self._pods.pop((pod.namespace, pod.name), None)

    def drop(self, pod: PodInfo) -> None:
        """Forget a deleted pod — only that very pod (``uid``), not a successor's namesake."""
        with self._lock:
            current = self._pods.get((pod.namespace, pod.name))
            if current is not None and current.uid == pod.uid:
                del self._pods[(pod.namespace, pod.name)]

    def by_lease(self) -> dict[tuple[str, str], list[PodInfo]]:
        """Pods grouped by (namespace, lease name)."""
        with self._lock:
            pods = list(self._pods.values())
        groups: dict[tuple[str, str], list[PodInfo]] = {}
        for pod in pods:
            groups.setdefault((pod.namespace, pod.lease), []).append(pod)
        return groups


def holder_pod_name(holder: str) -> tuple[str, str, str] | None:
    """``(namespace, name, uid)`` of a ``pod:<namespace>/<name>/<uid>`` holder, else None."""
    if not holder.startswith(HOLDER_PREFIX):
        return None
    parts = holder.removeprefix(HOLDER_PREFIX).split("/")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


@dataclass
class Delegator:
    """Claims, renews and hands over pod-delegated leases; mirrors tokens into annotations."""

    leases: LeaseStore
    pods: PodStore
    lease_view: LeaseView
    pod_view: PodView
    margin: timedelta
    announce: Callable[[Observed, Transition], None] = lambda obs, transition: None

    def pass_once(self) -> float:
        """Visit every delegated lease once; return seconds until something may be due."""
        wakeup = IDLE_WAKEUP
        for (namespace, name), pods in self.pod_view.by_lease().items():
            obs = self.lease_view.get(namespace, name)
            if obs is None:
                continue  # not created yet (or not yet seen on the watch)
            try:
                wakeup = min(wakeup, self._visit(obs, pods))
            except (LeaseError, ApiError) as err:
                log.info("delegated JobLease %s/%s: %s", namespace, name, err)
            except Exception as err:
                metrics.OBJECT_ERRORS.labels("delegate").inc()
                log.exception("delegated JobLease %s/%s failed: %s", namespace, name, err)
        return max(SOON, wakeup)

    def _visit(self, obs: Observed, pods: list[PodInfo]) -> float:
        st = obs.status
        delegated = st.phase == Phase.HELD and holder_pod_name(st.holder or "") is not None
        if delegated:
            obs, wait = self._finish_for_pod(obs, pods) or self._keep_or_let_go(obs)
        elif not obs.spec.pod_delegation:
            wait = IDLE_WAKEUP  # not opted in: labelled pods get nothing
        elif st.phase.finished or self._held_unexpired(obs):
            wait = self._seconds_until_expiry(obs)  # someone else's: wait
        else:
            obs, wait = self._claim(obs, pods)
        self._mirror(obs, pods)
        return wait

    def _finish_for_pod(self, obs: Observed, pods: list[PodInfo]
                        ) -> tuple[Observed, float] | None:
        """Complete or release an index lease whose holder pod has finished; else None.

        The watch only says the pod *may* have finished; the decision rests on the pod read
        now (that very uid, finished), as a renewal does.
        """
        holder = obs.status.holder or ""
        if not any(p.holder == holder and p.per_index and p.finished for p in pods):
            return None
        namespace, name, uid = holder_pod_name(holder) or ("", "", "")
        pod = self.pods.get(namespace, name)
        if pod is None or pod.uid != uid or not pod.finished:
            return None
        return self._finish(obs, pod), SOON

    def _finish(self, obs: Observed, pod: PodInfo) -> Observed:
        """Complete (``Succeeded``) or release as failed (``Failed``) for the holder pod."""
        st = obs.status
        claim = Claim(st.holder or "", st.token(), st.claim_id)
        return self._write(obs, indexed.finishing_decision(pod, claim, self.margin))

    def _keep_or_let_go(self, obs: Observed) -> tuple[Observed, float]:
        """The lease is held for a pod: renew it if due and the pod still qualifies."""
        wait = self._seconds_until_renewal(obs)
        if wait > 0:
            return obs, wait
        holder = obs.status.holder or ""
        namespace, name, uid = holder_pod_name(holder) or ("", "", "")
        pod = self.pods.get(namespace, name)
        if pod is None or pod.uid != uid:
            return self._release(obs), SOON  # the pod object is gone: hand over now
        if pod.per_index and pod.finished:  # the watch missed its end: finish it now
            return self._finish(obs, pod), SOON
        if (pod.eligible and pod.lease == obs.name and obs.spec.pod_delegation
                and self._allowed(obs, pod) and self._granted(obs, [pod])):
            claim = Claim(holder, obs.status.token(), obs.status.claim_id)
            margin = self.margin
            obs = self._write(obs, lambda o, n: decide_renew(o, claim, n, margin))
            return obs, self._seconds_until_renewal(obs)
        return obs, self._seconds_until_expiry(obs)  # may still run: let it expire

    def _claim(self, obs: Observed, pods: list[PodInfo]) -> tuple[Observed, float]:
        eligible = sorted((p for p in pods if p.eligible and self._allowed(obs, p)),
                          key=lambda p: (p.created, p.name))
        eligible = self._granted(obs, eligible)
        margin = self.margin
        for pod in eligible:
            claim_id = f"pod-{pod.uid}-{obs.status.generation + 1}"
            try:
                obs = self._write(obs, partial(_decide_claim, holder=pod.holder,
                                               margin=margin, claim_id=claim_id))
            except (InvalidError, ForbiddenError) as err:
                log.warning("delegated JobLease %s/%s: claim for pod %s refused, trying the "
                            "next pod: %s", obs.namespace, obs.name, pod.name, err)
                continue
            return obs, self._seconds_until_renewal(obs)
        return obs, IDLE_WAKEUP

    @staticmethod
    def _allowed(obs: Observed, pod: PodInfo) -> bool:
        wanted = obs.spec.delegation_service_account
        return wanted is None or pod.service_account == wanted

    def _granted(self, obs: Observed, pods: list[PodInfo]) -> list[PodInfo]:
        """The pods whose per-index request this lease grants (plain pods pass unchanged).

        Only read the lease's owners when a per-index pod is among ``pods``: plain
        delegation keeps its one request per claim.
        """
        if not any(p.per_index for p in pods):
            return pods
        owners = self.pods.lease_job_owners(obs.namespace, obs.name)
        return [p for p in pods if indexed.granted(p, owners)]

    def _release(self, obs: Observed) -> Observed:
        st, margin = obs.status, self.margin
        claim = Claim(st.holder or "", st.token(), st.claim_id)
        return self._write(obs, lambda o, n: decide_release(o, claim, n, margin))

    def _write(self, obs: Observed, decide: Decide) -> Observed:
        outcome = transact(self.leases, obs.namespace, obs.name, decide,
                           observed=write_basis(obs))
        if outcome.transition is not None:
            # The view now has this version, so the watch event will show no transition:
            # count and announce it here, as the reconciler does for its own writes.
            self.lease_view.put(outcome.observed)
            metrics.OPERATOR_WRITES.labels(outcome.transition.kind).inc()
            self.announce(outcome.observed, outcome.transition)
            log.info("delegated JobLease %s/%s: %s", obs.namespace, obs.name,
                     outcome.transition.message)
        return outcome.observed

    def _held_unexpired(self, obs: Observed) -> bool:
        st = obs.status
        return st.phase == Phase.HELD and not is_expired(
            st.lease_until, self.leases.api.server_now(), self.margin)

    def _seconds_until_renewal(self, obs: Observed) -> float:
        st = obs.status
        if st.lease_until is None or st.phase != Phase.HELD:
            return IDLE_WAKEUP
        return seconds_until_renewal(st.lease_until, obs.spec.duration,
                                     self.leases.api.server_now())

    def _seconds_until_expiry(self, obs: Observed) -> float:
        until = obs.status.lease_until
        if until is None or obs.status.phase != Phase.HELD:
            return IDLE_WAKEUP
        return max(SOON, seconds_until_expiry(until, self.margin,
                                              self.leases.api.server_now()))

    def _mirror(self, obs: Observed, pods: list[PodInfo]) -> None:
        for pod in pods:
            wanted = token_annotations(obs, pod)
            have = {k: pod.annotations.get(ANNOTATION_PREFIX + k) for k in TOKEN_ANNOTATIONS}
            if wanted != have and not pod.terminating:
                self.pods.annotate(pod, wanted)
                self.pod_view.put(_with_annotations(pod, wanted))


def _decide_claim(obs: Observed, now: ServerNow, *, holder: str, margin: timedelta,
                  claim_id: str) -> Transition | None:
    return decide_claim(obs, holder, now, margin, claim_id)


def token_annotations(obs: Observed, pod: PodInfo) -> dict[str, str | None]:
    """The token annotations ``pod`` should carry: its token if it holds ``obs``, else none."""
    st = obs.status
    if st.phase != Phase.HELD or st.holder != pod.holder:
        return dict.fromkeys(TOKEN_ANNOTATIONS)
    return {"holder": pod.holder, "epoch": str(st.epoch or 0), "generation": str(st.generation),
            "lease-until": format_time(st.lease_until) if st.lease_until else None}


def _with_annotations(pod: PodInfo, values: dict[str, str | None]) -> PodInfo:
    annotations = {k: v for k, v in pod.annotations.items()
                   if k.removeprefix(ANNOTATION_PREFIX) not in values}
    annotations.update({ANNOTATION_PREFIX + k: v for k, v in values.items() if v is not None})
    return replace(pod, annotations=annotations)
