"""A light transport for one-shot CLI calls: static kubeconfig credentials over ``http.client``.

Why it exists: importing the ``kubernetes`` package costs 0.3–0.4 s of CPU on a small machine
(its ``__init__`` loads the config loaders, which pull in ``requests_oauthlib``, ``oauthlib``,
``pydantic`` and ``dateutil``, whichever submodule one asks for), more than the whole
budget of ``joblease get`` (issue 18: ≤ 0.3 s). A process that makes one or two requests
and exits does not need it when the kubeconfig holds only static credentials.

What it is: a drop-in for the two ``ApiClient`` methods :class:`~joblease.kube.api.KubeApi`
calls (``param_serialize`` and ``call_api``), so every request still goes through
``KubeApi.request``: the same headers, the same typed errors, the same ``Date`` headers
feeding the same server-clock estimate. Only loading the configuration and moving bytes
differ.

What it is not: a second kubeconfig implementation. It reads exactly one kubeconfig file
whose chosen context uses a bearer token (``token``/``tokenFile``) and/or a client
certificate, with a CA or ``insecure-skip-tls-verify``, or the in-cluster ServiceAccount
when there is no kubeconfig; for anything else (exec plugins, auth providers, basic auth,
impersonation, proxies, several files in ``$KUBECONFIG``) :func:`connect` falls back to the
``kubernetes`` client, which covers them. ``JOBLEASE_KUBE_CLIENT=kubernetes`` forces the
fallback. ``joblease work`` uses it too (issue 30): it is started once per worker, and the
import was most of a worker's start-up CPU (0.4 of 0.6-0.8 s); for it the client keeps
several connections (its threads send side by side), streams watches, and reads a token
file again every minute, as the ``kubernetes`` client does. So do the operator's pool
dispatchers (their own transport: the ``kubernetes`` client's request path was a quarter of
a dispatcher's CPU per job, docs/benchmarks.md). The SDK, the rest of the operator and
``joblease run`` use the ``kubernetes`` client as before.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from joblease.kube.api import KubeApi

CLIENT_ENV = "JOBLEASE_KUBE_CLIENT"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
USER_AGENT = "joblease-cli"
_CLUSTER_KEYS = {"server", "certificate-authority", "certificate-authority-data",
                 "insecure-skip-tls-verify", "tls-server-name", "extensions"}
_USER_KEYS = {"token", "tokenFile", "client-certificate", "client-certificate-data",
              "client-key", "client-key-data", "extensions"}
_PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
              "all_proxy")


class UnsupportedConfigError(Exception):
    """The configuration needs the full ``kubernetes`` client (the message says why)."""


@dataclass(frozen=True)
class LiteConfig:
    """Where the API server is and how to authenticate: the static subset of a kubeconfig."""

    host: str
    ssl_context: ssl.SSLContext | None
    token: str | None = None
    server_hostname: str | None = None
    token_file: Path | None = None  # where ``token`` was read: read again every minute


class _Configuration:
    """The one ``Configuration`` attribute ``KubeApi`` reads."""

    def __init__(self, host: str) -> None:
        self.host = host


@dataclass(frozen=True)
class LiteResponse:
    """What ``KubeApi.request`` reads of a response: status, reason, headers, body."""

    status: int
    reason: str
    headers: http.client.HTTPMessage
    data: bytes

    def read(self) -> bytes:
        """The body (already read: the connection is free for the next request)."""
        return self.data


class LiteApiClient:
    """Kept-alive HTTPS connections, one per request in flight, and streamed watches.

    A request takes an idle connection (or opens one), sends, reads the whole answer and
    puts the connection back, so a CLI verb's handful of requests in sequence costs one TLS
    handshake, and the threads of ``joblease work`` (its slots, its feed, its presence) send
    theirs side by side instead of queueing behind an open watch. A watch (``watch=true`` in
    the query) keeps its connection for itself and hands back a response that streams
    (:class:`LiteStream`): its events are read as the server sends them. A request that
    fails closes its connection; nothing is retried here (``KubeApi``'s callers decide, and
    a write is never retried blindly).

    Attributes:
        transport_errors: The exceptions that mean "no answer"; ``KubeApi`` turns them into
            ``UnavailableError``.
    """

    transport_errors: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)

    def __init__(self, config: LiteConfig) -> None:
        self.configuration = _Configuration(config.host)
        self._config = config
        url = urlsplit(config.host)
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname or "localhost", url.port
        self._prefix = url.path.rstrip("/")
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []  # and when left idle
        self._lock = threading.Lock()  # guards _idle only: requests never wait for another
        self.opened = 0  # connections opened so far (their TLS handshakes): tests read it
        self._bearer = config.token
        self._token_read = time.monotonic()  # the loader has just read token_file

    def param_serialize(self, method: str, resource_path: str,
                        header_params: dict[str, str] | None = None, body: Any = None,
                        auth_settings: list[str] | None = None, **_: Any
                        ) -> tuple[str, str, dict[str, str], bytes | None]:
        """Method, path, headers (with the bearer token) and the JSON body, ready to send."""
        headers = {"User-Agent": USER_AGENT, **(header_params or {})}
        token = self._token()
        if token and auth_settings and "BearerToken" in auth_settings:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        return method, self._prefix + resource_path, headers, data

    def _token(self) -> str | None:
        """The bearer token, read again from its file once a minute.

        Why: ``joblease work`` runs for days, and a pod's ServiceAccount token is rotated
        in its file by the kubelet (the ``kubernetes`` client reads it again every minute
        too). A failed read keeps the last token: the API server then says what is wrong.
        """
        if self._config.token_file is None:
            return self._config.token
        now = time.monotonic()
        with self._lock:
            if now - self._token_read >= TOKEN_REREAD_SECONDS:
                self._token_read = now
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    self._bearer = self._config.token_file.read_text().strip()
            return self._bearer

    def call_api(self, method: str, path: str, headers: dict[str, str], body: bytes | None,
                 _request_timeout: float | None = None) -> LiteResponse | LiteStream:
        """Send one request; read the whole response, or (a watch) hand back its stream."""
        conn = self._take(_request_timeout)
        try:
            conn.request(method, path, body=body, headers=headers)
            reply = conn.getresponse()
            if _is_watch(path):
                return LiteStream(reply, conn)
            data = reply.read()
        except BaseException:
            conn.close()
            raise
        if reply.will_close:
            conn.close()
        else:
            self._give_back(conn)
        return LiteResponse(reply.status, reply.reason, reply.headers, data)

    def _take(self, timeout: float | None) -> http.client.HTTPConnection:
        conn = self._reusable()
        if conn is None:
            conn = self._open(timeout)
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _open(self, timeout: float | None) -> http.client.HTTPConnection:
        self.opened += 1
        if self._https:
            return _SniConnection(self._host, self._port, timeout=timeout,
                                  context=self._config.ssl_context,
                                  server_hostname=self._config.server_hostname)
        return _PlainConnection(self._host, self._port, timeout=timeout)

    def _reusable(self) -> http.client.HTTPConnection | None:
        """The most recently used idle connection still fit to send on, or ``None``.

        Why check: a connection the server closed while idle (or that sat idle long enough
        for a load balancer to forget it) would fail the next request, and a write that
        fails is never retried blindly. Closed by the peer shows as readable (an idle
        HTTP/1.1 connection has nothing to read), as urllib3 checks before reusing one.
        """
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn, since = self._idle.pop()
            sock = conn.sock
            if (sock is not None and time.monotonic() - since < MAX_IDLE_SECONDS
                    and not select.select([sock], [], [], 0)[0]):
                return conn
            conn.close()

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections (an open watch is closed by its own ``close``)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


TOKEN_REREAD_SECONDS = 60.0
MAX_IDLE = 8  # idle connections kept: a worker's threads rarely have more requests in flight
MAX_IDLE_SECONDS = 60.0  # an idle connection older than this is closed, not reused


def _is_watch(path: str) -> bool:
    query = path.partition("?")[2]
    return "watch=true" in query.split("&")


class LiteStream:
    """A watch's response, read as it arrives (what ``KubeApi.watch`` reads of urllib3's).

    ``response.stream(n)`` yields the bytes as the server sends them (chunked decoding by
    ``http.client``); ``response.shutdown()`` ends a read blocked in another thread (a pool
    switching scope, a stop); ``read()`` reads an error answer whole. The connection is
    never reused: a watch ends rarely, and what is left of it is unknown.
    """

    def __init__(self, reply: http.client.HTTPResponse, conn: http.client.HTTPConnection
                 ) -> None:
        self.status, self.reason, self.headers = reply.status, reply.reason, reply.headers
        self._reply, self._conn = reply, conn
        self.response = self

    def read(self) -> bytes:
        """The whole (error) body; the connection is closed after it."""
        try:
            return self._reply.read()
        finally:
            self.close()

    def stream(self, amount: int) -> Iterator[bytes]:
        """Bytes as they arrive, until the server ends the response."""
        while chunk := self._reply.read1(amount):
            yield chunk

    def shutdown(self) -> None:
        """Make a read blocked in another thread return (the socket is shut both ways)."""
        sock = self._conn.sock
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def release_conn(self) -> None:
        """The stream ended: close its connection (never reused, see the class)."""
        self.close()


class _LeanResponse(http.client.HTTPResponse):
    """``http.client``'s response, its header block read without the ``email`` parser.

    Why: ``http.client.parse_headers`` hands the block to ``email.parser``, which cost
    about 70 µs of CPU per response of kube-apiserver's (ten header lines), ten times a
    plain split, and ``joblease work`` reads two or three responses per job
    (docs/benchmarks.md). Everything else is ``HTTPResponse.begin``'s logic, unchanged: a
    ``100 Continue`` skipped, chunked bodies, ``Connection: close``, a Content-Length, and
    the same ``HTTPMessage`` (case-insensitive ``get``, repeated headers kept in order).
    """

    def begin(self) -> None:
        """Read the status line and headers; decide how the body is framed (as the stdlib)."""
        if self.headers is not None:
            return  # already begun
        while True:
            version, status, reason = self._read_status()
            if status != http.client.CONTINUE:
                break
            _header_lines(self.fp)  # an interim answer's headers: skipped
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        self.headers = self.msg = parse_header_block(_header_lines(self.fp))
        encoding = self.headers.get("transfer-encoding")
        self.chunked = bool(encoding and encoding.lower() == "chunked")
        if self.chunked:
            self.chunk_left = None  # the first chunk's size line is next
        self.will_close = self._check_close()
        self.length = None if self.chunked else _content_length(
            self.headers.get("content-length"))
        if (status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED)
                or 100 <= status < 200 or self._method == "HEAD"):
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True  # no framing: the body ends when the connection does


def _header_lines(fp: Any) -> list[bytes]:
    """The header block's lines up to the blank one, bounded as ``http.client`` bounds them."""
    lines: list[bytes] = []
    while True:
        line = fp.readline(MAX_HEADER_LINE + 1)
        if len(line) > MAX_HEADER_LINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return lines
        lines.append(line)
        if len(lines) > MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")


