"""Issue 14, the pure half: each test reproduces an item with the real code and no server.

The other half, against the real kube-apiserver, is tests/cluster/test_safety.py;
docs/safety.md lists both in the track record.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from joblease.controller import metrics
from joblease.controller.pods import Delegator, PodView
from joblease.controller.reconciler import LeaseView, Reconciler
from joblease.domain.clock import DEFAULT_DRIFT, ServerClock
from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLostError,
    StaleLeaseError,
)
from joblease.domain.lease import (
    LATEST_TIME,
    Claim,
    LeaseSpec,
    LeaseStatus,
    Observed,
    Phase,
    decide_claim,
    decide_complete,
    decide_release,
    decide_renew,
    parse_time,
)
from joblease.domain.token import FencingToken
from joblease.kube.api import KubeApi, Response, UnavailableError
from joblease.kube.pods import PodInfo
from joblease.kube.transact import ContentionError
from joblease.sdk.async_holding import AsyncHolding
from joblease.sdk.hold import Holding, RenewalStoppedError
from support.memstore import T0, MemoryStore

MARGIN = timedelta(milliseconds=250)


def now(seconds: float) -> Any:
    from joblease.domain.clock import ServerNow
    return ServerNow.exact(T0 + timedelta(seconds=seconds))


def held_by(holder: str, epoch: int, generation: int, claim_id: str | None = None,
            until: float = 30.0, rv: str = "50") -> Observed:
    status = LeaseStatus(Phase.HELD, holder, generation, epoch, T0, T0,
                         T0 + timedelta(seconds=until), claim_id=claim_id)
    return Observed("ns", "job", "uid", rv, 1, LeaseSpec(), status)


# -- item 1 --------------------------------------------------------------------------------

def test_renew_complete_release_compare_the_epoch_too() -> None:
    """Same holder name and generation, another incarnation (epoch): refused, naming it."""
    current = held_by("replicas", epoch=338, generation=1)
    old = Claim("replicas", FencingToken(335, 1))
    for decide in (lambda: decide_renew(current, old, now(1), MARGIN),
                   lambda: decide_complete(current, old, "x", now(1), MARGIN),
                   lambda: decide_release(current, old, now(1), MARGIN)):
        with pytest.raises(StaleLeaseError, match=r"token 335/1.*token 338/1"):
            decide()


def test_a_claim_id_tells_same_named_holders_apart() -> None:
    current = held_by("replicas", epoch=9, generation=4, claim_id="b")
    with pytest.raises(StaleLeaseError):
        decide_renew(current, Claim("replicas", FencingToken(9, 4), "a"), now(1), MARGIN)
    assert decide_renew(current, Claim("replicas", FencingToken(9, 4), "b"), now(1), MARGIN)


# -- item 2 --------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "9999-12-31T23:59:59.999Z", "0000-01-01T00:00:00Z", "2026-12-03t10:00:00z",
    "2026-12-03T10:00:00.123456789Z", "2026-12-31T23:59:60Z", "9999-12-31T23:59:59-23:59",
    "0001-01-01T00:00:00+23:59", "2026-12-03 10:00:00+05:30"])
def test_every_rfc3339_time_parses_and_any_protocol_arithmetic_on_it_is_safe(text: str) -> None:
    when = parse_time(text)
    assert when.tzinfo is not None
    status = LeaseStatus(Phase.HELD, "h", 1, 1, when, when, when, finish_time=when)
    obs = Observed("ns", "job", "uid", "5", 1,
                   LeaseSpec(86400, ttl_seconds_after_finished=31536000), status)
    with contextlib.suppress(LeaseHeldError):  # a refusal is an answer; a crash is not
        decide_claim(obs, "b", now(0), timedelta(days=1))
    from joblease.domain.lease import decide_expire, is_expired, ttl_expired
    is_expired(when, now(0), timedelta(days=1))
    ttl_expired(replace(obs, status=replace(status, phase=Phase.COMPLETED)), now(0))
    decide_expire(obs, now(0), timedelta(days=1))
    stored = LeaseStatus.from_dict(status.to_dict()).lease_until  # stored to the millisecond
    assert stored is not None and timedelta(0) <= when - stored < timedelta(milliseconds=1)


def test_one_hostile_lease_end_never_stops_expiry_of_the_others() -> None:
    store = MemoryStore()
    hostile = held_by("h", 1, 1, until=0)
    hostile = replace(hostile, name="hostile", status=replace(
        hostile.status, lease_until=parse_time("9999-12-31T23:59:59.999Z")))
    ordinary = replace(held_by("w", 1, 1, until=1), name="ordinary")
    store.objects = {"hostile": hostile, "ordinary": ordinary}
    store.api.now = 10
    view = LeaseView()
    view.put(hostile)
    view.put(ordinary)
    reconciler = Reconciler(store, view, MARGIN)  # type: ignore[arg-type]
    reconciler.pass_once()
    assert store.objects["ordinary"].status.phase is Phase.EXPIRED
    assert store.objects["hostile"].status.lease_until == LATEST_TIME


def test_an_unforeseen_error_on_one_object_is_isolated_and_counted() -> None:
    store = MemoryStore()
    bad, good = (replace(held_by("w", 1, 1, until=1), name=n, uid=n) for n in ("bad", "good"))
    store.objects = {"bad": bad, "good": good}
    store.api.now = 10

    def explode(observed: Observed, status: LeaseStatus) -> None:
        if observed.name == "bad":
            raise KeyError("a malformed response")

    store.fail = explode
    view = LeaseView()
    for obs in (bad, good):
        view.put(obs)
    before = metrics.OBJECT_ERRORS.labels("write")._value.get()
    Reconciler(store, view, MARGIN, writers=1).pass_once()  # type: ignore[arg-type]
    assert store.objects["good"].status.phase is Phase.EXPIRED
    assert store.objects["bad"].status.phase is Phase.HELD
    assert metrics.OBJECT_ERRORS.labels("write")._value.get() == before + 1


# -- items 3 and 4: the holding's only exits are a requested stop or a declared loss -------

class FakeLease:
    """A held lease whose renewal does whatever ``renew_effect`` says (on real time)."""

    def __init__(self, seconds: float, renew_effect: Any) -> None:
        self.name, self.holder, self.generation = "job", "h", 1
        self.token, self.lease_until, self.loss = FencingToken(1, 1), T0, None
        self.deadline = time.monotonic() + seconds
        self.renew_effect = renew_effect
        self.renewals = 0

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def valid(self) -> bool:
        return self.loss is None and self.remaining() > 0

    def renew(self) -> None:
        self.renewals += 1
        self.renew_effect()

    def release(self, failed: bool = False) -> None:
        pass


def _raises(err: BaseException) -> Any:
    def effect() -> None:
        raise err
    return effect


@pytest.mark.parametrize("err", [
    ContentionError("8 conflicting writes in a row"), UnavailableError(0, "x", "refused"),
    RuntimeError("credential refresh failed"), KeyError("status"), ValueError("bad json")])
def test_renewals_failing_any_way_end_in_a_declared_loss_at_the_deadline(
        err: Exception) -> None:
    lease = FakeLease(1.0, _raises(err))
    losses: list[LeaseLostError] = []
    with Holding(lease, renew_fraction=0.2) as holding:  # type: ignore[arg-type]
        holding.on_lost = lambda: losses.append(holding.loss)  # type: ignore[method-assign,arg-type]
        assert holding.lost.wait(3), "the loss was never declared"
        lost_at = lease.remaining()
    assert -1.0 < lost_at <= 0.05  # never early; late only by scheduling under load
    assert isinstance(holding.loss, LeaseExpiredError) and len(losses) == 1
    assert lease.renewals >= 2  # it kept retrying until the deadline


def test_a_renewal_thread_killed_by_a_base_exception_declares_the_loss() -> None:
    lease = FakeLease(30.0, _raises(SystemExit(3)))
    with Holding(lease, renew_fraction=0.01) as holding:  # type: ignore[arg-type]
        assert holding.lost.wait(3)
    assert isinstance(holding.loss, RenewalStoppedError)


def test_a_hung_renewal_cannot_delay_the_declared_loss() -> None:
    release = threading.Event()
    lease = FakeLease(1.0, lambda: release.wait(10))  # the request never answers
    try:
        with Holding(lease, renew_fraction=0.1) as holding:  # type: ignore[arg-type]
            started = time.monotonic()
            assert holding.lost.wait(3)
            assert time.monotonic() - started < 2.0  # the deadline (1 s), not a timeout
            with pytest.raises(LeaseExpiredError):
                holding.check()
            release.set()
    finally:
        release.set()


@pytest.mark.filterwarnings("ignore:joblease.AsyncHolding is deprecated")
def test_async_holding_cancels_its_body_when_renewals_keep_failing() -> None:
    lease = FakeLease(1.0, _raises(ContentionError("storm")))
    steps: list[int] = []

    async def work() -> None:
        async with AsyncHolding(lease, renew_fraction=0.2):  # type: ignore[arg-type]
            for i in range(100):
                steps.append(i)
                await asyncio.sleep(0.05)

    started = time.monotonic()
    with pytest.raises(LeaseExpiredError):
        asyncio.run(work())
    assert time.monotonic() - started < 3.0 and len(steps) < 60  # not the 5 s body


class CompletingLease(FakeLease):
    """A lease whose completion lands: the deadline it had stays (a completed lease has none)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds, lambda: None)
        self.completions = 0
        self.results: list[str] = []

    def complete(self, result: str = "") -> None:
        self.completions += 1
        self.results.append(result)


