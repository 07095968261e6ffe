"""The simulator's model API server against the real kube-apiserver: same writes, same answers.

Randomized (seeded) sequences of status writes — claims, renewals, completions, releases,
and hostile ones: lowered or skipped generations, a holder change without a claim, a
changed epoch, reopened or re-claimed finished leases, an altered completion, time fields
out of range or in lowercase — go to both, each as a compare-and-swap merge patch from the
current version. Every write must be accepted by both or refused by both: the simulator's
rules (tests/sim/model.py) are the CRD's rules, or the simulator proves nothing.

The second test does the same under the chart's admission policies (installed by helm into
the kwok control plane, as tests/cluster/test_admission.py does), with four identities
writing: two workers, an admin and the operator's ServiceAccount. JobLease status writes
meet the holder-only policy (who may renew, claim as whom, the first epoch), pod updates
the operator-pods policy (only joblease.dev/ annotations, for the operator), and a pod
patch carrying another uid is invalid. Both servers must give the same answer class:
accepted, 403 (a policy) or 422 (the CRD's rules, an immutable field).
"""

# ruff: noqa: F811  (pytest fixtures imported from kwok_support are redefined as arguments)
from __future__ import annotations

import json
import random
from typing import Any

from kwok_support import (
    OPERATOR_SA,
    RELEASE_NS,
    apply,
    bind_worker,
    kns,  # noqa: F401  (fixture)
    kwok_cluster,  # noqa: F401  (fixture)
    release,  # noqa: F401  (fixture)
    sa_kubeconfig,
)

from joblease.kube.api import ApiError, InvalidError, KubeApi
from joblease.kube.leases import lease_path
from joblease.kube.pods import pod_path
from joblease.sdk.client import LeaseClient
from joblease_localcluster.cluster import LocalCluster
from sim.model import ModelError, ModelServer
from support.waiting import wait_for

MERGE = "application/merge-patch+json"
WRITES_PER_OBJECT = 60
OBJECTS = 5


def _time(rng: random.Random) -> str:
    year = rng.choice([2026, 2026, 2026, 1969, 9001, 2100])
    text = f"{year}-12-03T10:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.000Z"
    return text.lower() if rng.random() < 0.1 else text


def _patch(rng: random.Random, status: dict[str, Any]) -> dict[str, Any]:
    """One status change, ordinary or hostile, from the current status."""
    gen = int(status.get("generation", 0))
    kind = rng.choice(["claim", "claim", "renew", "complete", "release", "lower", "skip",
                       "holder", "epoch", "reopen", "completion", "times", "expire"])
    renew, until = _time(rng), _time(rng)
    if kind == "claim":
        return {"phase": "Held", "holder": f"w{rng.randint(0, 3)}", "generation": gen + 1,
                "epoch": status.get("epoch", 7), "renewTime": renew, "leaseUntil": renew}
    if kind == "renew":
        return {"renewTime": renew, "leaseUntil": until}
    if kind == "complete":
        return {"phase": "Completed", "completion": {
            "generation": gen, "holder": status.get("holder") or "w0",
            "time": "2026-12-03T10:00:00.000Z", "result": "ok"}}
    if kind == "release":
        return {"phase": "Available", "holder": None}
    if kind == "lower":
        return {"generation": max(0, gen - 1)}
    if kind == "skip":
        return {"generation": gen + 2, "holder": "w9"}
    if kind == "holder":
        return {"holder": f"w{rng.randint(4, 6)}"}
    if kind == "epoch":
        return {"epoch": int(status.get("epoch", 7)) + rng.choice([-1, 1])}
    if kind == "reopen":
        return {"phase": rng.choice(["Available", "Held"])}
    if kind == "completion":
        return {"completion": {"generation": gen, "holder": "forged",
                               "time": "2026-12-03T10:00:00.000Z"}}
    if kind == "times":
        return {rng.choice(["acquireTime", "renewTime", "leaseUntil", "finishTime"]): _time(rng)}
    return {"phase": "Expired"}


