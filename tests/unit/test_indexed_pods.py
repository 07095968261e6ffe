"""Indexed Jobs, pure logic: who is index i, who is granted ``<prefix>-<i>``, how it ends.

The API-server side (owner references, the Job controller's pods, real refusals) is proved
in tests/cluster/test_indexed_jobs.py and tests/node/test_indexed_job.py; here the parsing
and the delegation pass run against fakes so that each hostile variant is one line.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from joblease.controller.pods import Delegator, PodView
from joblease.controller.reconciler import LeaseView, Reconciler
from joblease.domain.lease import LeaseSpec, LeaseStatus, Observed, Phase
from joblease.kube.api import UnavailableError
from joblease.kube.pods import PodInfo
from support.memstore import T0, MemoryStore

MARGIN = timedelta(seconds=0.5)
JOB_UID = "job-uid-1"


def job_pod(index: int = 3, *, name: str = "ingest-3-abcde", uid: str = "pod-u1",
            job: str = "ingest", job_uid: str = JOB_UID, phase: str = "Running",
            ready: bool = True) -> dict[str, Any]:
    """A pod as the Job controller creates it for an Indexed Job (plus the lease labels)."""
    key = "batch.kubernetes.io/job-completion-index"
    return {
        "metadata": {
            "namespace": "ns", "name": name, "uid": uid,
            "creationTimestamp": "2026-12-03T00:00:00Z",
            "labels": {"joblease.dev/lease": "ingest", "joblease.dev/lease-per-index": "true",
                       key: str(index), "batch.kubernetes.io/controller-uid": job_uid,
                       "batch.kubernetes.io/job-name": job},
            "annotations": {key: str(index)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                 "uid": job_uid, "controller": True}]},
        "spec": {"hostname": f"{job}-{index}"},
        "status": {"phase": phase, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_a_job_pod_asks_for_the_lease_of_its_index() -> None:
    pod = PodInfo.from_object(job_pod(3))
    assert (pod.lease, pod.per_index, pod.job_uid, pod.eligible) == (
        "ingest-3", True, JOB_UID, True)


INDEX = "batch.kubernetes.io/job-completion-index"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "ingest", "uid": JOB_UID}


@pytest.mark.parametrize(("where", "key", "value"), [
    # a forged index label: the other records still say 3
    ("labels", INDEX, "2"),
    ("annotations", INDEX, "2"),
    ("spec", "hostname", "ingest-2"),
    # no index at all, or not the Job controller's spelling of one
    ("labels", INDEX, None),
    ("annotations", INDEX, None),
    ("spec", "hostname", None),
    ("labels", INDEX, "03"),
    ("labels", INDEX, "-1"),
    ("labels", INDEX, "\uff13"),  # a Unicode digit 3
    # not a pod of this Job, or of no Job
    ("labels", JOB_UID_LABEL, "other-uid"),
    ("metadata", "ownerReferences", []),
    ("metadata", "ownerReferences", [{**OWNER, "apiVersion": "apps/v1", "controller": True}]),
    ("metadata", "ownerReferences", [OWNER]),  # an owner, but not the controller
])
def test_a_pod_whose_index_records_disagree_asks_for_nothing(where: str, key: str,
                                                             value: Any) -> None:
    obj = job_pod(3)
    target = obj["spec"] if where == "spec" else (
        obj["metadata"] if where == "metadata" else obj["metadata"][where])
    if value is None:
        del target[key]
    else:
        target[key] = value
    if where == "annotations" or where == "labels":
        assert obj["metadata"][where].get(key) == value  # the edit landed where meant
    pod = PodInfo.from_object(obj)
    assert pod.lease == "" and pod.per_index
    view = PodView()
    view.put(pod)
    assert view.by_lease() == {}


def test_a_plain_delegating_pod_is_unchanged() -> None:
    obj = job_pod(3)
    del obj["metadata"]["labels"]["joblease.dev/lease-per-index"]
    pod = PodInfo.from_object(obj)
    assert (pod.lease, pod.per_index) == ("ingest", False)


# -- the delegation pass ---------------------------------------------------------------------

class JobPods:
    """PodStore fake: pods by name, and the Job owners of each JobLease."""

    def __init__(self, pods: list[PodInfo], owners: dict[str, frozenset[str]]) -> None:
        self.pods = {p.name: p for p in pods}
        self.owners = owners
        self.owner_reads = 0
        self.annotated: list[tuple[str, dict[str, str | None]]] = []

    def get(self, namespace: str, name: str) -> PodInfo | None:
        return self.pods.get(name)

    def lease_job_owners(self, namespace: str, name: str) -> frozenset[str]:
        self.owner_reads += 1
        return self.owners.get(name, frozenset())

    def annotate(self, pod: PodInfo, values: dict[str, str | None]) -> None:
        self.annotated.append((pod.name, values))


def _lease(name: str = "ingest-3", status: LeaseStatus | None = None,
           spec: LeaseSpec | None = None) -> Observed:
    return Observed("ns", name, f"uid-{name}", "10", 1,
                    spec or LeaseSpec(lease_duration_seconds=6, pod_delegation=True,
                                      max_attempts=3),
                    status or LeaseStatus(epoch=10))


def _pass(store: MemoryStore, pods: JobPods) -> Delegator:
    leases, view = LeaseView(), PodView()
    for obs in store.objects.values():
        leases.put(obs)
    for pod in pods.pods.values():
        view.put(pod)
    delegator = Delegator(store, pods, leases, view, MARGIN)  # type: ignore[arg-type]
    delegator.pass_once()
    return delegator


def test_the_pod_of_the_owning_job_gets_its_index_and_only_its_token() -> None:
    store = MemoryStore([_lease()])
    pod = PodInfo.from_object(job_pod(3))
    pods = JobPods([pod], {"ingest-3": frozenset({JOB_UID})})
    _pass(store, pods)
    st = store.objects["ingest-3"].status
    assert (st.phase, st.holder, st.generation) == (Phase.HELD, pod.holder, 1)
    assert [(n, v["generation"]) for n, v in pods.annotated] == [(pod.name, "1")]


@pytest.mark.parametrize("owners", [frozenset(), frozenset({"another-job"})])
def test_a_lease_not_owned_by_the_pods_job_is_never_claimed(owners: frozenset[str]) -> None:
    """No owner: nobody granted it to a Job (an ordinary lease whose name merely matches).
    Another Job's: a pod of this Job must not take it."""
    store = MemoryStore([_lease()])
    pods = JobPods([PodInfo.from_object(job_pod(3))], {"ingest-3": owners})
    _pass(store, pods)
    assert store.objects["ingest-3"].status.phase is Phase.AVAILABLE and not store.writes
    assert pods.annotated == []


