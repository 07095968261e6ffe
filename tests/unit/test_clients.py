"""The two clients, one behaviour: every test runs against ``LeaseClient`` and ``AsyncLeaseClient``.

Issue 23, item 3. The same in-memory API server (``support.fakekube``: the real
``LeaseStore``/``AsyncLeaseStore``, the real merge patch and precondition) and one test
body (``support.clients``: a blocking facade over either client). What is pinned: claims,
refusals that name the current holder and token, ``wait_claim`` over a held lease, a backoff
and an unreachable server (one claim id across attempts), the identity, a claim decided from
a given version, a deleted or re-created JobLease, the holder-only policy's 403 on a Failed
write, ``resume``; the server-clock estimate's error on the safe side of every decision (a
takeover, a holder's deadline, a late renewal) and a renewal's one write bounded by the
deadline; and a property test that runs one random sequence of operations against
both clients on two identical servers and requires the same outcome at every step.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from joblease.domain.clock import DEFAULT_DRIFT, ServerClock, ServerNow
from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseGoneError,
    LeaseHeldError,
    LeaseNotReadyError,
    StaleLeaseError,
    format_time,
)
from joblease.domain.holder import DEFAULT_MARGIN, IDENTITY_HOLDER
from joblease.domain.token import FencingToken
from joblease.kube.api import ForbiddenError, UnavailableError
from joblease.kube.identity import default_holder
from support.clients import KINDS, Client, client_over, fake_sleep
from support.fakekube import T_NOW, FakeKubeApi, lease_object

pytestmark = pytest.mark.parametrize("kind", KINDS)


def server(status: dict[str, Any] | None = None, **spec: Any) -> FakeKubeApi:
    api = FakeKubeApi()
    api.put_object(lease_object("job", status if status is not None else {"phase": "Available"},
                                **spec))
    return api


def later(api: FakeKubeApi, seconds: float, error: float = 0.0) -> None:
    mid, half = T_NOW + timedelta(seconds=seconds), timedelta(seconds=error)
    api.now = ServerNow(mid - half, mid + half)


class RealTimeApi(FakeKubeApi):
    """A fake server whose clock runs with this process's (exact: no error interval)."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.monotonic()
        self.clock = ServerClock()
        self.clock.observe(0.0, 0.0, int(T_NOW.timestamp()))

    def server_now(self) -> ServerNow:
        return ServerNow.exact(T_NOW + timedelta(seconds=self.monotonic()))

    def monotonic(self) -> float:
        return time.monotonic() - self.start


def client_for(kind: str, status: dict[str, Any] | None = None, **spec: Any
               ) -> tuple[FakeKubeApi, Client]:
    api = server(status, **spec)
    return api, client_over(kind, api)


# -- claim, and the refusals that name the current claim -------------------------------------

def test_claim_returns_the_token_the_end_and_a_deadline_before_it(kind: str) -> None:
    api, client = client_for(kind, leaseDurationSeconds=10)
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


def test_margin_is_the_base_plus_the_clock_error(kind: str) -> None:
    api, client = client_for(kind, )
    later(api, 0, error=0.3)
    assert client.margin() == DEFAULT_MARGIN + timedelta(seconds=0.3)


def test_renew_extends_and_complete_finishes(kind: str) -> None:
    api, client = client_for(kind, leaseDurationSeconds=10)
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


def test_release_makes_it_claimable_and_failed_counts_an_attempt(kind: str) -> None:
    api, client = client_for(kind, )
    client.claim("job", "a").release(failed=True)
    stored = api.stored("ns", "job")["status"]  # type: ignore[index]
    assert stored["phase"] == "Available" and stored["attempts"] == 1
    assert "holder" not in stored
    assert client.claim("job", "b").generation == 2


def test_a_held_lease_refuses_another_claimer_until_it_certainly_ended(kind: str) -> None:
    api, client = client_for(kind, leaseDurationSeconds=10)
    client.claim("job", "a")
    with pytest.raises(LeaseHeldError) as err:
        client.claim("job", "b")
    assert (err.value.holder, err.value.generation) == ("a", 1)
    later(api, 10.3)
    assert client.claim("job", "b").token.generation == 2


