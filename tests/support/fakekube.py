"""An in-memory stand-in for the API server, behind the product's own ``LeaseStore``.

Why not a fake ``LeaseStore``: the fuzz and mutation tests want the real store and the
real ``transact`` to run — the merge patch built from ``changes_since``, the
``resourceVersion`` precondition, ``Observed.from_object`` on what comes back — so only
the HTTP layer (``KubeApi.request``) is replaced. What it does, as the API server does:

* GET of one JobLease returns the stored JSON; a missing one raises ``NotFoundError``;
* PATCH of ``/status`` with ``application/merge-patch+json`` applies RFC 7386 (``null``
  deletes, objects merge, anything else replaces) if ``metadata.resourceVersion`` matches,
  else raises ``ConflictError`` (409); every write takes the next global revision;
* DELETE honours the ``uid`` and ``resourceVersion`` preconditions (409 otherwise);
* POST of an Event records it.

It checks neither the schema nor the CEL rules (the cluster tests do); tests that need a
refusal use :attr:`FakeKubeApi.refuse_next`. Time is a fixed, settable ``ServerNow``.
"""

from __future__ import annotations

import copy
import itertools
import threading
from datetime import UTC, datetime
from typing import Any

from joblease.domain.clock import ServerClock, ServerNow
from joblease.kube.api import ApiError, ConflictError, NotFoundError, Response