def test_a_completed_holding_declares_no_loss_at_the_old_deadline() -> None:
    """Bug 17: after complete() the watchdog still fired at the lease's old deadline.

    The holding then declared a ``LeaseExpiredError`` for a Completed lease, and an
    ``AsyncHolding`` cancelled a body still running after ``complete_async`` (found while
    building the asyncio holding, whose completion stops both guards).
    """
    lease = CompletingLease(0.5)
    with Holding(lease, renew_fraction=0.9) as holding:  # type: ignore[arg-type]
        holding.complete("ok")
        assert not holding.lost.wait(1.0), f"a completed lease was declared lost: {holding.loss}"
    assert holding.loss is None and lease.completions == 1


@pytest.mark.filterwarnings("ignore:joblease.AsyncHolding is deprecated")
def test_an_async_body_after_its_completion_is_not_cancelled() -> None:
    lease = CompletingLease(0.5)
    steps: list[int] = []

    async def work() -> None:
        async with AsyncHolding(lease, renew_fraction=0.9) as holding:  # type: ignore[arg-type]
            await holding.complete_async("ok")
            for i in range(20):  # 1 s of bookkeeping after the completion
                steps.append(i)
                await asyncio.sleep(0.05)

    asyncio.run(work())
    assert len(steps) == 20
    assert lease.results == ["ok"]


