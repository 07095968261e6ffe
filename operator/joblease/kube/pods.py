"""Pods that ask the operator to hold a JobLease for them: read them, write their token.

A pod labelled ``joblease.dev/lease=<name>`` delegates the lease ``<name>`` (in its own
namespace) to the operator. This module only does the HTTP: reading such pods and
merge-patching the token annotations the pod's downward API volume then shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from joblease.kube.api import MERGE_PATCH, KubeApi, NotFoundError

LEASE_LABEL = "joblease.dev/lease"
ANNOTATION_PREFIX = "joblease.dev/"
# The token annotations the operator owns on a delegated pod (see joblease.downward).
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

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> PodInfo:
        """Parse a Pod as returned by the API server (or delivered by a watch)."""
        meta = obj.get("metadata") or {}
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        phase = (obj.get("status") or {}).get("phase")
        return cls(
            namespace=meta.get("namespace", ""), name=meta.get("name", ""),
            uid=meta.get("uid", ""), lease=(meta.get("labels") or {}).get(LEASE_LABEL, ""),
            ready=ready and phase == "Running",
            terminating=bool(meta.get("deletionTimestamp")),
            created=meta.get("creationTimestamp", ""),
            annotations=dict(meta.get("annotations") or {}),
            service_account=(obj.get("spec") or {}).get("serviceAccountName") or "default",
        )


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