def parse_header_block(lines: list[bytes]) -> http.client.HTTPMessage:
    """The headers of ``lines`` as ``http.client.parse_headers`` returns them.

    As ``email``'s compat32 policy reads them: the name is what precedes the first colon,
    the value what follows it less leading blanks, a folded line (starting with a space or
    a tab) continues the previous value with its line break kept, trailing line breaks
    dropped. A line without a colon is skipped (``email`` stops reading headers there).
    """
    message = http.client.HTTPMessage()
    fields: list[list[str]] = []
    for raw in lines:
        line = raw.decode("iso-8859-1")
        if line[:1] in (" ", "\t"):
            if fields:
                fields[-1].append(line)
        elif ":" in line:
            fields.append([line])
    for first, *folded in fields:
        name, value = first.split(":", 1)
        message[name] = (value.lstrip(" \t") + "".join(folded)).rstrip("\r\n")
    return message


def _content_length(value: str | None) -> int | None:
    try:
        length = int(value) if value else None
    except ValueError:
        return None
    return None if length is None or length < 0 else length


MAX_HEADER_LINE = 65536  # http.client's _MAXLINE
MAX_HEADERS = 100  # http.client's _MAXHEADERS


class _PlainConnection(http.client.HTTPConnection):
    """HTTP (a test's plain server, a local proxy) with the lean header reading."""

    response_class = _LeanResponse


