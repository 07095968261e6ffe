"""The dispatcher's rounds (``joblease.core.dispatcher``) on the in-memory API server.

Its threads are not started: each test feeds the queue and the workers the way its feed and
its presence list would, and runs rounds itself, the claims written in line. Pinned: a
claim that got no answer is not set aside (no newer version may ever come) but rests a
second and is then tried again; a refused one waits for a newer version; a live worker
that left an assignment unadopted past ``adopt_within`` loses it, with no attempt counted,
and is passed over meanwhile.
"""

from __future__ import annotations

from concurrent.futures import Future
from datetime import timedelta
from typing import Any

from joblease.core.dispatcher import PASS_OVER_SECONDS, RETRY_SECONDS, Dispatcher
from joblease.domain.errors import format_time
from joblease.domain.lease import Observed, dispatch_claim_id
from joblease.kube.api import ConflictError, UnavailableError
from joblease.kube.leases import LeaseStore
from support.fakekube import T_NOW, FakeKubeApi, lease_object

MARGIN = timedelta(seconds=1)
W1, GHOST = "system:serviceaccount:ns:w1", "system:serviceaccount:ns:ghost"
OPT_IN = {"enabled": True, "serviceAccountNames": ["w1", "ghost"]}


class InLine:
    """An executor that runs each claim at once, in the round that decided it."""

    def submit(self, fn: Any, *args: Any) -> Future[None]:
        done: Future[None] = Future()
        fn(*args)
        done.set_result(None)
        return done


def dispatcher_over(api: FakeKubeApi, slots: dict[str, int]) -> Dispatcher:
    dispatcher = Dispatcher(LeaseStore(api), api, lambda: MARGIN,  # type: ignore[arg-type]
                            "ns", "team=batch", "the-operator",
                            adopt_within=timedelta(seconds=5))
    dispatcher._executor.shutdown()
    dispatcher._executor = InLine()  # type: ignore[assignment]
    dispatcher._slots, dispatcher._live = dict(slots), set(slots)
    items = [Observed.from_object(obj) for obj in api.objects.values()]
    dispatcher.replace(items, "1")
    return dispatcher


def job(api: FakeKubeApi, name: str, status: dict[str, Any] | None = None) -> None:
    api.put_object(lease_object(name, status or {"phase": "Available", "generation": 0,
                                                 "epoch": 1}, dispatch=OPT_IN))


def test_a_claim_without_an_answer_rests_and_is_tried_again_not_set_aside() -> None:
    api = FakeKubeApi()
    job(api, "j")
    dispatcher = dispatcher_over(api, {W1: 1})
    api.refuse_next = [UnavailableError(0, "Unavailable", "connection reset")]
    dispatcher._dispatch()
    assert (dispatcher.counts.failed, dispatcher.counts.assigned) == (1, 0)
    assert not dispatcher.view.is_set_aside("j")  # no newer version may ever come
    requests = len(api.requests)
    dispatcher._dispatch()
    assert len(api.requests) == requests  # resting: not asked again at once
    api._monotonic += RETRY_SECONDS
    dispatcher._dispatch()
    assert dispatcher.counts.assigned == 1
    assert api.stored("ns", "j")["status"]["holder"] == W1  # type: ignore[index]


def test_a_refused_claim_waits_for_a_newer_version() -> None:
    api = FakeKubeApi()
    job(api, "j")
    dispatcher = dispatcher_over(api, {W1: 1})
    api.refuse_next = [ConflictError(409, "Conflict", "the object has been modified")]
    dispatcher._dispatch()
    assert dispatcher.counts.refused == 1 and dispatcher.view.is_set_aside("j")
    api._monotonic += RETRY_SECONDS
    requests = len(api.requests)
    dispatcher._dispatch()
    assert len(api.requests) == requests


def test_a_live_worker_that_never_adopts_loses_the_job_without_an_attempt_and_is_passed_over(
        ) -> None:
    api = FakeKubeApi()
    at = format_time(T_NOW - timedelta(seconds=6))  # assigned 6 s ago, adopt_within is 5
    job(api, "late", {"phase": "Held", "holder": GHOST, "generation": 1, "epoch": 1,
                      "claimId": dispatch_claim_id("x"), "acquireTime": at, "renewTime": at,
                      "leaseUntil": format_time(T_NOW + timedelta(seconds=24))})
    job(api, "next")
    dispatcher = dispatcher_over(api, {GHOST: 1, W1: 1})  # both live, one slot each
    dispatcher._dispatch()
    late = api.stored("ns", "late")["status"]  # type: ignore[index]
    assert (late["holder"], late["generation"], late.get("attempts", 0)) == (W1, 2, 0)
    assert dispatcher.counts.reassigned == 1 and GHOST in dispatcher.passed_over
    nxt = api.stored("ns", "next")["status"]  # type: ignore[index]
    assert nxt.get("holder") is None  # the ghost's free slot is passed over; w1's is taken
    api._monotonic += PASS_OVER_SECONDS
    dispatcher._dispatch()
    assert api.stored("ns", "next")["status"]["holder"] == GHOST  # type: ignore[index]
