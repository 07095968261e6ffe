"""Builders the unit tests share: a fixed instant and server-time intervals around it.

Written once (issue 23, item 7): several test modules had their own copies of ``T0`` and
``at()``. ``at(s, error)`` is the API server's time ``s`` seconds after ``T0``, known to
``±error`` seconds — the interval every decision of the protocol takes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from joblease.domain.clock import ServerNow

T0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)


def at(seconds: float, error: float = 0.0) -> ServerNow:
    """The server's time ``seconds`` after :data:`T0`, known to ``±error`` seconds."""
    mid = T0 + timedelta(seconds=seconds)
    return ServerNow(mid - timedelta(seconds=error), mid + timedelta(seconds=error))