def test_model_and_real_api_server_accept_and_refuse_the_same_writes(
        leases: LeaseClient) -> None:
    rng = random.Random(20261203)
    model = ModelServer(namespace=leases.namespace)
    compared, refused, disagreements = 0, 0, []
    for index in range(OBJECTS):
        name = f"diff-{index}"
        leases.store.create(leases.namespace, name, {"leaseDurationSeconds": 30})
        model.create(name, {"leaseDurationSeconds": 30})
        for _ in range(WRITES_PER_OBJECT):
            real = leases.api.request("GET", lease_path(leases.namespace, name)).body
            status = real.get("status") or {}
            patch = _patch(rng, status)
            if "status" in real:  # both decide from the same state
                model.objects[name]["status"] = dict(status)
            else:
                model.objects[name].pop("status", None)
            try:
                leases.api.request("PATCH", lease_path(leases.namespace, name, "status"),
                                   {"metadata": {"resourceVersion":
                                                 real["metadata"]["resourceVersion"]},
                                    "status": patch}, content_type=MERGE)
                real_ok, real_why = True, ""
            except InvalidError as err:
                real_ok, real_why = False, err.message
            try:
                model.patch_status(name, {"status": patch})
                model_ok, model_why = True, ""
            except ModelError as err:
                model_ok, model_why = False, err.message
            compared += 1
            refused += not real_ok
            if real_ok != model_ok:
                disagreements.append((status, patch, real_why[:300], model_why))
    print(f"\ndifferential: {compared} writes compared, {refused} refused by the API server, "
          f"{len(disagreements)} disagreements")
    assert not disagreements, disagreements[:3]
    assert 0.2 < refused / compared < 0.9  # both kinds were exercised


# -- under the chart's admission policies ------------------------------------------------------

POLICY_WRITES = 240
POD_WRITES = 80


def _answer(call: Any, *args: Any, **kwargs: Any) -> int:
    """The answer class of one write: 200, or the HTTP status of its refusal."""
    try:
        call(*args, **kwargs)
    except ModelError as err:
        return err.status
    except ApiError as err:
        return err.status
    return 200


def _policy_patch(rng: random.Random, status: dict[str, Any], rv: str, me: str,
                  others: list[str]) -> dict[str, Any]:
    """A status change aimed at the holder-only policy's rules (and a few the CRD refuses)."""
    gen = int(status.get("generation", 0))
    holder = rng.choice([me, me, *others])
    renew = "2026-12-03T10:00:00.000Z"
    kind = rng.choice(["claim", "claim", "renew", "complete", "release", "skip", "epoch"])
    if kind == "claim" or (kind == "epoch" and "epoch" in status):
        epoch = status.get("epoch", int(rv) + rng.choice([0, 0, 0, 1, -1]))
        return {"phase": "Held", "holder": holder, "generation": gen + 1, "epoch": epoch,
                "renewTime": renew, "leaseUntil": renew}
    if kind == "renew":
        return {"renewTime": renew, "leaseUntil": "2026-12-03T10:00:30.000Z"}
    if kind == "complete":
        return {"phase": "Completed", "completion": {
            "generation": gen, "holder": status.get("holder") or me, "time": renew}}
    if kind == "release":
        return {"phase": "Available", "holder": None}
    if kind == "skip":
        return {"generation": gen + 2, "holder": holder, "epoch": status.get("epoch", int(rv))}
    return {"epoch": int(rv) + rng.choice([0, 1]), "generation": 0}  # a first epoch alone


def _policy_active(apis: dict[str, KubeApi], ns: str) -> bool:
    """bob's no-op status write on an unheld lease is refused, and so is an operator's
    label change on a pod: both policies are live."""
    probe = {"status": {"generation": 0}}
    bob = _answer(apis["bob"].request, "PATCH", lease_path(ns, "probe", "status"), probe,
                  content_type=MERGE)
    label = {"metadata": {"labels": {"probe": "x"}}}
    operator = _answer(apis["operator"].request, "PATCH", pod_path(ns, "probe"), label,
                       content_type=MERGE)
    return bob == 403 and operator == 403


def _apis(cluster: LocalCluster, ns: str) -> dict[str, KubeApi]:
    bind_worker(cluster, ns, "alice", "bob")
    apis = {u: KubeApi.from_kubeconfig(str(cluster.kubeconfig_for(u)))
            for u in ("admin", "alice", "bob")}
    apis["operator"] = KubeApi.from_kubeconfig(str(sa_kubeconfig(cluster, RELEASE_NS,
                                                                 OPERATOR_SA)))
    return apis


def _pod(cluster: LocalCluster, ns: str, name: str) -> None:
    wait_for(lambda: cluster.kubectl("get", "sa", "default", "-n", ns).returncode == 0, 30,
             "the namespace's default ServiceAccount")
    out = apply(cluster, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": ns, "labels": {"joblease.dev/lease": "work", "app": "x"},
        "annotations": {"other.io/owner": "team", "joblease.dev/generation": "1"}},
        "spec": {"containers": [{"name": "main", "image": "worker:1"}]}})
    assert out.returncode == 0, out.stderr


def test_model_and_real_api_server_agree_under_the_admission_policies(
        kwok_cluster: LocalCluster, kns: str, release: str) -> None:
    apis = _apis(kwok_cluster, kns)
    try:
        _compare_under_policies(kwok_cluster, kns, apis)
    finally:
        for api in apis.values():
            api.close()


