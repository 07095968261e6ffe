"""A pool's presence records (``joblease.core.presence``) on the in-memory API server.

Pinned: a worker's record carries the *server's* time, is created once then patched, and is
deleted when its pool closes; two workers of one pool see each other (and a worker of another
pool does not); a listed record turns into ``note_worker`` and a vanished one into
``forget_worker``; an unreadable record is skipped; a refusal (no RBAC) turns presence off
once, without stopping claims.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from joblease.core.presence import (
    DISPATCHER_ROLE,
    POOL_LABEL,
    ROLE_LABEL,
    WARM_UP,
    Presence,
    live_records,
    micro_time,
    pool_key,
    record_name,
)
from joblease.core.steps import Stopped, SyncPort, drive
from joblease.domain.clock import ServerNow
from joblease.kube.api import MERGE_PATCH, ForbiddenError, UnavailableError
from joblease.kube.leases import LeaseStore
from support.fakekube import T_NOW, FakeKubeApi


class Collect:
    def __init__(self) -> None:
        self.seen: list[dict[str, datetime]] = []

        self.dispatchers: list[datetime | None] = []

    def workers(self, live: dict[str, datetime]) -> None:
        self.seen.append(live)

    def dispatcher(self, until: datetime | None, unfinished: int | None = None) -> None:
        self.dispatchers.append(until)


def drive_rounds(presence: Presence, api: FakeKubeApi, n: int, sink: Collect | None = None,
                 after: Callable[[], None] = lambda: None) -> tuple[list[float], list[Any]]:
    """Run ``presence`` (renew, list) until its n-th sleep: the pauses and requests it made.

    ``after`` runs after each request (what another thread of the worker might do then).
    """
    slept: list[float] = []
    calls: list[Any] = []

    class Port(SyncPort):
        def perform(self, step: Any) -> Any:
            if type(step).__name__ == "Sleep":
                slept.append(step.seconds)
                if len(slept) >= n:
                    raise Stopped()
                return None
            calls.append(step)
            answer = super().perform(step)
            after()
            return answer

    with pytest.raises(Stopped):
        drive(presence.steps(sink or Collect()),
              Port(LeaseStore(api)))  # type: ignore[arg-type]
    return slept, calls


def rounds(presence: Presence, api: FakeKubeApi, n: int) -> Collect:
    """Run ``n`` rounds of ``presence`` (renew, list), stopping at the n-th sleep."""
    sink = Collect()
    slept, _ = drive_rounds(presence, api, n, sink)
    expected = [*WARM_UP, *[presence.every] * n][:len(slept)]
    assert all(0.8 * e <= s <= 1.2 * e for s, e in zip(slept, expected, strict=True))
    return sink


def test_a_record_carries_the_servers_time_is_created_once_then_patched() -> None:
    api = FakeKubeApi(now=ServerNow.exact(T_NOW))
    presence = Presence("ns", "team=batch", "system:serviceaccount:ns:w1")
    sink = rounds(presence, api, 2)
    assert [m for m, _ in api.presence_requests] == ["PATCH", "POST", "GET", "PATCH", "GET"]
    record = api.presence[("ns", record_name(pool_key("team=batch"),
                                             "system:serviceaccount:ns:w1"))]
    assert record["metadata"]["labels"] == {POOL_LABEL: pool_key("team=batch")}
    assert record["spec"]["renewTime"] == micro_time(T_NOW)  # the server's clock, not ours
    until = T_NOW + timedelta(seconds=presence.seconds)
    assert sink.seen == [{"system:serviceaccount:ns:w1": until}] * 2
    assert api.requests == []  # no JobLease request at all


def test_workers_of_one_pool_see_each_other_and_no_other_pool() -> None:
    api = FakeKubeApi()
    rounds(Presence("ns", "team=batch", "w1"), api, 1)
    rounds(Presence("ns", "team=other", "x1"), api, 1)
    sink = rounds(Presence("ns", "team=batch", "w2"), api, 1)
    assert set(sink.seen[-1]) == {"w1", "w2"}


def test_leaving_deletes_the_record() -> None:
    api = FakeKubeApi()
    presence = Presence("ns", "p=1", "w1")
    rounds(presence, api, 1)
    assert len(api.presence) == 1
    drive(presence.leave_steps(), SyncPort(LeaseStore(api)))  # type: ignore[arg-type]
    assert api.presence == {}


def test_a_refusal_turns_presence_off_once_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    api = FakeKubeApi()

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise ForbiddenError(403, "Forbidden", "cannot patch leases.coordination.k8s.io")

    api._presence = forbidden  # type: ignore[method-assign]
    presence = Presence("ns", "p=1", "w1")
    drive(presence.steps(Collect()), SyncPort(LeaseStore(api)))  # type: ignore[arg-type]
    assert presence.enabled is False
    assert "pool presence is off" in caplog.text and "coordination" in caplog.text


def test_unreadable_or_hostile_records_are_skipped_and_the_latest_renewal_wins() -> None:
    good = {"holderIdentity": "w", "renewTime": "2026-12-03T12:00:00.000000Z",
            "leaseDurationSeconds": 15}
    later = {**good, "renewTime": "2026-12-03T12:00:05.000000Z"}
    items: list[Any] = [{"spec": good}, {"spec": later}, {"spec": {"holderIdentity": "x"}},
                        {"spec": {**good, "holderIdentity": "y", "leaseDurationSeconds": "x"}},
                        {"spec": None}, "not an object", {}]
    assert live_records(items) == {"w": datetime.fromisoformat("2026-12-03T12:00:20+00:00")}


def test_the_records_on_the_wire_are_coordination_leases_a_real_server_accepts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-memory server stores any body; kube-apiserver validates these (cluster tests)."""
    api = FakeKubeApi(now=ServerNow.exact(T_NOW))
    sent: list[tuple[str, Any, str | None, float]] = []
    real_request = api.request

    def request(method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        sent.append((method, copy.deepcopy(body), kwargs.get("content_type"),
                     kwargs.get("timeout", 10.0)))
        return real_request(method, path, body, **kwargs)

    monkeypatch.setattr(api, "request", request)
    presence = Presence("ns", "team=batch", "w1", seconds=20)
    rounds(presence, api, 2)
    spec = {"holderIdentity": "w1", "leaseDurationSeconds": 20, "renewTime": micro_time(T_NOW)}
    patch, create, listing, renewal = sent[:4]
    assert patch[:3] == ("PATCH", {"spec": spec}, MERGE_PATCH)  # 404 the first time
    assert create[:3] == ("POST", {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": presence.name, "labels": {POOL_LABEL: pool_key("team=batch")}},
        "spec": {**spec, "acquireTime": micro_time(T_NOW)}}, None)
    assert listing[:2] == ("GET", None)
    assert renewal[:3] == ("PATCH", {"spec": spec}, MERGE_PATCH)
    drive(presence.leave_steps(), SyncPort(LeaseStore(api)))  # type: ignore[arg-type]
    assert sent[-1] == ("DELETE", None, None, 2.0)  # a clean exit does not wait long


def test_the_first_rounds_come_sooner_then_every_renewal_period() -> None:
    presence = Presence("ns", "p=1", "w1", every=4.0)
    rounds(presence, FakeKubeApi(), 6)  # rounds() checks 0.5, 1, 2, then 4, 4, 4 (±20 %)


def test_a_transient_failure_is_counted_and_the_next_round_tries_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeKubeApi()
    real = api._presence
    failures = iter([UnavailableError(0, "Unavailable", "connection reset")])

    def flaky(*args: Any) -> Any:
        err = next(failures, None)
        if err is not None:
            raise err
        return real(*args)

    monkeypatch.setattr(api, "_presence", flaky)
    presence = Presence("ns", "p=1", "w1")
    sink = rounds(presence, api, 2)
    assert (presence.counts.failures, presence.counts.renewals, presence.counts.lists) == (
        1, 1, 1)
    assert presence.enabled and sink.seen and "w1" in sink.seen[-1]


def test_pool_keys_and_record_names_are_valid_kubernetes_names() -> None:
    key = pool_key("team=batch")
    assert len(key) == 32 and key != pool_key(None) and pool_key(None) == pool_key("")
    name = record_name(key, "system:serviceaccount:ns:w1")
    assert name.startswith("joblease-worker-") and len(name) == len("joblease-worker-") + 40
    assert name != record_name(key, "system:serviceaccount:ns:w2")


# -- issue 31 item 8: what mutation testing found unpinned ------------------------------------

def test_a_holders_latest_record_wins_whatever_the_order_and_a_bad_one_stops_nothing() -> None:
    def spec(holder: str, renewed: str) -> dict[str, Any]:
        return {"spec": {"holderIdentity": holder, "renewTime": f"2026-12-03T12:00:{renewed}Z",
                         "leaseDurationSeconds": 15}}

    items = [spec("w", "05.000000"), {"spec": {"holderIdentity": "x"}}, spec("w", "00.000000"),
             spec("v", "01.000000")]
    assert live_records(items) == {"w": datetime.fromisoformat("2026-12-03T12:00:20+00:00"),
                                   "v": datetime.fromisoformat("2026-12-03T12:00:16+00:00")}


def test_the_pool_of_every_joblease_has_the_label_of_the_empty_selector() -> None:
    """The label is on the wire: every worker version must compute the same value for it."""
    assert pool_key(None) == pool_key("") == hashlib.sha256(b"").hexdigest()[:32]


def test_the_refusal_warning_says_whom_why_and_how_to_fix_it(
        caplog: pytest.LogCaptureFixture) -> None:
    api = FakeKubeApi()
    refusal = ForbiddenError(403, "Forbidden", "cannot patch leases.coordination.k8s.io")

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise refusal

    api._presence = forbidden  # type: ignore[method-assign]
    drive(Presence("ns", "p=1", "w1").steps(Collect()),
          SyncPort(LeaseStore(api)))  # type: ignore[arg-type]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"pool presence is off for 'w1' ({refusal}): workers learn of each other only from "
        "the leases they hold; grant get/list/create/patch/delete on "
        "leases.coordination.k8s.io to fix (docs/pools.md)"]