T_NOW = datetime(2026, 12, 3, 12, 0, 10, tzinfo=UTC)
PRESENCE_PREFIX = "/apis/coordination.k8s.io/"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class FakeKubeApi:
    """The part of ``KubeApi`` that ``LeaseStore``, ``transact`` and the reconciler use."""

    def __init__(self, now: ServerNow | None = None, first_revision: int = 100) -> None:
        self.now = now or ServerNow.exact(T_NOW)
        self.clock = ServerClock()  # for the SDK's local deadline: server time at monotonic 0
        self.clock.observe(0.0, 0.0, int(self.now.earliest.timestamp()))
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.request_clock: list[float] = []  # the monotonic clock when each request went out
        self.refuse_next: list[ApiError] = []  # raised (in order) by the next writes
        # coordination.k8s.io Leases (pool presence records), kept apart from the JobLeases
        # so that tests counting JobLease requests see only those
        self.presence: dict[tuple[str, str], dict[str, Any]] = {}
        self.presence_requests: list[tuple[str, str]] = []
        self._revision = itertools.count(first_revision)
        self._lock = threading.Lock()
        self._monotonic = 0.0

    # -- KubeApi surface ------------------------------------------------------------------

    def server_now(self) -> ServerNow:
        return self.now

    def monotonic(self) -> float:
        self._monotonic += 0.001
        return self._monotonic

    def request(self, method: str, path: str, body: Any = None, *,
                query: dict[str, str] | None = None, content_type: str | None = None,
                timeout: float = 10.0) -> Response:
        with self._lock:
            if path.startswith(PRESENCE_PREFIX):
                self.presence_requests.append((method, path))
                result = self._presence(method, path, body, query)
                return Response(200, copy.deepcopy(result), 0.0, 0.0)
            self.requests.append((method, path))
            self.request_clock.append(self._monotonic)
            result = self._handle(method, path, body, content_type, query)
            return Response(200, copy.deepcopy(result), 0.0, 0.0)

    # -- test helpers ---------------------------------------------------------------------

    def next_revision(self) -> str:
        return str(next(self._revision))

    def put_object(self, obj: dict[str, Any], *, keep_revision: bool = False) -> dict[str, Any]:
        """Store ``obj`` as if created (a fresh resourceVersion unless ``keep_revision``)."""
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        if not keep_revision:
            meta["resourceVersion"] = self.next_revision()
        meta.setdefault("namespace", "ns")
        meta.setdefault("uid", f"uid-{meta['name']}")
        self.objects[(meta["namespace"], meta["name"])] = stored
        return copy.deepcopy(stored)

    def stored(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((namespace, name)))

    # -- the "server" ---------------------------------------------------------------------

    def _presence(self, method: str, path: str, body: Any, query: dict[str, str] | None
                  ) -> Any:
        """coordination.k8s.io/v1 Leases: create, get, merge-patch, delete, list by one label.

        As the API server: a create of an existing name is 409 AlreadyExists; a patch or a
        delete naming a ``resourceVersion`` (in ``metadata``, or the delete's
        ``preconditions``) other than the stored one is 409; every write takes the next
        revision.
        """
        parts = path.strip("/").split("/")
        namespace = parts[4]
        if method == "GET" and len(parts) == 6:
            selector = (query or {}).get("labelSelector") or ""
            name = ((query or {}).get("fieldSelector") or "").removeprefix("metadata.name=")
            items = [obj for (ns, n), obj in self.presence.items() if ns == namespace
                     and _labels_match(selector, obj["metadata"].get("labels") or {})
                     and (not name or n == name)]
            return {"items": items, "metadata": {"resourceVersion": self.next_revision()}}
        if method == "POST":
            name = body["metadata"]["name"]
            if (namespace, name) in self.presence:
                raise ConflictError(409, "AlreadyExists", f"leases {name!r} already exists")
            stored = {**copy.deepcopy(body), "metadata": {
                **body["metadata"], "namespace": namespace,
                "resourceVersion": self.next_revision()}}
            self.presence[(namespace, name)] = stored
            return stored
        key = (namespace, parts[6])
        if key not in self.presence:
            raise NotFoundError(404, "NotFound", f"leases {parts[6]!r} not found")
        if method == "GET":
            return self.presence[key]
        stored_version = self.presence[key]["metadata"].get("resourceVersion")
        wanted = ((body or {}).get("preconditions") if method == "DELETE"
                  else (body or {}).get("metadata")) or {}
        if wanted.get("resourceVersion") not in (None, stored_version):
            raise ConflictError(409, "Conflict", "the object has been modified")
        if method == "DELETE":
            return self.presence.pop(key)
        patched = merge_patch(self.presence[key], body)
        patched["metadata"]["resourceVersion"] = self.next_revision()
        self.presence[key] = patched
        return self.presence[key]

    def _handle(self, method: str, path: str, body: Any, content_type: str | None,
                query: dict[str, str] | None = None) -> Any:
        parts = path.strip("/").split("/")
        if method == "POST" and parts[-1] == "events":
            self.events.append(copy.deepcopy(body))
            return body
        if method == "GET" and parts[-1] == "events":
            return {"items": self._events_about(parts[3], (query or {}).get("fieldSelector"))}
        if method == "GET" and parts[-1] == "jobleases":
            return self._list(parts[4] if len(parts) == 6 else None, query or {})
        # /apis/joblease.dev/v1alpha1/namespaces/NS/jobleases/NAME[/status]
        namespace, name = parts[4], parts[6]
        key = (namespace, name)
        current = self.objects.get(key)
        if current is None:
            raise NotFoundError(404, "NotFound", f"jobleases {name!r} not found")
        if method == "GET":
            return current
        if self.refuse_next:
            raise self.refuse_next.pop(0)
        if method == "PATCH":
            assert parts[-1] == "status", path
            assert content_type == "application/merge-patch+json", content_type
            wanted = body["metadata"]["resourceVersion"]
            if wanted != current["metadata"]["resourceVersion"]:
                raise ConflictError(409, "Conflict", "the object has been modified")
            new = merge_patch(current, {"status": body["status"]})
            if new.get("status") is None:
                new.pop("status", None)
            new["metadata"]["resourceVersion"] = self.next_revision()
            self.objects[key] = new
            return new
        if method == "DELETE":
            pre = body["preconditions"]
            meta = current["metadata"]
            if pre["uid"] != meta["uid"] or pre["resourceVersion"] != meta["resourceVersion"]:
                raise ConflictError(409, "Conflict", "precondition failed")
            del self.objects[key]
            return {"status": "Success"}
        raise AssertionError(f"unexpected request {method} {path}")


    def _events_about(self, namespace: str, field_selector: str | None) -> list[dict[str, Any]]:
        """Posted Events of ``namespace`` matching ``involvedObject.*=…`` terms."""
        wanted = dict(term.split("=", 1) for term in (field_selector or "").split(",") if term)
        return [copy.deepcopy(e) for e in self.events
                if e["metadata"].get("namespace", namespace) == namespace
                and all(str(e["involvedObject"].get(k.removeprefix("involvedObject."))) == v
                        for k, v in wanted.items())]

    def _list(self, namespace: str | None, query: dict[str, str]) -> dict[str, Any]:
        """A page of JobLeases: ``key=value`` label terms; terms on the selectable fields
        (``=`` or ``!=``, an absent field being "") as field selector; ``limit``.

        The ``continue`` token is the offset of the next page in name order.
        """
        labels = dict(t.split("=", 1) for t in query.get("labelSelector", "").split(",") if t)
        terms = [t for t in query.get("fieldSelector", "").split(",") if t]
        matching = [obj for (ns, n), obj in sorted(self.objects.items())
                    if namespace in (None, ns)
                    and all(obj["metadata"].get("labels", {}).get(k) == v
                            for k, v in labels.items())
                    and all(_field_matches(obj, term) for term in terms)]
        start, limit = int(query.get("continue") or 0), int(query.get("limit") or 500)
        rest = start + limit < len(matching)
        return {"items": matching[start:start + limit],
                "metadata": {"resourceVersion": self.next_revision(),
                             "continue": str(start + limit) if rest else ""}}


