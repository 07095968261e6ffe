"""JobLease objects on the API server: read, conditional status write, delete, Events.

The requests the protocol makes (read one, write its status conditionally, create, list a
pool, watch it) are described once, as :class:`LeaseCall` values built by pure functions,
and sent by either :class:`LeaseStore` (thread-safe ``KubeApi``) or
``joblease.kube.aioleases.AsyncLeaseStore`` (asyncio): both clients send the same
merge patch with the same ``resourceVersion`` precondition and read the answer the same way.
"""

from __future__ import annotations

import builtins
import os
import socket
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from joblease.domain.errors import LeaseNotFoundError
from joblease.domain.lease import LeaseStatus, Observed
from joblease.domain.time import format_time
from joblease.kube.api import (
    DEFAULT_TIMEOUT,
    MERGE_PATCH,
    ApiError,
    ConflictError,
    InvalidError,
    NotFoundError,
)
from joblease.kube.requests import JSON_PATCH, Response
from joblease.kube.transport import Transport

GROUP = "joblease.dev"
VERSION = "v1alpha1"
PLURAL = "jobleases"
KIND = "JobLease"

T = TypeVar("T")


def lease_path(namespace: str | None, name: str | None = None, subresource: str = "") -> str:
    """URL path of the JobLease collection, one object, or its subresource."""
    base = f"/apis/{GROUP}/{VERSION}"
    base += f"/namespaces/{namespace}/{PLURAL}" if namespace else f"/{PLURAL}"
    if name:
        base += f"/{name}"
    if subresource:
        base += f"/{subresource}"
    return base


@dataclass(frozen=True)
class LeaseCall(Generic[T]):
    """One request about JobLeases and how to read its answer, for any transport.

    Attributes:
        method, path, body, query, content_type: The request (``KubeApi.request``'s arguments).
        parse: Turns the decoded answer into the caller's value.
        lease: ``(namespace, name)`` when a 404 means "no such JobLease"
            (``LeaseNotFoundError``, a protocol error) rather than a plain ``NotFoundError``.
    """

    method: str
    path: str
    parse: Callable[[dict[str, Any]], T]
    body: Any = None
    query: dict[str, str] | None = None
    content_type: str | None = None
    lease: tuple[str, str] | None = None
    vouched: bool = False

    def refusal(self, err: ApiError) -> Exception:
        """What a refusal of this call means: ``err`` itself unless it says more here.

        A 404 to a call about one JobLease is ``LeaseNotFoundError``. A 422 to a write
        decided from a version it was told (``Observed.vouched``) is a ``ConflictError``:
        a ``test`` failed, so the object is not as the decision believed — read it and
        decide again, as after any other lost compare-and-swap.
        """
        if isinstance(err, NotFoundError) and self.lease is not None:
            namespace, name = self.lease
            return LeaseNotFoundError(name, namespace)
        if isinstance(err, InvalidError) and self.vouched:
            return ConflictError(err.status, "Conflict", f"{self.path}: the version a "
                                 f"proposal told is not the object's ({err.message})")
        return err


@dataclass(frozen=True)
class Page:
    """One page of a list.

    Attributes:
        items: The objects, raw.
        resource_version: The list's resourceVersion, where a watch resumes.
        next_token: The ``continue`` token of the next page (empty on the last).
    """

    items: builtins.list[dict[str, Any]]
    resource_version: str
    next_token: str


def read_call(namespace: str, name: str) -> LeaseCall[Observed]:
    """Read one JobLease."""
    return LeaseCall("GET", lease_path(namespace, name), Observed.from_object,
                     lease=(namespace, name))


def status_write_call(observed: Observed, status: LeaseStatus) -> LeaseCall[Observed]:
    """Write ``status`` only if the object is still at ``observed.resource_version``.

    A merge patch carrying ``metadata.resourceVersion`` is a compare-and-swap: the API
    server answers 409 (``ConflictError``) if anyone wrote in between. Because it can only
    apply to ``observed`` itself, it carries only the fields that change.
    """
    changes = (status.changes_since(observed.status) if observed.has_status
               else status.to_dict())
    path = lease_path(observed.namespace, observed.name, "status")
    if observed.vouched:
        return LeaseCall("PATCH", path, Observed.from_object,
                         body=vouched_patch(observed, changes), content_type=JSON_PATCH,
                         lease=(observed.namespace, observed.name), vouched=True)
    patch = {"metadata": {"resourceVersion": observed.resource_version}, "status": changes}
    return LeaseCall("PATCH", path, Observed.from_object, body=patch,
                     content_type=MERGE_PATCH, lease=(observed.namespace, observed.name))


