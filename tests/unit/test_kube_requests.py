"""``joblease.kube.requests``: what a request is and what its answer means, for both clients.

``KubeApi`` (thread-safe) and ``AsyncKubeApi`` (aiohttp) send exactly these requests and
read answers exactly this way; each rule is pinned here once, without a server.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest

from joblease.domain.clock import ServerClock, ServerNow
from joblease.kube.leases import (
    list_call,
    read_call,
    status_write_call,
)
from joblease.kube.requests import (
    JSON,
    MERGE_PATCH,
    ApiError,
    ConflictError,
    ForbiddenError,
    GoneError,
    InvalidError,
    NotFoundError,
    UnavailableError,
    build_request,
    calibration_pause,
    decode_body,
    fold_date,
    server_time,
    watch_event,
)
from support.fakekube import lease_object

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


# -- building -----------------------------------------------------------------------------------

def test_a_read_asks_for_json_and_carries_no_body_or_content_type() -> None:
    req = build_request("GET", "/version")
    assert (req.method, req.path, req.headers, req.body) == ("GET", "/version",
                                                             {"Accept": JSON}, None)
    assert req.payload() is None


def test_the_query_is_joined_to_the_path_encoded() -> None:
    req = build_request("GET", "/x", query={"labelSelector": "a=b,c in (d)", "limit": "5"})
    assert req.path == "/x?labelSelector=a%3Db%2Cc+in+%28d%29&limit=5"
    assert build_request("GET", "/x", query={}).path == "/x"


def test_a_body_is_json_unless_a_content_type_is_given() -> None:
    body = {"metadata": {"resourceVersion": "7"}, "status": {"holder": "a"}}
    plain = build_request("POST", "/x", body)
    patch = build_request("PATCH", "/x", body, content_type=MERGE_PATCH)
    assert plain.headers == {"Accept": JSON, "Content-Type": JSON}
    assert patch.headers == {"Accept": JSON, "Content-Type": MERGE_PATCH}
    assert json.loads(patch.payload() or b"") == body


def test_a_status_write_is_a_merge_patch_conditional_on_the_read_version() -> None:
    from joblease.domain.lease import Observed

    obs = Observed.from_object(lease_object("job", {"phase": "Available"}))
    held = obs.status.__class__.from_dict({"phase": "Held", "holder": "a", "generation": 1})
    call = status_write_call(obs, held)
    assert (call.method, call.path, call.content_type) == (
        "PATCH", "/apis/joblease.dev/v1alpha1/namespaces/ns/jobleases/job/status", MERGE_PATCH)
    assert call.body["metadata"] == {"resourceVersion": obs.resource_version}
    assert call.body["status"] == {"phase": "Held", "holder": "a", "generation": 1}
    assert call.lease == ("ns", "job")


def test_a_read_maps_404_to_the_protocols_not_found_and_a_list_does_not() -> None:
    from joblease.domain.errors import LeaseNotFoundError

    err = NotFoundError(404, "NotFound", "gone")
    assert isinstance(read_call("ns", "job").refusal(err), LeaseNotFoundError)
    assert list_call("ns", "a=b").refusal(err) is err


def test_list_pages_and_watches_carry_the_selector_and_resume_point() -> None:
    call = list_call("ns", "pool=p", page_size=50, token="tok")
    assert call.query == {"limit": "50", "labelSelector": "pool=p", "continue": "tok"}
    page = call.parse({"items": [{"a": 1}], "metadata": {"resourceVersion": "9",
                                                        "continue": "next"}})
    assert (page.items, page.resource_version, page.next_token) == ([{"a": 1}], "9", "next")
    last = call.parse({"metadata": {"resourceVersion": "9"}})
    assert (last.items, last.next_token) == ([], "")
    filtered = list_call("ns", "pool=p", field_selector="status.phase!=Completed")
    assert filtered.query == {"limit": "500", "labelSelector": "pool=p",
                              "fieldSelector": "status.phase!=Completed"}


# -- answers -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "kind"), [
    (409, ConflictError), (404, NotFoundError), (410, GoneError), (422, InvalidError),
    (400, InvalidError), (403, ForbiddenError), (500, UnavailableError),
    (503, UnavailableError), (429, UnavailableError), (418, ApiError),
])
def test_each_error_status_is_its_typed_error_with_the_servers_message(
        status: int, kind: type[ApiError]) -> None:
    req = build_request("PATCH", "/x")
    with pytest.raises(ApiError) as err:
        req.answer(status, "Why", json.dumps({"message": "the server says"}).encode())
    assert type(err.value) is kind
    assert (err.value.status, err.value.reason, err.value.message) == (status, "Why",
                                                                      "the server says")


def test_a_success_returns_the_decoded_body_and_an_error_without_message_names_the_request(
        ) -> None:
    req = build_request("GET", "/x", query={"a": "1"})
    assert req.answer(200, "OK", b'{"kind": "JobLease"}') == {"kind": "JobLease"}
    assert req.answer(299, "", b"") == {}
    with pytest.raises(ApiError, match=r"^300 Multiple: GET /x\?a=1$"):
        req.answer(300, "Multiple", b"")
    with pytest.raises(ApiError, match=r"^199 Early"):
        req.answer(199, "Early", b"")


def test_bodies_that_are_not_json_objects_are_kept_readable() -> None:
    assert decode_body(None) == {} and decode_body(b"") == {}
    assert decode_body(b"[1, 2]") == {"items": [1, 2]}
    assert decode_body(b"<html>bad gateway</html>") == {"message": "<html>bad gateway</html>"}
    assert len(decode_body(b"x" * 5000)["message"]) == 2000


def test_no_answer_is_unavailable_naming_the_request_and_the_cause() -> None:
    req = build_request("GET", "/x")
    err = req.unavailable(ConnectionResetError("reset by peer"))
    assert (err.status, err.reason, err.message) == (0, "Unavailable", "GET /x: reset by peer")
    assert req.unavailable(TimeoutError()).message == "GET /x: TimeoutError"


def test_watch_lines_are_events_and_an_error_event_is_its_typed_error() -> None:
    obj = {"metadata": {"name": "job", "resourceVersion": "5"}}
    line = json.dumps({"type": "MODIFIED", "object": obj}).encode()
    assert watch_event(line, "/w") == ("MODIFIED", obj)
    gone = json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                   "reason": "Expired",
                                                   "message": "too old resource version"}})
    with pytest.raises(GoneError, match="410 Expired: too old resource version"):
        watch_event(gone.encode(), "/w")
    for broken in (b"not json", b'{"type": "ADDED"}', b"[]"):
        with pytest.raises(UnavailableError, match="WATCH /w: not a watch event"):
            watch_event(broken, "/w")


# -- the server's clock ------------------------------------------------------------------------

def test_a_date_header_bounds_the_servers_time_and_a_bad_one_is_ignored() -> None:
    clock = ServerClock()
    fold_date(clock, None, 0.0, 0.1)
    fold_date(clock, "not a date", 0.0, 0.1)
    assert not clock.known
    fold_date(clock, "Thu, 03 Dec 2026 12:00:00 GMT", 10.0, 10.1)
    now = clock.now(10.1)
    assert now.earliest >= T0 and now.latest <= T0 + timedelta(seconds=1.1)


def test_a_clock_that_jumps_is_logged_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    clock = ServerClock()
    fold_date(clock, "Thu, 03 Dec 2026 12:00:00 GMT", 0.0, 0.0)
    with caplog.at_level(logging.WARNING, logger="joblease.kube.api"):
        fold_date(clock, "Thu, 03 Dec 2026 12:10:00 GMT", 1.0, 1.0)
    assert clock.jumps == 1
    assert "disagrees with earlier responses" in caplog.text


def test_without_a_date_the_time_cannot_be_judged_and_the_error_says_why() -> None:
    with pytest.raises(UnavailableError, match="at https://h answered without a usable Date"):
        server_time(ServerClock(), 0.0, "https://h")
    clock = ServerClock()
    clock.observe(0.0, 0.0, int(T0.timestamp()))
    assert server_time(clock, 0.0, "h") == clock.now(0.0)


def test_calibration_waits_for_the_next_tick_then_polls_and_stops_when_narrow() -> None:
    # the interval [12:00:00.2, 12:00:00.9] cannot tick before 12:00:01: wait until just
    # before its latest end may reach it, plus half the polling gap
    now = ServerNow(T0 + timedelta(seconds=0.2), T0 + timedelta(seconds=0.9))
    assert calibration_pause(now, 0.0, 0.01, 5.0) == pytest.approx(0.1 - 0.01 + 0.005, abs=1e-6)
    straddling = ServerNow(T0 + timedelta(seconds=0.995), T0 + timedelta(seconds=1.5))
    assert calibration_pause(straddling, 0.0, 0.01, 5.0) == pytest.approx(0.005, abs=1e-6)
    assert calibration_pause(now, 0.0, 0.01, 0.05) == pytest.approx(0.05 + 0.005, abs=1e-6)
    narrow = ServerNow(T0, T0 + timedelta(seconds=0.02))
    assert calibration_pause(narrow, 0.0, 0.01, 5.0) is None
    assert calibration_pause(now, 0.0, 0.01, 0.0) is None
    # the inter-server allowance is not narrowed by sampling: judged without it
    skewed = ServerNow(T0 - timedelta(seconds=2), T0 + timedelta(seconds=2.02))
    assert calibration_pause(skewed, 2.0, 0.01, 5.0) is None
