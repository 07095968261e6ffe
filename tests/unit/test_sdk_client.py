"""The worker SDK's ``LeaseClient`` and ``Lease`` against the in-memory API server.

Pure: the real ``LeaseStore`` and ``transact`` run, only HTTP is replaced (see
``support.fakekube``). Each test pins what a worker relies on: the token it gets, the
local deadline before which it may act, that a refusal marks the lease lost, and that
``maxAttempts`` exhaustion is reported as a finished lease rather than a claim.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from joblease.domain.clock import DEFAULT_DRIFT, ServerNow
from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseGoneError,
    LeaseHeldError,
    LeaseNotReadyError,
    StaleLeaseError,
    format_time,
)
from joblease.domain.token import FencingToken
from joblease.kube.api import ForbiddenError, UnavailableError
from joblease.sdk.client import DEFAULT_MARGIN, IDENTITY_HOLDER, LeaseClient, default_holder
from support.fakekube import T_NOW, FakeKubeApi, lease_object


def client_for(status: dict | None = None, **spec: int) -> tuple[FakeKubeApi, LeaseClient]:
    api = FakeKubeApi()
    api.put_object(lease_object("job", status if status is not None else {"phase": "Available"},
                                **spec))
    return api, LeaseClient("ns", api=api, calibrate=False)  # type: ignore[arg-type]


def later(api: FakeKubeApi, seconds: float, error: float = 0.0) -> None:
    mid, half = T_NOW + timedelta(seconds=seconds), timedelta(seconds=error)
    api.now = ServerNow(mid - half, mid + half)


def test_claim_returns_the_token_the_end_and_a_deadline_before_it() -> None:
    api, client = client_for(leaseDurationSeconds=10)
    rv = int(api.stored("ns", "job")["metadata"]["resourceVersion"])  # type: ignore[index]
    lease = client.claim("job", "worker-a")
    assert lease.token == FencingToken(rv, 1) and lease.generation == 1
    assert (lease.name, lease.namespace, lease.holder) == ("job", "ns", "worker-a")
    assert lease.lease_until == T_NOW + timedelta(seconds=10)
    # the clock was observed at monotonic 0 as [T_NOW, T_NOW + 1): the holder must assume
    # the server is as far ahead as possible, so the deadline is 10 - 1 - margin seconds,
    # shortened by the drift the server's clock may gain meanwhile (docs/safety.md)
    assert lease.deadline == pytest.approx(
        (10 - 1 - DEFAULT_MARGIN.total_seconds()) / (1 + DEFAULT_DRIFT))
    assert 0 < lease.remaining() < 10 - 1 - DEFAULT_MARGIN.total_seconds()
    assert lease.valid() and lease.loss is None
    assert "worker-a" in repr(lease) and f"token={lease.token}" in repr(lease)


def test_margin_is_the_base_plus_the_clock_error() -> None:
    api, client = client_for()
    later(api, 0, error=0.3)
    assert client.margin() == DEFAULT_MARGIN + timedelta(seconds=0.3)


def test_renew_extends_and_complete_finishes() -> None:
    api, client = client_for(leaseDurationSeconds=10)
    lease = client.claim("job", "a")
    later(api, 5)
    lease.renew()
    assert lease.lease_until == T_NOW + timedelta(seconds=15)
    assert lease.token.generation == 1
    lease.complete("ok")
    stored = api.stored("ns", "job")["status"]  # type: ignore[index]
    assert stored["phase"] == "Completed" and stored["completion"]["result"] == "ok"
    assert stored["completion"]["holder"] == "a" and stored["completion"]["generation"] == 1
    assert not lease.valid()  # no lease_until any more: the deadline is now


def test_release_makes_it_claimable_and_failed_counts_an_attempt() -> None:
    api, client = client_for()
    client.claim("job", "a").release(failed=True)
    stored = api.stored("ns", "job")["status"]  # type: ignore[index]
    assert stored["phase"] == "Available" and stored["attempts"] == 1
    assert "holder" not in stored
    assert client.claim("job", "b").generation == 2


def test_a_held_lease_refuses_another_claimer_until_it_certainly_ended() -> None:
    api, client = client_for(leaseDurationSeconds=10)
    client.claim("job", "a")
    with pytest.raises(LeaseHeldError) as err:
        client.claim("job", "b")
    assert (err.value.holder, err.value.generation) == ("a", 1)
    later(api, 10.3)
    assert client.claim("job", "b").token.generation == 2


def test_a_stale_holder_is_told_it_lost_and_marked_lost() -> None:
    api, client = client_for(leaseDurationSeconds=10)
    a = client.claim("job", "a")
    later(api, 11)
    client.claim("job", "b")
    with pytest.raises(StaleLeaseError) as err:
        a.renew()
    assert (err.value.current_holder, err.value.current_generation) == ("b", 2)
    assert a.loss is err.value and not a.valid()
    with pytest.raises(StaleLeaseError):
        a.complete("late")


def test_an_expired_holder_gets_expired_not_stale() -> None:
    api, client = client_for(leaseDurationSeconds=10)
    a = client.claim("job", "a")
    later(api, 10)
    with pytest.raises(LeaseExpiredError):
        a.release()
    assert isinstance(a.loss, LeaseExpiredError)


def test_exhausted_attempts_turn_a_claim_into_a_finished_error() -> None:
    api, client = client_for(leaseDurationSeconds=10, maxAttempts=1)
    client.claim("job", "a")
    later(api, 11)
    with pytest.raises(LeaseFinishedError) as err:
        client.claim("job", "b")
    assert err.value.phase == "Failed" and "maxAttempts 1" in str(err.value)
    assert api.stored("ns", "job")["status"]["phase"] == "Failed"  # type: ignore[index]


def test_release_as_failed_exhausting_attempts_is_a_finished_error() -> None:
    _, client = client_for(maxAttempts=1)
    lease = client.claim("job", "a")
    with pytest.raises(LeaseFinishedError) as err:
        lease.release(failed=True)
    assert err.value.phase == "Failed"


def test_wait_claim_gives_up_with_the_held_error() -> None:
    _, client = client_for(leaseDurationSeconds=60)
    client.claim("job", "a")
    with pytest.raises(LeaseHeldError):
        client.wait_claim("job", "b", timeout=0.05, poll=0.01)


def test_holder_defaults_and_identity() -> None:
    api, client = client_for()
    assert client.resolve_holder("x") == "x"
    assert client.resolve_holder(None) == default_holder()
    calls = []

    def whoami() -> str:
        calls.append(1)
        return "system:serviceaccount:ns:w"

    api.whoami = whoami  # type: ignore[attr-defined]
    assert client.resolve_holder(IDENTITY_HOLDER) == "system:serviceaccount:ns:w"
    assert client.resolve_holder(IDENTITY_HOLDER) == "system:serviceaccount:ns:w"
    assert calls == [1]  # asked once


def test_default_holder_prefers_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBLEASE_HOLDER", "from-env")
    assert default_holder() == "from-env"
    monkeypatch.delenv("JOBLEASE_HOLDER")
    assert default_holder().rsplit("-", 1)[1].isdigit()


def test_wait_claim_sleeps_until_a_backoff_ends_then_claims(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rest_end = T_NOW + timedelta(seconds=7)
    api, client = client_for({"phase": "Available", "attempts": 1,
                              "notBefore": format_time(rest_end)})
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the fake server's time moves as the caller sleeps
        slept.append(seconds)
        later(api, sum(slept))

    monkeypatch.setattr("joblease.core.steps.time.sleep", sleep)
    lease = client.wait_claim("job", "b", timeout=60, poll=0.5)
    assert lease.generation == 1
    assert slept == [pytest.approx(7.0)]  # one sleep to notBefore, not a poll every 0.5 s


def test_wait_claim_gives_up_with_the_not_ready_error() -> None:
    _, client = client_for({"phase": "Available", "attempts": 2,
                            "notBefore": format_time(T_NOW + timedelta(seconds=60))})
    with pytest.raises(LeaseNotReadyError) as err:
        client.wait_claim("job", "b", timeout=0.05)
    assert err.value.attempts == 2


def test_a_forbidden_claim_that_only_recorded_used_up_attempts_is_a_finished_error() -> None:
    """Bug 16 in the client: the holder-only policy refuses the claimer's Failed write (403);
    the caller learns that the lease cannot be claimed again, not that it lacks a right."""
    api, client = client_for(leaseDurationSeconds=10, maxAttempts=1)
    client.claim("job", "a")
    later(api, 11)
    api.refuse_next = [ForbiddenError(403, "Forbidden", "only the holder may renew")]
    with pytest.raises(LeaseFinishedError) as err:
        client.claim("job", "b")
    assert isinstance(err.value.__cause__, ForbiddenError)
    assert "the operator marks it Failed" in str(err.value)
    assert api.stored("ns", "job")["status"]["phase"] == "Held"  # type: ignore[index]


def test_a_forbidden_ordinary_claim_stays_forbidden() -> None:
    api, client = client_for()
    refusal = ForbiddenError(403, "Forbidden", "holder must be the requesting user")
    api.refuse_next = [refusal]
    with pytest.raises(ForbiddenError) as err:
        client.claim("job", "b")
    assert err.value is refusal


# -- the package's lazy names ------------------------------------------------------------------

def test_the_lazily_loaded_names_are_the_defining_modules_own() -> None:
    """``from joblease.sdk import Pool`` (and the holdings) load their modules on first use;
    each name must still be the very class the module defines, and a typo must say so."""
    import joblease.sdk as sdk
    from joblease.domain.errors import PoolClosedError
    from joblease.sdk import hold, pool

    for name in ("AsyncHolding", "Holding", "RenewalStoppedError"):
        assert getattr(sdk, name) is getattr(hold, name)
    assert sdk.Pool is pool.Pool
    assert sdk.PoolClosedError is PoolClosedError
    with pytest.raises(AttributeError) as err:
        sdk.Holdings  # noqa: B018
    assert str(err.value) == "module 'joblease.sdk' has no attribute 'Holdings'"


# -- claim ids, deletion, wait_claim -----------------------------------------------------------

def test_a_claim_carries_a_fresh_claim_id_or_the_one_given() -> None:
    api, client = client_for()
    lease = client.claim("job", "a")
    assert lease.claim_id and len(lease.claim_id) == 32
    assert api.stored("ns", "job")["status"]["claimId"] == lease.claim_id  # type: ignore[index]
    lease.release()
    again = client.claim("job", "a", claim_id="mine")
    assert again.claim_id == "mine" and again.claim.claim_id == "mine"


def test_a_claim_decided_from_a_given_version_skips_the_read() -> None:
    api, client = client_for()
    seen = client.get("job")
    api.requests.clear()
    client.claim("job", "a", observed=seen)
    assert [method for method, _ in api.requests] == ["PATCH"]


def test_a_deleted_lease_is_lost_as_gone() -> None:
    api, client = client_for()
    lease = client.claim("job", "a")
    del api.objects[("ns", "job")]
    lease._observed = None  # as after a lost answer: the next operation reads first
    with pytest.raises(LeaseGoneError) as err:
        lease.renew()
    assert lease.loss is err.value
    assert str(err.value) == "JobLease ns/job held by this caller is gone: deleted"


def test_wait_claim_retries_with_one_claim_id_and_sleeps_until_the_holders_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api, client = client_for(leaseDurationSeconds=10)
    client.claim("job", "a")
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        later(api, sum(slept))

    monkeypatch.setattr("joblease.core.steps.time.sleep", sleep)
    lease = client.wait_claim("job", "b", timeout=60, poll=4.0)
    assert lease.holder == "b" and lease.generation == 2
    # polls of 4 s, then the rest until leaseUntil + margin has certainly passed
    assert slept == pytest.approx([4.0, 4.0, 2.0 + DEFAULT_MARGIN.total_seconds()])


def test_wait_claim_retries_an_unreachable_server_each_second_at_most_until_told_to_stop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api, client = client_for()
    clock = {"now": 0.0}
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock["now"] += seconds

    monkeypatch.setattr("joblease.core.steps.time.sleep", sleep)
    monkeypatch.setattr(api, "monotonic", lambda: clock["now"])
    api.refuse_next = [UnavailableError(0, "Unavailable", "reset")] * 100
    with pytest.raises(UnavailableError):
        client.wait_claim("job", "b", timeout=60, poll=5.0, retry_unavailable=3.0)
    assert slept == [1.0, 1.0, 1.0]  # min(poll, 1 s); gives up once 3 s have passed
    api.refuse_next = []
    slept.clear()
    real_request, lost = api.request, [UnavailableError(0, "Unavailable", "reset")] * 2

    def request(method: str, path: str, body: object = None, **kwargs: object) -> object:
        answer = real_request(method, path, body, **kwargs)  # type: ignore[arg-type]
        if lost and (method == "PATCH" or len(lost) == 1):
            raise lost.pop()  # the claim's write lands; its answer and the re-read's are lost
        return answer

    monkeypatch.setattr(api, "request", request)
    api.requests.clear()
    lease = client.wait_claim("job", "b", timeout=60, poll=0.25)
    assert slept == [0.25]
    # the retry carries the same claim id, so it adopts the write that landed
    assert (lease.holder, lease.generation) == ("b", 1)
    assert [method for method, _ in api.requests] == ["GET", "PATCH", "GET", "GET"]