@pytest.mark.filterwarnings("ignore:joblease.AsyncHolding is deprecated")
def test_an_async_completion_without_a_result_records_an_empty_one() -> None:
    lease = CompletingLease(5.0)

    async def work() -> None:
        async with AsyncHolding(lease) as holding:  # type: ignore[arg-type]
            await holding.complete_async()

    asyncio.run(work())
    assert lease.results == [""]


# -- item 5: the supervisor (one watcher process per worker; issue 22 replaced the sentinel) --
# Its own tests: tests/unit/test_supervisor.py.


# -- item 6: drift in the holder's deadline --------------------------------------------------

@pytest.mark.parametrize("hours", [1, 24])
def test_the_holders_deadline_includes_drift_for_long_leases(hours: int) -> None:
    clock = ServerClock()
    clock.observe(100.0, 100.01, 1_000_000)
    end = datetime.fromtimestamp(1_000_000 + hours * 3600, UTC)
    stop = clock.monotonic_at(end)
    assert clock.now(stop).latest <= end + timedelta(microseconds=1)
    without_drift = end.timestamp() - 1_000_001 + 100.0
    assert without_drift - stop == pytest.approx(hours * 3600 * DEFAULT_DRIFT, rel=0.01)


# -- item 7: a retry recognises its own write ------------------------------------------------

