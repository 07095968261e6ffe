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

Several servers (an HA control plane behind a load balancer)
------------------------------------------------------------
Responses through a TCP load balancer do not say which server answered, so successive
``Date`` headers may come from clocks that disagree. The model (``docs/ha.md``):

* **Assumption:** every API server's clock is within ``max_skew`` seconds of every other
  one (configured: ``JOBLEASE_MAX_SERVER_SKEW``; 0 means "one clock").
* Observations that agree with each other form a *track* (one server's clock, or several
  servers that agree to within the resolution). An observation that intersects no track
  starts a new one. If it lies within ``max_skew`` of the nearest track it is counted in
  ``switches`` (another server, as assumed); otherwise in ``jumps`` (a clock step, or the
  assumption is broken).
* :meth:`ServerClock.now` returns the *hull* of every track seen in the last ``track_ttl``
  seconds, widened by ``max_skew`` on each side for the servers not observed yet. So the
  interval contains every server's time when the assumption holds, and contains every
  clock this client has *seen* even when it does not: a broken assumption makes the error
  bound (and so the margin) large, which ends leases early and delays takeovers, instead
  of silently trusting whichever server answered last.
* With ``track_ttl == 0`` (the default of this pure class) an observation that intersects
  no track drops the old ones: the estimate restarts from the new observation, as a single
  server's NTP step calls for.

A wrong estimate can only make expiry *timing* wrong; fencing never depends on it.

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


MAX_TRACKS = 8  # more distinct clocks than this in ``track_ttl`` is itself a broken setup


@dataclass
class _Track:
    """One clock's offset interval, as of local monotonic ``anchor`` (its last observation)."""

    low: float
    high: float
    anchor: float


