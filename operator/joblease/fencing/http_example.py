r"""A fenced HTTP endpoint with the standard library: the pattern for any HTTP target.

Run it with ``python -m joblease.fencing.http_example --port 8080`` and write with::

    curl -X PUT localhost:8080/resources/job-1 \
         -H 'X-Joblease-Token: 4711/8' -H 'Idempotency-Key: step-3' -d 'payload'

Responses (JSON bodies):

* ``200 {"applied": true, "duplicate": false, ...}``: stored; the token is now the highest.
* ``200 {"applied": false, "duplicate": true, ...}``: this token + key was stored before; a
  retry after a lost reply, with no second effect.
* ``409 {"error": "stale fencing token", "presented": ..., "highest": ...}``: a newer holder
  has written; the client lost its lease and must stop (retrying cannot succeed).
* ``400``: missing or malformed ``X-Joblease-Token`` (want ``EPOCH/GENERATION``).

The check and the store happen inside :meth:`TokenGate.apply`, under the resource's lock:
checking in one step and storing in another would let a delayed stale request pass the
check just before a newer one and then overwrite it. State is in memory; a real service
keeps the token next to its data (see ``docs/fencing.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from joblease.domain.token import FencingToken
from joblease.fencing.check import TokenGate
from joblease.fencing.errors import StaleTokenError
from joblease.fencing.result import Duplicate

TOKEN_HEADER = "X-Joblease-Token"
KEY_HEADER = "Idempotency-Key"
MAX_BODY = 1 << 20
_PATH = re.compile(r"^/resources/([A-Za-z0-9._~-]{1,253})$")


class FencedStore:
    """The example's "database": bodies per resource, written only through the gate."""

    def __init__(self) -> None:
        self.gate = TokenGate()
        self.values: dict[str, bytes] = {}

    def put(self, resource: str, token: FencingToken, key: str | None, body: bytes) -> Any:
        """Store ``body`` if ``token`` is not stale; return the response document."""
        decision = self.gate.apply(resource, token, key, lambda: self._store(resource, body))
        if isinstance(decision, Duplicate):
            return {"applied": False, "duplicate": True, "resource": resource, "token": str(token)}
        previous = None if decision.previous is None else str(decision.previous)
        return {
            "applied": True,
            "duplicate": False,
            "resource": resource,
            "token": str(token),
            "previous": previous,
        }

    def _store(self, resource: str, body: bytes) -> None:
        self.values[resource] = body


class FencedHandler(BaseHTTPRequestHandler):
    """``PUT /resources/<name>``: a write guarded by the fencing token header."""

    server: FencedHTTPServer

    def do_PUT(self) -> None:
        """Validate the request, then store through the gate (200), or refuse (4xx)."""
        match = _PATH.match(self.path)
        if match is None:
            self._reply(HTTPStatus.NOT_FOUND, {"error": "no such endpoint", "path": self.path})
            return
        token = _parse_token(self.headers.get(TOKEN_HEADER))
        if token is None:
            detail = f"missing or malformed {TOKEN_HEADER} header (want EPOCH/GENERATION)"
            self._reply(HTTPStatus.BAD_REQUEST, {"error": detail})
            return
        body = self._read_body()
        if body is None:
            return
        self._put(match.group(1), token, self.headers.get(KEY_HEADER), body)

    def _put(self, resource: str, token: FencingToken, key: str | None, body: bytes) -> None:
        try:
            document = self.server.store.put(resource, token, key, body)
        except StaleTokenError as e:
            self._reply(HTTPStatus.CONFLICT, _stale_document(e))
            return
        self._reply(HTTPStatus.OK, document)

    def _read_body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"Content-Length must be 0..{MAX_BODY}"})
            return None
        return self.rfile.read(length)

    def _reply(self, status: HTTPStatus, document: Any) -> None:
        payload = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the example quiet unless the server was built with ``verbose=True``."""
        if self.server.verbose:
            super().log_message(format, *args)


class FencedHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server on 127.0.0.1 that owns one :class:`FencedStore`."""

    daemon_threads = True

    def __init__(self, port: int = 0, *, verbose: bool = False) -> None:
        self.store = FencedStore()
        self.verbose = verbose
        super().__init__(("127.0.0.1", port), FencedHandler)

    @property
    def url(self) -> str:
        """Base URL, with the port actually bound (useful with ``port=0``)."""
        return f"http://127.0.0.1:{self.server_address[1]}"


def _parse_token(header: str | None) -> FencingToken | None:
    if header is None:
        return None
    try:
        return FencingToken.parse(header)
    except ValueError:
        return None


def _stale_document(error: StaleTokenError) -> dict[str, str]:
    return {
        "error": "stale fencing token",
        "resource": error.resource,
        "presented": str(error.presented),
        "highest": str(error.highest),
        "message": str(error),
    }


def main(argv: list[str] | None = None) -> None:
    """Serve the example until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8080, help="port on 127.0.0.1 (0: any)")
    args = parser.parse_args(argv)
    with FencedHTTPServer(args.port, verbose=True) as server:
        print(f"fenced example listening on {server.url}/resources/<name>", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()


if __name__ == "__main__":
    main()