def vouched_patch(observed: Observed, changes: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch writing ``changes`` to ``status`` only where ``observed.vouched`` holds.

    ``test`` operations first: the API server applies the whole patch to the object it has
    or refuses it (422), atomically, and again on each of its own retries, so a test of
    ``metadata.resourceVersion`` is the same compare-and-swap as the merge patch's
    precondition, and the other tests check what the decision took on trust.
    """
    ops: list[dict[str, Any]] = [{"op": "test", "path": pointer, "value": value}
                                 for pointer, value in observed.vouched]
    if not observed.has_status:
        ops.append({"op": "add", "path": "/status",
                    "value": {k: v for k, v in changes.items() if v is not None}})
        return ops
    for key, value in changes.items():
        if value is None:
            ops.append({"op": "remove", "path": f"/status/{key}"})
        else:
            ops.append({"op": "add", "path": f"/status/{key}", "value": value})
    return ops


def create_call(namespace: str, name: str, spec: dict[str, Any] | None = None,
                labels: dict[str, str] | None = None) -> LeaseCall[Observed]:
    """Create a JobLease (tests, demo and CLI convenience; users normally `kubectl apply`)."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": name, "labels": labels or {}}, "spec": spec or {}}
    return LeaseCall("POST", lease_path(namespace), Observed.from_object, body=body)


def list_call(namespace: str | None, label_selector: str | None = None,
              page_size: int = 500, token: str = "", field_selector: str | None = None
              ) -> LeaseCall[Page]:
    """One page of the JobLeases matching the selectors (``token``: the page to read)."""
    query = {"limit": str(page_size)}
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    if token:
        query["continue"] = token
    return LeaseCall("GET", lease_path(namespace), _page, query=query)


LeaseCalls = Generator[LeaseCall[Any], Any, T]
"""A read of several requests as a sans-IO loop: it yields each :class:`LeaseCall` and
receives its parsed answer. ``LeaseStore.run`` and ``AsyncLeaseStore.run`` perform it, so
the thread and the asyncio client page through a list with the same code."""


def object_call(namespace: str, name: str) -> LeaseCall[dict[str, Any]]:
    """Read one JobLease as the API server returns it (metadata, spec and status), for displays.

    A 404 is ``LeaseNotFoundError``, as for :func:`read_call`.
    """
    return LeaseCall("GET", lease_path(namespace, name), dict, lease=(namespace, name))


def events_call(observed: EventSubject) -> LeaseCall[builtins.list[dict[str, Any]]]:
    """The core/v1 Events about this very JobLease (name *and* uid), oldest first.

    Matching the uid too keeps Events of an earlier, deleted JobLease of the same name
    (which live on for the Event TTL, an hour by default) out of its successor's story.
    """
    selector = (f"involvedObject.name={observed.name},involvedObject.uid={observed.uid},"
                f"involvedObject.kind={KIND}")
    return LeaseCall("GET", f"/api/v1/namespaces/{observed.namespace}/events", _events,
                     query={"fieldSelector": selector})


def _events(body: dict[str, Any]) -> builtins.list[dict[str, Any]]:
    return sorted(body.get("items") or [], key=event_time)


def list_objects_calls(namespace: str | None, label_selector: str | None = None,
                       field_selector: str | None = None, page_size: int = 500
                       ) -> LeaseCalls[builtins.list[dict[str, Any]]]:
    """Every JobLease object (raw) matching both selectors, a page of ``page_size`` at a time.

    Pages keep one huge namespace from becoming one huge response; the API server's
    ``continue`` token stitches them into one consistent snapshot.
    """
    items: builtins.list[dict[str, Any]] = []
    token = ""
    while True:
        page: Page = yield list_call(namespace, label_selector, page_size, token,
                                     field_selector)
        items.extend(page.items)
        token = page.next_token
        if not token:
            return items


def _page(body: dict[str, Any]) -> Page:
    meta = body.get("metadata") or {}
    return Page(list(body.get("items") or []), str(meta.get("resourceVersion") or ""),
                str(meta.get("continue") or ""))


class EventSubject(Protocol):
    """What an Event names of its JobLease (an ``Observed`` has it; so has a queued Event)."""

    @property
    def namespace(self) -> str:
        """The JobLease's namespace."""

    @property
    def name(self) -> str:
        """The JobLease's name."""

    @property
    def uid(self) -> str:
        """The JobLease's uid (the Event's ``involvedObject``)."""