def test_every_renewal_list_and_failure_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeKubeApi()
    real = api._presence
    failures = iter([UnavailableError(0, "Unavailable", "reset")] * 2)

    def flaky(*args: Any) -> Any:
        err = next(failures, None)
        if err is not None:
            raise err
        return real(*args)

    monkeypatch.setattr(api, "_presence", flaky)
    presence = Presence("ns", "p=1", "w1")
    rounds(presence, api, 5)
    assert presence.namespace == "ns"
    assert (presence.counts.failures, presence.counts.renewals, presence.counts.lists) == (
        2, 3, 3)


# -- the warm-up and the list's cost (issue 30) -----------------------------------------


def _dispatcher_record(api: FakeKubeApi, selector: str, renewed: datetime) -> None:
    api.presence[("ns", "joblease-dispatcher-x")] = {
        "metadata": {"name": "joblease-dispatcher-x", "namespace": "ns",
                     "labels": {POOL_LABEL: pool_key(selector), ROLE_LABEL: DISPATCHER_ROLE}},
        "spec": {"holderIdentity": "operator", "renewTime": micro_time(renewed),
                 "leaseDurationSeconds": 10}}


def test_a_worker_reading_its_inbox_with_a_live_dispatcher_skips_the_warm_up() -> None:
    """It takes no turn while the dispatcher lives: the warm-up's rounds would be waste."""
    api = FakeKubeApi(now=ServerNow.exact(T_NOW))
    _dispatcher_record(api, "p=1", T_NOW)
    presence = Presence("ns", "p=1", "w1", slots=1)
    slept, _ = drive_rounds(presence, api, 3)
    assert all(0.8 * presence.every <= s <= 1.2 * presence.every for s in slept), slept


