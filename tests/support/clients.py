"""One test body, both clients: a blocking facade over ``LeaseClient`` or ``AsyncLeaseClient``.

Issue 23, item 3: every client test runs against the thread-based and the asyncio client.
:func:`client_over` returns a :class:`Client` whose methods look blocking; for ``"async"``
each call runs on one event loop in a thread of its own (:data:`LOOP`), so a pool's watch
task and a holding's renewer keep running between calls, as they would in a real program.
Results that are leases come back wrapped (:class:`LeaseView`) the same way.

Time: the sync client sleeps with ``time.sleep`` and the asyncio one with ``asyncio.sleep``;
:func:`fake_sleep` replaces both, so a test that moves the fake server's clock as the client
sleeps is written once.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from joblease.aio import AsyncLeaseClient
from joblease.sdk.client import LeaseClient
from support.fakekube import AsyncFakeKubeApi, FakeKubeApi

KINDS = ["sync", "async"]


class _Loop:
    """One asyncio loop in a daemon thread, for every asyncio client of the test process.

    Started on first use, and again in a forked child: a fork copies the loop object but
    not its thread, so a child that used the parent's loop waited for an answer no thread
    would ever give (``make mutate`` forks a worker per mutant; every asyncio test there
    hung until mutmut's timeout, and a timeout counts as a killed mutant).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """This process's loop, its thread started if this process has none yet."""
        if self._loop is None or self._pid != os.getpid():
            self._loop, self._pid = asyncio.new_event_loop(), os.getpid()
            threading.Thread(target=self._loop.run_forever, daemon=True,
                             name="test-clients-loop").start()
        return self._loop

    def run(self, awaitable: Any, timeout: float = 60.0) -> Any:
        async def wrapped() -> Any:
            return await awaitable
        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(timeout)


LOOP = _Loop()


def _blocking(value: Any) -> Any:
    return LOOP.run(value) if inspect.isawaitable(value) else value


def _wrap(value: Any) -> Any:
    if type(value).__name__ in ("Lease", "AsyncLease"):
        return LeaseView(value)
    return value


def _blocking_attribute(real: Any, name: str) -> Any:
    """``real``'s attribute; a method comes back blocking, its leases wrapped."""
    value = getattr(real, name)
    if not callable(value):
        return value

    def call(*args: Any, **kwargs: Any) -> Any:
        return _wrap(_blocking(value(*args, **kwargs)))
    return call


class LeaseView:
    """A lease of either client; its operations block; its attributes are the lease's."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __repr__(self) -> str:
        return repr(self.real)

    def __getattr__(self, name: str) -> Any:
        return _blocking_attribute(self.real, name)


class Client:
    """Either client, blocking. ``kind`` is ``"sync"`` or ``"async"``; ``api`` the fake."""

    def __init__(self, kind: str, api: FakeKubeApi, namespace: str = "ns",
                 **options: Any) -> None:
        self.kind, self.api = kind, api
        options.setdefault("calibrate", False)
        self.real: Any = (LeaseClient(namespace, api=api, **options)  # type: ignore[arg-type]
                          if kind == "sync" else
                          AsyncLeaseClient(namespace, api=AsyncFakeKubeApi(api),  # type: ignore[arg-type]
                                           **options))

    def __getattr__(self, name: str) -> Any:
        return _blocking_attribute(self.real, name)

    def close(self) -> None:
        _blocking(self.real.close())

    def _call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call one of the client's objects' methods (a pool's), blocking, leases wrapped."""
        return _wrap(_blocking(function(*args, **kwargs)))


def client_over(kind: str, api: FakeKubeApi, **options: Any) -> Client:
    """A blocking facade over the ``kind`` client on the in-memory API server ``api``."""
    return Client(kind, api, **options)


def fake_sleep(monkeypatch: pytest.MonkeyPatch, on_sleep: Callable[[float], None]
               ) -> list[float]:
    """Replace both clients' sleeps by ``on_sleep`` (which may move the fake clock).

    Returns the list of the seconds slept, in order.
    """
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        on_sleep(seconds)

    async def asleep(seconds: float) -> None:
        sleep(seconds)

    monkeypatch.setattr("joblease.core.steps.time.sleep", sleep)
    monkeypatch.setattr("joblease.core.asteps.asyncio.sleep", asleep)
    return slept


def iter_kinds() -> Iterator[str]:
    """The two clients, for ``pytest.mark.parametrize``."""
    yield from KINDS
