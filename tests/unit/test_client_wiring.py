"""What each client passes on and what it defaults to, both clients.

Found by mutation testing (issue 31, item 8; ``joblease.sdk.client``,
``joblease.aio.client``): the clients are thin over ``joblease.core.ops``, so what they can
get wrong is the wiring: the kubeconfig and context given, the ``max_server_skew`` that
widens every margin, who closes the API connection, the lazy calibration (once, and not
again after an explicit one), ``claim_next``'s holder, spread, timeout and
``until_empty`` (one pool per selector), ``hold``'s renewal fraction and early stop, and
the documented defaults (namespace ``default``, ``wait_claim``'s 60 s and 0.5 s,
``release()`` not counting an attempt). The pool and holding classes are replaced by
recorders here: their own behaviour has its own tests (``test_pools.py``,
``test_holdings.py``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import pytest

from joblease.aio import AsyncLeaseClient
from joblease.domain.errors import LeaseHeldError
from joblease.domain.holder import DEFAULT_MARGIN, RENEW_FRACTION
from joblease.domain.pool import DEFAULT_SPREAD
from joblease.sdk.client import LeaseClient
from support.clients import KINDS, LOOP, Client, client_over, fake_sleep
from support.fakekube import T_NOW, AsyncFakeKubeApi, FakeKubeApi, lease_object

pytestmark = pytest.mark.parametrize("kind", KINDS)


class Api(FakeKubeApi):
    """The in-memory server, counting calibrations and closes."""

    def __init__(self) -> None:
        super().__init__()
        self.calibrations = 0
        self.closed = 0
        self.put_object(lease_object("job", {"phase": "Available"}, leaseDurationSeconds=120))

    def calibrate(self, max_seconds: float = 1.5, target_error: float = 0.01) -> float:
        self.calibrations += 1
        return 0.0

    def close(self) -> None:
        self.closed += 1


class AsyncApi(AsyncFakeKubeApi):
    async def calibrate(self, max_seconds: float = 1.5, target_error: float = 0.01) -> float:
        return self.sync.calibrate()  # type: ignore[no-any-return,attr-defined]

    async def close(self) -> None:
        self.sync.close()  # type: ignore[attr-defined]


def build(kind: str, api: Api | None = None, **options: Any) -> Any:
    """The real client of ``kind`` (its defaults untouched) over ``api``, if given."""
    if kind == "sync":
        return LeaseClient(api=api, **options)  # type: ignore[arg-type]
    return AsyncLeaseClient(api=AsyncApi(api) if api else None, **options)  # type: ignore[arg-type]


def call(value: Any) -> Any:
    """Run a client call to its end (awaited on the test loop for the asyncio client)."""
    import inspect

    return LOOP.run(value) if inspect.isawaitable(value) else value


# -- construction ------------------------------------------------------------------------------

def test_a_client_built_from_a_kubeconfig_uses_the_file_and_context_and_closes_it(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api()
    asked: list[tuple[Any, Any]] = []
    if kind == "sync":
        def from_kubeconfig(kubeconfig: Any, context: Any) -> Api:
            asked.append((kubeconfig, context))
            return api
        monkeypatch.setattr("joblease.sdk.client.KubeApi.from_kubeconfig", from_kubeconfig)
    else:
        def async_api(*, kubeconfig: Any, context: Any) -> AsyncApi:
            asked.append((kubeconfig, context))
            return AsyncApi(api)
        monkeypatch.setattr("joblease.aio.client.AsyncKubeApi", async_api)
    client = build(kind, kubeconfig="cluster.yaml", context="staging")
    assert asked == [("cluster.yaml", "staging")]
    assert client.namespace == "default"
    call(client.close())
    call(client.close())  # idempotent
    assert api.closed == 1


def test_an_api_passed_in_is_left_open_for_its_owner(kind: str) -> None:
    api = Api()
    client = build(kind, api, calibrate=False)
    call(client.close())
    assert api.closed == 0


def test_max_server_skew_widens_the_clock_estimate(kind: str) -> None:
    api = Api()
    build(kind, api, max_server_skew=timedelta(seconds=2.5))
    assert api.clock.max_skew == 2.5
    other = Api()
    build(kind, other)
    assert other.clock.max_skew == 0.0  # the estimate's own default stays


# -- calibration -------------------------------------------------------------------------------

def test_the_first_claim_calibrates_by_default_and_only_once(kind: str) -> None:
    api = Api()
    client = build(kind, api, namespace="ns")
    lease = call(client.claim("job", "a"))
    assert api.calibrations == 1
    call(lease.release())
    call(client.claim("job", "a"))
    assert api.calibrations == 1


def test_an_explicit_calibration_cancels_the_lazy_one(kind: str) -> None:
    api = Api()
    client = build(kind, api, namespace="ns")
    assert call(client.calibrate()) == api.now.error
    call(client.claim("job", "a"))
    assert api.calibrations == 1


def test_calibrate_false_never_calibrates_by_itself(kind: str) -> None:
    api = Api()
    call(build(kind, api, namespace="ns", calibrate=False).claim("job", "a"))
    assert api.calibrations == 0


# -- defaults ----------------------------------------------------------------------------------

def test_release_without_arguments_does_not_count_an_attempt(kind: str) -> None:
    api = Api()
    client = client_over(kind, api)
    client.claim("job", "a").release()
    status = api.stored("ns", "job")["status"]  # type: ignore[index]
    assert status["phase"] == "Available" and not status.get("attempts")


def test_wait_claim_polls_every_half_second_for_a_minute_by_default(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api()
    client = client_over(kind, api)
    client.claim("job", "a")
    clock = {"now": 0.0}
    monkeypatch.setattr(api, "monotonic", lambda: clock["now"])
    slept = fake_sleep(monkeypatch, lambda s: clock.__setitem__("now", clock["now"] + s))
    with pytest.raises(LeaseHeldError):
        client.wait_claim("job", "b")
    assert set(slept) == {0.5} and sum(slept) == pytest.approx(60.0)


def test_seconds_until_a_held_lease_may_be_taken_over_includes_the_margin(kind: str) -> None:
    """What the simulator and the cluster protocol test wait with (sync client only)."""
    if kind == "async":
        return
    api = Api()
    client = build(kind, api, calibrate=False)
    until = T_NOW + timedelta(seconds=10)
    assert client._seconds_until(until) == pytest.approx(10 + DEFAULT_MARGIN.total_seconds())
    assert client._seconds_until(until, margin=False) == pytest.approx(10)


# -- pools and holdings: what is passed on -----------------------------------------------------

class PoolRecorder:
    """Stands in for ``Pool``/``AsyncPool``: records how it was built and asked."""

    built: ClassVar[list[tuple[str | None, int]]] = []

    def __init__(self, client: Any, selector: str | None, *, spread: int = DEFAULT_SPREAD,
                 slots: int | None = None) -> None:
        self.client, self.selector, self.spread, self.slots = client, selector, spread, slots
        self.asked: list[tuple[Any, ...]] = []
        self.closed = False
        PoolRecorder.built.append((selector, spread))

    def claim_next(self, holder: str | None, *, timeout: float | None, spread: int,
                   until_empty: bool) -> Any:
        self.asked.append((holder, timeout, spread, until_empty))
        return None

    def close(self) -> None:
        self.closed = True


class AsyncPoolRecorder(PoolRecorder):
    async def claim_next(self, holder: str | None, *, timeout: float | None,  # type: ignore[override]
                         spread: int, until_empty: bool) -> Any:
        return PoolRecorder.claim_next(self, holder, timeout=timeout, spread=spread,
                                       until_empty=until_empty)

    async def close(self) -> None:  # type: ignore[override]
        PoolRecorder.close(self)


@pytest.fixture
def pools(kind: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str | None, int]]:
    PoolRecorder.built = []
    if kind == "sync":
        monkeypatch.setattr("joblease.sdk.client.Pool", PoolRecorder)
    else:
        monkeypatch.setattr("joblease.aio.client.AsyncPool", AsyncPoolRecorder)
    return PoolRecorder.built


def test_a_pool_is_built_for_the_selector_and_spread_asked(
        kind: str, pools: list[tuple[str | None, int]]) -> None:
    client = client_over(kind, Api())
    pool = client.pool("team=a", spread=4)
    assert (pool.client, pool.selector, pool.spread) == (client.real, "team=a", 4)
    assert pool.slots is None  # announces no slots unless asked (issue 30: dispatched pools)
    assert client.pool("team=b", slots=3).slots == 3
    assert pools == [("team=a", 4), ("team=b", DEFAULT_SPREAD)]


def test_claim_next_passes_everything_on_to_one_pool_per_selector(
        kind: str, pools: list[tuple[str | None, int]]) -> None:
    client = client_over(kind, Api())
    assert client.claim_next("team=a", "w1", timeout=2.5, spread=3, until_empty=True) is None
    client.claim_next("team=a", "w2")
    client.claim_next("team=b", "w3")
    assert pools == [("team=a", DEFAULT_SPREAD), ("team=b", DEFAULT_SPREAD)]
    first = client.real._pools["team=a"]
    assert first.asked == [("w1", 2.5, 3, True), ("w2", None, DEFAULT_SPREAD, False)]
    client.close()
    assert first.closed and client.real._pools == {}


def test_a_closed_client_refuses_claim_next_saying_so(
        kind: str, pools: list[tuple[str | None, int]]) -> None:
    client = client_over(kind, Api())
    client.close()
    name = "LeaseClient" if kind == "sync" else "AsyncLeaseClient"
    with pytest.raises(RuntimeError) as err:
        client.claim_next("team=a")
    assert str(err.value) == f"the {name} is closed"
    assert pools == []


def test_hold_passes_the_lease_its_renewal_fraction_and_early_stop(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if kind == "sync":
        return  # the thread client's holding is built by the lease's caller (joblease.sdk.hold)
    built: list[tuple[Any, ...]] = []

    def holding(lease: Any, renew_fraction: float, *, stop_before: float) -> str:
        built.append((lease, renew_fraction, stop_before))
        return "holding"

    monkeypatch.setattr("joblease.aio.client.AsyncLeaseHolding", holding)
    client: Client = client_over(kind, Api())
    lease = client.claim("job", "a").real
    assert client.real.hold(lease) == "holding"
    client.real.hold(lease, 0.5, stop_before=2.0)
    assert built == [(lease, RENEW_FRACTION, 0.0), (lease, 0.5, 2.0)]


def test_max_conflicts_bounds_the_409s_a_claim_absorbs(kind: str) -> None:
    """A pool claims with ``max_conflicts=1`` from its cache: a stale version costs one write."""
    from joblease.kube.transact import ContentionError

    api = Api()
    client = client_over(kind, api)
    stale = client.get("job")
    client.claim("job", "a").release()  # the stored version moves on
    api.requests.clear()
    with pytest.raises(ContentionError):
        client.claim("job", "b", observed=stale, max_conflicts=1)
    assert [m for m, _ in api.requests] == ["PATCH"]
    assert client.claim("job", "b", observed=stale).holder == "b"  # the default re-reads


def test_count_counts_this_namespace_only(kind: str) -> None:
    api = Api()
    api.put_object(lease_object("elsewhere", {"phase": "Available"}, namespace="ns2"))
    assert client_over(kind, api).count() == 1