class LeaseStore:
    """JobLease objects through one transport (``KubeApi``: one identity, one clock estimate).

    Args:
        api: The transport every request goes through.
        on_conflict: Called on every 409 the API server answers (then the ``ConflictError``
            propagates as before). The operator counts its conflicts with it
            (``joblease_operator_conflicts_total``): every request of the store goes through
            :meth:`_send`, so no write — a status compare-and-swap in ``transact`` or a
            conditional TTL delete — can meet a 409 uncounted.
    """

    def __init__(self, api: Transport, on_conflict: Callable[[], None] | None = None) -> None:
        self.api = api
        self._on_conflict = on_conflict

    def _send(self, method: str, path: str, body: Any = None, *,
              query: dict[str, str] | None = None, content_type: str | None = None,
              timeout: float = DEFAULT_TIMEOUT) -> Response:
        """Send one request; report a 409 to ``on_conflict`` before it propagates."""
        try:
            return self.api.request(method, path, body, query=query,
                                    content_type=content_type, timeout=timeout)
        except ConflictError:
            if self._on_conflict is not None:
                self._on_conflict()
            raise

    def get(self, namespace: str, name: str, timeout: float = DEFAULT_TIMEOUT) -> Observed:
        """Read one JobLease.

        Raises:
            LeaseNotFoundError: it does not exist.
        """
        return self.call(read_call(namespace, name), timeout)

    def call(self, call: LeaseCall[T], timeout: float = DEFAULT_TIMEOUT) -> T:
        """Send one :class:`LeaseCall` and read its answer.

        Raises:
            LeaseNotFoundError: a 404 for a call about one JobLease.
            ApiError: any other refusal; ``UnavailableError`` for no answer.
        """
        try:
            body = self._send(call.method, call.path, call.body, query=call.query,
                              content_type=call.content_type, timeout=timeout).body
        except (NotFoundError, InvalidError) as err:
            meant = call.refusal(err)
            if meant is err:
                raise
            raise meant from err
        return call.parse(body)

    def list(self, namespace: str | None = None) -> list[Observed]:
        """List JobLeases in one namespace, or in all."""
        items = self._send("GET", lease_path(namespace)).body.get("items", [])
        return [Observed.from_object(item) for item in items]

    def run(self, calls: LeaseCalls[T], timeout: float = DEFAULT_TIMEOUT) -> T:
        """Perform a sans-IO read of several requests (:data:`LeaseCalls`) to its end."""
        answer: Any = None
        while True:
            try:
                call = calls.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            answer = self.call(call, timeout)

    def get_object(self, namespace: str, name: str, timeout: float = DEFAULT_TIMEOUT
                   ) -> dict[str, Any]:
        """One JobLease as stored (:func:`object_call`).

        Raises:
            LeaseNotFoundError: it does not exist.
        """
        return self.call(object_call(namespace, name), timeout)

    def list_objects(self, namespace: str | None = None, label_selector: str | None = None,
                     page_size: int = 500, timeout: float = DEFAULT_TIMEOUT,
                     field_selector: str | None = None) -> builtins.list[dict[str, Any]]:
        """Every JobLease object (raw, with metadata) matching the selectors, paginated.

        Raw objects, not ``Observed``: an overview needs metadata the protocol does not
        (labels, ``creationTimestamp``). See :func:`list_objects_calls`.
        """
        return self.run(list_objects_calls(namespace, label_selector, field_selector,
                                           page_size), timeout)

    def count(self, namespace: str | None, label_selector: str | None = None,
              field_selector: str | None = None, page_size: int = 500,
              timeout: float = DEFAULT_TIMEOUT) -> int:
        """How many JobLeases match both selectors (paged; only the matches travel).

        ``joblease work --until-empty`` counts the Failed jobs of its selector this way
        (``status.phase=Failed``, a selectable field): a full list of a 10,000-job batch
        took 31.7 s at its exit (issue 22).
        """
        return len(self.list_objects(namespace, label_selector, page_size, timeout,
                                     field_selector))

    def events_for(self, observed: EventSubject, timeout: float = DEFAULT_TIMEOUT
                   ) -> builtins.list[dict[str, Any]]:
        """The core/v1 Events about this very JobLease, oldest first (:func:`events_call`)."""
        return self.call(events_call(observed), timeout)

    def create(self, namespace: str, name: str, spec: dict[str, Any] | None = None,
               labels: dict[str, str] | None = None) -> Observed:
        """Create a JobLease (tests, demo and CLI convenience; users normally `kubectl apply`)."""
        return self.call(create_call(namespace, name, spec, labels))

    def write_status(self, observed: Observed, status: LeaseStatus,
                     timeout: float = DEFAULT_TIMEOUT) -> Observed:
        """Write ``status`` only if the object is still at ``observed.resource_version``.

        The compare-and-swap of :func:`status_write_call`.

        Raises:
            LeaseNotFoundError: the object is gone (404).
            ConflictError: someone wrote in between (409): read and decide again.
        """
        return self.call(status_write_call(observed, status), timeout)

    def delete_if_unchanged(self, observed: Observed) -> None:
        """Delete only the exact version decided from (uid and resourceVersion preconditions).

        Raises:
            ConflictError: the object changed since ``observed`` (409): decide again.
        """
        body = {"kind": "DeleteOptions", "apiVersion": "v1",
                "preconditions": {"uid": observed.uid,
                                  "resourceVersion": observed.resource_version}}
        self._send("DELETE", lease_path(observed.namespace, observed.name), body)

    def post_event(self, observed: EventSubject, type_: str, reason: str, message: str,
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
        self._send("POST", f"/api/v1/namespaces/{observed.namespace}/events", body)


def event_time(event: dict[str, Any]) -> str:
    """When an Event last happened, as an RFC 3339 string that sorts in time order.

    Events written through events.k8s.io carry ``eventTime`` (and a ``series``) rather than
    ``lastTimestamp``; core/v1 ones the other way round. Both are UTC with a ``Z``.
    """
    series = event.get("series") or {}
    return str(series.get("lastObservedTime") or event.get("lastTimestamp")
               or event.get("eventTime") or event.get("firstTimestamp")
               or event.get("metadata", {}).get("creationTimestamp") or "")
