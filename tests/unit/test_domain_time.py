"""``joblease.domain.time``: the one place for time and for the two sides of a lease's end.

Issue 31: "leaseUntil + margin − now.earliest" was written out in four places, the margin's
default twice, and time formatting lived in the errors module. Each boundary here is
pinned to the microsecond on the side that keeps the protocol safe: others act only when
the server's *earliest* time is past ``leaseUntil + margin``; the holder stops when its
*latest* time may have reached ``leaseUntil - margin``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from joblease.controller.settings import OperatorSettings
from joblease.domain import errors, holder, lease
from joblease.domain import time as jtime
from joblease.domain.clock import ServerNow

pytestmark = pytest.mark.unit

UNTIL = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
MARGIN = timedelta(milliseconds=250)
US = timedelta(microseconds=1)


def around(mid: datetime, error: timedelta = timedelta(milliseconds=100)) -> ServerNow:
    return ServerNow(mid - error, mid + error)


def at_earliest(earliest: datetime) -> ServerNow:
    return ServerNow(earliest, earliest + timedelta(seconds=1))


def at_latest(latest: datetime) -> ServerNow:
    return ServerNow(latest - timedelta(seconds=1), latest)


def test_expiry_is_due_only_once_the_earliest_server_time_reaches_until_plus_margin() -> None:
    end = UNTIL + MARGIN
    assert jtime.expiry_at(UNTIL, MARGIN) == end
    assert not jtime.expiry_due(UNTIL, MARGIN, at_earliest(end - US))
    assert jtime.expiry_due(UNTIL, MARGIN, at_earliest(end))
    # the latest bound past the end is not enough: the server may still be before it
    assert not jtime.expiry_due(UNTIL, MARGIN, ServerNow(end - US, end + timedelta(hours=1)))


def test_seconds_until_expiry_counts_from_the_earliest_server_time() -> None:
    now = around(UNTIL)  # earliest is 100 ms before leaseUntil
    assert jtime.seconds_until_expiry(UNTIL, MARGIN, now) == pytest.approx(0.35)
    assert jtime.seconds_until_expiry(UNTIL, MARGIN, at_earliest(UNTIL + MARGIN)) == 0
    assert jtime.seconds_until_expiry(UNTIL, MARGIN, at_earliest(UNTIL + 2 * MARGIN)) == -0.25
    assert holder.seconds_until_claimable(UNTIL, MARGIN, now) == pytest.approx(0.35)
    assert holder.seconds_until_claimable(UNTIL, MARGIN, at_earliest(UNTIL + MARGIN * 3)) == 0


def test_the_holder_stops_once_the_latest_server_time_may_reach_until_minus_margin() -> None:
    end = UNTIL - MARGIN
    assert jtime.holder_end(UNTIL, MARGIN) == end
    assert not jtime.past_holder_end(UNTIL, MARGIN, at_latest(end))
    assert jtime.past_holder_end(UNTIL, MARGIN, at_latest(end + US))


def test_between_the_holders_end_and_the_others_start_lie_two_margins() -> None:
    gap = jtime.expiry_at(UNTIL, MARGIN) - jtime.holder_end(UNTIL, MARGIN)
    assert gap == 2 * MARGIN


def test_renewal_comes_when_a_third_of_the_duration_has_passed_on_the_latest_time() -> None:
    duration = timedelta(seconds=30)
    assert pytest.approx(1 / 3) == jtime.RENEW_FRACTION
    assert jtime.renew_at(UNTIL, duration) == UNTIL - timedelta(seconds=20)
    assert jtime.renew_at(UNTIL, duration, fraction=0.5) == UNTIL - timedelta(seconds=15)
    now = ServerNow(UNTIL - timedelta(seconds=26), UNTIL - timedelta(seconds=24))
    assert jtime.seconds_until_renewal(UNTIL, duration, now) == pytest.approx(4.0)
    # the holding's local form: a third of what is left, the same point right after a renewal
    assert holder.renew_interval(30.0) == pytest.approx(10.0)
    assert holder.renew_interval(0.0) == holder.MIN_RENEW_INTERVAL


def test_saturating_arithmetic_and_the_clamp_window() -> None:
    assert jtime.add_time(datetime.max.replace(tzinfo=UTC) - US, timedelta(days=1)) == (
        datetime.max.replace(tzinfo=UTC))
    assert jtime.add_time(datetime.min.replace(tzinfo=UTC) + US, -timedelta(days=1)) == (
        datetime.min.replace(tzinfo=UTC))
    assert jtime.clamp_time(datetime(1, 1, 1, tzinfo=UTC)) == jtime.EARLIEST_TIME
    assert jtime.clamp_time(datetime(9999, 1, 1, tzinfo=UTC)) == jtime.LATEST_TIME
    assert jtime.clamp_time(UNTIL) == UNTIL


def test_parse_and_format_are_inverse_to_the_millisecond() -> None:
    text = "2026-12-03T12:00:00.123Z"
    assert jtime.format_time(jtime.parse_time(text)) == text
    assert jtime.format_time(jtime.parse_time("2026-12-03T13:00:00.123456+01:00")) == text


def test_one_definition_under_every_old_name_and_one_margin_default() -> None:
    """The old homes re-export (other modules still import them there), never redefine."""
    assert errors.format_time is jtime.format_time
    assert (lease.parse_time, lease.add_time, lease.clamp_time) == (
        jtime.parse_time, jtime.add_time, jtime.clamp_time)
    assert (lease.EARLIEST_TIME, lease.LATEST_TIME) == (jtime.EARLIEST_TIME, jtime.LATEST_TIME)
    assert holder.DEFAULT_MARGIN is jtime.DEFAULT_MARGIN
    assert holder.RENEW_FRACTION is jtime.RENEW_FRACTION
    assert OperatorSettings().margin == jtime.DEFAULT_MARGIN
    assert lease.is_expired(None, around(UNTIL), MARGIN)  # no end: nothing to wait for
    assert lease.is_expired(UNTIL, at_earliest(UNTIL + MARGIN), MARGIN)
    assert not lease.is_expired(UNTIL, at_earliest(UNTIL + MARGIN - US), MARGIN)


def test_parse_time_remembers_answers_but_never_an_error() -> None:
    """The operator parses thousands of equal ``creationTimestamp`` strings (issue 28): the
    remembered answer must be the parser's own answer, an error must be raised every time,
    and a string too long to remember is still parsed."""
    remembered = jtime._parse_remembered
    remembered.cache_clear()
    text = "2026-12-06T12:15:30Z"
    first = jtime.parse_time(text)
    assert jtime.parse_time(text) is first  # the second answer came from the cache
    assert remembered.cache_info().hits == 1 and first == jtime._parse(text)
    for _ in range(2):
        with pytest.raises(ValueError, match="not an RFC 3339 timestamp"):
            jtime.parse_time("2026-12-06 nonsense")
    long_text = "2026-12-06T12:15:30." + "1" * 60 + "Z"
    assert jtime.parse_time(long_text) == datetime(2026, 12, 6, 12, 15, 30, 111111, tzinfo=UTC)
    assert remembered.cache_info().currsize == 1  # neither the error nor the long string
    for i in range(jtime.PARSED_TIMES_CACHED + 10):  # bounded: old entries make way
        jtime.parse_time(f"2026-12-06T12:{i // 60 % 60:02d}:{i % 60:02d}.{i:06d}Z")
    assert remembered.cache_info().currsize == jtime.PARSED_TIMES_CACHED
