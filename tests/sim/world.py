"""One true timeline, per-process clocks, and the API the real client code talks through.

* ``World`` owns true time and a seeded event queue; nothing sleeps and nothing runs on a
  thread: an event is a callback at a true instant.
* ``LocalClock``: a process's monotonic clock, ``offset + (1 + rate) * true``; ``rate``
  within the drift bound in ordinary runs.
* ``SimApi`` is what the real ``LeaseStore``, ``transact``, ``LeaseClient`` and ``Lease``
  see instead of ``KubeApi``: the same ``request``/``server_now``/``monotonic``/``clock``
  surface, answered by the model server at the current true instant, with a ``Date`` header
  at one-second resolution folded into a real ``ServerClock``, and faults injected per call.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from joblease.domain.clock import ServerClock, ServerNow
from joblease.kube.api import (
    ApiError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    Response,
    UnavailableError,
)

from .model import ModelError, ModelServer

BASE = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
BASE_UNIX = BASE.timestamp()
INJECTED = "_sim_injected"  # the attribute that marks an exception the world raised on purpose


def inject(err: Exception) -> Exception:
    """Mark ``err`` as a fault the world injects, keeping its type.

    The code under test must handle a ``KeyError`` as a ``KeyError`` (no subclass that a
    ``type(err) is`` check would tell apart); the mark only lets the simulator's oracle m
    tell these planned faults from an exception a bug raised.
    """
    setattr(err, INJECTED, True)
    return err


def injected(err: BaseException) -> bool:
    """Whether ``err``, or any exception it was raised from or while handling, was injected.

    The product may wrap an injected fault (``raise ... from err``) or fail while handling
    it; both chains lead back to the world's fault, so neither is a bug of its own.
    """
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if getattr(current, INJECTED, False):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


@dataclass(order=True)
class _Item:
    at: float
    seq: int
    action: Callable[[], None] = field(compare=False)
    owner: str = field(compare=False, default="")


class World:
    """True time, a seeded random source and the event queue."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self._queue: list[_Item] = []
        self._seq = 0
        self.serving = 0.0  # true time at which the request being served reached the server
        self.dead: set[str] = set()
        self.paused_until: dict[str, float] = {}

    def at(self, when: float, action: Callable[[], None], owner: str = "") -> None:
        """Run ``action`` at true time ``when`` (on behalf of process ``owner``)."""
        self._seq += 1
        heapq.heappush(self._queue, _Item(max(when, self.now), self._seq, action, owner))

    def after(self, delay: float, action: Callable[[], None], owner: str = "") -> None:
        self.at(self.now + delay, action, owner)

    def run_until(self, end: float, each: Callable[[], None] = lambda: None) -> None:
        while self._queue and self._queue[0].at <= end:
            item = heapq.heappop(self._queue)
            if item.owner in self.dead:
                continue
            resume = self.paused_until.get(item.owner, 0.0)
            if resume > item.at:  # a paused process does nothing until it resumes
                self.at(resume, item.action, item.owner)
                continue
            self.now = item.at
            item.action()
            each()
        self.now = end

    def server_time(self, serving: bool = False) -> datetime:
        """The API server's clock: the true timeline (its own offset is irrelevant here).

        ``serving``: the instant the request now being served reached the server (the
        step's start plus the time its process has spent in requests so far).
        """
        return BASE + timedelta(seconds=max(self.now, self.serving) if serving else self.now)


@dataclass
class LocalClock:
    """A process's monotonic clock as a function of true time."""

    offset: float
    rate: float  # relative error: +1e-4 runs 100 ppm fast

    def local(self, true: float) -> float:
        return self.offset + (1.0 + self.rate) * true

    def true(self, local: float) -> float:
        return (local - self.offset) / (1.0 + self.rate)


@dataclass
class Faults:
    """Per-call fault probabilities (0 disables), drawn from the world's seeded source."""

    request_lost: float = 0.0
    response_lost: float = 0.0
    hung: float = 0.0
    conflict_storm: float = 0.0
    exception: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)

    def draw(self, rng: random.Random) -> str | None:
        for name in ("request_lost", "response_lost", "hung", "conflict_storm", "exception"):
            if rng.random() < getattr(self, name):
                self.counts[name] = self.counts.get(name, 0) + 1
                return name
        return None