def _compare_under_policies(kwok_cluster: LocalCluster, kns: str,
                            apis: dict[str, KubeApi]) -> None:
    users = {u: (kwok_cluster.username(u) if u != "operator" else
                 f"system:serviceaccount:{RELEASE_NS}:{OPERATOR_SA}") for u in apis}
    admin = LeaseClient(kns, api=apis["admin"], calibrate=False)
    admin.store.create(kns, "probe", {"leaseDurationSeconds": 30})
    _pod(kwok_cluster, kns, "probe")
    wait_for(lambda: _policy_active(apis, kns), 60, "both admission policies to be active",
             poll=0.5)
    model = ModelServer(namespace=kns, admission=True, operator=users["operator"])
    rng = random.Random(20261204)
    tally = _compare_status_writes(rng, apis, users, admin, model, kns)
    tally += _compare_pod_writes(rng, apis, users, model, kwok_cluster, kns)
    compared = len(tally)
    disagreements = [t for t in tally if t[0] != t[1]]
    answers = sorted({t[0] for t in tally})
    print(f"\ndifferential under the admission policies: {compared} writes compared, answers "
          f"{ {a: sum(1 for t in tally if t[0] == a) for a in answers} } (real API server), "
          f"{len(disagreements)} disagreements")
    assert not disagreements, sorted({(g, w, who, json.dumps(p)[:120])
                                      for g, w, who, p in disagreements})
    assert {200, 403, 422} <= set(answers)  # accepted, refused by a policy, by the CRD


Tally = list[tuple[int, int, str, Any]]


def _compare_status_writes(rng: random.Random, apis: dict[str, KubeApi],
                           users: dict[str, str], admin: LeaseClient, model: ModelServer,
                           ns: str) -> Tally:
    tally: Tally = []
    for index in range(POLICY_WRITES):
        name = f"pol-{index // 12}"  # a fresh JobLease every 12 writes: first epochs too
        if index % 12 == 0:
            admin.store.create(ns, name, {"leaseDurationSeconds": 30})
            model.create(name, {"leaseDurationSeconds": 30})
        real = apis["admin"].request("GET", lease_path(ns, name)).body
        status, rv = real.get("status") or {}, real["metadata"]["resourceVersion"]
        model.objects[name]["metadata"]["resourceVersion"] = rv
        if "status" in real:
            model.objects[name]["status"] = json.loads(json.dumps(status))
        writer = rng.choice(list(apis))
        others = [u for w, u in users.items() if w != writer]
        patch = _policy_patch(rng, status, rv, users[writer], others)
        body = {"metadata": {"resourceVersion": rv}, "status": patch}
        got = _answer(apis[writer].request, "PATCH", lease_path(ns, name, "status"), body,
                      content_type=MERGE)
        want = _answer(model.patch_status, name, {"status": patch}, users[writer])
        tally.append((got, want, writer, patch))
    return tally


def _pod_patch(rng: random.Random, pod: dict[str, Any]) -> dict[str, Any]:
    """A pod update: token or foreign annotations, labels, the image, a uid precondition.

    The image changes in the whole containers list as stored (a merge patch replaces a
    list, and a pod's other container fields may not change).
    """
    uid = pod["metadata"]["uid"]
    kind = rng.choice(["token", "token", "foreign", "label", "unlabel", "image", "uid"])
    meta: dict[str, Any] = {}
    if kind == "token":
        meta["annotations"] = {f"joblease.dev/{rng.choice(['generation', 'epoch'])}":
                               rng.choice([str(rng.randint(1, 9)), None])}
    elif kind == "foreign":
        meta["annotations"] = {"other.io/owner": rng.choice(["team", "operator", None])}
    elif kind in ("label", "unlabel"):
        meta["labels"] = {"joblease.dev/lease": "other" if kind == "label" else None}
    elif kind == "uid":
        meta["uid"] = rng.choice([uid, "00000000-0000-0000-0000-000000000000"])
        meta["annotations"] = {"joblease.dev/holder": "pod:x"}
    if kind == "image":
        containers = json.loads(json.dumps(pod["spec"]["containers"]))
        containers[0]["image"] = rng.choice(["worker:1", "worker:2"])
        return {"spec": {"containers": containers}}
    return {"metadata": meta}


def _compare_pod_writes(rng: random.Random, apis: dict[str, KubeApi], users: dict[str, str],
                        model: ModelServer, cluster: LocalCluster, ns: str) -> Tally:
    tally: Tally = []
    _pod(cluster, ns, "target")
    for _ in range(POD_WRITES):
        real = apis["admin"].request("GET", pod_path(ns, "target")).body
        model.pods["target"] = json.loads(json.dumps(real))
        writer = rng.choice(["operator", "operator", "admin"])
        patch = _pod_patch(rng, real)
        got = _answer(apis[writer].request, "PATCH", pod_path(ns, "target"), patch,
                      content_type=MERGE)
        want = _answer(model.patch_pod, "target", json.loads(json.dumps(patch)), users[writer])
        tally.append((got, want, writer, patch))
    return tally
