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


def test_forbidden_lines_finds_403_answers_not_timestamps() -> None:
    """The operators' logs are searched for refused requests; a timestamp's milliseconds
    ("07:12:36,403") once failed the pod delegation test as a "403"."""
    from support.operator_process import forbidden_lines

    log = "\n".join([
        "2026-12-06 07:12:36,403 INFO joblease.operator.pods: renewed",
        'DEBUG urllib3: "PATCH /api/v1/namespaces/t-403/pods/a HTTP/1.1" 200 None',
        "uid ec5709e3-a6bd-4031-b732-14aeb7b43db2 port 40321 took 1.403 s",
        'DEBUG urllib3: "GET /apis/joblease.dev/v1alpha1/jobleases HTTP/1.1" 403 None',
        "kopf: APIForbiddenError: ('jobleases is forbidden', ...)",
        "ApiError: (403) Reason: Forbidden",
    ])
    assert forbidden_lines(log) == log.splitlines()[3:]
