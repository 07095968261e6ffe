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
    LeaseHeldError,
    LeaseNotReadyError,
    StaleLeaseError,
    format_time,
)
from joblease.domain.token import FencingToken
from joblease.kube.api import ForbiddenError
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

    monkeypatch.setattr("joblease.sdk.client.time.sleep", sleep)
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