def test_claim_complete_release_recognise_their_own_earlier_write() -> None:
    fresh = Observed("ns", "job", "uid", "7", 1, LeaseSpec(max_attempts=1), LeaseStatus(epoch=7))
    mine = decide_claim(fresh, "A", now(0), MARGIN, "c1")
    assert mine is not None
    landed = replace(fresh, status=mine.status, resource_version="8")
    assert decide_claim(landed, "A", now(1), MARGIN, "c1") is None  # adopted, not refused
    with pytest.raises(Exception, match="held by 'A'"):
        decide_claim(landed, "A", now(1), MARGIN, "c2")  # another claim is refused
    claim = Claim("A", FencingToken(7, 1), "c1")
    done = decide_complete(landed, claim, "ok", now(2), MARGIN)
    assert done is not None
    completed = replace(landed, status=done.status)
    assert decide_complete(completed, claim, "ok", now(3), MARGIN) is None
    released = decide_release(landed, claim, now(2), MARGIN)
    assert released is not None
    gone = replace(landed, status=released.status)
    assert decide_release(gone, claim, now(3), MARGIN) is None


# -- item 9: the operator never acts on objects that are gone --------------------------------

def test_a_late_delete_of_an_old_incarnation_keeps_the_new_one() -> None:
    view = LeaseView()
    old, new = held_by("a", 1, 1), replace(held_by("b", 9, 1, rv="90"), uid="uid-new")
    view.put(old)
    view.put(new)
    view.drop("ns", "job", old.uid)
    assert view.get("ns", "job") == new
    view.drop("ns", "job", "uid-new")
    assert view.get("ns", "job") is None


def test_a_lease_deleted_in_a_watch_gap_is_dropped_not_rewritten_every_pass() -> None:
    store = MemoryStore()
    view = LeaseView()
    view.put(held_by("w", 1, 1, until=1))  # the store has no such object
    store.api.now = 10
    reconciler = Reconciler(store, view, MARGIN)  # type: ignore[arg-type]
    reconciler.pass_once()
    assert view.snapshot() == []


class PodStoreFake:
    def __init__(self, pods: dict[str, PodInfo | None]) -> None:
        self.pods = pods
        self.annotated: list[str] = []

    def get(self, namespace: str, name: str) -> PodInfo | None:
        return self.pods.get(name)

    def annotate(self, pod: PodInfo, values: dict[str, str | None]) -> None:
        self.annotated.append(pod.name)


def _pod(name: str, uid: str, lease: str = "job", sa: str = "default") -> PodInfo:
    return PodInfo("ns", name, uid, lease, True, False, "2026-12-03T00:00:00Z", {}, sa)


def _delegator(store: MemoryStore, pods: PodStoreFake, view_pods: list[PodInfo]
               ) -> tuple[Delegator, LeaseView]:
    leases, pod_view = LeaseView(), PodView()
    for obs in store.objects.values():
        leases.put(obs)
    for pod in view_pods:
        pod_view.put(pod)
    return Delegator(store, pods, leases, pod_view, MARGIN), leases  # type: ignore[arg-type]


def _delegated(spec: LeaseSpec, holder: str) -> Observed:
    obs = held_by(holder, 1, 1, until=3)
    return replace(obs, spec=spec)


@pytest.mark.parametrize("opt_in", [None, LeaseSpec(pod_delegation=True,
                                                    delegation_service_account="worker")])
def test_a_pod_gets_a_lease_only_if_the_lease_opted_in(opt_in: LeaseSpec | None) -> None:
    store = MemoryStore()
    store.objects["job"] = Observed("ns", "job", "uid", "5", 1, opt_in or LeaseSpec(),
                                    LeaseStatus(epoch=5))
    squatter = _pod("squatter", "u1")  # runs as 'default'
    delegator, _ = _delegator(store, PodStoreFake({}), [squatter])
    delegator.pass_once()
    assert store.objects["job"].status.phase is Phase.AVAILABLE and not store.writes


