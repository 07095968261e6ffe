"""The SDK surface a Python user relies on (issue 16, item 3).

One root exception over everything joblease raises on purpose, a client that closes what
it opened, calibration that happens where the docs say (never inside ``margin()``), and one
answer to "is this hold lost, and why". Pure: the in-memory API server of
``support.fakekube`` stands in for HTTP.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from datetime import timedelta
from typing import Any

import pytest

import joblease
from joblease.domain.clock import ServerNow
from joblease.domain.errors import JobleaseError, LeaseError, StaleLeaseError
from joblease.domain.token import FencingToken
from joblease.fencing.errors import FencingError, StaleTokenError
from joblease.kube.api import ApiError, UnavailableError
from joblease.kube.transact import ContentionError
from joblease.pod.downward import DownwardFormatError
from joblease.sdk import Holding, LeaseClient
from joblease.sdk.client import Lease, default_holder
from support.fakekube import T_NOW, FakeKubeApi, lease_object


class CountingApi(FakeKubeApi):
    """The fake API server, counting what the client asks of it beyond requests."""

    def __init__(self) -> None:
        super().__init__()
        self.calibrations = 0
        self.closes = 0

    def calibrate(self, *args: Any, **kwargs: Any) -> float:
        self.calibrations += 1
        return 0.0

    def close(self) -> None:
        self.closes += 1


def counting_client(calibrate: bool = True, duration: int = 300
                    ) -> tuple[CountingApi, LeaseClient]:
    api = CountingApi()
    api.put_object(lease_object("job", {"phase": "Available"}, leaseDurationSeconds=duration))
    return api, LeaseClient("ns", api=api, calibrate=calibrate)  # type: ignore[arg-type]


# -- one root exception ---------------------------------------------------------------------

def _joblease_exceptions() -> list[type[BaseException]]:
    """Every exception class defined in any module of the ``joblease`` package."""
    found: list[type[BaseException]] = []
    for info in pkgutil.walk_packages(joblease.__path__, "joblease."):
        if info.name == "joblease.__main__":
            continue  # runs the operator on import
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                found.append(obj)
    return found


# The light client's internal signal to fall back to the full one (caught by
# joblease.kube.lite.connect, never seen by a caller). Nothing else may join this list.
NOT_YET_JOBLEASE_ERRORS = {"joblease.kube.lite.UnsupportedConfigError"}


def test_every_exception_joblease_defines_is_a_joblease_error() -> None:
    classes = _joblease_exceptions()
    # the walk really saw the four families (a broken walk must not pass vacuously)
    assert {LeaseError, ApiError, FencingError, DownwardFormatError} <= set(classes)
    outside = {f"{c.__module__}.{c.__qualname__}" for c in classes
               if not issubclass(c, JobleaseError)}
    assert outside - NOT_YET_JOBLEASE_ERRORS == set(), (
        "add JobleaseError to their bases (docs/sdk.md, Errors)")


def test_existing_subclass_relations_are_kept() -> None:
    assert issubclass(DownwardFormatError, ValueError)  # callers caught it as one
    assert issubclass(ContentionError, UnavailableError)  # retried like an outage
    assert issubclass(StaleTokenError, FencingError)
    err = StaleTokenError("r", FencingToken(1, 1), FencingToken(1, 2))
    assert isinstance(err, JobleaseError)


def test_the_api_errors_are_exported_from_the_package() -> None:
    for name in ("JobleaseError", "ApiError", "ConflictError", "NotFoundError", "InvalidError",
                 "ForbiddenError", "UnavailableError", "ContentionError", "LeaseGoneError"):
        assert name in joblease.__all__
        assert issubclass(getattr(joblease, name), JobleaseError)
    assert all(hasattr(joblease, name) for name in joblease.__all__)


# -- a closeable client ---------------------------------------------------------------------

def test_a_client_closes_the_api_it_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built = CountingApi()
    monkeypatch.setattr("joblease.sdk.client.KubeApi.from_kubeconfig",
                        lambda *args: built)
    with LeaseClient("ns", calibrate=False) as client:
        assert client.api is built
    assert built.closes == 1
    client.close()  # idempotent
    assert built.closes == 1


def test_a_client_leaves_an_api_passed_in_open() -> None:
    api, client = counting_client()
    with client:
        pass
    client.close()
    assert api.closes == 0  # its owner shares it with other clients


# -- calibration where the docs say, never inside margin() ----------------------------------

def test_margin_never_calibrates() -> None:
    api, client = counting_client(calibrate=True)
    assert client.margin() == client.base_margin + api.server_now().error
    client.margin()
    assert api.calibrations == 0


def test_the_first_claim_calibrates_once_when_asked_to() -> None:
    api, client = counting_client(calibrate=True)
    lease = client.claim("job", "a")
    assert api.calibrations == 1
    lease.release()
    client.claim("job", "a")
    assert api.calibrations == 1


def test_the_first_resume_calibrates_too() -> None:
    api, client = counting_client(calibrate=True)
    token = client.claim("job", "a").token
    other = LeaseClient("ns", api=api)  # type: ignore[arg-type]
    assert other.resume("job", "a", token).valid()
    assert api.calibrations == 2  # one per client that was built with calibrate=True


def test_an_explicit_calibration_replaces_the_lazy_one() -> None:
    api, client = counting_client(calibrate=True)
    assert client.calibrate() == api.server_now().error
    client.claim("job", "a")
    assert api.calibrations == 1


def test_calibrate_false_never_calibrates_by_itself() -> None:
    api, client = counting_client(calibrate=False)
    client.claim("job", "a").release()
    client.resume("job", "a", FencingToken(100, 1))
    assert api.calibrations == 0


# -- one answer to "is this hold lost, and why" ---------------------------------------------

def test_a_holding_reports_its_token_precisely_and_no_loss_while_held() -> None:
    _, client = counting_client(calibrate=False)
    lease = client.claim("job", "a")
    with Holding(lease) as holding:
        assert isinstance(holding.token, FencingToken) and holding.token == lease.token
        assert holding.loss is None and not holding.lost.is_set()
        holding.check()
        holding.complete("ok")


def test_a_loss_met_outside_the_holding_is_adopted_with_its_reason() -> None:
    api, client = counting_client(calibrate=False)
    lease = client.claim("job", "a")
    with Holding(lease) as holding:
        api.now = api.now.__class__.exact(T_NOW + timedelta(seconds=301))
        client.claim("job", "b")
        with pytest.raises(StaleLeaseError) as met:
            lease.renew()  # the lease's own operation, not the holding's renewer
        with pytest.raises(StaleLeaseError) as seen:
            holding.check()
        assert seen.value is met.value  # the reason, not a generic "expired"
        assert holding.loss is met.value and lease.loss is met.value
        assert holding.lost.is_set()


def test_loss_is_read_only() -> None:
    _, client = counting_client(calibrate=False)
    holding = Holding(client.claim("job", "a"))
    with pytest.raises(AttributeError):
        holding.loss = None  # type: ignore[misc]


def _attempts(api: FakeKubeApi) -> int:
    stored = api.stored("ns", "job")
    assert stored is not None
    return int(stored["status"].get("attempts", 0))


def test_fail_releases_as_failed_on_exit() -> None:
    api, client = counting_client(calibrate=False)
    with Holding(client.claim("job", "a")) as holding:
        holding.fail()
    assert _attempts(api) == 1
    with Holding(client.claim("job", "a")):
        pass
    assert _attempts(api) == 1  # a plain exit releases without counting an attempt


# -- a lease resumed or renewed too late says why, from the server's current claim ----------

def _patches(api: FakeKubeApi) -> int:
    return sum(1 for method, _ in api.requests if method == "PATCH")


def test_a_renewal_past_the_deadline_names_the_newer_claim() -> None:
    api, client = counting_client(calibrate=False, duration=10)
    a = client.claim("job", "a")
    api.now = ServerNow.exact(T_NOW + timedelta(seconds=11))
    client.claim("job", "b")
    api._monotonic = 100.0  # "a" was paused well past its local deadline
    writes = _patches(api)
    with pytest.raises(StaleLeaseError) as err:
        a.renew()
    assert (err.value.current_holder, err.value.current_generation) == ("b", 2)
    assert a.loss is err.value and _patches(api) == writes  # a refusal writes nothing


def test_a_resumed_stale_token_is_told_the_current_claim() -> None:
    _, client = counting_client(calibrate=False)
    token = client.claim("job", "a").token
    stale = client.resume("job", "a", FencingToken(token.epoch, 0))
    assert not stale.valid()
    with pytest.raises(StaleLeaseError, match="current generation is 1"):
        stale.renew()


# -- the sync package's own surface (moved from test_sdk_client.py) --------------------------

def test_the_lazily_loaded_names_are_the_defining_modules_own() -> None:
    """``from joblease.sdk import Pool`` (and the holdings) load their modules on first use;
    each name must still be the very class the module defines, and a typo must say so."""
    import joblease.sdk as sdk
    from joblease.domain.errors import PoolClosedError
    from joblease.sdk import async_holding, hold, pool

    for name in ("Holding", "RenewalStoppedError"):
        assert getattr(sdk, name) is getattr(hold, name)
    assert sdk.AsyncHolding is async_holding.AsyncHolding
    assert sdk.Pool is pool.Pool
    assert sdk.PoolClosedError is PoolClosedError
    with pytest.raises(AttributeError) as err:
        sdk.Holdings  # noqa: B018
    assert str(err.value) == "module 'joblease.sdk' has no attribute 'Holdings'"


def test_default_holder_prefers_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBLEASE_HOLDER", "from-env")
    assert default_holder() == "from-env"
    monkeypatch.delenv("JOBLEASE_HOLDER")
    assert default_holder().rsplit("-", 1)[1].isdigit()


def test_async_holding_is_deprecated_with_a_pointer_to_joblease_aio() -> None:
    """Issue 31, item 4: the asyncio flavour of the thread holding is retired, not removed."""
    from joblease.domain.holder import HoldingFront

    lease = Lease.__new__(Lease)  # never renewed: the holding is built, not entered
    lease.name, lease.loss = "job", None
    lease.remaining = lambda: 30.0  # type: ignore[method-assign]
    with pytest.warns(DeprecationWarning, match=r"joblease\.aio\.AsyncLeaseClient.*client\.hold"):
        holding = joblease.AsyncHolding(lease)
    assert isinstance(holding, Holding) and isinstance(holding, HoldingFront)
    assert "AsyncHolding" in joblease.__all__


def test_the_downward_readers_old_name_is_the_same_reader() -> None:
    """``joblease.downward`` moved to ``joblease.pod.downward`` (issue 31, item 7); the old
    name is public API (README, docs/sdk.md, the examples) and must give the very objects."""
    import joblease.downward as old
    import joblease.pod.downward as new

    assert old.__all__ == new.__all__
    for name in new.__all__:
        assert getattr(old, name) is getattr(new, name), name