def test_a_stale_holder_is_told_it_lost_and_marked_lost(kind: str) -> None:
    api, client = client_for(kind, leaseDurationSeconds=10)
    a = client.claim("job", "a")
    later(api, 11)
    client.claim("job", "b")
    with pytest.raises(StaleLeaseError) as err:
        a.renew()
    assert (err.value.current_holder, err.value.current_generation) == ("b", 2)
    assert a.loss is err.value and not a.valid()
    with pytest.raises(StaleLeaseError):
        a.complete("late")


def test_an_expired_holder_gets_expired_not_stale(kind: str) -> None:
    api, client = client_for(kind, leaseDurationSeconds=10)
    a = client.claim("job", "a")
    later(api, 10)
    with pytest.raises(LeaseExpiredError):
        a.release()
    assert isinstance(a.loss, LeaseExpiredError)


def test_exhausted_attempts_turn_a_claim_into_a_finished_error(kind: str) -> None:
    api, client = client_for(kind, leaseDurationSeconds=10, maxAttempts=1)
    client.claim("job", "a")
    later(api, 11)
    with pytest.raises(LeaseFinishedError) as err:
        client.claim("job", "b")
    assert err.value.phase == "Failed" and "maxAttempts 1" in str(err.value)
    assert api.stored("ns", "job")["status"]["phase"] == "Failed"  # type: ignore[index]


def test_a_claim_carries_a_fresh_claim_id_or_the_one_given(kind: str) -> None:
    api, client = client_for(kind, )
    lease = client.claim("job", "a")
    assert lease.claim_id and len(lease.claim_id) == 32
    assert api.stored("ns", "job")["status"]["claimId"] == lease.claim_id  # type: ignore[index]
    lease.release()
    again = client.claim("job", "a", claim_id="mine")
    assert again.claim_id == "mine" and again.claim.claim_id == "mine"


def test_a_deleted_lease_is_lost_as_gone(kind: str) -> None:
    api, client = client_for(kind, )
    lease = client.claim("job", "a")
    del api.objects[("ns", "job")]
    lease.real._observed = None  # as after a lost answer: the next operation reads first
    with pytest.raises(LeaseGoneError) as err:
        lease.renew()
    assert lease.loss is err.value
    assert str(err.value) == "JobLease ns/job held by this caller is gone: deleted"



def test_a_claim_returns_the_token_the_end_and_a_deadline_before_it(kind: str) -> None:
    api = server(leaseDurationSeconds=10)
    rv = int(api.stored("ns", "job")["metadata"]["resourceVersion"])  # type: ignore[index]
    lease = client_over(kind, api).claim("job", "worker-a")
    assert lease.token == FencingToken(rv, 1) and lease.generation == 1
    assert (lease.name, lease.namespace, lease.holder) == ("job", "ns", "worker-a")
    assert lease.lease_until == T_NOW + timedelta(seconds=10)
    assert lease.valid() and 0 < lease.remaining() < 10
    assert lease.claim_id and len(lease.claim_id) == 32


def test_a_held_lease_is_refused_naming_its_holder_and_end(kind: str) -> None:
    api = server(leaseDurationSeconds=30)
    client = client_over(kind, api)
    client.claim("job", "a")
    with pytest.raises(LeaseHeldError) as err:
        client.claim("job", "b")
    assert (err.value.holder, err.value.generation) == ("a", 1)
    assert err.value.lease_until == T_NOW + timedelta(seconds=30)


def test_the_a_b_example_a_stale_token_is_refused_naming_the_current_holder_and_token(
        kind: str) -> None:
    """A claims, pauses past its lease; B claims generation 2; A's completion is refused."""
    api = server(leaseDurationSeconds=10)
    client = client_over(kind, api)
    a = client.claim("job", "a")
    later(api, 11)
    b = client.claim("job", "b")
    assert b.generation == a.generation + 1
    with pytest.raises(StaleLeaseError) as err:
        a.complete("late")
    assert a.loss is err.value and not a.valid()
    assert (f"the current generation is {b.generation} (token {b.token}, held by 'b'"
            in str(err.value))
    b.complete("done")
    assert api.stored("ns", "job")["status"]["phase"] == "Completed"  # type: ignore[index]