def test_a_lease_without_the_delegation_opt_in_is_never_claimed_even_when_owned() -> None:
    store = MemoryStore([_lease(spec=LeaseSpec(pod_delegation=False))])
    pods = JobPods([PodInfo.from_object(job_pod(3))], {"ingest-3": frozenset({JOB_UID})})
    _pass(store, pods)
    assert not store.writes


def test_a_not_ready_pod_is_refused_and_the_ready_one_of_the_index_gets_it() -> None:
    store = MemoryStore([_lease()])
    stuck = PodInfo.from_object(job_pod(3, name="ingest-3-old", uid="u-old", ready=False))
    fresh = replace(PodInfo.from_object(job_pod(3, name="ingest-3-new", uid="u-new")),
                    created="2026-12-03T00:00:09Z")
    pods = JobPods([stuck, fresh], {"ingest-3": frozenset({JOB_UID})})
    _pass(store, pods)
    assert store.objects["ingest-3"].status.holder == fresh.holder


def _held_by(pod: PodInfo, until: float = 6.0) -> LeaseStatus:
    return LeaseStatus(Phase.HELD, pod.holder, 4, 10, T0, T0, T0 + timedelta(seconds=until),
                       attempts=0, claim_id=f"pod-{pod.uid}-4")


def test_a_succeeded_holder_completes_the_lease_with_its_own_token() -> None:
    done = PodInfo.from_object(job_pod(3, phase="Succeeded", ready=False))
    store = MemoryStore([_lease(status=_held_by(done))])
    pods = JobPods([done], {"ingest-3": frozenset({JOB_UID})})
    _pass(store, pods)
    st = store.objects["ingest-3"].status
    assert st.phase is Phase.COMPLETED and st.completion is not None
    assert (st.completion.holder, st.completion.generation) == (done.holder, 4)


def test_a_failed_holder_releases_and_counts_an_attempt() -> None:
    failed = PodInfo.from_object(job_pod(3, phase="Failed", ready=False))
    store = MemoryStore([_lease(status=_held_by(failed))])
    _pass(store, JobPods([failed], {"ingest-3": frozenset({JOB_UID})}))
    st = store.objects["ingest-3"].status
    assert (st.phase, st.holder, st.attempts) == (Phase.AVAILABLE, None, 1)


def test_a_finished_pod_shown_by_a_stale_watch_is_read_again_before_acting() -> None:
    """The view says Succeeded, the pod read now is another incarnation: nothing is done."""
    seen = PodInfo.from_object(job_pod(3, phase="Succeeded", ready=False))
    store = MemoryStore([_lease(status=_held_by(seen))])
    pods = JobPods([seen], {"ingest-3": frozenset({JOB_UID})})
    pods.pods[seen.name] = replace(seen, uid="someone-else", phase="Running")
    leases, view = LeaseView(), PodView()
    leases.put(store.objects["ingest-3"])
    view.put(seen)
    Delegator(store, pods, leases, view, MARGIN).pass_once()  # type: ignore[arg-type]
    assert store.objects["ingest-3"].status.phase is Phase.HELD


