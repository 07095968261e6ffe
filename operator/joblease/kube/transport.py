"""The explicit shape of a transport: what every caller of the API server may rely on.

Three transports talk HTTP to the API server, and only they do:

* ``joblease.kube.api.KubeApi`` over the official ``kubernetes`` client's ``ApiClient``
  (urllib3): the worker SDK, ``joblease run``/``work`` and the operator;
* the same ``KubeApi`` over ``joblease.kube.lite.LiteApiClient`` (``http.client``): the
  CLI's one-shot verbs, whose start-up would otherwise be mostly the ``kubernetes`` import;
* ``joblease.kube.aioapi.AsyncKubeApi`` over aiohttp: ``joblease.aio``.

:class:`Transport` and :class:`AsyncTransport` are what the stores, the protocol core and
the clients use of them, so a caller never probes attributes, and the in-memory API
servers of the tests (``tests/support/fakekube.py``) are checked against the same shape by
mypy. :class:`HttpBackend` is what ``KubeApi`` needs of the client library under it. What a
request is and what its answer means (headers, typed errors, the ``Date`` header folded
into the server-clock estimate) is ``joblease.kube.requests``', shared by all three, and
the errors are ``joblease.kube.errors``'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from joblease.domain.clock import ServerClock, ServerNow
from joblease.kube.requests import DEFAULT_TIMEOUT, Response

WatchHandler = Callable[[str, dict[str, Any]], None]


class EventStream(Protocol):
    """One open watch (``WatchStream``): iterate it for events; close it from any thread."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """The events, until the server ends the stream or :meth:`close`."""

    def close(self) -> None:
        """Stop the stream now."""


class Transport(Protocol):
    """A thread-safe transport (``KubeApi``)."""

    clock: ServerClock

    def monotonic(self) -> float:
        """The local monotonic clock every deadline is counted on."""

    def server_now(self) -> ServerNow:
        """The API server's time now, as an interval (asks only if nothing is known)."""

    def calibrate(self, max_seconds: float = 1.5, target_error: float = 0.01) -> float:
        """Narrow the server-clock estimate; return the error bound reached."""

    def request(self, method: str, path: str, body: Any = None, *,
                query: dict[str, str] | None = None, content_type: str | None = None,
                timeout: float = DEFAULT_TIMEOUT) -> Response:
        """Send one request; raise the ``ApiError`` its answer means."""

    def watch(self, path: str, query: dict[str, str] | None = None, *,
              timeout: float = DEFAULT_TIMEOUT) -> EventStream:
        """Open a watch; iterate it for ``{"type": …, "object": …}`` events."""

    def whoami(self) -> str:
        """The username the API server authenticates this client as."""

    def close(self) -> None:
        """Release the connections."""


class AsyncTransport(Protocol):
    """An asyncio transport (``AsyncKubeApi``): the same operations, awaited."""

    clock: ServerClock

    def monotonic(self) -> float:
        """The local monotonic clock every deadline is counted on."""

    async def server_now(self) -> ServerNow:
        """The API server's time now, as an interval."""

    async def calibrate(self, max_seconds: float = 1.5, target_error: float = 0.01) -> float:
        """Narrow the server-clock estimate; return the error bound reached."""

    async def request(self, method: str, path: str, body: Any = None, *,
                      query: dict[str, str] | None = None, content_type: str | None = None,
                      timeout: float = DEFAULT_TIMEOUT) -> Response:
        """Send one request; raise the ``ApiError`` its answer means."""

    async def watch(self, path: str, query: dict[str, str], on_event: WatchHandler, *,
                    idle_timeout: float) -> None:
        """Stream a watch into ``on_event(type, object)`` until the server ends it."""

    async def whoami(self) -> str:
        """The username the API server authenticates this client as."""

    async def close(self) -> None:
        """Release the connections."""


class HttpBackend(Protocol):
    """What ``KubeApi`` needs of the HTTP library under it (``ApiClient``, ``LiteApiClient``).

    The two methods of the ``kubernetes`` client's lowest level; a backend may also carry
    ``transport_errors`` (the exceptions that mean "no answer"), else the ``kubernetes``
    client's are assumed.
    """

    def param_serialize(self, method: str, resource_path: str, *args: Any,
                        **kwargs: Any) -> tuple[Any, ...]:
        """The request as ``call_api`` takes it."""

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        """Send it; the raw response (``status``, ``reason``, ``headers``, ``read()``)."""

    def close(self) -> None:
        """Release the connections."""