class _SniConnection(http.client.HTTPSConnection):
    """HTTPS with the kubeconfig's ``tls-server-name`` as SNI and verified name."""

    response_class = _LeanResponse

    def __init__(self, host: str, port: int | None, *, timeout: float | None,
                 context: ssl.SSLContext | None, server_hostname: str | None) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_hostname = server_hostname

    def connect(self) -> None:
        """Connect and wrap, naming ``tls-server-name`` (when set) instead of the host."""
        if self._server_hostname is None:
            super().connect()
            return
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(  # type: ignore[attr-defined]
            self.sock, server_hostname=self._server_hostname)


def load(path: str | None = None, context: str | None = None,
         environ: Mapping[str, str] | None = None) -> LiteConfig:
    """Read the configuration the light client can serve, or raise :class:`UnsupportedConfigError`.

    Same sources, in the same order, as ``KubeApi.from_kubeconfig``: ``path``, else
    ``$KUBECONFIG``, else ``~/.kube/config``; with none of them and no explicit ``path``,
    the in-cluster ServiceAccount.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    if env.get(CLIENT_ENV, "").strip().lower() == "kubernetes":
        raise UnsupportedConfigError(f"{CLIENT_ENV}=kubernetes")
    if any(env.get(name) for name in _PROXY_ENV):
        raise UnsupportedConfigError("a proxy is configured in the environment")
    if path is None:
        listed = env.get("KUBECONFIG", "")
        if os.pathsep in listed.strip(os.pathsep):
            raise UnsupportedConfigError("$KUBECONFIG lists several files (merging them is the "
                              "kubernetes client's job)")
        path = listed.strip(os.pathsep) or str(Path("~/.kube/config").expanduser())
        if not Path(path).exists():
            if listed:
                raise UnsupportedConfigError(f"no kubeconfig at {path}")
            return _incluster(env)
    return _from_kubeconfig(Path(path), context)


def _from_kubeconfig(path: Path, context: str | None) -> LiteConfig:
    import yaml  # the kubeconfig format; CSafeLoader when libyaml is there (faster)

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        doc = yaml.load(path.read_text(), Loader=loader) or {}
    except (OSError, yaml.YAMLError) as err:
        raise UnsupportedConfigError(f"cannot read {path}: {err}") from err
    name = context or doc.get("current-context")
    ctx = _named(doc, "contexts", name, "context")
    cluster = _named(doc, "clusters", ctx.get("cluster"), "cluster")
    user = _named(doc, "users", ctx.get("user"), "user") if ctx.get("user") else {}
    extra = (set(cluster) - _CLUSTER_KEYS) | (set(user) - _USER_KEYS)
    if extra:
        raise UnsupportedConfigError(f"kubeconfig uses {sorted(extra)}")
    base = path.parent
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise UnsupportedConfigError(f"server {server!r}")
    token, token_file = user.get("token"), None
    if token is None and user.get("tokenFile"):
        token_file = _resolve(base, user["tokenFile"])
        token = token_file.read_text().strip()
    context_ = None
    if server.startswith("https://"):
        context_ = _ssl_context(
            ca_file=_resolve(base, cluster["certificate-authority"])
            if cluster.get("certificate-authority") else None,
            ca_data=cluster.get("certificate-authority-data"),
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
            cert=_pem(base, user, "client-certificate"), key=_pem(base, user, "client-key"))
    return LiteConfig(server, context_, token, cluster.get("tls-server-name"), token_file)


def _named(doc: dict[str, Any], section: str, name: Any, key: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if entry.get("name") == name:
            value = entry.get(key) or {}
            if not isinstance(value, dict):
                raise UnsupportedConfigError(f"{section} entry {name!r} is not a mapping")
            return value
    raise UnsupportedConfigError(f"no {key} named {name!r} in the kubeconfig")


def _resolve(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _pem(base: Path, user: dict[str, Any], key: str) -> bytes | None:
    if user.get(f"{key}-data"):
        return base64.b64decode(user[f"{key}-data"])
    if user.get(key):
        return _resolve(base, user[key]).read_bytes()
    return None


def _ssl_context(*, ca_file: Path | None, ca_data: str | None, insecure: bool,
                 cert: bytes | None, key: bytes | None) -> ssl.SSLContext:
    context = ssl.create_default_context(
        cafile=str(ca_file) if ca_file else None,
        cadata=base64.b64decode(ca_data).decode() if ca_data else None)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if (cert is None) != (key is None):
        raise UnsupportedConfigError("a client certificate without its key (or the reverse)")
    if cert is not None and key is not None:
        import tempfile  # only here: it costs a few milliseconds of imports (shutil, random)

        # ssl loads a certificate chain only from files: write both to a private folder,
        # load them, and remove them at once (the context keeps them in memory)
        with tempfile.TemporaryDirectory(prefix="joblease-") as folder:
            cert_path, key_path = Path(folder, "cert.pem"), Path(folder, "key.pem")
            for target, data in ((cert_path, cert), (key_path, key)):
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
            context.load_cert_chain(cert_path, key_path)
    return context


def _incluster(env: Mapping[str, str]) -> LiteConfig:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    token_file = SERVICE_ACCOUNT / "token"
    if not host or not port or not token_file.exists():
        raise UnsupportedConfigError("no kubeconfig, and not in a pod")
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    context = _ssl_context(ca_file=SERVICE_ACCOUNT / "ca.crt", ca_data=None, insecure=False,
                           cert=None, key=None)
    return LiteConfig(server, context, token_file.read_text().strip(), token_file=token_file)


def connect(path: str | None = None, context: str | None = None) -> KubeApi:
    """A ``KubeApi`` for a one-shot command: light when the kubeconfig allows, else full.

    A configuration the light loader cannot use *or cannot read* (a missing CA or token
    file, a CA that is not PEM, bad base64) also goes to the ``kubernetes`` client, so such
    errors surface exactly as they did before this transport existed.
    """
    try:
        config = load(path, context)
    except (UnsupportedConfigError, OSError, ValueError):  # ssl.SSLError is an OSError
        return KubeApi.from_kubeconfig(path, context)
    return KubeApi(LiteApiClient(config))
