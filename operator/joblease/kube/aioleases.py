"""JobLease objects through the asyncio client: the same calls as ``LeaseStore``, awaited.

Every request is one of ``joblease.kube.leases``' :class:`~joblease.kube.leases.LeaseCall`
values — the read, the conditional status write (merge patch with the ``resourceVersion``
precondition), create, a pool's list page — so the asyncio SDK writes exactly what the
thread-based one writes. A pool's list and watch are ``joblease.core.feed``'s, sent as
``Call`` and ``Watch`` steps.
"""

from __future__ import annotations

from typing import Any, TypeVar

from joblease.domain.lease import LeaseStatus, Observed
from joblease.kube.api import DEFAULT_TIMEOUT, InvalidError, NotFoundError
from joblease.kube.leases import (
    EventSubject,
    LeaseCall,
    LeaseCalls,
    create_call,
    events_call,
    list_objects_calls,
    object_call,
    read_call,
    status_write_call,
)
from joblease.kube.transport import AsyncTransport

T = TypeVar("T")


class AsyncLeaseStore:
    """JobLease objects through one ``AsyncKubeApi`` (one identity, one server-clock estimate)."""

    def __init__(self, api: AsyncTransport) -> None:
        self.api = api

    async def call(self, call: LeaseCall[T], timeout: float = DEFAULT_TIMEOUT) -> T:
        """Send one :class:`LeaseCall` and read its answer.

        Raises:
            LeaseNotFoundError: a 404 for a call about one JobLease.
            ApiError: any other refusal; ``UnavailableError`` for no answer.
        """
        try:
            response = await self.api.request(call.method, call.path, call.body,
                                              query=call.query,
                                              content_type=call.content_type, timeout=timeout)
        except (NotFoundError, InvalidError) as err:
            meant = call.refusal(err)
            if meant is err:
                raise
            raise meant from err
        return call.parse(response.body)

    async def run(self, calls: LeaseCalls[T], timeout: float = DEFAULT_TIMEOUT) -> T:
        """Perform a sans-IO read of several requests (``LeaseCalls``) to its end."""
        answer: Any = None
        while True:
            try:
                call = calls.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            answer = await self.call(call, timeout)

    async def get_object(self, namespace: str, name: str, timeout: float = DEFAULT_TIMEOUT
                         ) -> dict[str, Any]:
        """One JobLease as stored (``object_call``).

        Raises:
            LeaseNotFoundError: it does not exist.
        """
        return await self.call(object_call(namespace, name), timeout)

    async def list_objects(self, namespace: str | None = None,
                           label_selector: str | None = None, page_size: int = 500,
                           timeout: float = DEFAULT_TIMEOUT, field_selector: str | None = None
                           ) -> list[dict[str, Any]]:
        """Every JobLease object (raw) matching the selectors, paginated (as ``LeaseStore``)."""
        return await self.run(list_objects_calls(namespace, label_selector, field_selector,
                                                 page_size), timeout)

    async def events_for(self, observed: EventSubject, timeout: float = DEFAULT_TIMEOUT
                         ) -> list[dict[str, Any]]:
        """The core/v1 Events about this very JobLease, oldest first (``events_call``)."""
        return await self.call(events_call(observed), timeout)

    async def get(self, namespace: str, name: str, timeout: float = DEFAULT_TIMEOUT
                  ) -> Observed:
        """Read one JobLease.

        Raises:
            LeaseNotFoundError: it does not exist.
        """
        return await self.call(read_call(namespace, name), timeout)

    async def write_status(self, observed: Observed, status: LeaseStatus,
                           timeout: float = DEFAULT_TIMEOUT) -> Observed:
        """Write ``status`` only if the object is still at ``observed.resource_version``.

        Raises:
            LeaseNotFoundError: the object is gone (404).
            ConflictError: someone wrote in between (409): read and decide again.
        """
        return await self.call(status_write_call(observed, status), timeout)

    async def create(self, namespace: str, name: str, spec: dict[str, Any] | None = None,
                     labels: dict[str, str] | None = None) -> Observed:
        """Create a JobLease (tests and examples; users normally `kubectl apply`)."""
        return await self.call(create_call(namespace, name, spec, labels))
