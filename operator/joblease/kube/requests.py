"""What a request to the API server *is*, and what its answer means: shared by every transport.

Why a module of its own: joblease talks to the API server through two transports, the
thread-safe ``KubeApi`` (the ``kubernetes`` client, or ``joblease.kube.lite``) and the
asyncio ``AsyncKubeApi`` (aiohttp). They must send the same requests — the same headers,
the merge-patch content type, the ``resourceVersion`` precondition carried in the body —
and read the answers the same way — the same typed errors, the same ``Date`` header folded
into the same server-clock estimate — or the sync and async clients would judge leases
differently. Everything here is pure (no sockets, no client libraries): the transports only
move bytes and measure the local send and receive instants.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import dataclass, field
from datetime import timedelta
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlencode

from joblease.domain.clock import ServerClock, ServerNow
from joblease.kube.errors import (
    BY_STATUS,
    ApiError,
    ConfigError,
    ConflictError,
    ForbiddenError,
    GoneError,
    InvalidError,
    NotFoundError,
    UnavailableError,
)

__all__ = ["DEFAULT_TIMEOUT", "JSON", "JSON_PATCH", "MAX_SERVER_SKEW_ENV", "MERGE_PATCH",
           "ApiError", "ApiRequest", "ConfigError", "ConflictError", "ForbiddenError", "GoneError",
           "InvalidError", "NotFoundError", "Response", "UnavailableError", "build_request",
           "calibration_pause", "decode_body", "error_for", "fold_date", "server_time",
           "watch_event"]

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"  # RFC 6902: with `test` operations
DEFAULT_TIMEOUT = 10.0
MAX_SERVER_SKEW_ENV = "JOBLEASE_MAX_SERVER_SKEW"

log = logging.getLogger("joblease.kube.api")


@dataclass(frozen=True)
class Response:
    """A successful response: the decoded body, and the local monotonic send/receive times."""

    status: int
    body: dict[str, Any]
    sent: float
    received: float


@dataclass(frozen=True)
class ApiRequest:
    """One request as the API server will see it, whatever transport carries it.

    Attributes:
        method: The HTTP method.
        path: The path with its query string (what error messages name).
        headers: ``Accept`` always; ``Content-Type`` when there is a body (JSON, or the
            merge patch whose ``metadata.resourceVersion`` makes a write conditional).
        body: The JSON value to send, or ``None``.
    """

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None

    def payload(self) -> bytes | None:
        """The body as the bytes on the wire (for transports that do not serialize JSON)."""
        return None if self.body is None else json.dumps(self.body).encode()

    def unavailable(self, err: BaseException) -> UnavailableError:
        """The error for "no answer" (refused, reset, timed out): names the request and why."""
        return UnavailableError(0, "Unavailable", f"{self.method} {self.path}: "
                                f"{str(err) or type(err).__name__}")

    def answer(self, status: int, reason: str, data: bytes | None) -> dict[str, Any]:
        """Decode an answer's body; raise the typed ``ApiError`` its status means.

        Raises:
            ApiError: a status outside 2xx (``ConflictError`` for 409 and so on, with the
                API server's own message).
        """
        decoded = decode_body(data)
        if not 200 <= status <= 299:
            raise error_for(status, reason, decoded, self.method, self.path)
        return decoded


def build_request(method: str, path: str, body: Any = None, *,
                  query: dict[str, str] | None = None,
                  content_type: str | None = None) -> ApiRequest:
    """Describe one request: the query joined to the path, and exactly our headers."""
    if query:
        path = f"{path}?{urlencode(query)}"
    headers = {"Accept": JSON}
    if body is not None:
        headers["Content-Type"] = content_type or JSON
    return ApiRequest(method, path, headers, body)


def decode_body(data: bytes | None) -> dict[str, Any]:
    """A response body as a dict.

    JSON objects as they are, a JSON list under ``items``, anything else (a proxy's HTML
    page) as a ``message``, so an error can still quote it.
    """
    if not data:
        return {}
    try:
        decoded = json.loads(data)
    except ValueError:
        return {"message": data.decode(errors="replace")[:2000]}
    return decoded if isinstance(decoded, dict) else {"items": decoded}


def error_for(status: int, reason: str, body: dict[str, Any], method: str, path: str
              ) -> ApiError:
    """The typed error for an error status; 5xx and 429 mean "no answer", not "refused"."""
    message = str(body.get("message") or f"{method} {path}")
    if status >= 500 or status == 429:
        return UnavailableError(status, reason, message)
    return BY_STATUS.get(status, ApiError)(status, reason, message)


def watch_event(line: bytes, path: str) -> tuple[str, dict[str, Any]]:
    """One line of a watch stream: its type and object.

    The type is ``ADDED``, ``MODIFIED``, ``DELETED`` or ``BOOKMARK`` (only a resourceVersion).

    Raises:
        ApiError: an ``ERROR`` event (its object is a ``Status``; a 410 is ``GoneError``:
            the watch cannot resume, list again).
        UnavailableError: a line that is not a watch event (a proxy cut the stream).
    """
    try:
        event = json.loads(line)
        kind, obj = str(event["type"]), event["object"]
    except (ValueError, KeyError, TypeError) as err:
        raise UnavailableError(0, "BadWatchEvent",
                               f"WATCH {path}: not a watch event ({err})") from None
    if kind == "ERROR":
        raise error_for(int(obj.get("code") or 0), str(obj.get("reason") or ""), obj,
                        "WATCH", path)
    return kind, obj


def fold_date(clock: ServerClock, header: str | None, sent: float, received: float) -> None:
    """Fold one response's ``Date`` header into the server-clock estimate.

    The response was produced at a server time in ``[Date, Date + 1)`` at a local instant
    between ``sent`` and ``received`` (``joblease.domain.clock``). A missing or unparsable
    header is skipped: the estimate only ever narrows on evidence. Callers serialize calls
    on one clock (the thread-safe client holds its lock; the asyncio one has one thread).
    """
    if not header:
        return
    try:
        server_seconds = date_seconds(header)
    except (TypeError, ValueError):
        return
    jumps = clock.jumps
    clock.observe(sent, received, server_seconds)
    if clock.jumps != jumps:
        log.warning(
            "the API server's clock (Date: %s) disagrees with earlier responses by "
            "%.1fs, more than %s=%.1fs: a clock stepped, or the API servers' clocks "
            "differ beyond the assumption; expiry judgments stay conservative for "
            "%.0fs (leases end early, takeovers wait). See docs/ha.md.",
            header, clock.max_gap, MAX_SERVER_SKEW_ENV, clock.max_skew, clock.track_ttl)


@functools.lru_cache(maxsize=16)
def date_seconds(header: str) -> int:
    """A ``Date`` header as Unix seconds (``ValueError``/``TypeError`` if it is not one).

    Cached: the header changes once a second while a worker reads two or three responses
    a job, and ``email.utils`` takes 10 µs to parse one (docs/benchmarks.md). A failed
    parse is not cached (``lru_cache`` keeps only results); it is rare and skipped.
    """
    return int(parsedate_to_datetime(header).timestamp())


def server_time(clock: ServerClock, monotonic: float, host: str) -> ServerNow:
    """The server's time at ``monotonic``, or the error that says why it cannot be judged.

    Raises:
        UnavailableError: no response has carried a usable ``Date`` header yet.
    """
    if not clock.known:
        raise UnavailableError(
            0, "NoDate", f"the API server at {host} answered without a usable "
            "Date header, so its clock cannot be estimated; joblease judges expiry "
            "only on the server's clock (is a proxy stripping Date?)")
    return clock.now(monotonic)


def calibration_pause(now: ServerNow, max_skew: float, target_error: float, left: float
                      ) -> float | None:
    """How long to wait before the next calibration sample; ``None``: calibration is done.

    The first response bounds the offset to about one second; the interval then narrows to
    the round trip plus the polling gap when a response shows the next second. So sleep
    until just before the earliest possible tick, then poll every ``target_error`` seconds
    (tens of requests, not hundreds). The configured inter-server allowance (docs/ha.md)
    is not something sampling can narrow: the interval is judged without it.

    Args:
        now: The server's time now, as estimated so far.
        max_skew: The clock's inter-server allowance, in seconds.
        target_error: The error bound to reach, in seconds.
        left: Seconds left of the calibration's time budget.
    """
    if left <= 0:
        return None
    skew = timedelta(seconds=max_skew)
    if (now.error - skew).total_seconds() <= target_error:
        return None
    # the next second boundary after the earliest possible server time: if the interval
    # already straddles it, poll now; otherwise sleep until it may come
    boundary = math.floor((now.earliest + skew).timestamp()) + 1
    wait = boundary - (now.latest - skew).timestamp() - target_error
    return min(max(0.0, wait), left) + target_error / 2