class SimApi:
    """The ``KubeApi`` surface over the model server, for one process."""

    host = "https://sim.invalid"

    def __init__(self, world: World, server: ModelServer, clock: LocalClock, name: str,
                 faults: Faults | None = None, rtt: float = 0.002, user: str = "") -> None:
        self.world, self.server, self.local, self.name = world, server, clock, name
        self.user = user or name  # the username the API server (and its policies) see
        self.faults = faults or Faults()
        self.rtt = rtt
        self.clock = ServerClock()
        self.elapsed = 0.0  # true seconds this process has spent inside the current step
        self.requests = 0
        self.blocked = 0.0  # true seconds the current step is blocked by a hung request
        self.hung_at = -1e9  # true time this process's last hung request was sent
        self.conflicts = 0  # 409 answers to writes (a pool's wasted attempts)
        self.forbidden = 0  # 403 answers: an admission policy refused a write

    # -- the KubeApi surface ----------------------------------------------------------------
    def monotonic(self) -> float:
        return self.local.local(self.world.now + self.elapsed)

    def server_now(self) -> ServerNow:
        if not self.clock.known:
            self.request("GET", "/version")
        return self.clock.now(self.monotonic())

    def calibrate(self, *args: Any, **kwargs: Any) -> float:
        return self.clock.error_bound(self.monotonic()).total_seconds()

    def close(self) -> None:
        pass

    def whoami(self) -> str:
        return self.user

    def request(self, method: str, path: str, body: Any = None, *,
                query: dict[str, str] | None = None, content_type: str | None = None,
                timeout: float = 10.0) -> Response:
        self.requests += 1
        fault = self.faults.draw(self.world.rng) if path != "/version" else None
        sent = self.monotonic()
        if self.blocked:
            # The world stands still during a step, so a process that waited out a hung
            # request cannot see what happened meanwhile: for the rest of this step the
            # server stays unreachable (its next step sees the world as it then is).
            self.elapsed += self.rtt
            raise UnavailableError(0, "Unavailable", f"{method} {path}: still no answer")
        if fault == "hung":
            self.hung_at = self.world.now + self.elapsed
            self.elapsed += timeout
            self.blocked += timeout
            raise UnavailableError(0, "Unavailable", f"{method} {path}: read timed out")
        if fault == "request_lost":
            self.elapsed += self.rtt
            raise UnavailableError(0, "Unavailable", f"{method} {path}: connection reset")
        if fault == "exception":
            self.elapsed += self.rtt
            raise inject(self.world.rng.choice([RuntimeError("credential refresh failed"),
                                                KeyError("status"),
                                                ValueError("malformed response")]))
        if fault == "conflict_storm" and method == "PATCH" and path.endswith("/status"):
            self.server.touch_metadata(path.split("/")[-2])
        self.elapsed += self.rtt / 2
        server_seconds = int(BASE_UNIX + self.world.now + self.elapsed)
        self.world.serving = self.world.now + self.elapsed
        try:
            status, data = 200, self._serve(method, path, body)
        except ModelError as err:
            status, data = err.status, {"message": err.message}
        self.elapsed += self.rtt / 2
        received = self.monotonic()
        self.clock.observe(sent, received, server_seconds)
        if fault == "response_lost":
            raise UnavailableError(0, "Unavailable", f"{method} {path}: response lost")
        self.conflicts += status == 409 and method == "PATCH"
        self.forbidden += status == 403
        if status != 200:
            raise _error(status, data["message"])
        return Response(status, data, sent, received)

    def _serve(self, method: str, path: str, body: Any) -> dict[str, Any]:
        if path == "/version":
            return {"gitVersion": "sim"}
        parts = path.split("?")[0].strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            return self._serve_pod(method, parts, body)
        # apis/joblease.dev/v1alpha1/namespaces/NS/jobleases[/NAME[/status]]
        name = parts[6] if len(parts) > 6 else None
        if method == "GET" and name is None:
            return {"items": self.server.list()}
        if method == "GET":
            return self.server.get(name or "")
        if method == "PATCH" and len(parts) > 7 and parts[7] == "status":
            return self.server.patch_status(name or "", body, self.user)
        if method == "POST":
            return self.server.create(body["metadata"]["name"], body.get("spec") or {},
                                      body["metadata"].get("labels"))
        if method == "DELETE":
            self.server.delete(name or "")
            return {}
        raise ModelError(405, f"{method} {path} is not modelled")

    def _serve_pod(self, method: str, parts: list[str], body: Any) -> dict[str, Any]:
        # api/v1/namespaces/NS/pods/NAME
        name = parts[5] if len(parts) > 5 else ""
        if method == "GET" and name:
            return self.server.get_pod(name)
        if method == "PATCH" and name:
            return self.server.patch_pod(name, body, self.user)
        raise ModelError(405, f"{method} /{'/'.join(parts)} is not modelled")


def _error(status: int, message: str) -> ApiError:
    kind: type[ApiError] = {409: ConflictError, 404: NotFoundError, 422: InvalidError,
                             403: ForbiddenError}.get(status, ApiError)
    return kind(status, "", message)
