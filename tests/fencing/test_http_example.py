"""The documented fenced HTTP endpoint, exercised over real sockets on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from joblease.fencing.http_example import FencedHTTPServer


@pytest.fixture
def server() -> Iterator[FencedHTTPServer]:
    srv = FencedHTTPServer(0)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def put(srv: FencedHTTPServer, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(srv.url + path, data=body, method="PUT", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def fenced(token: str, key: str | None = None) -> dict[str, str]:
    headers = {"X-Joblease-Token": token}
    if key is not None:
        headers["Idempotency-Key"] = key
    return headers


def test_applied_then_stale_then_duplicate(server: FencedHTTPServer) -> None:
    status, doc = put(server, "/resources/job-1", b"A", fenced("4711/7", "a-1"))
    assert (status, doc["applied"], doc["duplicate"], doc["previous"]) == (200, True, False, None)

    status, doc = put(server, "/resources/job-1", b"B", fenced("4711/8", "b-1"))
    assert (status, doc["token"], doc["previous"]) == (200, "4711/8", "4711/7")

    status, doc = put(server, "/resources/job-1", b"A-late", fenced("4711/7", "a-2"))
    assert status == 409
    assert (doc["presented"], doc["highest"], doc["resource"]) == ("4711/7", "4711/8", "job-1")
    assert "4711/7" in doc["message"] and "4711/8" in doc["message"]
    assert server.store.values["job-1"] == b"B"

    status, doc = put(server, "/resources/job-1", b"B", fenced("4711/8", "b-1"))
    assert (status, doc["applied"], doc["duplicate"]) == (200, False, True)


def test_duplicate_does_not_write_again(server: FencedHTTPServer) -> None:
    put(server, "/resources/job-2", b"first", fenced("1/1", "k"))
    status, doc = put(server, "/resources/job-2", b"second", fenced("1/1", "k"))
    assert (status, doc["duplicate"]) == (200, True)
    assert server.store.values["job-2"] == b"first"


@pytest.mark.parametrize("token", ["", "7", "a/b", "1/2/3", "-1/2", "4711 / 7x"])
def test_malformed_token_is_400(server: FencedHTTPServer, token: str) -> None:
    status, doc = put(server, "/resources/job-3", b"x", fenced(token))
    assert status == 400
    assert "X-Joblease-Token" in doc["error"]
    assert "job-3" not in server.store.values


def test_missing_token_is_400_and_unknown_path_is_404(server: FencedHTTPServer) -> None:
    assert put(server, "/resources/job-4", b"x", {})[0] == 400
    assert put(server, "/elsewhere/job-4", b"x", fenced("1/1"))[0] == 404
    assert put(server, "/resources/a/b", b"x", fenced("1/1"))[0] == 404


def test_binds_loopback_only(server: FencedHTTPServer) -> None:
    assert server.server_address[0] == "127.0.0.1"
