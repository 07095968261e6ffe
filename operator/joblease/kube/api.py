"""``KubeApi``: the thread-safe transport (one of three, ``joblease.kube.transport``).

It serves the worker SDK, ``joblease run``/``work`` and the operator's writes over the official
``kubernetes`` client, used at its lowest level (``ApiClient.param_serialize`` +
``call_api``) so that every request can carry exactly the headers we choose (merge-patch
content type, ``resourceVersion`` preconditions) and every response's ``Date`` header is
folded into the server-clock estimate. Its configuration loaders cover kubeconfig files,
in-cluster ServiceAccount tokens and exec plugins, which a hand-rolled client would redo.

Errors come back as typed exceptions (409 → ``ConflictError`` and so on,
``joblease.kube.errors``), with the API server's own message, so callers never parse HTTP.
The same class, over ``joblease.kube.lite``'s ``http.client`` backend, is the CLI's light
transport (``joblease work`` included); ``joblease.kube.aioapi.AsyncKubeApi`` is the asyncio
one. Configuration loading is ``joblease.kube.config``'s.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

from joblease.domain.clock import ServerClock, ServerNow

# The ``kubernetes`` package (and urllib3 under it) is imported where a client is built,
# not here: it costs 0.3-0.4 s of CPU, and the CLI's one-shot verbs use the light transport
# in ``joblease.kube.lite`` instead (issue 18, item 5).
from joblease.kube.config import (
    CLOCK_TRACK_TTL_ENV,
    DEFAULT_TRACK_TTL,
    clock_from_env,
    kubernetes_configuration,
)

# What a request is and what its answer means (headers, typed errors, the Date header's
# fold into the clock) is shared with the asyncio client; the names stay importable here.
from joblease.kube.requests import (
    DEFAULT_TIMEOUT,
    MAX_SERVER_SKEW_ENV,
    MERGE_PATCH,
    ApiError,
    ConfigError,
    ConflictError,
    ForbiddenError,
    GoneError,
    InvalidError,
    NotFoundError,
    Response,
    UnavailableError,
    build_request,
    calibration_pause,
    decode_body,
    error_for,
    fold_date,
    server_time,
    watch_event,
)

__all__ = [
    "CLOCK_TRACK_TTL_ENV", "DEFAULT_TIMEOUT", "DEFAULT_TRACK_TTL", "MAX_SERVER_SKEW_ENV",
    "MERGE_PATCH", "ApiError", "ConfigError", "ConflictError", "ForbiddenError", "GoneError",
    "InvalidError",
    "KubeApi", "NotFoundError", "Response", "UnavailableError", "clock_from_env",
    "kubernetes_configuration",
]


class KubeApi:
    """A thread-safe HTTP client bound to one cluster identity, with a server-clock estimate.

    Args:
        api_client: A configured ``kubernetes.client.ApiClient``.
        clock: The server-clock estimate to feed (default: :func:`clock_from_env`).
        monotonic: The local monotonic clock (injected for tests).
    """

    def __init__(self, api_client: Any, clock: ServerClock | None = None,
                 monotonic: Any = time.monotonic) -> None:
        self._client = api_client
        # what "no answer" looks like depends on the transport (joblease.kube.lite says)
        self._transport_errors: tuple[type[BaseException], ...] = (
            getattr(api_client, "transport_errors", None) or _kubernetes_transport_errors())
        self.clock = clock or clock_from_env()
        self._monotonic = monotonic
        self._lock = threading.Lock()

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> KubeApi:
        """Build from a kubeconfig file (``$KUBECONFIG`` by default) or, in a pod, in-cluster."""
        from kubernetes import client as k8s_client

        configuration = kubernetes_configuration(path, context)
        configuration.retries = False  # we decide what to retry: a 409 is never retried blindly
        return cls(k8s_client.ApiClient(configuration))

    @property
    def host(self) -> str:
        """The API server URL."""
        return str(self._client.configuration.host)

    def monotonic(self) -> float:
        """The local monotonic clock this client measures with."""
        return float(self._monotonic())

    def server_now(self) -> ServerNow:
        """The server's current time as an interval (asks the server if nothing is known)."""
        if not self.clock.known:
            self.request("GET", "/version")
        with self._lock:
            return server_time(self.clock, self.monotonic(), self.host)

    def calibrate(self, max_seconds: float = 1.5, target_error: float = 0.01) -> float:
        """Sample ``/version`` until the server's second ticks over, narrowing the clock estimate.

        The first response bounds the offset to about one second; the interval then narrows
        to the round trip plus the polling gap when a response shows the next second. So we
        sleep until just before the earliest possible tick and poll every ``target_error``
        seconds from there (tens of requests, not hundreds). Returns the error bound reached.
        Costs up to about one second once per process; without it the bound is about half a
        second plus half a round trip.
        """
        deadline = self.monotonic() + max_seconds
        self.request("GET", "/version")
        while (pause := calibration_pause(self.server_now(), self.clock.max_skew,
                                          target_error, deadline - self.monotonic())
               ) is not None:
            time.sleep(pause)
            self.request("GET", "/version")
        return self.clock.error_bound(self.monotonic()).total_seconds()

    def request(self, method: str, path: str, body: Any = None, *,
                query: dict[str, str] | None = None, content_type: str | None = None,
                timeout: float = DEFAULT_TIMEOUT) -> Response:
        """Send one request; return the decoded body or raise a typed ``ApiError``."""
        req = build_request(method, path, body, query=query, content_type=content_type)
        serialized = self._client.param_serialize(req.method, req.path,
                                                  header_params=req.headers, body=req.body,
                                                  auth_settings=["BearerToken"])
        sent = self.monotonic()
        try:
            raw = self._client.call_api(*serialized, _request_timeout=timeout)
            data = raw.read()
        except self._transport_errors as err:
            raise req.unavailable(err) from err
        received = self.monotonic()
        self._observe_date(raw.headers.get("Date"), sent, received)
        return Response(raw.status, req.answer(raw.status, raw.reason or "", data), sent,
                        received)

    def whoami(self) -> str:
        """The username the API server authenticates us as (a SelfSubjectReview).

        Under the holder-only admission policy a worker's holder must be exactly this name
        (``system:serviceaccount:NS:NAME`` for a ServiceAccount).
        """
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        review = self.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                              body).body
        return str(review["status"]["userInfo"]["username"])

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()

    def _observe_date(self, header: str | None, sent: float, received: float) -> None:
        with self._lock:
            fold_date(self.clock, header, sent, received)

    def watch(self, path: str, query: dict[str, str] | None = None, *,
              timeout: float = DEFAULT_TIMEOUT) -> WatchStream:
        """Open a watch on the collection at ``path``; iterate the result for its events.

        ``timeout`` bounds the whole stream on the client side: pass more than the
        ``timeoutSeconds`` the query asks the server for, so the server ends it normally.
        The response's ``Date`` feeds the clock estimate like every :meth:`request`'s.
        Both sync transports stream: the events arrive as the server sends them.

        Raises:
            ApiError: the server refused to open it (``GoneError`` for a resourceVersion it
                no longer keeps); ``UnavailableError`` if it did not answer.
        """
        full = f"{path}?{urlencode({**(query or {}), 'watch': 'true'})}"
        serialized = self._client.param_serialize("GET", full,
                                                  header_params={"Accept": "application/json"},
                                                  auth_settings=["BearerToken"])
        sent = self.monotonic()
        try:
            raw = self._client.call_api(*serialized, _request_timeout=timeout)
        except self._transport_errors as err:
            raise UnavailableError(0, "Unavailable", f"WATCH {path}: {err}") from err
        self._observe_date(raw.headers.get("Date"), sent, self.monotonic())
        if not 200 <= raw.status <= 299:
            try:
                body = decode_body(raw.read())
            except self._transport_errors as err:
                raise UnavailableError(0, "Unavailable", f"WATCH {path}: {err}") from err
            raise error_for(raw.status, raw.reason or "", body, "WATCH", path)
        return WatchStream(raw, path, self._transport_errors)


