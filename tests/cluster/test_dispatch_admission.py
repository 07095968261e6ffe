"""Who may receive work from a pool dispatcher (issue 30, item 3), tried against the chart's
admission policies on the real API server (the kwok cluster with the chart installed).

Identities: the operator's ServiceAccount (the dispatcher), two worker ServiceAccounts
``w1`` and ``w2``, and ``bob``, a user with the same worker role (RBAC lets him write any
Lease and any JobLease status in the namespace: only the policies stand in his way). Each
refusal asserted is the API server's (403 with the policy's message).
"""

# ruff: noqa: F811  (pytest fixtures imported from kwok_support are redefined as arguments)
from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kwok_support import (
    OPERATOR_SA,
    RELEASE_NS,
    WORKER_ROLE,
    apply,
    kns,  # noqa: F401  (fixture)
    kwok_cluster,  # noqa: F401  (fixture)
    release,  # noqa: F401  (fixture)
    sa_kubeconfig,
)

from joblease.core.dispatcher import Dispatcher
from joblease.core.inbox import write_inbox_steps
from joblease.core.presence import PATH, Presence, micro_time, pool_key, record_name
from joblease.core.steps import Call, Steps, SyncPort, drive
from joblease.domain.clock import ServerNow
from joblease.domain.dispatch import Proposal
from joblease.domain.holder import ClaimDecider
from joblease.domain.lease import (
    DISPATCH_CLAIM_PREFIX,
    Claim,
    Observed,
    Phase,
    Transition,
    decide_renew,
    dispatch_claim_id,
)
from joblease.kube.api import MERGE_PATCH, ForbiddenError
from joblease.kube.identity import new_claim_id
from joblease.kube.leases import LeaseCall
from joblease.kube.transact import transact
from joblease.sdk.client import LeaseClient
from joblease_localcluster.cluster import LocalCluster
from support.waiting import wait_for

POOL = "pool=p"


def sa_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def call(client: LeaseClient, method: str, path: str, body: Any = None,
         content_type: str | None = None) -> dict[str, Any]:
    """One request about coordination Leases as ``client``'s identity."""
    def steps() -> Steps[dict[str, Any]]:
        answer: dict[str, Any] = yield Call(LeaseCall(method, path, lambda b: b, body=body,
                                                      content_type=content_type))
        return answer

    return drive(steps(), SyncPort(client.store))


def record(name: str, holder: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "labels": labels},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}}


@pytest.fixture
def who(kwok_cluster: LocalCluster, kns: str, release: str) -> Iterator[dict[str, LeaseClient]]:
    """LeaseClients of the dispatcher (the operator's SA), w1, w2 and bob; policies live."""
    for sa in ("w1", "w2"):
        kwok_cluster.kubectl("create", "serviceaccount", sa, "-n", kns, check=True)
    subjects = [{"kind": "ServiceAccount", "name": sa, "namespace": kns} for sa in ("w1", "w2")]
    subjects.append({"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": RELEASE_NS})
    subjects.append(kwok_cluster.rbac_subject("bob"))
    out = apply(kwok_cluster, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "pool-workers", "namespace": kns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": WORKER_ROLE},
        "subjects": subjects})
    assert out.returncode == 0, out.stderr
    clients = {name: LeaseClient(kns, kubeconfig=str(sa_kubeconfig(kwok_cluster, kns, name)))
               for name in ("w1", "w2")}
    clients["dispatcher"] = LeaseClient(kns, kubeconfig=str(
        sa_kubeconfig(kwok_cluster, RELEASE_NS, OPERATOR_SA)))
    clients["bob"] = LeaseClient(kns, kubeconfig=str(kwok_cluster.kubeconfig_for("bob")))
    path = PATH.format(namespace=kns)

    def impostor_refused() -> bool:  # the policy takes a few seconds to become active
        name = f"probe-{secrets.token_hex(3)}"
        try:
            call(clients["bob"], "POST", path, record(name, sa_user(kns, "w1"),
                                                      {"joblease.dev/pool": "x"}))
        except ForbiddenError:
            return True
        return False

    wait_for(impostor_refused, 60, "the presence policy to be active", poll=0.5)
    yield clients
    for client in clients.values():
        client.api.close()


def test_a_presence_record_speaks_only_for_its_writer(kns: str,
                                                      who: dict[str, LeaseClient]) -> None:
    path, w1 = PATH.format(namespace=kns), sa_user(kns, "w1")
    presence = Presence(kns, POOL, w1, slots=1)
    drive(presence._renew_steps(), SyncPort(who["w1"].store))  # its own: accepted
    mine = f"{path}/{presence.name}"
    bob, pool_label = who["bob"], {"joblease.dev/pool": presence.pool}
    attempts: list[tuple[str, Any, str]] = [
        ("POST", lambda: call(bob, "POST", path, record(record_name(presence.pool, "x"), w1,
                                                        pool_label)),
         "may name only its writer"),
        ("PATCH renewTime", lambda: call(bob, "PATCH", mine, {"spec": {
            "renewTime": micro_time(datetime.now(UTC))}}, MERGE_PATCH), "you are bob"),
        ("DELETE", lambda: call(bob, "DELETE", mine), "may renew or"),
        ("dispatcher record", lambda: call(bob, "POST", path, record(
            "joblease-dispatcher-x", "bob", {**pool_label, "joblease.dev/role": "dispatcher"})),
         "only the joblease operator"),
    ]
    for what, attempt, message in attempts:
        with pytest.raises(ForbiddenError) as refused:
            attempt()
        assert message in refused.value.message, what
    with pytest.raises(ForbiddenError, match="labels of a joblease presence record"):
        call(who["w1"], "PATCH", mine, {"metadata": {"labels": {"joblease.dev/pool": None}}},
             MERGE_PATCH)  # escaping the policy by dropping the label
    call(who["w1"], "DELETE", mine)  # its own: accepted


