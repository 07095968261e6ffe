"""The clients' bounds in time, both clients: ``wait_claim``'s timeout, the deadline, resume.

Found by mutation testing (issue 31, item 8; ``joblease.core.ops``): ``wait_claim`` could
sleep past its timeout, give up a second early, or wait for a held lease without the clock
estimate's error; a renewal with less than a second left could go out unbounded by the
deadline; a lease could be called valid a second too early or at its very deadline; a
resumed lease could forget the claim id it was resumed with; a completion could be cut
short by the renewal's bound. Every test runs against ``LeaseClient`` and
``AsyncLeaseClient`` on the in-memory API server, with the local monotonic clock moved
only by the clients' (fake) sleeps, so that every figure is exact.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from joblease.domain.errors import LeaseHeldError, StaleLeaseError, format_time
from joblease.domain.holder import DEFAULT_MARGIN
from joblease.kube.api import DEFAULT_TIMEOUT
from support.clients import KINDS, client_over, fake_sleep
from support.fakekube import T_NOW, FakeKubeApi, lease_object

pytestmark = pytest.mark.parametrize("kind", KINDS)

MARGIN = DEFAULT_MARGIN.total_seconds()


class Api(FakeKubeApi):
    """The in-memory server; the local clock stands still but for ``advance``; timeouts kept."""

    def __init__(self, status: dict[str, Any] | None = None, **spec: Any) -> None:
        super().__init__()
        self.local = 0.0
        self.timeouts: list[tuple[str, float | None]] = []
        self.put_object(lease_object("job", status or {"phase": "Available"}, **spec))

    def monotonic(self) -> float:
        return self.local

    def at(self, seconds: float, error: float = 0.0) -> None:
        """Local and server clock at ``seconds`` after the start (server ± ``error``/2)."""
        from joblease.domain.clock import ServerNow

        self.local = seconds
        mid, half = T_NOW + timedelta(seconds=seconds), timedelta(seconds=error / 2)
        self.now = ServerNow(mid - half, mid + half)

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        self.timeouts.append((method, kwargs.get("timeout")))
        return super().request(method, path, body, **kwargs)


def sleeping(monkeypatch: pytest.MonkeyPatch, api: Api, error: float = 0.0) -> list[float]:
    """Fake sleeps that move both clocks by what was slept."""
    return fake_sleep(monkeypatch, lambda seconds: api.at(api.local + seconds, error))


# -- wait_claim's timeout ----------------------------------------------------------------------

def test_wait_claim_never_sleeps_past_its_timeout(kind: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api(leaseDurationSeconds=10)
    client = client_over(kind, api)
    client.claim("job", "a")
    slept = sleeping(monkeypatch, api)
    with pytest.raises(LeaseHeldError):
        client.wait_claim("job", "b", timeout=3.0, poll=5.0)
    assert slept == [3.0]  # the timeout, not the poll


def test_wait_claim_gives_up_at_its_timeout_without_one_more_attempt(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api(leaseDurationSeconds=10)
    client = client_over(kind, api)
    client.claim("job", "a")
    slept = sleeping(monkeypatch, api)
    api.requests.clear()
    with pytest.raises(LeaseHeldError) as err:
        client.wait_claim("job", "b", timeout=10.0, poll=5.0)
    assert slept == [5.0, 5.0]
    assert [m for m, _ in api.requests] == ["GET"] * 3  # at 0, 5 and 10 s: then no more
    assert err.value.holder == "a"


def test_wait_claim_takes_a_lease_freed_in_the_last_second_of_its_timeout(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api(leaseDurationSeconds=10)
    client = client_over(kind, api)
    client.claim("job", "a")
    slept = sleeping(monkeypatch, api)
    lease = client.wait_claim("job", "b", timeout=10.8, poll=5.0)
    assert (lease.holder, lease.generation) == ("b", 2)
    assert slept == pytest.approx([5.0, 5.0, MARGIN])  # claimable at 10 + margin < 10.8


def test_wait_claim_takes_a_backoff_ending_within_its_last_second(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api({"phase": "Available", "attempts": 1,
               "notBefore": format_time(T_NOW + timedelta(seconds=0.5))})
    slept = sleeping(monkeypatch, api)
    lease = client_over(kind, api).wait_claim("job", "b", timeout=0.8, poll=5.0)
    assert lease.generation == 1
    assert slept == pytest.approx([0.5])  # notBefore is not widened by the margin


def test_wait_claim_waits_for_a_held_lease_plus_the_margin_plus_the_clock_error(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api(leaseDurationSeconds=10)
    client = client_over(kind, api)
    client.claim("job", "a")
    api.at(4.0, error=0.4)  # earliest server time 4 - 0.2 s; error bound 0.2 s
    slept = sleeping(monkeypatch, api, error=0.4)
    lease = client.wait_claim("job", "b", timeout=60, poll=30)
    assert lease.generation == 2
    # until the earliest server time passes leaseUntil + margin + error: 10.25 + 0.2 - 3.8
    assert slept[0] == pytest.approx(10 - 4 + MARGIN + 0.4)


# -- the deadline ------------------------------------------------------------------------------

def test_a_lease_is_valid_until_its_very_deadline_and_not_at_it(kind: str) -> None:
    api = Api(leaseDurationSeconds=10)
    lease = client_over(kind, api).claim("job", "a")
    api.local = lease.deadline - 0.5
    assert lease.valid() and lease.remaining() == pytest.approx(0.5)
    api.local = lease.deadline
    assert not lease.valid()


def test_a_renewal_with_half_a_second_left_waits_no_longer_than_that(kind: str) -> None:
    api = Api(leaseDurationSeconds=10)
    lease = client_over(kind, api).claim("job", "a")
    api.local = lease.deadline - 0.5
    api.timeouts.clear()
    lease.renew()
    assert api.timeouts == [("PATCH", pytest.approx(0.5))]


def test_a_renewal_at_the_deadline_asks_the_server_without_that_bound(kind: str) -> None:
    """Past the deadline the lease is lost either way; the server's answer says to whom."""
    api = Api(leaseDurationSeconds=10)
    lease = client_over(kind, api).claim("job", "a")
    api.local = lease.deadline
    api.timeouts.clear()
    lease.renew()  # the server's clock has not moved: still ours
    assert api.timeouts == [("PATCH", DEFAULT_TIMEOUT)]


