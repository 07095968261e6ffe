"""``transact``'s deadline and lost answers, on the in-memory API server with a settable clock.

Pins what mutation testing found untested after c5789f0 (docs/mutation.md): every request
waits at most until the caller's deadline, no request is sent once it has passed, a lost
answer is read again and decided again (never reported as a conflict), and the error a
caller gets says which of those happened.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from joblease.core.steps import transact
from joblease.core.transaction import ContentionError
from joblease.domain.lease import decide_claim
from joblease.kube.api import DEFAULT_TIMEOUT, ConflictError, Response, UnavailableError
from joblease.kube.leases import LeaseStore
from support.fakekube import FakeKubeApi, lease_object, transact_via_async

MARGIN = timedelta(milliseconds=250)


@pytest.fixture(autouse=True, params=["sync", "async"])
def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs against both drivers of the one loop: blocking and asyncio."""
    if request.param == "async":
        monkeypatch.setitem(globals(), "transact", transact_via_async)
    return str(request.param)


class TimedApi(FakeKubeApi):
    """Monotonic time stands still except that each request takes ``step`` seconds."""

    def __init__(self, step: float = 1.0) -> None:
        super().__init__()
        self.t, self.step = 0.0, step
        self.timeouts: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def request(self, method: str, path: str, body: Any = None, *,
                query: dict[str, str] | None = None, content_type: str | None = None,
                timeout: float = DEFAULT_TIMEOUT) -> Response:
        self.timeouts.append(timeout)
        try:
            return super().request(method, path, body, query=query, content_type=content_type,
                                   timeout=timeout)
        finally:
            self.t += self.step


def setup(step: float = 1.0) -> tuple[TimedApi, LeaseStore]:
    api = TimedApi(step)
    api.put_object(lease_object("job", {"phase": "Available"}))
    return api, LeaseStore(api)  # type: ignore[arg-type]


def claim_a(obs: Any, now: Any) -> Any:
    return decide_claim(obs, "a", now, MARGIN)


def lost() -> UnavailableError:
    return UnavailableError(503, "ServiceUnavailable", "answer lost")


def test_without_a_deadline_every_request_gets_the_default_timeout() -> None:
    api, store = setup()
    transact(store, "ns", "job", claim_a)
    assert api.timeouts == [DEFAULT_TIMEOUT, DEFAULT_TIMEOUT]


def test_each_request_waits_at_most_what_is_left_before_the_deadline() -> None:
    # The read starts at 0 with 5 s left, the write at 1 with 4 s left.
    api, store = setup()
    out = transact(store, "ns", "job", claim_a, deadline=5.0)
    assert out.transition is not None and out.transition.kind == "claimed"
    assert api.timeouts == [5.0, 4.0]


def test_less_than_a_second_left_is_still_enough_to_ask() -> None:
    api, store = setup(step=0.25)
    transact(store, "ns", "job", claim_a, deadline=0.75)
    assert api.timeouts == [0.75, 0.5]


def test_no_request_is_sent_once_the_deadline_is_reached() -> None:
    # Exactly at the deadline nothing is left: refused without asking, as "unavailable".
    api, store = setup()
    with pytest.raises(UnavailableError) as err:
        transact(store, "ns", "job", claim_a, deadline=0.0)
    assert api.requests == []
    assert (err.value.status, err.value.reason, err.value.message) == (
        0, "DeadlineExceeded", "no time left before the caller's deadline to ask the API server")
    assert str(err.value) == "no time left before the caller's deadline to ask the API server"


def test_a_lost_answer_is_read_and_decided_again() -> None:
    api, store = setup()
    api.refuse_next = [lost()]
    out = transact(store, "ns", "job", claim_a)
    assert out.transition is not None and out.observed.status.holder == "a"
    assert [m for m, _ in api.requests] == ["GET", "PATCH", "GET", "PATCH"]


def test_lost_answers_to_the_end_say_unknown_not_refused() -> None:
    # The last write may have landed: the caller must get UnavailableError, not Contention.
    api, store = setup()
    api.refuse_next = [lost(), lost()]
    with pytest.raises(UnavailableError) as err:
        transact(store, "ns", "job", claim_a, max_conflicts=2)
    assert err.value.reason == "ServiceUnavailable"
    assert [m for m, _ in api.requests] == ["GET", "PATCH", "GET", "PATCH"]


def test_a_conflict_after_a_lost_answer_makes_the_end_a_contention() -> None:
    api, store = setup()
    api.refuse_next = [lost(), ConflictError(409, "Conflict", "modified")]
    with pytest.raises(ContentionError):
        transact(store, "ns", "job", claim_a, max_conflicts=2)


def test_a_lost_answer_past_the_deadline_is_raised_at_once() -> None:
    # The write went out at 1 with 1 s left and its answer was lost at 2 = the deadline.
    api, store = setup()
    api.refuse_next = [lost()]
    with pytest.raises(UnavailableError) as err:
        transact(store, "ns", "job", claim_a, deadline=2.0)
    assert err.value.reason == "ServiceUnavailable"
    assert [m for m, _ in api.requests] == ["GET", "PATCH"]


def test_contention_is_a_409_named_contention_with_the_count() -> None:
    api, store = setup()
    api.refuse_next = [ConflictError(409, "Conflict", "m") for _ in range(2)]
    with pytest.raises(ContentionError) as err:
        transact(store, "ns", "job", claim_a, max_conflicts=2)
    assert (err.value.status, err.value.reason) == (409, "Contention")
    assert err.value.message == ("JobLease ns/job: 2 conflicting writes in a row; giving up "
                                 "(is something rewriting it in a loop?)")


def test_a_budget_of_no_attempts_sends_nothing_and_reports_contention() -> None:
    # Nothing was written, so the outcome is known: refused (Contention), never "unknown".
    api, store = setup()
    with pytest.raises(ContentionError, match="0 conflicting writes"):
        transact(store, "ns", "job", claim_a, max_conflicts=0)
    assert api.requests == []