def test_renewal_for_a_pod_that_lost_its_label_stops_and_for_a_gone_pod_releases() -> None:
    spec = LeaseSpec(lease_duration_seconds=3, pod_delegation=True)
    holder = "pod:ns/w/u1"
    store = MemoryStore([_delegated(spec, holder)])
    store.api.now = 2.5  # a renewal is due
    unlabelled = _pod("w", "u1", lease="")
    delegator, _ = _delegator(store, PodStoreFake({"w": unlabelled}), [_pod("w", "u1")])
    delegator.pass_once()
    assert not store.writes  # not renewed: it may still run, so it expires
    delegator.pods = PodStoreFake({"w": _pod("w", "u2")})  # type: ignore[assignment]
    delegator.pass_once()  # the name now belongs to another pod: the holder is gone
    assert store.objects["job"].status.phase is Phase.AVAILABLE


def test_a_refused_claim_for_one_pod_does_not_starve_the_next() -> None:
    from joblease.kube.api import InvalidError
    store = MemoryStore()
    store.objects["job"] = Observed("ns", "job", "uid", "5", 1, LeaseSpec(pod_delegation=True),
                                    LeaseStatus(epoch=5))

    def refuse_first(observed: Observed, status: LeaseStatus) -> None:
        if status.holder == "pod:ns/a/u1":
            raise InvalidError(422, "Invalid", "holder too long")

    store.fail = refuse_first
    delegator, _ = _delegator(store, PodStoreFake({}), [_pod("a", "u1"), _pod("b", "u2")])
    delegator.pass_once()
    assert store.objects["job"].status.holder == "pod:ns/b/u2"


# -- item 10: no Date header ------------------------------------------------------------------

def test_no_date_header_is_named_as_the_problem() -> None:
    class NoDate(KubeApi):
        def request(self, *args: Any, **kwargs: Any) -> Response:
            return Response(200, {}, 0.0, 0.0)

        @property
        def host(self) -> str:
            return "https://127.0.0.1:6443"

    api = NoDate(None, ServerClock())  # type: ignore[arg-type]
    with pytest.raises(UnavailableError, match="without a usable Date header"):
        api.server_now()



# -- the deprecated AsyncHolding's own surface (mutation pass, 2026-12-06) -----------------

class ReleasingLease(CompletingLease):
    """Records each release on exit."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.releases: list[bool] = []

    def release(self, failed: bool = False) -> None:
        self.releases.append(failed)


def test_async_holding_warns_whole() -> None:
    lease = ReleasingLease(30.0)
    with pytest.warns(DeprecationWarning) as warned:
        AsyncHolding(lease, renew_fraction=0.25)  # type: ignore[arg-type]
    assert [str(w.message) for w in warned] == [
        "joblease.AsyncHolding is deprecated: claim with joblease.aio.AsyncLeaseClient and "
        "hold with `async with client.hold(lease)` (docs/sdk.md)"]


@pytest.mark.filterwarnings("ignore:joblease.AsyncHolding is deprecated")
def test_async_holding_releases_on_exit_failed_only_after_an_exception_and_never_swallows(
) -> None:
    lease = ReleasingLease(30.0)

    async def fine() -> None:
        async with AsyncHolding(lease):  # type: ignore[arg-type]
            pass

    async def failing() -> None:
        async with AsyncHolding(lease):  # type: ignore[arg-type]
            raise ValueError("the body failed")

    asyncio.run(fine())
    with pytest.raises(ValueError, match="the body failed"):
        asyncio.run(failing())
    assert lease.releases == [False, True]


@pytest.mark.filterwarnings("ignore:joblease.AsyncHolding is deprecated")
def test_async_holding_renews_at_the_fraction_it_is_given() -> None:
    lease = ReleasingLease(30.0)
    pause = AsyncHolding(lease, renew_fraction=0.2)._engine.renew_pause()  # type: ignore[arg-type]
    assert pause == pytest.approx(6.0, abs=0.1)  # a fifth of 30 s, not the default third
