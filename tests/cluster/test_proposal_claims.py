"""A worker claims a proposed job from the state its proposal carries, unread (issue 30).

A dispatcher's proposal carries the job as the dispatcher saw it (``proposal_state``); the
worker decides its claim from that and sends one JSON patch whose ``test`` operations make
the API server apply it only to that version, in the worker's pool, with the status the
decision read (``inbox.proposed_observed``). Here the real API server judges each case,
through both ports (the thread pool's and the asyncio pool's), counting the requests:

* an honest proposal: one write, no read;
* a forged state (a held job told as Available, at its true resourceVersion): the write is
  refused, the job is read and left to its holder;
* a job of another pool, proposed with its true state: refused, then not found in the pool;
* a stale proposal (the job changed since): refused, read, and claimed from what was read;
* an unread claim whose answer is lost: read, and adopted as its own (generation 1);
* a pool whose selector ``test`` operations cannot express: read first, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from joblease.aio.client import AsyncLeaseClient
from joblease.core.asteps import AsyncPort, adrive
from joblease.core.claiming import claim_proposed
from joblease.core.steps import SyncPort, drive
from joblease.domain.dispatch import Proposal, proposal_state
from joblease.domain.errors import LeaseHeldError, LeaseNotFoundError
from joblease.domain.lease import Phase
from joblease.kube.api import MERGE_PATCH, UnavailableError
from joblease.kube.leases import lease_path
from joblease.kube.transact import ContentionError
from joblease.sdk.client import LeaseClient
from support.clients import LOOP

HOLDER = "worker-1"
LOSE_NEXT_PATCH_ANSWER: list[bool] = []  # non-empty: the next PATCH lands, its answer is lost
Claim = Callable[..., tuple[Any, Any, list[str]]]


def _kind(method: str, query: dict[str, str] | None) -> str:
    return "LIST" if method == "GET" and query and "fieldSelector" in query else method


@pytest.fixture(params=["sync", "async"])
def claim(request: pytest.FixtureRequest, cluster: Any, jl_crd: str, namespace: str
          ) -> Iterator[Claim]:
    """``claim(proposal, selector)``: ``claim_proposed`` as ``HOLDER`` through one port,
    returning ``(decided from, outcome, the requests it sent)``."""
    kubeconfig = str(cluster.kubeconfig_for("admin"))
    sent: list[str] = []
    lose = LOSE_NEXT_PATCH_ANSWER
    lose.clear()
    if request.param == "sync":
        client = LeaseClient(namespace, kubeconfig=kubeconfig)
        real = client.api.request

        def counting(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            sent.append(_kind(method, kwargs.get("query")))
            answer = real(method, path, *args, **kwargs)
            if method == "PATCH" and lose:
                lose.pop()
                raise UnavailableError(0, "Unavailable", "the answer was lost (test)")
            return answer

        client.api.request = counting  # type: ignore[method-assign]
        port = SyncPort(client.store, claim=client.claim)

        def run(proposal: Proposal, selector: str = "pool=p") -> tuple[Any, Any, list[str]]:
            client.calibrate()
            sent.clear()
            decided, outcome = drive(claim_proposed(namespace, selector, proposal, HOLDER,
                                                    None, time.monotonic), port)
            return decided, outcome, list(sent)

        yield run
        client.api.close()
        return
    aclient: AsyncLeaseClient = LOOP.run(_async_client(namespace, kubeconfig))
    areal = aclient.api.request

    async def acounting(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(_kind(method, kwargs.get("query")))
        answer = await areal(method, path, *args, **kwargs)
        if method == "PATCH" and lose:
            lose.pop()
            raise UnavailableError(0, "Unavailable", "the answer was lost (test)")
        return answer

    aclient.api.request = acounting  # type: ignore[method-assign]
    aport = AsyncPort(aclient.store, claim=aclient.claim)

    def arun(proposal: Proposal, selector: str = "pool=p") -> tuple[Any, Any, list[str]]:
        LOOP.run(aclient.calibrate())
        sent.clear()
        decided, outcome = LOOP.run(adrive(claim_proposed(
            namespace, selector, proposal, HOLDER, None, time.monotonic), aport))
        return decided, outcome, list(sent)

    yield arun
    LOOP.run(aclient.close())


async def _async_client(namespace: str, kubeconfig: str) -> AsyncLeaseClient:
    return AsyncLeaseClient(namespace, kubeconfig=kubeconfig)


def create(leases: LeaseClient, name: str, labels: dict[str, str] | None = None) -> Proposal:
    """A job of ``labels`` (pool ``p``), and an honest proposal of it."""
    obs = leases.store.create(leases.namespace, name, {"maxAttempts": 3},
                              labels or {"pool": "p"})
    return Proposal(name, obs.resource_version, proposal_state(obs))


def won(outcome: Any, generation: int) -> None:
    assert not isinstance(outcome, Exception), outcome
    status = outcome.observed.status
    assert (status.phase, status.holder, status.generation) == (Phase.HELD, HOLDER, generation)


def test_an_honest_proposal_is_claimed_with_one_write_and_no_read(
        claim: Claim, leases: LeaseClient) -> None:
    proposal = create(leases, "job")
    decided, outcome, sent = claim(proposal)
    won(outcome, 1)
    assert sent == ["PATCH"]  # the claim, and nothing read first
    assert decided.vouched and leases.get("job").status.holder == HOLDER


def test_a_forged_state_is_refused_by_the_server_and_the_job_left_to_its_holder(
        claim: Claim, leases: LeaseClient) -> None:
    """The state of a held job, told as Available at its true resourceVersion: the claim
    would take a live lease over. The API server's ``test`` of ``status.phase`` refuses it;
    the worker reads the job and refuses itself (held), with no second write."""
    create(leases, "job")
    held = leases.claim("job", holder="other").observed
    assert held is not None
    forged = proposal_state(held)  # the true state, but for who holds it: a faithful lie
    forged["status"] = {key: value for key, value in forged["status"].items()
                        if key not in ("holder", "leaseUntil", "claimId", "renewTime")}
    forged["status"]["phase"] = "Available"
    decided, outcome, sent = claim(Proposal("job", held.resource_version, forged))
    # refused (422), then read: held, refused by the worker itself with no second write
    # (a pool's refusal decided from a version it was given is not confirmed by another
    # read: ``max_conflicts=1``, so it comes back as a ContentionError, the pool moves on)
    assert isinstance(outcome, (LeaseHeldError, ContentionError)), outcome
    assert sent == ["PATCH", "LIST"] and not decided.vouched
    assert decided.status.holder == "other"
    status = leases.get("job").status
    assert (status.holder, status.generation) == ("other", held.status.generation)


def test_a_job_of_another_pool_is_never_claimed_from_a_proposal(
        claim: Claim, leases: LeaseClient) -> None:
    proposal = create(leases, "theirs", {"pool": "q"})
    decided, outcome, sent = claim(proposal)  # this worker's pool is pool=p
    assert decided is None and isinstance(outcome, LeaseNotFoundError)
    assert sent == ["PATCH", "LIST"]  # the label test refused it; not in the pool
    assert leases.get("theirs").status.generation == 0


def test_a_stale_proposal_is_read_and_claimed_from_what_was_read(
        claim: Claim, leases: LeaseClient) -> None:
    proposal = create(leases, "job")
    leases.store.api.request("PATCH", lease_path(leases.namespace, "job"),
                             {"metadata": {"labels": {"touched": "yes"}}},
                             content_type=MERGE_PATCH)  # a new version, still claimable
    decided, outcome, sent = claim(proposal)
    won(outcome, 1)
    assert sent == ["PATCH", "LIST", "PATCH"]  # refused by version, read, claimed
    assert decided.resource_version != proposal.resource_version and not decided.vouched


def test_a_lost_answer_to_an_unread_claim_is_adopted_not_claimed_again(
        claim: Claim, leases: LeaseClient) -> None:
    """The unread claim landed but its answer was lost: the retry reads the job and finds
    its own claim (same claim id), adopting it at generation 1 instead of refusing itself
    or claiming a second time."""
    proposal = create(leases, "job")
    LOSE_NEXT_PATCH_ANSWER.append(True)
    _, outcome, sent = claim(proposal)
    won(outcome, 1)
    assert sent == ["PATCH", "GET"]  # the vouched claim (landed), then one read: adopted
    assert leases.get("job").status.claim_id == outcome.claim_id


def test_a_selector_tests_cannot_express_is_read_first(
        claim: Claim, leases: LeaseClient) -> None:
    proposal = create(leases, "job")
    _, outcome, sent = claim(proposal, "pool in (p)")
    won(outcome, 1)
    assert sent == ["LIST", "PATCH"]