def test_the_dispatcher_claims_only_opted_in_jobs_for_the_service_accounts_they_name(
        kwok_cluster: LocalCluster, kns: str, who: dict[str, LeaseClient]) -> None:
    w1, w2 = sa_user(kns, "w1"), sa_user(kns, "w2")
    opt_in = {"enabled": True, "serviceAccountNames": ["w1"]}
    job(kwok_cluster, kns, "closed", {}, "elsewhere")  # outside w1's pool: nobody runs them
    job(kwok_cluster, kns, "open", {"dispatch": opt_in}, "elsewhere")
    dispatcher = who["dispatcher"]
    dispatcher.calibrate()
    margin = dispatcher.margin() + timedelta(seconds=1)

    def claim_for(client: LeaseClient, name: str, holder: str) -> None:
        decide = ClaimDecider(holder, margin, dispatch_claim_id(new_claim_id()))
        transact(client.store, kns, name, decide)

    with pytest.raises(ForbiddenError, match=r"only if its spec\.dispatch is enabled"):
        claim_for(dispatcher, "closed", w1)  # the job did not opt in
    with pytest.raises(ForbiddenError, match=r"only if its spec\.dispatch is enabled"):
        claim_for(dispatcher, "open", w2)  # not a ServiceAccount it names
    with pytest.raises(ForbiddenError, match=r"may not carry a dispatch- claim id"):
        claim_for(who["bob"], "open", "bob")  # a worker passing its claim off as assigned
    assert dispatcher.get("open").status.generation == 0
    claim_for(dispatcher, "open", w1)  # opted in, named: accepted
    opened = dispatcher.get("open").status
    assert opened.holder == w1
    claim = Claim(w1, opened.token(), opened.claim_id)
    transact(who["w1"].store, kns, "open",  # w1 adopts it (a worker of an earlier version)
             lambda obs, now: decide_renew(obs, claim, now, margin))

    def unadopt(obs: Observed, now: ServerNow) -> Transition:
        renewed = decide_renew(obs, claim, now, margin)
        return replace(renewed, status=replace(renewed.status,
                                               renew_time=obs.status.acquire_time))

    with pytest.raises(ForbiddenError, match="may not be made equal again"):
        transact(who["w1"].store, kns, "open", unadopt)  # hiding its attempt

    # a worker may not write an inbox (its own included): only the operator proposes
    forged = write_inbox_steps(kns, pool_key(POOL), w1, w1, [Proposal("closed", "1")])
    with pytest.raises(ForbiddenError, match="only the joblease operator writes"):
        drive(forged, SyncPort(who["w1"].store))

    # end to end under the real identities: the dispatcher proposes, w1 claims and completes
    running = Dispatcher.for_client(dispatcher, POOL, record_seconds=3).start()
    try:
        with who["w1"].pool(POOL, slots=1) as pool:
            # announced: presence runs. Not timeout=0: a pool that announces slots lists
            # nothing before its presence's first list (issue 30), so a claim that may not
            # wait raises NotSynced (docs/pools.md); this one waits for the list, finds
            # nothing of its own and gives up.
            assert pool.claim_next(w1, timeout=3) is None
            wait_for(lambda: pool.engine.dispatched(pool.engine.clock.server_now()), 20,
                     "w1 to see the dispatcher")
            job(kwok_cluster, kns, "assigned", {"dispatch": opt_in}, "p")
            lease = pool.claim_next(w1, timeout=20)
            assert lease is not None and lease.name == "assigned"
            assert lease.claim_id is not None
            assert not lease.claim_id.startswith(DISPATCH_CLAIM_PREFIX)  # w1's own claim
            lease.complete("done")
    finally:
        running.kill()
    status = dispatcher.get("assigned").status
    assert (status.phase, status.holder, status.generation, status.attempts) == (
        Phase.COMPLETED, w1, 1, 0)
    assert running.counts.proposed == 1 and running.counts.assigned == 0
    assert running.counts.inbox_writes >= 1


def job(cluster: LocalCluster, namespace: str, name: str, spec: dict[str, Any],
        pool: str) -> None:
    out = apply(cluster, {"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
                          "metadata": {"name": name, "namespace": namespace,
                                       "labels": {"pool": pool}},
                          "spec": {"leaseDurationSeconds": 30, **spec}})
    assert out.returncode == 0, out.stderr
