"""An in-memory JobLease store with the API server's compare-and-swap, for pure tests.

It is *not* proof of an API-server property (tests/cluster/ is); it lets the operator's
and the SDK's real code run without a server so that failures can be injected exactly:
404s, lost answers, exceptions of any type.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.errors import LeaseNotFoundError
from joblease.domain.lease import LeaseSpec, LeaseStatus, Observed
from joblease.kube.api import ConflictError

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


class FakeApi:
    """A server clock that is exactly ``T0 + now`` seconds, and a settable monotonic clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.clock = ServerClock()
        self.clock.observe(0.0, 0.0, int(T0.timestamp()))

    def server_now(self) -> ServerNow:
        return ServerNow.exact(T0 + timedelta(seconds=self.now))

    def monotonic(self) -> float:
        return self.now


class MemoryStore:
    """JobLeases in memory; ``fail`` may inject an exception before a write."""

    def __init__(self, leases: list[Observed] = ()) -> None:  # type: ignore[assignment]
        self.api = FakeApi()
        self.objects = {o.name: o for o in leases}
        self.writes: list[tuple[str, str]] = []
        self.fail: Callable[[Observed, LeaseStatus], None] | None = None
        self.lock = threading.Lock()

    def create(self, name: str, spec: LeaseSpec | None = None, rv: int = 10) -> Observed:
        obs = Observed("ns", name, f"uid-{name}-{rv}", str(rv), 1, spec or LeaseSpec(),
                       LeaseStatus(), has_status=False)
        self.objects[name] = obs
        return obs

    def get(self, namespace: str, name: str, timeout: float = 10.0) -> Observed:
        try:
            return self.objects[name]
        except KeyError:
            raise LeaseNotFoundError(name, namespace) from None

    def write_status(self, observed: Observed, status: LeaseStatus,
                     timeout: float = 10.0) -> Observed:
        if self.fail is not None:
            self.fail(observed, status)
        with self.lock:
            current = self.get(observed.namespace, observed.name)
            if current.resource_version != observed.resource_version:
                raise ConflictError(409, "Conflict", "the object has been modified")
            stored = LeaseStatus.from_dict(_json(status.to_dict()))
            new = replace(current, resource_version=str(int(current.resource_version) + 1),
                          status=stored, has_status=True)
            self.objects[observed.name] = new
            self.writes.append((observed.name, threading.current_thread().name))
            return new

    def delete_if_unchanged(self, observed: Observed) -> None:
        with self.lock:
            self.objects.pop(observed.name, None)


def _json(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}