def test_renewing_past_the_end_on_the_servers_clock_is_an_expiry(kind: str) -> None:
    api = server(leaseDurationSeconds=10)
    lease = client_over(kind, api).claim("job", "a")
    later(api, 10)
    with pytest.raises(LeaseExpiredError):
        lease.renew()
    assert isinstance(lease.loss, LeaseExpiredError)


def test_a_claim_decided_from_a_given_version_skips_the_read(kind: str) -> None:
    api = server()
    client = client_over(kind, api)
    seen = client.get("job")
    api.requests.clear()
    client.claim("job", "a", observed=seen)
    assert [method for method, _ in api.requests] == ["PATCH"]


def test_holders_default_and_the_identity_is_asked_once(kind: str) -> None:
    api = server()
    client = client_over(kind, api)
    assert client.resolve_holder("x") == "x"
    assert client.resolve_holder(None) == default_holder()
    calls: list[int] = []

    def whoami() -> str:
        calls.append(1)
        return "system:serviceaccount:ns:w"

    api.whoami = whoami  # type: ignore[attr-defined]
    assert client.resolve_holder(IDENTITY_HOLDER) == "system:serviceaccount:ns:w"
    assert client.claim("job", IDENTITY_HOLDER).holder == "system:serviceaccount:ns:w"
    assert calls == [1]


def test_a_deleted_lease_is_lost_as_gone_and_a_recreated_one_is_not_adopted(
        kind: str) -> None:
    api = server()
    client = client_over(kind, api)
    lease = client.claim("job", "a")
    obj = api.stored("ns", "job")
    assert obj is not None
    del api.objects[("ns", "job")]
    api.put_object({**obj, "metadata": {**obj["metadata"], "uid": "another-uid"}})
    with pytest.raises(LeaseGoneError) as err:
        lease.renew()
    assert "re-created" in str(err.value) and lease.loss is err.value


def test_a_forbidden_claim_that_only_recorded_used_up_attempts_is_a_finished_error(
        kind: str) -> None:
    api = server(leaseDurationSeconds=10, maxAttempts=1)
    client = client_over(kind, api)
    client.claim("job", "a")
    later(api, 11)
    api.refuse_next = [ForbiddenError(403, "Forbidden", "only the holder may renew")]
    with pytest.raises(LeaseFinishedError) as err:
        client.claim("job", "b")
    assert isinstance(err.value.__cause__, ForbiddenError)
    assert "the operator marks it Failed" in str(err.value)


def test_a_forbidden_ordinary_claim_stays_forbidden(kind: str) -> None:
    api = server()
    refusal = ForbiddenError(403, "Forbidden", "holder must be the requesting user")
    api.refuse_next = [refusal]
    with pytest.raises(ForbiddenError) as err:
        client_over(kind, api).claim("job", "b")
    assert err.value is refusal


def test_releasing_as_failed_the_last_attempt_is_a_finished_error(kind: str) -> None:
    lease = client_over(kind, server(maxAttempts=1)).claim("job", "a")
    with pytest.raises(LeaseFinishedError) as err:
        lease.release(failed=True)
    assert err.value.phase == "Failed"