@pytest.mark.parametrize("finish", ["complete", "release"])
def test_a_completion_or_release_is_not_cut_short_by_the_renewals_bound(
        kind: str, finish: str) -> None:
    api = Api(leaseDurationSeconds=10)
    lease = client_over(kind, api).claim("job", "a")
    api.local = lease.deadline - 0.5
    api.timeouts.clear()
    getattr(lease, finish)()
    assert api.timeouts == [("PATCH", DEFAULT_TIMEOUT)]


# -- resume and the lease's description --------------------------------------------------------

def test_a_resumed_lease_keeps_its_claim_id_and_reads_with_the_default_timeout(
        kind: str) -> None:
    api = Api(leaseDurationSeconds=30)
    client = client_over(kind, api)
    first = client.claim("job", "a")
    api.timeouts.clear()
    resumed = client.resume("job", "a", first.token, first.claim_id)
    assert api.timeouts == [("GET", DEFAULT_TIMEOUT)]
    assert resumed.claim_id == first.claim_id and resumed.valid()
    other = client.resume("job", "a", first.token, "another-claim")
    assert other.claim_id == "another-claim" and not other.valid()
    with pytest.raises(StaleLeaseError):
        other.renew()


def test_a_lease_describes_itself_by_name_holder_token_and_end(kind: str) -> None:
    api = Api(leaseDurationSeconds=10)
    lease = client_over(kind, api).claim("job", "a")
    cls = "Lease" if kind == "sync" else "AsyncLease"
    end = (T_NOW + timedelta(seconds=10)).isoformat()
    assert repr(lease) == f"{cls}(ns/job, holder='a', token=100/1, lease_until={end})"
    lease.complete()
    assert repr(lease) == f"{cls}(ns/job, holder='a', token=100/1, lease_until=None)"
