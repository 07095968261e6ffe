"""Time in the protocol, written once: parse, format, add, clamp, and when a lease ends.

Why one module: the rules were spread where they were first needed — ``format_time`` in
``domain/errors.py`` (so the CLI imported time formatting from the errors module),
``parse_time`` and the saturating arithmetic in ``domain/lease.py``, "``leaseUntil`` +
margin − the server's earliest now" written out in the holder, the protocol, the reconciler
and pod delegation, the margin's default in the holder and again in the operator's
settings (issue 31). Here each is one function, and everything else calls it.

Two sides of one end
--------------------
A lease's end, ``leaseUntil``, is judged on the API server's clock, known only as an
interval (``ServerNow``: ``earliest``..``latest``), widened by a safety ``margin``:

* **Others** (a claimer taking over, the operator marking it Expired, a pool choosing a
  candidate) act only once the *earliest* possible server time is past ``leaseUntil +
  margin``: :func:`expiry_at`, :func:`expiry_due`, :func:`seconds_until_expiry`.
* **The holder** stops once the *latest* possible server time may have reached
  ``leaseUntil - margin``: :func:`holder_end`, :func:`past_holder_end`.

Between the two lies at least ``2 × margin`` of server time, so the holder has stopped
before anyone may take over (docs/safety.md states the assumptions).

Renewal: a holder renews when :data:`RENEW_FRACTION` of the lease's duration has passed
(:func:`renew_at`, :func:`seconds_until_renewal`, on the server's clock: what a stateless
renewer such as the operator's pod delegation needs). A holding that counts on its own
monotonic clock takes the same fraction of the time its lease has left
(``joblease.domain.holder.renew_interval``): right after a renewal that is the same point.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta

from joblease.domain.clock import ServerNow

DEFAULT_MARGIN = timedelta(milliseconds=250)
"""The safety margin's default, for holders and the operator (``--margin-seconds``)."""

RENEW_FRACTION = 1 / 3
"""A holder renews when this fraction of its lease has passed (two more chances remain)."""

# RFC 3339 as kube-openapi's strfmt accepts it for ``format: date-time``: lower-cased and split
# at ``t`` (anything after a second ``t`` is ignored); a date of any year 0000-9999; a time
# whose fraction may follow any one character and have any length; ``z`` or an offset of
# two two-digit numbers (``+99:99`` passes).
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})(?:.(\d+))?(?:(z)|([+-])(\d{2}):(\d{2}))",
                   re.ASCII | re.DOTALL)
