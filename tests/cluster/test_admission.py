"""The chart's holder-only ValidatingAdmissionPolicy, with two real identities.

``alice`` and ``bob`` both hold the chart's worker role in the namespace, so RBAC lets
either write any JobLease's status; only the policy stands between bob and alice's lease.
bob's writes are built with the same protocol code the SDK uses (the protocol itself
would accept them: bob presents alice's holder and generation), so the refusal seen is
the API server's.
"""

# ruff: noqa: F811  (pytest fixtures imported from kwok_support are redefined as arguments)
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import pytest
from kwok_support import (
    apply,
    bind_worker,
    kns,  # noqa: F401  (fixture)
    kwok_cluster,  # noqa: F401  (fixture)
    release,  # noqa: F401  (fixture)
)

from joblease.domain.errors import LeaseFinishedError
from joblease.domain.lease import (
    Claim,
    Observed,
    Transition,
    decide_claim,
    decide_complete,
    decide_renew,
    epoch_of,
)
from joblease.domain.token import FencingToken
from joblease.kube.api import ForbiddenError
from joblease.kube.transact import transact
from joblease.sdk.client import DEFAULT_MARGIN, LeaseClient
from joblease_localcluster.cluster import LocalCluster
from support.waiting import wait_for


def c(holder: str, o: Observed, generation: int) -> Claim:
    """The claim a caller presents: its holder and the whole token (this incarnation's epoch)."""
    return Claim(holder, FencingToken(o.status.epoch or 0, generation))


def _lease(cluster: LocalCluster, ns: str, name: str, seconds: int = 30) -> None:
    out = apply(cluster, {"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
                          "metadata": {"name": name, "namespace": ns},
                          "spec": {"leaseDurationSeconds": seconds}})
    assert out.returncode == 0, out.stderr


def _policy_active(cluster: LocalCluster, ns: str) -> bool:
    """A no-op status write by bob on an unheld lease is refused once the policy is live."""
    out = cluster.kubectl("patch", "jl", "probe", "-n", ns, "--subresource=status",
                          "--type=merge", "-p", json.dumps({"status": {"generation": 0}}),
                          user="bob")
    return out.returncode != 0 and "only the holder" in out.stderr


@pytest.fixture
def clients(kwok_cluster: LocalCluster, kns: str, release: str
            ) -> dict[str, LeaseClient]:
    bind_worker(kwok_cluster, kns, "alice", "bob")
    _lease(kwok_cluster, kns, "probe")
    wait_for(lambda: _policy_active(kwok_cluster, kns), 60, "the admission policy to be active",
             poll=0.5)
    return {u: LeaseClient(kns, kubeconfig=str(kwok_cluster.kubeconfig_for(u)))
            for u in ("alice", "bob")}


def _as(client: LeaseClient, name: str, decide: Callable[..., object]) -> None:
    transact(client.store, client.namespace, name,
             lambda obs, now: decide(obs, now))  # type: ignore[arg-type,return-value]


def test_non_holder_cannot_renew_or_complete(kwok_cluster: LocalCluster, kns: str,
                                             clients: dict[str, LeaseClient]) -> None:
    alice, bob = clients["alice"], clients["bob"]
    _lease(kwok_cluster, kns, "job")
    lease = alice.claim("job", holder="alice")
    gen, margin = lease.generation, DEFAULT_MARGIN
    for decide in (lambda o, n: decide_renew(o, c("alice", o, gen), n, margin),
                   lambda o, n: decide_complete(o, c("alice", o, gen), "stolen", n, margin)):
        with pytest.raises(ForbiddenError) as denied:
            _as(bob, "job", decide)
        assert denied.value.status == 403
        message = denied.value.message
        assert "only the holder may renew, complete or release JobLease job" in message
        assert "Held by alice at generation 1, and you are bob" in message
    lease.renew()
    lease.complete("done by the holder")
    assert alice.get("job").status.completion is not None


