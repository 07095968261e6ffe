"""The asyncio HTTP client for the API server: the same requests as ``KubeApi``, on aiohttp.

Why aiohttp: kopf, which the operator already runs on, depends on it, so the asyncio client
adds no dependency to the product (``pyproject.toml`` pins the very version kopf brings);
it streams responses, which a watch needs; and one ``ClientSession`` per client keeps one
connection pool and one event loop's worth of state, with no thread per request or lease.

What is shared with the thread-safe ``KubeApi`` (``joblease.kube.requests``): what a
request is (method, path with query, headers, JSON body, merge-patch content type, the
``resourceVersion`` precondition in the body), which typed ``ApiError`` a status means,
and how each response's ``Date`` header narrows the server-clock estimate. Only the moving
of bytes differs.

Credentials come from the ``kubernetes`` package's own loaders (kubeconfig, in-cluster
ServiceAccount, exec plugins and other token sources), run once in a worker thread so the
event loop never blocks on files, subprocesses or the package's import. The bearer token
they produce is asked for again at most once a minute, in the same way (an in-cluster token
file is re-read, an exec plugin re-run when its token is about to expire), and at once after
a 401.

Every request is bounded by its ``timeout`` — loading the configuration, connecting,
sending and reading the whole answer — so a holder's request never outlives its deadline.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from joblease.domain.clock import ServerClock, ServerNow
from joblease.kube.api import clock_from_env, kubernetes_configuration
from joblease.kube.requests import (
    DEFAULT_TIMEOUT,
    ApiRequest,
    Response,
    build_request,
    calibration_pause,
    fold_date,
    server_time,
    watch_event,
)

USER_AGENT = "joblease-aio"
TOKEN_REFRESH_SECONDS = 60.0
CONNECT_TIMEOUT = 10.0
TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)
WatchHandler = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate, as the ``kubernetes`` loaders found it.

    Attributes:
        host: The API server's URL.
        ssl: The TLS context (CA, client certificate), ``False`` for an unverified server
            (``insecure-skip-tls-verify``), ``True`` for plain HTTP.
        server_hostname: ``tls-server-name``: the name to verify instead of the host's.
        proxy: ``proxy-url``, if the kubeconfig names one.
        token: The ``Authorization`` header's value when the loader gave a bearer token.
        refresh_token: Asks the loader for the current token (blocking: it may read a file
            or run an exec plugin; called in a worker thread), or ``None`` for none.
    """

    host: str
    ssl: ssl.SSLContext | bool = True
    server_hostname: str | None = None
    proxy: str | None = None
    token: str | None = None
    refresh_token: Callable[[], str | None] | None = None


def load_connection(path: str | None = None, context: str | None = None) -> Connection:
    """Read a kubeconfig (``$KUBECONFIG`` by default) or, in a pod, the ServiceAccount.

    Blocking (files, and an exec plugin if the kubeconfig names one): :class:`AsyncKubeApi`
    runs it in a worker thread. The same sources, in the same order, as
    ``KubeApi.from_kubeconfig``: both read them with ``kubernetes_configuration``.

    Raises:
        ConfigError: neither a kubeconfig nor an in-cluster
            configuration exists (not wrapped, as for ``KubeApi``).
    """
    return connection_from(kubernetes_configuration(path, context))


def connection_from(configuration: Any) -> Connection:
    """Turn a loaded ``kubernetes.client.Configuration`` into a :class:`Connection`."""
    host = str(configuration.host).rstrip("/")
    context: ssl.SSLContext | bool = True
    if host.startswith("https://"):
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
        if not configuration.verify_ssl:
            context = False
    has_token = any(key in configuration.api_key for key in ("BearerToken", "authorization"))

    def refresh() -> str | None:
        value = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        return str(value) if value else None

    return Connection(host, context, configuration.tls_server_name or None,
                      configuration.proxy or None, refresh() if has_token else None,
                      refresh if has_token else None)