class WatchStream:
    """One open watch: iterating yields its events (``{"type": ..., "object": {...}}``).

    The iteration ends when the server ends the stream (its ``timeoutSeconds``) or
    :meth:`close` is called, from any thread (a pool being closed or switching what it
    watches, a test forcing a resume) — whatever the read raises once it is closed.
    An ``ERROR`` event is raised as the ``ApiError`` its status names (410 → ``GoneError``:
    the resourceVersion is too old, list again); a broken connection as ``UnavailableError``.
    """

    def __init__(self, raw: Any, path: str,
                 transport_errors: tuple[type[BaseException], ...]) -> None:
        self._raw = raw
        self._path = path
        self._errors = transport_errors
        self._closed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        pending = b""
        try:
            for chunk in self._chunks():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                yield from (self._event(line) for line in lines if line.strip())
            if pending.strip() and not self._closed:
                yield self._event(pending)
        except Exception as err:
            if self._closed:  # closed from another thread: what the read raised is the close
                return  # (urllib3 may raise anything then: AttributeError, fp set to None)
            if isinstance(err, self._errors):
                raise UnavailableError(0, "Unavailable", f"WATCH {self._path}: {err}") from err
            raise
        self._release()

    def close(self) -> None:
        """Stop the stream now: a read blocked in another thread returns."""
        self._closed = True
        stream = getattr(self._raw, "response", None)
        for stop in ("shutdown", "close"):
            # already released or closed: nothing left to stop
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                getattr(stream, stop, lambda: None)()

    def _chunks(self) -> Iterator[bytes]:
        stream = getattr(self._raw, "response", None)
        if stream is None or not hasattr(stream, "stream"):
            yield self._raw.read()  # a transport that reads whole bodies
            return
        for chunk in stream.stream(65536):
            if self._closed:
                return
            yield chunk

    def _event(self, line: bytes) -> dict[str, Any]:
        kind, obj = watch_event(line, self._path)
        return {"type": kind, "object": obj}

    def _release(self) -> None:
        release = getattr(getattr(self._raw, "response", None), "release_conn", None)
        if release is not None:
            release()


def _kubernetes_transport_errors() -> tuple[type[BaseException], ...]:
    import urllib3
    from kubernetes import client as k8s_client

    return (urllib3.exceptions.HTTPError, OSError, k8s_client.ApiException)
