"""Work-pool test helpers: a scripted list+watch, jobs on the in-memory API server.

Shared by the pool tests of both clients (``tests/unit/test_sdk_pool.py``,
``tests/unit/test_pools.py``). ``ScriptedFeed`` stands in for the one feed
(``joblease.core.feed``; its own tests are ``tests/unit/test_kube_feed.py``), so each test
decides exactly which versions a pool's cache holds; the claims stay real.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.errors import format_time
from joblease.domain.lease import Observed
from support.fakekube import T_NOW, FakeKubeApi, lease_object


class ScriptedFeed:
    """``LeaseFeed``'s surface: lists the fake server's objects once, then waits for events.

    ``before_list`` is reported as trouble (and the list skipped) when set; ``crash`` is
    raised from ``run`` instead of listing (a bug in the feed's thread); with
    ``never_lists`` the feed runs but no list ever arrives. ``listed`` is set once the
    list step is over, whichever of these it was.
    """

    before_list: Exception | None = None
    crash: Exception | None = None
    never_lists = False
    fields: str | None = None  # the stream's extra field selector (a narrow scope's)

    def __init__(self, api: FakeKubeApi) -> None:
        self.api = api
        self.sink: Any = None
        self.listed = threading.Event()
        self.stopped = threading.Event()

    def run(self, sink: Any) -> None:
        self.list_step(sink)
        self.stopped.wait(30)

    def list_step(self, sink: Any) -> None:
        """The scripted start: crash, report trouble, list nothing, or list every object."""
        self.sink = sink
        try:
            if self.crash is not None:
                raise self.crash
            if self.before_list is not None:
                sink.trouble(self.before_list)
            elif not self.never_lists:
                sink.replace([Observed.from_object(o) for o in self.api.objects.values()],
                             str(max((int(o["metadata"]["resourceVersion"])
                                      for o in self.api.objects.values()), default=0)))
        finally:
            self.listed.set()

    def stop(self) -> None:
        self.stopped.set()

    def relist(self) -> None:
        """Run the list step again now (with ``never_lists`` cleared: a late first list)."""
        self.list_step(self.sink)

    def event(self, kind: str, name: str) -> None:
        """Deliver the fake server's current version of ``name`` as a watch event."""
        self.sink.apply(kind, Observed.from_object(self.api.stored("ns", name)))  # type: ignore[arg-type]


def server(*jobs: tuple[str, dict[str, Any] | None, dict[str, Any]],
           api: FakeKubeApi | None = None) -> FakeKubeApi:
    """A fake API server holding ``(name, status, spec)`` jobs, created one second apart."""
    api = api or FakeKubeApi()
    for i, (name, status, spec) in enumerate(jobs):
        obj = lease_object(name, status, **spec)
        obj["metadata"]["creationTimestamp"] = format_time(T_NOW + timedelta(seconds=i))
        api.put_object(obj)
    return api


def available(name: str, **spec: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    return name, {"phase": "Available", "generation": 0, "epoch": 1}, spec


def held_by_other(name: str, until: float, **extra: Any
                  ) -> tuple[str, dict[str, Any], dict[str, Any]]:
    status = {"phase": "Held", "holder": "other", "generation": 1, "epoch": 1,
              "claimId": "theirs", "leaseUntil": format_time(T_NOW + timedelta(seconds=until)),
              **extra.pop("status", {})}
    return name, status, extra


def writes(api: FakeKubeApi) -> list[tuple[str, str]]:
    return [(method, path.rsplit("/", 2)[-2] if path.endswith("/status") else
             path.rsplit("/", 1)[-1]) for method, path in api.requests]


class RealTimeApi(FakeKubeApi):
    """A fake server whose clock runs with this process's.

    Its monotonic clock starts at 0 when it is made; ``server_now`` is exact, and the
    earliest time of the estimate (``clock``, one ``Date`` of one-second resolution) is
    the same instant, so both pools judge the jobs at the server time the claims do.
    """

    def __init__(self) -> None:
        super().__init__()
        self.start = time.monotonic()
        self.clock = ServerClock()
        self.clock.observe(0.0, 0.0, int(T_NOW.timestamp()))  # T_NOW is a whole second

    def server_now(self) -> ServerNow:
        return ServerNow.exact(T_NOW + timedelta(seconds=self.monotonic()))

    def monotonic(self) -> float:
        return time.monotonic() - self.start