def test_a_terminating_holder_is_not_renewed_and_its_replacement_waits_for_the_lapse() -> None:
    old = replace(PodInfo.from_object(job_pod(3, name="ingest-3-old", uid="u-old")),
                  terminating=True)
    new = PodInfo.from_object(job_pod(3, name="ingest-3-new", uid="u-new"))
    store = MemoryStore([_lease(status=_held_by(old))])
    store.api.now = 5.0  # renewal long due, the lease not yet lapsed
    pods = JobPods([old, new], {"ingest-3": frozenset({JOB_UID})})
    _pass(store, pods)
    assert not store.writes  # neither renewed for the old pod nor claimed for the new
    store.api.now = 6.0 + MARGIN.total_seconds() + 0.1
    _pass(store, pods)
    assert not store.writes  # lapsed: the reconciler marks it (the operator's other loop)
    view = LeaseView()
    view.put(store.objects["ingest-3"])
    Reconciler(store, view, MARGIN).pass_once()
    _pass(store, pods)
    st = store.objects["ingest-3"].status
    assert (st.holder, st.generation) == (new.holder, 5)


def test_a_holder_whose_job_no_longer_owns_the_lease_is_not_renewed() -> None:
    holder = PodInfo.from_object(job_pod(3))
    store = MemoryStore([_lease(status=_held_by(holder))])
    store.api.now = 5.0
    _pass(store, JobPods([holder], {"ingest-3": frozenset()}))
    assert not store.writes


def test_plain_delegation_reads_no_owners() -> None:
    obj = job_pod(3)
    del obj["metadata"]["labels"]["joblease.dev/lease-per-index"]
    plain = PodInfo.from_object(obj)
    store = MemoryStore([_lease(name="ingest")])
    pods = JobPods([plain], {})
    _pass(store, pods)
    assert store.objects["ingest"].status.holder == plain.holder and pods.owner_reads == 0


def test_a_finished_holder_the_watch_missed_is_finished_at_its_renewal() -> None:
    """The view still shows the pod Running; the live read before the renewal shows it
    Succeeded: completed then, not left to lapse."""
    running = PodInfo.from_object(job_pod(3))
    store = MemoryStore([_lease(status=_held_by(running))])
    store.api.now = 5.0  # a renewal is due
    pods = JobPods([running], {"ingest-3": frozenset({JOB_UID})})
    pods.pods[running.name] = replace(running, phase="Succeeded", ready=False)
    leases, view = LeaseView(), PodView()
    leases.put(store.objects["ingest-3"])
    view.put(running)
    Delegator(store, pods, leases, view, MARGIN).pass_once()  # type: ignore[arg-type]
    st = store.objects["ingest-3"].status
    assert st.phase is Phase.COMPLETED and st.completion is not None
    assert st.completion.holder == running.holder


def test_the_example_job_asks_for_a_lease_per_index_named_like_its_worker() -> None:
    """examples/indexed-job.yaml, examples/indexed_worker.py and the recipe agree on names."""
    import yaml

    from support.paths import REPO
    job = yaml.safe_load((REPO / "examples" / "indexed-job.yaml").read_text())
    template = job["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["suspend"] is True
    assert labels["joblease.dev/lease-per-index"] == "true"
    env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    assert env["JOBLEASE_LEASE_PREFIX"] == labels["joblease.dev/lease"]
    assert "JOB_COMPLETION_INDEX" in (REPO / "examples" / "indexed_worker.py").read_text()
    recipe = (REPO / "examples" / "indexed-leases.sh").read_text()
    assert "name: $prefix-$i" in recipe and "kind: Job" in recipe


@pytest.mark.parametrize("failure", [UnavailableError(0, "Unavailable", "response lost"),
                                     RuntimeError("unexpected")])
def test_a_failed_owner_read_claims_nothing_and_the_next_pass_claims(failure: Exception
                                                                    ) -> None:
    """No answer (or any exception) about the grant is never read as a grant."""
    store = MemoryStore([_lease()])
    pod = PodInfo.from_object(job_pod(3))
    pods = JobPods([pod], {"ingest-3": frozenset({JOB_UID})})
    real = pods.lease_job_owners

    def failing(namespace: str, name: str) -> frozenset[str]:
        raise failure

    pods.lease_job_owners = failing  # type: ignore[method-assign]
    delegator = _pass(store, pods)
    assert not store.writes and pods.annotated == []
    pods.lease_job_owners = real  # type: ignore[method-assign]
    delegator.pass_once()
    assert store.objects["ingest-3"].status.holder == pod.holder