def _field_matches(obj: dict[str, Any], term: str) -> bool:
    """One field-selector term (the JobLease's selectable fields; ``=`` or ``!=``)."""
    negated = "!=" in term
    key, value = term.split("!=" if negated else "=", 1)
    status, dispatch = obj.get("status") or {}, (obj.get("spec") or {}).get("dispatch") or {}
    enabled = dispatch.get("enabled")
    fields = {"metadata.name": obj["metadata"].get("name", ""),
              "status.phase": status.get("phase", ""), "status.holder": status.get("holder", ""),
              "spec.dispatch.enabled": "" if enabled is None else str(enabled).lower()}
    if key not in fields:
        raise ValueError(f"the fake lists by {sorted(fields)} only, not {key}")
    return (fields[key] == value) != negated


def lease_object(name: str, status: dict[str, Any] | None = None, namespace: str = "ns",
                 **spec: Any) -> dict[str, Any]:
    """A JobLease object as the API server returns it (spec defaults applied)."""
    obj: dict[str, Any] = {
        "apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "resourceVersion": "1", "generation": 1},
        "spec": {"leaseDurationSeconds": 30, **spec},
    }
    if status is not None:
        obj["status"] = status
    return obj


def transact_via_async(store: Any, namespace: str, name: str, decide: Any, **kwargs: Any
                       ) -> Any:
    """``transact``'s signature, performed by the asyncio client's driver in a fresh loop.

    The same loop (``joblease.core.transaction``) through ``joblease.core.asteps`` — the
    ``AsyncPort`` and ``AsyncLeaseStore`` the asyncio client uses — over the same in-memory
    server, clock and faults the test gives ``transact``: each test pins both drivers.
    """
    import asyncio

    from joblease.core.asteps import AsyncPort, adrive
    from joblease.core.transaction import transaction
    from joblease.kube.aioleases import AsyncLeaseStore

    api = AsyncFakeKubeApi(store.api)
    steps = transaction(namespace, name, decide, api.monotonic, **kwargs)
    return asyncio.run(adrive(steps, AsyncPort(AsyncLeaseStore(api))))  # type: ignore[arg-type]


class AsyncFakeKubeApi:
    """``AsyncKubeApi``'s surface over a ``FakeKubeApi``: the same objects, clock and faults.

    The asyncio client's in-memory API server (issue 23, item 3): every request goes to the
    wrapped sync fake, so a test can drive ``AsyncLeaseClient`` and ``LeaseClient`` against
    one store and compare, and set ``refuse_next``, ``now`` or ``objects`` on ``sync``.
    """

    def __init__(self, sync: FakeKubeApi) -> None:
        self.sync = sync

    @property
    def clock(self) -> ServerClock:
        return self.sync.clock

    def monotonic(self) -> float:
        return float(self.sync.monotonic())

    async def server_now(self) -> ServerNow:
        return self.sync.server_now()

    async def calibrate(self, max_seconds: float = 1.5, target_error: float = 0.01) -> float:
        return 0.0

    async def whoami(self) -> str:
        return str(self.sync.whoami())  # type: ignore[attr-defined]

    async def request(self, method: str, path: str, body: Any = None, *,
                      query: dict[str, str] | None = None, content_type: str | None = None,
                      timeout: float = 10.0) -> Response:
        return self.sync.request(method, path, body, query=query, content_type=content_type,
                                 timeout=timeout)

    async def close(self) -> None:
        pass


def _labels_match(selector: str, labels: dict[str, str]) -> bool:
    """Whether ``labels`` match a selector of ``key=value`` and ``key!=value`` terms."""
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, _, value = term.partition("!=")
            if labels.get(key) == value:
                return False
        else:
            key, _, value = term.partition("=")
            if labels.get(key) != value:
                return False
    return True