@dataclass
class ServerClock:
    """Tracks the interval that contains ``server_time - local_monotonic``.

    Attributes:
        drift: Assumed maximum relative rate difference between the clocks.
        max_skew: Assumed maximum difference between any two API servers' clocks, seconds.
        track_ttl: How long (seconds) a clock not observed again still counts in the hull.
        jumps: Observations that contradicted every known clock by more than ``max_skew``
            (a clock step, or servers disagreeing beyond the assumption).
        switches: Observations from another clock within ``max_skew`` (as assumed).
        max_gap: The largest disagreement (seconds) seen between an observation and the
            nearest known clock; compare it with ``max_skew`` to size the setting.
        observations: How many responses have been folded in.
    """

    drift: float = DEFAULT_DRIFT
    max_skew: float = 0.0
    track_ttl: float = 0.0
    jumps: int = 0
    switches: int = 0
    max_gap: float = 0.0
    observations: int = 0
    _tracks: list[_Track] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.max_skew < 0 or self.track_ttl < 0 or self.drift < 0:
            raise ValueError("drift, max_skew and track_ttl must be >= 0")

    @property
    def known(self) -> bool:
        """Whether at least one response has been observed."""
        return bool(self._tracks)

    @property
    def tracks(self) -> int:
        """How many distinct clocks are currently remembered."""
        return len(self._tracks)

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
        for i, track in enumerate(self._tracks):  # most recently seen first
            low, high = self._widened(track, received)
            low, high = max(low, new_low), min(high, new_high)
            if low <= high:
                del self._tracks[i]
                self._tracks.insert(0, _Track(low, high, received))
                self._forget(received)
                return
        if self._tracks:
            gap = min(self._gap(t, received, new_low, new_high) for t in self._tracks)
            self.max_gap = max(self.max_gap, gap)
            if gap <= self.max_skew:
                self.switches += 1
            else:
                self.jumps += 1
        self._tracks.insert(0, _Track(new_low, new_high, received))
        self._forget(received, keep_first_only=self.track_ttl == 0)

    def now(self, monotonic: float) -> ServerNow:
        """Return the interval that contains the server's time at ``monotonic``.

        Raises:
            RuntimeError: nothing has been observed yet (callers must talk to the server first).
        """
        if not self._tracks:
            raise RuntimeError("the server clock is unknown until a response has been observed")
        if len(self._tracks) == 1:  # one clock seen (the usual case): the same sums, inline
            widest_low, widest_high = self._widened(self._tracks[0], monotonic)
        else:
            widened = [self._widened(t, monotonic) for t in self._live(monotonic)]
            widest_low, widest_high = min(w[0] for w in widened), max(w[1] for w in widened)
        low, high = widest_low - self.max_skew, widest_high + self.max_skew
        return ServerNow(_to_datetime(monotonic + low), _to_datetime(monotonic + high))

    def error_bound(self, monotonic: float) -> timedelta:
        """Half-width of the interval at ``monotonic`` (how far ``midpoint`` may be off)."""
        return self.now(monotonic).error

    def monotonic_at(self, when: datetime) -> float:
        """Return the *earliest* local monotonic instant at which the server may reach ``when``.

        The holder uses this to stop on time: it must assume the server reaches a lease's
        end as early as the estimate allows, so the fastest remembered clock (plus the
        allowance for unobserved servers) decides, and that clock is assumed to gain
        ``drift`` on ours for every second after its last observation — the same widening
        :meth:`now` applies. Without the drift term a one-day lease's holder could stop
        8.6 s after the server passed its end (issue 14, item 6).

        For one track observed at ``anchor`` with upper offset bound ``high``, the server's
        latest possible time at local ``t >= anchor`` is ``t + high + drift * (t - anchor)``;
        solving for the instant it reaches ``when`` gives the formula below.
        """
        if not self._tracks:
            raise RuntimeError("the server clock is unknown until a response has been observed")
        target = when.timestamp() - self.max_skew
        return min(self._earliest_local(t, target) for t in self._tracks)

    def monotonic_certain(self, when: datetime) -> float:
        """Return the local monotonic instant by which the server has *certainly* reached ``when``.

        The claimer's counterpart of :meth:`monotonic_at`: a waiting claim wants the first
        instant at which ``now(t).earliest >= when``, so that its decision, judged on the
        earliest server time, finds the lease claimable. Waking at :meth:`monotonic_at`
        instead would be up to the whole error interval too early, and a waiter would spin
        until the interval had passed. Every remembered clock is assumed to lose ``drift``
        on ours after its last observation (the widening :meth:`now` applies); clocks that
        :meth:`now` stops counting only make the instant earlier, so the answer is late
        at worst, never early.
        """
        if not self._tracks:
            raise RuntimeError("the server clock is unknown until a response has been observed")
        target = when.timestamp() + self.max_skew
        # t + low - drift * (t - anchor) = target, for t after the track's last observation
        return max((target - t.low - self.drift * t.anchor) / (1 - self.drift)
                   for t in self._tracks)

    def _earliest_local(self, track: _Track, target: float) -> float:
        after = (target - track.high + self.drift * track.anchor) / (1 + self.drift)
        if after >= track.anchor:
            return after
        # Reached before the last observation: there the bound widens towards the past.
        return (target - track.high - self.drift * track.anchor) / (1 - self.drift)

    def _live(self, monotonic: float) -> list[_Track]:
        # The most recently seen clock always counts; others while seen within track_ttl.
        return [t for i, t in enumerate(self._tracks)
                if i == 0 or t.anchor >= monotonic - self.track_ttl]

    def _forget(self, at: float, keep_first_only: bool = False) -> None:
        if keep_first_only:
            del self._tracks[1:]
            return
        self._tracks[:] = [t for i, t in enumerate(self._tracks)
                           if i == 0 or t.anchor >= at - self.track_ttl][:MAX_TRACKS]

    def _gap(self, track: _Track, at: float, low: float, high: float) -> float:
        t_low, t_high = self._widened(track, at)
        return max(low - t_high, t_low - high, 0.0)

    def _widened(self, track: _Track, monotonic: float) -> tuple[float, float]:
        spread = self.drift * abs(monotonic - track.anchor)
        return track.low - spread, track.high + spread


def _to_datetime(unix_seconds: float) -> datetime:
    return datetime.fromtimestamp(unix_seconds, tz=UTC)
