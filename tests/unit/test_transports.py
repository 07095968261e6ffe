"""The three transports, one behaviour: the same answers mean the same thing to each.

Issue 23, item 4. A stub HTTP server on 127.0.0.1 plays the API server; the same table of
answers goes through ``KubeApi`` over the ``kubernetes`` client, ``KubeApi`` over the CLI's
light ``http.client`` backend, and ``AsyncKubeApi`` over aiohttp: every status maps to the
same typed error with the server's message; every response's ``Date`` header is folded into
the server-clock estimate; a watch stream's events (BOOKMARK included) arrive in order and
an ``ERROR`` event with code 410 is ``GoneError``; a server that does not answer is
``UnavailableError``. So the transports cannot drift apart unnoticed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from joblease.kube.aioapi import AsyncKubeApi, Connection
from joblease.kube.api import (
    ApiError,
    ConflictError,
    ForbiddenError,
    GoneError,
    InvalidError,
    KubeApi,
    NotFoundError,
    UnavailableError,
)
from joblease.kube.lite import LiteApiClient, LiteConfig

DATE = 1_800_000_000  # the stub's clock: a fixed second, far from the local one
ANSWERS: dict[str, tuple[int, dict[str, Any]]] = {
    "/ok": (200, {"kind": "Thing", "metadata": {"name": "ok"}}),
    "/conflict": (409, {"kind": "Status", "message": "the object has been modified"}),
    "/missing": (404, {"kind": "Status", "message": "jobleases 'x' not found"}),
    "/gone": (410, {"kind": "Status", "message": "too old resource version"}),
    "/invalid": (422, {"kind": "Status", "message": "spec.backoff: Invalid value"}),
    "/bad": (400, {"kind": "Status", "message": "field label not supported"}),
    "/forbidden": (403, {"kind": "Status", "message": "cannot patch jobleases/status"}),
    "/broken": (500, {"kind": "Status", "message": "etcdserver: leader changed"}),
    "/busy": (429, {"kind": "Status", "message": "too many requests"}),
    "/teapot": (418, {"kind": "Status", "message": "short and stout"}),
}
EXPECTED: dict[str, type[ApiError]] = {
    "/conflict": ConflictError, "/missing": NotFoundError, "/gone": GoneError,
    "/invalid": InvalidError, "/bad": InvalidError, "/forbidden": ForbiddenError,
    "/broken": UnavailableError, "/busy": UnavailableError, "/teapot": ApiError,
}
WATCH = [{"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "5"}}},
         {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}]
GONE = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                    "message": "too old resource version: 1 (40)"}}


class Stub(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/watch" or path == "/watch-gone":
            events = WATCH + ([GONE] if path == "/watch-gone" else [])
            body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
            return self._send(200, body)
        status, answer = ANSWERS.get(path, (404, {"kind": "Status", "message": "no"}))
        return self._send(status, json.dumps(answer).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Date", formatdate(DATE, usegmt=True))
        self.end_headers()
        self.wfile.write(body)

    def date_time_string(self, timestamp: float | None = None) -> str:
        return formatdate(DATE, usegmt=True)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def host() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _kubernetes(host: str) -> KubeApi:
    from kubernetes import client as k8s_client

    configuration = k8s_client.Configuration()
    configuration.host = host
    return KubeApi(k8s_client.ApiClient(configuration))


def _lite(host: str) -> KubeApi:
    return KubeApi(LiteApiClient(LiteConfig(host, None)))


class _Blocking:
    """``AsyncKubeApi`` driven to completion call by call, so one test body covers it."""

    def __init__(self, host: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.api = AsyncKubeApi(Connection(host, ssl=True))
        self.clock = self.api.clock

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.loop.run_until_complete(self.api.request(method, path, **kwargs))

    def events(self, path: str) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        self.loop.run_until_complete(self.api.watch(
            path, {}, lambda kind, obj: got.append({"type": kind, "object": obj}),
            idle_timeout=5))
        return got

    def close(self) -> None:
        self.loop.run_until_complete(self.api.close())
        self.loop.close()


TRANSPORTS: dict[str, Callable[[str], Any]] = {
    "kubernetes": _kubernetes, "lite": _lite, "aiohttp": _Blocking}


@pytest.fixture(params=list(TRANSPORTS))
def transport(request: pytest.FixtureRequest, host: str) -> Iterator[Any]:
    made = TRANSPORTS[request.param](host)
    made.kind = request.param
    yield made
    made.close()


def _events(transport: Any, path: str) -> list[dict[str, Any]]:
    if isinstance(transport, _Blocking):
        return transport.events(path)
    return list(transport.watch(path, {}, timeout=5))


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_each_status_is_the_same_typed_error_with_the_servers_message(
        transport: Any, path: str) -> None:
    with pytest.raises(ApiError) as err:
        transport.request("GET", path)
    assert type(err.value) is EXPECTED[path]
    assert ANSWERS[path][1]["message"] in str(err.value)
    assert err.value.status == ANSWERS[path][0]


def test_a_success_is_decoded_and_its_date_folded_into_the_clock(transport: Any) -> None:
    answer = transport.request("GET", "/ok")
    assert answer.body == ANSWERS["/ok"][1]
    now = transport.clock.now(_monotonic(transport))
    assert DATE - 1 <= now.earliest.timestamp() <= DATE + 2  # the stub's second, not ours


def test_a_watch_delivers_its_events_in_order_and_an_error_410_is_gone(transport: Any) -> None:
    assert _events(transport, "/watch") == WATCH
    with pytest.raises(GoneError):
        _events(transport, "/watch-gone")


def test_a_server_that_does_not_answer_is_unavailable(transport: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    silent = TRANSPORTS[transport.kind](f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(UnavailableError):
            silent.request("GET", "/ok", timeout=2)
    finally:
        silent.close()


def _monotonic(transport: Any) -> float:
    api = transport.api if isinstance(transport, _Blocking) else transport
    return float(api.monotonic())