def test_claim_must_name_the_claimer(kwok_cluster: LocalCluster, kns: str,
                                     clients: dict[str, LeaseClient]) -> None:
    _lease(kwok_cluster, kns, "job")
    with pytest.raises(ForbiddenError) as denied:
        clients["bob"].claim("job", holder="alice")
    assert "must record the claimer as holder: you are bob but wrote holder alice" in \
        denied.value.message
    assert clients["bob"].claim("job", holder="bob").generation == 1


def test_takeover_after_expiry_raises_the_generation(kwok_cluster: LocalCluster,
                                                     kns: str,
                                                     clients: dict[str, LeaseClient]) -> None:
    _lease(kwok_cluster, kns, "job", seconds=1)
    first = clients["alice"].claim("job", holder="alice")
    second = clients["bob"].wait_claim("job", holder="bob", timeout=10)
    assert second.generation == first.generation + 1
    margin = DEFAULT_MARGIN
    with pytest.raises(ForbiddenError, match="Held by bob at generation 2, and you are alice"):
        _as(clients["alice"], "job", lambda o, n: decide_renew(o, c("bob", o, 2), n, margin))


def test_a_claim_finding_the_attempts_used_up_is_refused_as_finished_not_forbidden(
        kwok_cluster: LocalCluster, kns: str, clients: dict[str, LeaseClient]) -> None:
    """Simulator finding: under the policy a claimer may not write another holder's Failed.

    bob's claim of alice's expired lease with ``maxAttempts: 1`` decides Failed (no new
    generation), which the policy refuses (403) because bob is not the holder. For bob that
    must read as "finished", and a work pool over the lease must keep working, not stop on
    a ForbiddenError; the operator records Failed (not running on this kwok cluster).
    """
    out = apply(kwok_cluster, {"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
                               "metadata": {"name": "job", "namespace": kns,
                                            "labels": {"batch": "exhausted"}},
                               "spec": {"leaseDurationSeconds": 1, "maxAttempts": 1}})
    assert out.returncode == 0, out.stderr
    clients["alice"].claim("job", holder="alice")
    with pytest.raises(LeaseFinishedError, match="1 attempts used of maxAttempts 1") as refused:
        clients["bob"].wait_claim("job", holder="bob", timeout=15)
    assert "operator marks it Failed" in str(refused.value)
    assert isinstance(refused.value.__cause__, ForbiddenError)
    with clients["bob"].pool("batch=exhausted") as pool:
        assert pool.claim_next(holder="bob", timeout=2.0) is None
    stored = clients["bob"].get("job").status
    assert (stored.phase.value, stored.holder, stored.generation) == ("Held", "alice", 1)


def test_a_claimer_cannot_choose_its_own_epoch(kwok_cluster: LocalCluster, kns: str,
                                               clients: dict[str, LeaseClient]) -> None:
    """Issue 28: a born-initialised JobLease has no epoch; its first claim records one.

    An epoch chosen low would make this incarnation's tokens rank below an earlier
    incarnation's at a fencing target; chosen high, below nothing ever again. The CRD's
    rules cannot see ``metadata.resourceVersion``; the holder-only policy can, and it
    refuses any first epoch but the resourceVersion the claim was decided from.
    """
    _lease(kwok_cluster, kns, "job")
    bob = clients["bob"]
    assert bob.get("job").status.epoch is None  # the CRD's default carries none
    for chosen in (lambda rv: 1, lambda rv: rv + 1000):
        def claim_with(o: Observed, n: object, chosen: Callable[[int], int] = chosen
                       ) -> Transition:
            t = decide_claim(o, "bob", n, DEFAULT_MARGIN, "bob-1")  # type: ignore[arg-type]
            assert t is not None
            return replace(t, status=replace(t.status, epoch=chosen(epoch_of(o))))

        with pytest.raises(ForbiddenError) as denied:
            _as(bob, "job", claim_with)
        assert "status.epoch of JobLease job must be the resourceVersion the first claim " \
               "read" in denied.value.message
    read = bob.get("job")
    lease = bob.claim("job", holder="bob")
    assert (lease.generation, lease.token.epoch) == (1, int(read.resource_version))
