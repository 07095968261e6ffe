"""JobLease objects on the API server: read, conditional status write, delete, Events."""

from __future__ import annotations

import builtins
import os
import socket
from typing import Any

from joblease.domain.errors import LeaseNotFoundError, format_time
from joblease.domain.lease import LeaseStatus, Observed
from joblease.kube.api import DEFAULT_TIMEOUT, MERGE_PATCH, KubeApi, NotFoundError

GROUP = "joblease.dev"
VERSION = "v1alpha1"
PLURAL = "jobleases"
KIND = "JobLease"


def lease_path(namespace: str | None, name: str | None = None, subresource: str = "") -> str:
    """URL path of the JobLease collection, one object, or its subresource."""
    base = f"/apis/{GROUP}/{VERSION}"
    base += f"/namespaces/{namespace}/{PLURAL}" if namespace else f"/{PLURAL}"
    if name:
        base += f"/{name}"
    if subresource:
        base += f"/{subresource}"
    return base


class LeaseStore:
    """JobLease objects through one ``KubeApi`` (one identity, one server-clock estimate)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def get(self, namespace: str, name: str, timeout: float = DEFAULT_TIMEOUT) -> Observed:
        """Read one JobLease.

        Raises:
            LeaseNotFoundError: it does not exist.
        """
        try:
            body = self.api.request("GET", lease_path(namespace, name), timeout=timeout).body
        except NotFoundError as err:
            raise LeaseNotFoundError(name, namespace) from err
        return Observed.from_object(body)

    def list(self, namespace: str | None = None) -> list[Observed]:
        """List JobLeases in one namespace, or in all."""
        items = self.api.request("GET", lease_path(namespace)).body.get("items", [])
        return [Observed.from_object(item) for item in items]

    def list_objects(self, namespace: str | None = None, label_selector: str | None = None,
                     page_size: int = 500, timeout: float = DEFAULT_TIMEOUT
                     ) -> builtins.list[dict[str, Any]]:
        """Every JobLease object (raw, with metadata) matching a label selector, paginated.

        Raw objects, not ``Observed``: an overview needs metadata the protocol does not
        (labels, ``creationTimestamp``). Pages of ``page_size`` keep one huge namespace from
        becoming one huge response; the API server's ``continue`` token stitches them into
        one consistent snapshot.
        """
        items: builtins.list[dict[str, Any]] = []
        token = ""
        while True:
            query = {"limit": str(page_size)}
            if label_selector:
                query["labelSelector"] = label_selector
            if token:
                query["continue"] = token
            body = self.api.request("GET", lease_path(namespace), query=query,
                                    timeout=timeout).body
            items.extend(body.get("items", []))
            token = str(body.get("metadata", {}).get("continue") or "")
            if not token:
                return items

    def events_for(self, observed: Observed, timeout: float = DEFAULT_TIMEOUT
                   ) -> builtins.list[dict[str, Any]]:
        """The core/v1 Events about this very JobLease (name *and* uid), oldest first.

        Matching the uid too keeps Events of an earlier, deleted JobLease of the same name
        (which live on for the Event TTL, an hour by default) out of its successor's story.
        """
        selector = (f"involvedObject.name={observed.name},involvedObject.uid={observed.uid},"
                    f"involvedObject.kind={KIND}")
        body = self.api.request("GET", f"/api/v1/namespaces/{observed.namespace}/events",
                                query={"fieldSelector": selector}, timeout=timeout).body
        events: builtins.list[dict[str, Any]] = body.get("items", [])
        return sorted(events, key=event_time)

    def create(self, namespace: str, name: str, spec: dict[str, Any] | None = None,
               labels: dict[str, str] | None = None) -> Observed:
        """Create a JobLease (tests, demo and CLI convenience; users normally `kubectl apply`)."""
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                "metadata": {"name": name, "labels": labels or {}}, "spec": spec or {}}
        return Observed.from_object(self.api.request("POST", lease_path(namespace), body).body)

    def write_status(self, observed: Observed, status: LeaseStatus,
                     timeout: float = DEFAULT_TIMEOUT) -> Observed:
        """Write ``status`` only if the object is still at ``observed.resource_version``.

        A merge patch carrying ``metadata.resourceVersion`` is a compare-and-swap: the API
        server answers 409 (``ConflictError``) if anyone wrote in between. Because it can
        only apply to ``observed`` itself, it carries only the fields that change.

        Raises:
            LeaseNotFoundError: the object is gone (404).
        """
        changes = (status.changes_since(observed.status) if observed.has_status
                   else status.to_dict())
        patch = {"metadata": {"resourceVersion": observed.resource_version}, "status": changes}
        path = lease_path(observed.namespace, observed.name, "status")
        try:
            body = self.api.request("PATCH", path, patch, content_type=MERGE_PATCH,
                                    timeout=timeout).body
        except NotFoundError as err:
            raise LeaseNotFoundError(observed.name, observed.namespace) from err
        return Observed.from_object(body)

    def delete_if_unchanged(self, observed: Observed) -> None:
        """Delete only the exact version decided from (uid and resourceVersion preconditions)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1",
                "preconditions": {"uid": observed.uid,
                                  "resourceVersion": observed.resource_version}}
        self.api.request("DELETE", lease_path(observed.namespace, observed.name), body)

    def post_event(self, observed: Observed, type_: str, reason: str, message: str,
                   component: str = "joblease-operator") -> None:
        """Post a core/v1 Event about a JobLease (visible in `kubectl describe jl`)."""
        now = format_time(self.api.server_now().midpoint)  # the server clock, as everywhere
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{observed.name}.", "namespace": observed.namespace},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                               "name": observed.name, "namespace": observed.namespace,
                               "uid": observed.uid},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": component, "host": socket.gethostname()},
            "reportingComponent": component,
            "reportingInstance": f"{socket.gethostname()}-{os.getpid()}",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        self.api.request("POST", f"/api/v1/namespaces/{observed.namespace}/events", body)


def event_time(event: dict[str, Any]) -> str:
    """When an Event last happened, as an RFC 3339 string that sorts in time order.

    Events written through events.k8s.io carry ``eventTime`` (and a ``series``) rather than
    ``lastTimestamp``; core/v1 ones the other way round. Both are UTC with a ``Z``.
    """
    series = event.get("series") or {}
    return str(series.get("lastObservedTime") or event.get("lastTimestamp")
               or event.get("eventTime") or event.get("firstTimestamp")
               or event.get("metadata", {}).get("creationTimestamp") or "")
