"""The light transport as ``joblease work`` uses it (issue 30): streamed watches, requests
side by side, kept-alive connections, a token file read again.

A stub HTTP/1.1 server on 127.0.0.1 plays the API server. What each test breaks: a watch
read whole (the events would arrive only when the server ends it: a worker would never
see its assignment), one connection behind one lock (a request would wait for the open
watch to end), a connection per request (a TLS handshake per request), a token read once
(a pod's rotated ServiceAccount token would be refused after it expires).
"""

from __future__ import annotations

import json
import select
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from joblease.kube import lite
from joblease.kube.api import KubeApi, UnavailableError
from joblease.kube.lite import LiteApiClient, LiteConfig

FIRST = {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "5"}}}
SECOND = {"type": "MODIFIED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}}
LATE = {"type": "MODIFIED", "object": {"metadata": {"name": "late", "resourceVersion": "7"}}}


class Server:
    """The stub's shared state: the gate the slow watch waits at, and what it saw."""

    release: ClassVar[threading.Event] = threading.Event()
    connections: ClassVar[set[int]] = set()
    lock: ClassVar[threading.Lock] = threading.Lock()


class Stub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked, as kube-apiserver answers

    def do_GET(self) -> None:
        with Server.lock:
            Server.connections.add(id(self.connection))
        if "watch=true" in self.path:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(json.dumps(FIRST).encode() + b"\n")
            # slow: the second event only once the test has the first (else LATE, which no
            # test expects: a client that reads the stream whole gets it)
            late = "slow" in self.path and not Server.release.wait(3)
            self._chunk(json.dumps(LATE if late else SECOND).encode() + b"\n")
            if "hang" in self.path:  # never ends by itself: only a close ends the read
                Server.release.wait(10)
            self._chunk(b"")
            return
        if "stall" in self.path:  # a hung request: read, never answered (until released)
            Server.release.wait(10)
            return
        body = json.dumps({"kind": "Thing", "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if "drop" in self.path:  # kept alive as far as the client knows, then closed
            self.wfile.flush()
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[KubeApi]:
    Server.release.clear()
    Server.connections.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    made = KubeApi(LiteApiClient(LiteConfig(f"http://127.0.0.1:{server.server_address[1]}",
                                            None)))
    yield made
    Server.release.set()
    made.close()
    server.shutdown()


def test_a_watch_delivers_each_event_as_it_arrives(api: KubeApi) -> None:
    events = iter(api.watch("/slow", {}, timeout=10))
    assert next(events) == FIRST  # the server has not sent the second one yet
    Server.release.set()
    assert list(events) == [SECOND]


def test_a_request_is_answered_while_a_watch_is_open(api: KubeApi) -> None:
    stream = api.watch("/slow", {}, timeout=10)
    events = iter(stream)
    assert next(events) == FIRST
    answer = api.request("GET", "/ok", timeout=5)  # would wait for the watch behind one lock
    assert answer.body["path"] == "/ok"
    Server.release.set()
    assert list(events) == [SECOND]


def test_close_from_another_thread_ends_a_blocked_watch(api: KubeApi) -> None:
    stream = api.watch("/hang", {}, timeout=30)
    got: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: got.extend(stream), daemon=True)
    reader.start()
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got == [FIRST, SECOND]  # then the read blocks: the server sends nothing more
    stream.close()
    reader.join(5)
    assert not reader.is_alive()


def test_requests_in_sequence_reuse_one_connection(api: KubeApi) -> None:
    for i in range(5):
        assert api.request("GET", f"/n{i}").body["path"] == f"/n{i}"
    client = api._client
    assert isinstance(client, LiteApiClient)
    assert client.opened == 1
    assert len(Server.connections) == 1


def test_requests_side_by_side_each_get_a_connection(api: KubeApi) -> None:
    answers: list[str] = []
    threads = [threading.Thread(target=lambda i=i: answers.append(
        str(api.request("GET", f"/p{i}").body["path"]))) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(answers) == [f"/p{i}" for i in range(4)]
    client = api._client
    assert isinstance(client, LiteApiClient)
    assert 1 <= client.opened <= 4


def test_a_token_file_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    config = tmp_path / "config"
    config.write_text(json.dumps({
        "current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k",
                                                                       "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"tokenFile": "token"}}]}))
    client = LiteApiClient(lite.load(str(config), environ={}))
    bearer = client.param_serialize("GET", "/x", auth_settings=["BearerToken"])[2]
    assert bearer["Authorization"] == "Bearer first"
    token.write_text("rotated\n")
    bearer = client.param_serialize("GET", "/x", auth_settings=["BearerToken"])[2]
    assert bearer["Authorization"] == "Bearer first"  # not before a minute has passed
    monkeypatch.setattr(lite, "TOKEN_REREAD_SECONDS", 0.0)
    bearer = client.param_serialize("GET", "/x", auth_settings=["BearerToken"])[2]
    assert bearer["Authorization"] == "Bearer rotated"


def test_a_connection_the_server_closed_while_idle_is_not_reused(api: KubeApi) -> None:
    assert api.request("GET", "/drop").body["path"] == "/drop"
    client = api._client
    assert isinstance(client, LiteApiClient)
    idle = client._idle[0][0].sock
    deadline = time.monotonic() + 5
    while not select.select([idle], [], [], 0.05)[0]:  # the server's close reached us
        assert time.monotonic() < deadline, "the server never closed the connection"
    assert api.request("GET", "/after").body["path"] == "/after"  # not a failed request
    assert client.opened == 2


def test_a_connection_idle_too_long_is_not_reused(api: KubeApi,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lite, "MAX_IDLE_SECONDS", 0.0)  # a load balancer may have dropped it
    for i in range(3):
        assert api.request("GET", f"/n{i}").body["path"] == f"/n{i}"
    client = api._client
    assert isinstance(client, LiteApiClient)
    assert client.opened == 3


def test_a_hung_request_times_out_as_unavailable_and_its_connection_is_dropped(
        api: KubeApi) -> None:
    """A renewal on ``joblease work``'s transport must not wait past its own bound: a server
    that reads the request and never answers ends it at ``timeout`` with "no answer", and
    the half-used connection is never handed to the next request."""
    assert api.request("GET", "/warm").body["path"] == "/warm"  # one idle connection
    began = time.monotonic()
    with pytest.raises(UnavailableError):
        api.request("GET", "/stall", timeout=0.3)
    assert time.monotonic() - began < 5  # the bound held (the stub waits 10 s)
    client = api._client
    assert isinstance(client, LiteApiClient)
    assert client._idle == []  # the stalled connection was closed, not put back
    assert api.request("GET", "/after").body["path"] == "/after"
    assert client.opened == 2