def test_a_lost_completion_answer_is_recognised_on_retry(kind: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    api = server()
    lease = client_over(kind, api).claim("job", "a")
    real = api.request
    lost = [UnavailableError(0, "Unavailable", "reset")]

    def request(method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        answer = real(method, path, body, **kwargs)
        if method == "PATCH" and lost:
            raise lost.pop()  # the completion landed; its answer did not
        return answer

    monkeypatch.setattr(api, "request", request)
    lease.complete("ok")  # retried from a fresh read: finds its own completion
    assert api.stored("ns", "job")["status"]["phase"] == "Completed"  # type: ignore[index]


# -- resume ----------------------------------------------------------------------------------

def test_resume_acts_only_while_that_very_claim_is_current(kind: str) -> None:
    api = server(leaseDurationSeconds=30)
    client = client_over(kind, api)
    first = client.claim("job", "a")
    resumed = client.resume("job", "a", first.token, first.claim_id)
    assert resumed.valid() and resumed.token == first.token
    resumed.renew()
    stale = client.resume("job", "a", FencingToken(first.token.epoch, 7), None)
    assert not stale.valid()  # not the current claim: a deadline of now
    with pytest.raises(StaleLeaseError) as err:
        stale.renew()
    assert "current generation is 1 (token 100/1, held by 'a'" in str(err.value)


# -- wait_claim ------------------------------------------------------------------------------

def test_wait_claim_waits_out_a_backoff_of_half_a_second_and_claims(kind: str) -> None:
    """The drift of issue 23: the asyncio client raised ``LeaseNotReadyError`` at once
    (``AsyncLeaseClient.wait_claim`` had no branch for it), the sync one claimed after 0.5 s."""
    api = RealTimeApi()
    rest = T_NOW + timedelta(seconds=0.5)
    api.put_object(lease_object("job", {"phase": "Available", "generation": 1, "epoch": 1,
                                        "attempts": 1, "notBefore": format_time(rest)},
                                backoff={"initialSeconds": 1}))
    client = client_over(kind, api)
    start = time.monotonic()
    lease = client.wait_claim("job", "b", timeout=5)
    took = time.monotonic() - start
    assert lease.generation == 2
    assert 0.45 <= took < 2.0, f"claimed after {took:.2f}s"


def test_wait_claim_sleeps_until_a_backoff_ends_then_claims(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api = server({"phase": "Available", "attempts": 1,
                  "notBefore": format_time(T_NOW + timedelta(seconds=7))})
    slept = fake_sleep(monkeypatch, lambda _: later(api, sum(slept)))
    lease = client_over(kind, api).wait_claim("job", "b", timeout=60, poll=0.5)
    assert lease.generation == 1
    assert slept == [pytest.approx(7.0)]  # one sleep to notBefore, not a poll every 0.5 s


def test_wait_claim_polls_a_held_lease_then_sleeps_until_its_end_plus_margin(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api = server(leaseDurationSeconds=10)
    client = client_over(kind, api)
    client.claim("job", "a")
    slept = fake_sleep(monkeypatch, lambda _: later(api, sum(slept)))
    lease = client.wait_claim("job", "b", timeout=60, poll=4.0)
    assert (lease.holder, lease.generation) == ("b", 2)
    assert slept == pytest.approx([4.0, 4.0, 2.0 + DEFAULT_MARGIN.total_seconds()])


@pytest.mark.parametrize(("status", "error"), [
    (None, LeaseHeldError),
    ({"phase": "Available", "attempts": 2,
      "notBefore": format_time(T_NOW + timedelta(seconds=60))}, LeaseNotReadyError),
])
def test_wait_claim_gives_up_with_the_last_refusal(kind: str, status: dict[str, Any] | None,
                                                   error: type[Exception]) -> None:
    api = server(status, leaseDurationSeconds=60)
    client = client_over(kind, api)
    if status is None:
        client.claim("job", "a")
    with pytest.raises(error):
        client.wait_claim("job", "b", timeout=0.05, poll=0.01)


def test_wait_claim_retries_an_unreachable_server_then_adopts_its_landed_claim(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api = server()
    clock = {"now": 0.0}
    monkeypatch.setattr(api, "monotonic", lambda: clock["now"])
    slept = fake_sleep(monkeypatch, lambda s: clock.__setitem__("now", clock["now"] + s))
    api.refuse_next = [UnavailableError(0, "Unavailable", "reset")] * 100
    client = client_over(kind, api)
    with pytest.raises(UnavailableError):
        client.wait_claim("job", "b", timeout=60, poll=5.0, retry_unavailable=3.0)
    assert slept == [1.0, 1.0, 1.0]  # min(poll, 1 s); gives up once 3 s have passed
    api.refuse_next = []
    slept.clear()
    real, lost = api.request, [UnavailableError(0, "Unavailable", "reset")] * 2

    def request(method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        answer = real(method, path, body, **kwargs)
        if lost and (method == "PATCH" or len(lost) == 1):
            raise lost.pop()  # the claim's write lands; its answer and the re-read's are lost
        return answer

    monkeypatch.setattr(api, "request", request)
    api.requests.clear()
    lease = client.wait_claim("job", "b", timeout=60, poll=0.25)
    assert slept == [0.25]
    assert (lease.holder, lease.generation) == ("b", 1)  # the same claim id adopted it
    assert [method for method, _ in api.requests] == ["GET", "PATCH", "GET", "GET"]


# -- one random history, both clients ----------------------------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(["a", "b"])),
    st.tuples(st.just("renew"), st.integers(0, 3)),
    st.tuples(st.just("complete"), st.integers(0, 3)),
    st.tuples(st.just("release"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("later"), st.sampled_from([1, 5, 11])),
), max_size=12)


def _play(client: Client, api: FakeKubeApi, ops: list[tuple[Any, ...]]) -> list[str]:
    """Run ``ops``; the outcome of each (a result or an exception's type and message)."""
    leases: list[Any] = []
    clock = 0
    outcomes: list[str] = []
    for op in ops:
        try:
            if op[0] == "claim":
                lease = client.claim("job", op[1], claim_id=f"id-{len(leases)}")
                leases.append(lease)
                outcomes.append(f"claimed {lease.token} until {lease.lease_until}")
            elif op[0] == "later":
                clock += op[1]
                later(api, clock)
                outcomes.append(f"t={clock}")
            elif not leases:
                outcomes.append("no lease")
            else:
                lease = leases[op[1] % len(leases)]
                if op[0] == "release":
                    lease.release(failed=op[2])
                else:
                    getattr(lease, op[0])()
                outcomes.append(f"{op[0]} ok until {lease.lease_until}")
        except Exception as err:  # compared, not judged: both must say the same
            outcomes.append(f"{type(err).__name__}: {err}")
    stored = api.stored("ns", "job")
    outcomes.append(repr(stored and stored.get("status")))
    return outcomes


@given(OPS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.differing_executors])
def test_both_clients_give_the_same_outcome_for_any_history(kind: str,
                                                            ops: list[tuple[Any, ...]]) -> None:
    if kind == "async":
        return  # one run compares both: the parameter only keeps the module's shape
    spec = {"leaseDurationSeconds": 10, "maxAttempts": 2, "backoff": {"initialSeconds": 2}}
    sync_api, async_api = server(**spec), server(**spec)
    sync_out = _play(client_over("sync", sync_api), sync_api, ops)
    async_out = _play(client_over("async", async_api), async_api, ops)
    assert sync_out == async_out


# -- the clock's error bound is on the safe side, everywhere -----------------------------------

def test_a_takeover_waits_for_the_margin_plus_the_clock_error(kind: str) -> None:
    """Expiry is judged on the server's clock: its earliest possible time past leaseUntil
    plus the margin, and the margin grows with the estimate's error bound."""
    api, client = client_for(kind, leaseDurationSeconds=10)
    client.claim("job", "a")
    # earliest T+10.2: past leaseUntil + base margin (10.25)? no; the error widens it to 10.55
    later(api, 10.5, error=0.3)
    with pytest.raises(LeaseHeldError):
        client.claim("job", "b")
    later(api, 10.5, error=0.1)  # earliest 10.4 >= 10 + 0.25 + 0.1
    assert client.claim("job", "b").generation == 2


def test_a_holders_deadline_is_earlier_by_the_clock_error(kind: str) -> None:
    exact_api, exact = client_for(kind, leaseDurationSeconds=10)
    unsure_api, unsure = client_for(kind, leaseDurationSeconds=10)
    later(unsure_api, 0, error=0.4)
    mid = T_NOW
    later(exact_api, 0)
    a, b = exact.claim("job", "a"), unsure.claim("job", "a")
    assert a.lease_until == b.lease_until == mid + timedelta(seconds=10)  # stamped at midpoint
    assert a.deadline - b.deadline == pytest.approx(0.4 / (1 + DEFAULT_DRIFT), abs=0.01)
    # a renewal under the same uncertainty keeps the deadline earlier by as much
    later(exact_api, 5)
    later(unsure_api, 5, error=0.4)
    a.renew()
    b.renew()
    assert a.deadline - b.deadline == pytest.approx(0.4 / (1 + DEFAULT_DRIFT), abs=0.01)


def test_a_renewal_is_one_write_that_waits_no_longer_than_the_deadline(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api, client = client_for(kind, leaseDurationSeconds=10)
    lease = client.claim("job", "a")
    timeouts: list[float] = []
    real_request = api.request

    def request(method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        timeouts.append(kwargs["timeout"])
        return real_request(method, path, body, **kwargs)

    monkeypatch.setattr(api, "request", request)
    before, left = len(api.requests), lease.remaining()
    lease.renew()
    assert [method for method, _ in api.requests[before:]] == ["PATCH"]  # from what it holds
    assert len(timeouts) == 1 and 0 < timeouts[0] <= left  # not the 10 s default


def test_a_renewal_the_servers_clock_may_already_see_as_too_late_is_refused(kind: str) -> None:
    """Near the end the clock's error decides: at T+9.6 a renewal is still safe when the
    server's time is exact (9.6 < 10 − 0.25) and not when it may be 0.3 s later."""
    for error, refused in ((0.0, False), (0.3, True)):
        api, client = client_for(kind, leaseDurationSeconds=10)
        lease = client.claim("job", "a")
        later(api, 9.6, error=error)
        if refused:
            with pytest.raises(LeaseExpiredError):
                lease.renew()
        else:
            lease.renew()
            assert lease.lease_until == T_NOW + timedelta(seconds=19.6)


# -- the reads a display needs (the CLI's ls, describe and work use only these) -------------

def labelled(api: FakeKubeApi, name: str, phase: str, namespace: str = "ns",
             **labels: str) -> dict[str, Any]:
    obj = lease_object(name, {"phase": phase}, namespace=namespace)
    obj["metadata"]["labels"] = labels
    return api.put_object(obj)


def test_list_objects_reads_every_page_of_the_selector_in_one_or_all_namespaces(
        kind: str) -> None:
    api = FakeKubeApi()
    for i in range(502):  # a page is 500: two pages, stitched
        labelled(api, f"job-{i:03}", "Available", batch="b1")
    labelled(api, "other", "Available", batch="b2")
    labelled(api, "elsewhere", "Held", namespace="ns2", batch="b1")
    client = client_over(kind, api)
    objects = client.list_objects("batch=b1")
    assert len(objects) == 502 and all(o["metadata"]["labels"] == {"batch": "b1"}
                                       for o in objects)
    assert [m for m, p in api.requests if p.endswith("/namespaces/ns/jobleases")] == ["GET"] * 2
    assert {o["metadata"]["name"] for o in client.list_objects("batch=b1", all_namespaces=True)
            } >= {"elsewhere", "job-501"}
    assert len(client.list_objects()) == 503


def test_count_selects_by_phase_on_the_server(kind: str) -> None:
    api = FakeKubeApi()
    for name, phase in (("a", "Failed"), ("b", "Failed"), ("c", "Completed"), ("d", "Held")):
        labelled(api, name, phase, batch="b1")
    labelled(api, "x", "Failed", batch="b2")
    client = client_over(kind, api)
    from joblease.domain.lease import Phase

    assert client.count("batch=b1", phase=Phase.FAILED) == 2
    assert client.count("batch=b1") == 4
    assert client.count(phase=Phase.FAILED) == 3


def test_get_object_is_the_stored_object_and_a_missing_one_is_not_found(kind: str) -> None:
    api, client = client_for(kind)
    raw = client.get_object("job")
    assert raw == api.stored("ns", "job")
    from joblease.domain.errors import LeaseNotFoundError

    with pytest.raises(LeaseNotFoundError):
        client.get_object("nope")


def test_events_are_this_objects_by_name_and_uid_oldest_first(kind: str) -> None:
    from joblease.kube.leases import LeaseStore

    api, client = client_for(kind)
    obs = client.get("job")
    store = LeaseStore(api)  # type: ignore[arg-type]
    for when, reason in (("2026-12-03T12:00:02Z", "Claimed"), ("2026-12-03T12:00:01Z", "Created")):
        api.now = ServerNow.exact(T_NOW)
        store.post_event(obs, "Normal", reason, "m")
        api.events[-1]["lastTimestamp"] = when
    store.post_event(replace_uid(obs, "uid-of-a-predecessor"), "Normal", "Expired", "m")
    assert [e["reason"] for e in client.events(obs)] == ["Created", "Claimed"]


def replace_uid(obs: Any, uid: str) -> Any:
    from dataclasses import replace

    return replace(obs, uid=uid)


def test_server_now_is_the_clock_estimate(kind: str) -> None:
    api, client = client_for(kind)
    later(api, 3, error=0.2)
    assert client.server_now() == api.now
