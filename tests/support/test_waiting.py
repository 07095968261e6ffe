"""The shared ``wait_for`` and ``retry``: they return what succeeded and give up on time."""

from __future__ import annotations

import time

import pytest

from support.waiting import retry, wait_for


def test_wait_for_returns_the_first_truthy_value() -> None:
    values = iter([0, None, "", "ready"])
    assert wait_for(lambda: next(values), 5, "the fourth value", poll=0.001) == "ready"


def test_wait_for_names_what_it_waited_for_when_it_times_out() -> None:
    began = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0\.2s waiting for the moon"):
        wait_for(lambda: False, 0.2, "the moon", poll=0.01)
    assert 0.2 <= time.monotonic() - began < 2


def test_retry_returns_once_the_call_stops_raising() -> None:
    calls = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("server restarting")
        return 42

    assert retry(flaky, seconds=5, pause=0.001) == 42
    assert len(calls) == 3


def test_retry_raises_the_last_error_after_its_time() -> None:
    def broken() -> None:
        raise ConnectionError("still down")

    with pytest.raises(ConnectionError, match="still down"):
        retry(broken, seconds=0.1, pause=0.01)
