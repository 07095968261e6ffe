"""An estimate of the API server's clock, with an honest error bound.

Why: a lease's expiry must be judged on *one* clock that every party agrees on, and the
only clock all clients share is the API server's. A worker's wall clock may be off by
minutes (or faked); its monotonic clock is steady but has an arbitrary origin. So we
estimate ``offset = server_time - local_monotonic`` from the HTTP ``Date`` header of API
responses and carry an interval ``[low, high]`` that certainly contains it.

How: a response stamped ``Date: S`` (one-second resolution, truncated) was produced at a
server time in ``[S, S + 1)``, at a local monotonic instant between the request's send
time ``t0`` and its receive time ``t1``. Hence ``offset ∈ [S - t1, S + 1 - t0]``.
Intersecting the intervals of successive responses narrows it; when a response lands
just after the server's second ticks over, the interval shrinks to about one round trip
(milliseconds on loopback). Between observations the interval widens by the assumed
maximum rate difference between the two clocks (``drift``, default 100 ppm).

If a new observation does not intersect the current interval, the server's clock moved
(an NTP step, or in an HA control plane a different server with a different clock): the
estimate restarts from the new observation and ``jumps`` counts it. Such a jump can only
make expiry *timing* wrong; fencing never depends on this estimate.

Everything here is pure: callers pass monotonic readings in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

DEFAULT_DRIFT = 100e-6  # 100 ppm: far above what NTP-disciplined hosts show.


@dataclass(frozen=True)
class ServerNow:
    """The server's current time, known to lie in ``[earliest, latest]``."""

    earliest: datetime
    latest: datetime

    @property
    def midpoint(self) -> datetime:
        """The best single estimate; used to stamp times we write."""
        return self.earliest + (self.latest - self.earliest) / 2

    @property
    def error(self) -> timedelta:
        """Half the width of the interval: the bound on ``midpoint``'s error."""
        return (self.latest - self.earliest) / 2

    @classmethod
    def exact(cls, when: datetime) -> ServerNow:
        """Build a zero-width interval (tests, and callers that trust a single clock)."""
        return cls(when, when)


@dataclass
class ServerClock:
    """Tracks the interval that contains ``server_time - local_monotonic``.

    Attributes:
        drift: Assumed maximum relative rate difference between the clocks.
        jumps: How many times an observation contradicted the estimate (clock stepped).
        observations: How many responses have been folded in.
    """

    drift: float = DEFAULT_DRIFT
    jumps: int = 0
    observations: int = 0
    _low: float | None = field(default=None, repr=False)
    _high: float | None = field(default=None, repr=False)
    _anchor: float = field(default=0.0, repr=False)

    @property
    def known(self) -> bool:
        """Whether at least one response has been observed."""
        return self._low is not None

    def observe(self, sent: float, received: float, server_seconds: int) -> None:
        """Fold in one response.

        Args:
            sent: Local monotonic time just before the request was sent.
            received: Local monotonic time just after the response headers arrived.
            server_seconds: The response's ``Date`` header as Unix seconds.
        """
        if received < sent:
            raise ValueError(f"received ({received}) before sent ({sent})")
        new_low = server_seconds - received
        new_high = server_seconds + 1 - sent
        self.observations += 1
        if self._low is None or self._high is None:
            self._set(new_low, new_high, received)
            return
        low, high = self._widened(received)
        low, high = max(low, new_low), min(high, new_high)
        if low > high:
            self.jumps += 1
            self._set(new_low, new_high, received)
        else:
            self._set(low, high, received)

    def now(self, monotonic: float) -> ServerNow:
        """Return the interval that contains the server's time at ``monotonic``.

        Raises:
            RuntimeError: nothing has been observed yet (callers must talk to the server first).
        """
        if self._low is None:
            raise RuntimeError("the server clock is unknown until a response has been observed")
        low, high = self._widened(monotonic)
        return ServerNow(_to_datetime(monotonic + low), _to_datetime(monotonic + high))

    def error_bound(self, monotonic: float) -> timedelta:
        """Half-width of the interval at ``monotonic`` (how far ``midpoint`` may be off)."""
        return self.now(monotonic).error

    def monotonic_at(self, when: datetime) -> float:
        """Return the *earliest* local monotonic instant at which the server may reach ``when``.

        The holder uses this to stop on time: it must assume the server reaches a lease's
        end as early as the estimate allows.
        """
        if self._high is None:
            raise RuntimeError("the server clock is unknown until a response has been observed")
        return when.timestamp() - self._high

    def _widened(self, monotonic: float) -> tuple[float, float]:
        assert self._low is not None and self._high is not None
        spread = self.drift * abs(monotonic - self._anchor)
        return self._low - spread, self._high + spread

    def _set(self, low: float, high: float, anchor: float) -> None:
        self._low, self._high, self._anchor = low, high, anchor


def _to_datetime(unix_seconds: float) -> datetime:
    return datetime.fromtimestamp(unix_seconds, tz=UTC)