# Every stored time is clamped into this window, so that adding any duration the protocol
# uses (a lease of at most a day, a TTL of at most a year, margins) can never overflow.
EARLIEST_TIME = datetime(2, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(9998, 1, 1, tzinfo=UTC)


PARSED_TIMES_CACHED = 1024
"""How many distinct timestamp strings :func:`parse_time` remembers (least recently used go).

Why a cache: the operator parses every JobLease's ``creationTimestamp`` from its watch,
and JobLeases created together share the second it names (hundreds per second in a
burst); parsing was 17 % of the operator's CPU per creation (a py-spy profile of 30,000
creations, docs/benchmarks.md). The answer depends on the text alone and ``datetime`` is
immutable, so a remembered answer is the same answer. About 250 bytes an entry.
"""


def parse_time(text: str) -> datetime:
    """Parse a timestamp as the API server stores it; never raises for one it accepts.

    Why not ``datetime.fromisoformat``: the API server accepts what Python does not (year
    0000, a lowercase ``z``, nanoseconds, offsets of ``+24:00`` and more, odd fraction
    separators, offsets that push the instant past year 9999), and one such value written
    by any client must not stop the operator or a worker. Out-of-range instants are
    clamped to ``[EARLIEST_TIME, LATEST_TIME]``. A space instead of ``T`` is read too.
    Answers for short strings are remembered (:data:`PARSED_TIMES_CACHED`); an error is not.

    Raises:
        ValueError: ``text`` is not a date-time the schema accepts at all.
    """
    if type(text) is str and len(text) <= 64:  # exactly str: a subclass may hash otherwise
        return _parse_remembered(text)
    return _parse(text)


def _parse(text: str) -> datetime:
    lowered = text.strip().lower()
    if lowered[10:11] == " ":
        lowered = lowered[:10] + "t" + lowered[11:]
    parts = lowered.split("t")
    date = _DATE.fullmatch(parts[0])
    time_ = _TIME.fullmatch(parts[1]) if len(parts) > 1 else None
    if date is None or time_ is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    year, month, day = (int(g) for g in date.groups())
    hour, minute, second = (int(g) for g in time_.groups()[:3])
    fraction, zulu, sign, off_h, off_m = time_.groups()[3:]
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    offset = 0 if zulu else (int(off_h) * 60 + int(off_m)) * (1 if sign == "+" else -1)
    if year < EARLIEST_TIME.year:
        return EARLIEST_TIME
    try:
        local = datetime(year, month, day, hour, minute, min(second, 59), micros)
    except ValueError as err:
        raise ValueError(f"not a valid date and time: {text!r} ({err})") from None
    return clamp_time(_shift_saturating(local, -offset))


_parse_remembered = functools.lru_cache(maxsize=PARSED_TIMES_CACHED)(_parse)


def _shift_saturating(local: datetime, minutes: int) -> datetime:
    try:
        return local.replace(tzinfo=UTC) + timedelta(minutes=minutes)
    except OverflowError:
        return LATEST_TIME if minutes > 0 else EARLIEST_TIME


def format_time(when: datetime) -> str:
    """Format a time the way the JobLease status stores it (RFC 3339, ms, UTC).

    Converted to UTC first: a time read with an offset is written back as the same instant.
    """
    if when.tzinfo is not None:
        when = when.astimezone(UTC)
    return (f"{when.year:04d}-{when.month:02d}-{when.day:02d}T{when.hour:02d}:"
            f"{when.minute:02d}:{when.second:02d}.{when.microsecond // 1000:03d}Z")


def clamp_time(when: datetime) -> datetime:
    """``when`` limited to ``[EARLIEST_TIME, LATEST_TIME]`` (see :data:`LATEST_TIME`)."""
    return min(max(when, EARLIEST_TIME), LATEST_TIME)


def add_time(when: datetime, delta: timedelta) -> datetime:
    """``when + delta``, saturating instead of raising ``OverflowError``."""
    try:
        return when + delta
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC) if delta > timedelta(0) \
            else datetime.min.replace(tzinfo=UTC)


# --- the end of a lease, for others and for its holder ---------------------------------------

def expiry_at(lease_until: datetime, margin: timedelta) -> datetime:
    """The server time after which others may act on an ended lease: ``leaseUntil + margin``."""
    return add_time(lease_until, margin)


def expiry_due(lease_until: datetime, margin: timedelta, now: ServerNow) -> bool:
    """Whether the server's time is *certainly* past :func:`expiry_at`.

    The test every taker applies: a claim over a holder, the operator's expiry, a pool's
    choice of candidates (``joblease.domain.lease.claimable_at``).
    """
    return now.earliest >= expiry_at(lease_until, margin)


def seconds_until_expiry(lease_until: datetime, margin: timedelta, now: ServerNow) -> float:
    """Seconds until :func:`expiry_due` becomes true (0 or less: it is).

    What a claimer waits, and when the operator looks at a Held lease next.
    """
    return (expiry_at(lease_until, margin) - now.earliest).total_seconds()


def holder_end(lease_until: datetime, margin: timedelta) -> datetime:
    """The server time at which the holder must consider its lease gone: ``leaseUntil - margin``."""
    return add_time(lease_until, -margin)


def past_holder_end(lease_until: datetime, margin: timedelta, now: ServerNow) -> bool:
    """Whether the server's time *may* have reached :func:`holder_end` (a renewal is too late)."""
    return now.latest > holder_end(lease_until, margin)


def renew_at(lease_until: datetime, duration: timedelta,
             fraction: float = RENEW_FRACTION) -> datetime:
    """The server time at which ``fraction`` of a lease of ``duration`` has passed."""
    return add_time(lease_until, -duration * (1 - fraction))


def seconds_until_renewal(lease_until: datetime, duration: timedelta, now: ServerNow,
                          fraction: float = RENEW_FRACTION) -> float:
    """Seconds until :func:`renew_at` may have come (on the *latest* server time: never late)."""
    return (renew_at(lease_until, duration, fraction) - now.latest).total_seconds()