@pytest.mark.parametrize("case", ["lapsed dispatcher", "no inbox", "no dispatcher"])
def test_the_warm_up_stays_for_a_worker_that_may_take_turns(case: str) -> None:
    api = FakeKubeApi(now=ServerNow.exact(T_NOW))
    if case != "no dispatcher":
        _dispatcher_record(api, "p=1",
                           T_NOW - timedelta(seconds=60) if case == "lapsed dispatcher"
                           else T_NOW)
    presence = Presence("ns", "p=1", "w1", slots=None if case == "no inbox" else 1)
    slept, _ = drive_rounds(presence, api, 3)
    assert all(0.8 * e <= s <= 1.2 * e for s, e in zip(slept, WARM_UP, strict=True)), slept


def test_the_presence_list_is_read_from_the_watch_cache() -> None:
    """``resourceVersion=0``: no quorum read of etcd for a figure judged in seconds."""
    api = FakeKubeApi(now=ServerNow.exact(T_NOW))
    _, calls = drive_rounds(Presence("ns", "p=1", "w1"), api, 2)
    lists = [c.call for c in calls if type(c).__name__ == "Call" and c.call.method == "GET"]
    assert len(lists) == 2
    assert all(c.query == {"labelSelector": f"{POOL_LABEL}={pool_key('p=1')},"
                                            f"{ROLE_LABEL}!=inbox", "resourceVersion": "0"}
               for c in lists), lists


def test_a_pending_announcement_keeps_the_warm_up_until_it_is_sent() -> None:
    """``--until-empty`` asked for after the first renewal: announced 0.5 s later, not 5."""
    api = FakeKubeApi(now=ServerNow.exact(T_NOW))
    _dispatcher_record(api, "p=1", T_NOW)
    presence = Presence("ns", "p=1", "w1", slots=1)

    def until_empty_after_the_first_renewal() -> None:
        if presence.counts.renewals == 1 and not presence.waits_for_empty:
            presence.wait_for_empty()

    slept, _ = drive_rounds(presence, api, 3, after=until_empty_after_the_first_renewal)
    assert 0.8 * WARM_UP[0] <= slept[0] <= 1.2 * WARM_UP[0]  # the announcement comes soon
    assert all(0.8 * presence.every <= s <= 1.2 * presence.every for s in slept[1:]), slept
    record = api.presence[("ns", record_name(pool_key("p=1"), "w1"))]
    assert record["metadata"]["annotations"]["joblease.dev/until-empty"] == "1"
