"""Pods that ask the operator to hold a JobLease for them: read them, write their token.

A pod labelled ``joblease.dev/lease=<name>`` delegates the lease ``<name>`` (in its own
namespace) to the operator. A pod of an Indexed Job that also carries
``joblease.dev/lease-per-index=true`` delegates ``<name>-<i>``, ``i`` its completion index
(``docs/indexed-jobs.md``); the index counts only if every place the Job controller wrote it
agrees (:func:`completion_index`). This module only does the HTTP and the parsing: reading
such pods, the Job owners of a JobLease, and merge-patching the token annotations the pod's
downward API volume then shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from joblease.kube.api import MERGE_PATCH, KubeApi, NotFoundError
from joblease.kube.leases import lease_path

LEASE_LABEL = "joblease.dev/lease"
# With value "true": the pod asks for "<lease label>-<completion index>", not the label's lease.
PER_INDEX_LABEL = "joblease.dev/lease-per-index"
# Set by the Job controller on each pod of an Indexed Job, as a label and as an annotation.
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
MAX_INDEX_DIGITS = 6  # the API server caps an Indexed Job's completions at 100,000
ANNOTATION_PREFIX = "joblease.dev/"
# The token annotations the operator owns on a delegated pod (see joblease.pod.downward).
TOKEN_ANNOTATIONS = ("holder", "epoch", "generation", "lease-until")


@dataclass(frozen=True)
class PodInfo:
    """What delegation needs to know about one labelled pod."""

    namespace: str
    name: str
    uid: str
    lease: str
    ready: bool
    terminating: bool
    created: str
    annotations: dict[str, str]
    service_account: str = "default"
    phase: str = "Running"
    job_uid: str = ""  # the controlling Job's uid (ownerReferences), "" if none
    per_index: bool = False  # asks for "<label>-<index>"; ``lease`` is "" if the index is bad

    @property
    def holder(self) -> str:
        """The holder identity the operator claims the lease under for this pod.

        ``pod:<namespace>/<name>/<uid>``: the uid makes a re-created pod of the same name
        a different holder, so it can never renew its predecessor's lease.
        """
        return f"pod:{self.namespace}/{self.name}/{self.uid}"

    @property
    def eligible(self) -> bool:
        """A pod may hold (or keep) a lease only while Ready and not being deleted."""
        return self.ready and not self.terminating

    @property
    def finished(self) -> bool:
        """Every container stopped for good (``Succeeded`` or ``Failed``): no process runs."""
        return self.phase in ("Succeeded", "Failed")

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> PodInfo:
        """Parse a Pod as returned by the API server (or delivered by a watch)."""
        meta = obj.get("metadata") or {}
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        phase = (obj.get("status") or {}).get("phase")
        labels = meta.get("labels") or {}
        lease, per_index = labels.get(LEASE_LABEL, ""), labels.get(PER_INDEX_LABEL) == "true"
        job = controlling_job(meta)
        if per_index:
            index = completion_index(obj, job)
            lease = f"{lease}-{index}" if lease and index is not None else ""
        return cls(
            namespace=meta.get("namespace", ""), name=meta.get("name", ""),
            uid=meta.get("uid", ""), lease=lease,
            ready=ready and phase == "Running",
            terminating=bool(meta.get("deletionTimestamp")),
            created=meta.get("creationTimestamp", ""),
            annotations=dict(meta.get("annotations") or {}),
            service_account=(obj.get("spec") or {}).get("serviceAccountName") or "default",
            phase=str(phase or ""), job_uid=job[1] if job else "", per_index=per_index,
        )


def controlling_job(meta: dict[str, Any]) -> tuple[str, str] | None:
    """``(name, uid)`` of the Job that controls an object (its ``controller`` owner), else None."""
    for ref in meta.get("ownerReferences") or []:
        if (ref.get("controller") and ref.get("kind") == "Job"
                and str(ref.get("apiVersion", "")).startswith("batch/")):
            return str(ref.get("name", "")), str(ref.get("uid", ""))
    return None


def completion_index(obj: dict[str, Any], job: tuple[str, str] | None) -> int | None:
    """The pod's completion index if every place the Job controller wrote it agrees, else None.

    Why four places: labels and annotations can be changed by anyone who may update the
    pod, but ``spec.hostname`` (``<job name>-<index>``, set by the Job controller) is
    immutable, and the ``controller-uid`` label must name the controlling Job. A pod whose
    index label was edited, or a pod of one Job dressed up as another's, then has no index
    and asks for no lease.
    """
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    label = (meta.get("labels") or {}).get(INDEX_KEY)
    annotation = (meta.get("annotations") or {}).get(INDEX_KEY)
    if job is None or not label or label != annotation:
        return None
    if not (label.isascii() and label.isdigit() and len(label) <= MAX_INDEX_DIGITS
            and str(int(label)) == label):
        return None
    name, uid = job
    if (meta.get("labels") or {}).get(JOB_UID_LABEL) != uid or not uid:
        return None
    return int(label) if spec.get("hostname") == f"{name}-{label}" else None


def pod_path(namespace: str, name: str = "") -> str:
    """URL path of a namespace's pods, or of one pod."""
    return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")


class PodStore:
    """Delegating pods through one ``KubeApi``."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def get(self, namespace: str, name: str) -> PodInfo | None:
        """Read one pod now (``None`` if it does not exist).

        Why a read and not the watch: a watch filtered by label never shows the deletion of
        a pod whose label was removed, and events can be missed in a gap; renewing on a
        pod's behalf must rest on the pod as it is now.
        """
        try:
            return PodInfo.from_object(self.api.request("GET", pod_path(namespace, name)).body)
        except NotFoundError:
            return None

    def lease_job_owners(self, namespace: str, name: str) -> frozenset[str]:
        """Uids of the Jobs that own the JobLease ``name`` (read now; empty if none or gone).

        A per-index lease is granted to the pods of the Job its creator named as its owner:
        the grant is the owner reference, written by whoever may create JobLeases, never
        by whoever may create pods (``docs/indexed-jobs.md``).
        """
        try:
            meta = self.api.request("GET", lease_path(namespace, name)).body.get("metadata") or {}
        except NotFoundError:
            return frozenset()
        return frozenset(str(ref.get("uid", "")) for ref in meta.get("ownerReferences") or []
                         if ref.get("kind") == "Job"
                         and str(ref.get("apiVersion", "")).startswith("batch/"))

    def annotate(self, pod: PodInfo, values: dict[str, str | None]) -> None:
        """Merge-patch ``joblease.dev/<key>`` annotations on ``pod`` (``None`` removes one).

        The patch carries the pod's uid: if the name now belongs to a re-created pod the
        API server refuses it (uid is immutable), so a token is never written onto a pod
        it was not claimed for.
        """
        annotations = {ANNOTATION_PREFIX + key: value for key, value in values.items()}
        patch = {"metadata": {"uid": pod.uid, "annotations": annotations}}
        self.api.request("PATCH", pod_path(pod.namespace, pod.name), patch,
                         content_type=MERGE_PATCH)