class AsyncKubeApi:
    """An asyncio HTTP client bound to one cluster identity, with a server-clock estimate.

    Use one per event loop and close it (``await api.close()`` or ``async with``). Building
    it does no I/O: the configuration is loaded, in a worker thread, by the first request.

    Args:
        connection: A :class:`Connection`, or a blocking function that loads one (default:
            :func:`load_connection` with ``kubeconfig`` and ``context``).
        kubeconfig: Path of a kubeconfig file (default ``$KUBECONFIG``, then in-cluster).
        context: The kubeconfig context (default: its current context).
        clock: The server-clock estimate to feed (default: ``clock_from_env()``).
        monotonic: The local monotonic clock (injected for tests).
    """

    def __init__(self, connection: Connection | Callable[[], Connection] | None = None, *,
                 kubeconfig: str | None = None, context: str | None = None,
                 clock: ServerClock | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._connection = connection if isinstance(connection, Connection) else None
        self._load: Callable[[], Connection] = (
            connection if callable(connection)
            else lambda: load_connection(kubeconfig, context))
        self._loading: asyncio.Future[Connection] | None = None
        self.clock = clock or clock_from_env()
        self._monotonic = monotonic
        self._session: aiohttp.ClientSession | None = None
        self._token_due = 0.0  # when to ask the credential loader for the token again
        self._token_lock: asyncio.Lock | None = None
        self._closed = False

    @property
    def host(self) -> str:
        """The API server URL (empty until the configuration is loaded)."""
        return self._connection.host if self._connection else ""

    def monotonic(self) -> float:
        """The local monotonic clock this client measures with."""
        return float(self._monotonic())

    async def server_now(self) -> ServerNow:
        """The server's current time as an interval (asks the server if nothing is known).

        Raises:
            UnavailableError: no answer, or no usable ``Date`` header.
        """
        if not self.clock.known:
            await self.request("GET", "/version")
        return server_time(self.clock, self.monotonic(), self.host)

    async def calibrate(self, max_seconds: float = 1.5, target_error: float = 0.01) -> float:
        """Narrow the clock estimate around one tick of the server's second (as ``KubeApi``).

        Waits with ``asyncio.sleep``; returns the error bound reached, in seconds.
        """
        deadline = self.monotonic() + max_seconds
        await self.request("GET", "/version")
        while (pause := calibration_pause(await self.server_now(), self.clock.max_skew,
                                          target_error, deadline - self.monotonic())
               ) is not None:
            await asyncio.sleep(pause)
            await self.request("GET", "/version")
        return self.clock.error_bound(self.monotonic()).total_seconds()

    async def request(self, method: str, path: str, body: Any = None, *,
                      query: dict[str, str] | None = None, content_type: str | None = None,
                      timeout: float = DEFAULT_TIMEOUT) -> Response:
        """Send one request; return the decoded body or raise a typed ``ApiError``.

        Nothing of it — the configuration's first load included — takes longer than
        ``timeout`` seconds; past that, ``UnavailableError``.
        """
        req = build_request(method, path, body, query=query, content_type=content_type)
        try:
            async with asyncio.timeout(timeout):
                session, connection = await self._ready()
                headers = await self._headers(req, connection)
                sent = self.monotonic()
                async with session.request(
                        req.method, connection.host + req.path, data=req.payload(),
                        headers=headers, ssl=connection.ssl, proxy=connection.proxy,
                        server_hostname=connection.server_hostname) as raw:
                    data = await raw.read()
                    received = self.monotonic()
        except TRANSPORT_ERRORS as err:
            raise req.unavailable(err) from err
        fold_date(self.clock, raw.headers.get("Date"), sent, received)
        self._note_status(raw.status)
        return Response(raw.status, req.answer(raw.status, raw.reason or "", data), sent,
                        received)

    async def watch(self, path: str, query: dict[str, str], on_event: WatchHandler, *,
                    idle_timeout: float) -> None:
        """Stream a watch, calling ``on_event(type, object)`` for each event, until it ends.

        The server ends a watch after its ``timeoutSeconds``; returning then is normal (the
        caller resumes from the last resourceVersion it saw). ``idle_timeout`` bounds the
        silence between two lines (bookmarks arrive while nothing changes).

        Raises:
            GoneError: the resourceVersion is too old (410): list again.
            ApiError: the watch was refused, or an ``ERROR`` event arrived.
            UnavailableError: no answer, a broken stream, or ``idle_timeout`` of silence.
        """
        req = build_request("GET", path, query=query)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT,
                                        sock_read=idle_timeout)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                session, connection = await self._ready()
                headers = await self._headers(req, connection)
            sent = self.monotonic()
            async with session.request(
                    "GET", connection.host + req.path, headers=headers, ssl=connection.ssl,
                    proxy=connection.proxy, server_hostname=connection.server_hostname,
                    timeout=timeout) as raw:
                fold_date(self.clock, raw.headers.get("Date"), sent, self.monotonic())
                self._note_status(raw.status)
                if not 200 <= raw.status <= 299:
                    req.answer(raw.status, raw.reason or "", await raw.read())
                async for line in raw.content:
                    if line.strip():
                        on_event(*watch_event(line, req.path))
        except (*TRANSPORT_ERRORS, ValueError) as err:  # ValueError: a line beyond the limit
            raise req.unavailable(err) from err

    async def whoami(self) -> str:
        """The username the API server authenticates us as (a SelfSubjectReview)."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        review = (await self.request(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body)).body
        return str(review["status"]["userInfo"]["username"])

    async def close(self) -> None:
        """Close the connection pool (idempotent)."""
        self._closed = True
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> AsyncKubeApi:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def _ready(self) -> tuple[aiohttp.ClientSession, Connection]:
        """The session and the connection settings, loading them on first use."""
        if self._closed:
            raise aiohttp.ClientConnectionError("the client is closed")
        if self._connection is None:
            self._connection = await self._loaded()
            self._token_due = self.monotonic() + TOKEN_REFRESH_SECONDS
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT))
        return self._session, self._connection

    async def _loaded(self) -> Connection:
        """Load the configuration once, in a worker thread, whoever asks first.

        Shielded: a request that times out stops waiting, but the load goes on for the next
        one; a load that failed is tried again by the next request.
        """
        if self._loading is None:
            self._loading = asyncio.ensure_future(asyncio.to_thread(self._load))
        loading = self._loading
        try:
            return await asyncio.shield(loading)
        except Exception:
            if self._loading is loading and loading.done():
                self._loading = None
            raise

    async def _headers(self, req: ApiRequest, connection: Connection) -> dict[str, str]:
        headers = {**req.headers, "User-Agent": USER_AGENT}
        token = await self._token(connection)
        if token:
            headers["Authorization"] = token
        return headers

    async def _token(self, connection: Connection) -> str | None:
        """The bearer token, asked for again (in a worker thread) when it is due."""
        refresh = connection.refresh_token
        if refresh is None or self.monotonic() < self._token_due:
            return self._current_token(connection)
        if self._token_lock is None:
            self._token_lock = asyncio.Lock()
        async with self._token_lock:
            if self.monotonic() >= self._token_due:
                token = await asyncio.to_thread(refresh)
                self._connection = connection = _with_token(connection, token)
                self._token_due = self.monotonic() + TOKEN_REFRESH_SECONDS
        return self._current_token(connection)

    def _current_token(self, connection: Connection) -> str | None:
        return self._connection.token if self._connection else connection.token

    def _note_status(self, status: int) -> None:
        if status == 401:  # the token may have expired or been rotated: ask again next time
            self._token_due = 0.0


def _with_token(connection: Connection, token: str | None) -> Connection:
    return Connection(connection.host, connection.ssl, connection.server_hostname,
                      connection.proxy, token, connection.refresh_token)
