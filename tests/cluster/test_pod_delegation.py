"""Pod-delegated leases with kwok pods against the real API server.

The operator runs under the chart's ServiceAccount (so the pod rules are proved too). kwok
turns a bound pod Running and Ready; "not Ready" is a status patch, as a kubelet's failing
readiness probe would write; deletion removes the object as a kubelet would after its
containers stopped.
"""

# ruff: noqa: F811  (pytest fixtures imported from kwok_support are redefined as arguments)
from __future__ import annotations

import json
import subprocess
from typing import Any

from kwok_support import (
    OPERATOR_SA,
    RELEASE_NS,
    apply,
    kns,  # noqa: F401  (fixture)
    kubectl_json,
    kwok_cluster,  # noqa: F401  (fixture)
    operator_as_sa,  # noqa: F401  (fixture)
    release,  # noqa: F401  (fixture)
    sa_kubeconfig,
)

from joblease_localcluster.cluster import LocalCluster
from support.operator_process import OperatorProcess, forbidden_lines
from support.waiting import wait_for

DURATION = 4


def _pod(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any]:
    wait_for(lambda: cluster.kubectl("get", "sa", "default", "-n", ns).returncode == 0, 30,
             "the namespace's default ServiceAccount")
    out = apply(cluster, {"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": name, "namespace": ns,
                                       "labels": {"joblease.dev/lease": "work"}},
                          "spec": {"nodeName": "kwok-node-0",
                                   "containers": [{"name": "worker", "image": "worker:test"}]}})
    assert out.returncode == 0, out.stderr
    return wait_for(lambda: _ready(cluster, ns, name), 30, f"pod {name} Ready")


def _ready(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any] | None:
    pod = kubectl_json(cluster, "get", "pod", name, "-n", ns)
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return pod if conditions.get("Ready") == "True" else None


def _annotations(cluster: LocalCluster, ns: str, name: str) -> dict[str, str]:
    pod = kubectl_json(cluster, "get", "pod", name, "-n", ns)
    return {k.removeprefix("joblease.dev/"): v for k, v in
            (pod["metadata"].get("annotations") or {}).items() if k.startswith("joblease.dev/")}


def _status(cluster: LocalCluster, ns: str) -> dict[str, Any]:
    return dict(kubectl_json(cluster, "get", "jl", "work", "-n", ns).get("status") or {})


def _holder(pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    return f"pod:{meta['namespace']}/{meta['name']}/{meta['uid']}"


def _held_by(cluster: LocalCluster, ns: str, pod: dict[str, Any], generation: int) -> bool:
    st = _status(cluster, ns)
    ann = _annotations(cluster, ns, pod["metadata"]["name"])
    return (st.get("phase") == "Held" and st.get("holder") == _holder(pod)
            and st.get("generation") == generation and ann.get("generation") == str(generation))


def test_delegation_claims_renews_and_hands_over(kwok_cluster: LocalCluster, kns: str,
                                                 operator_as_sa: OperatorProcess) -> None:
    apply(kwok_cluster, {"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
                         "metadata": {"name": "work", "namespace": kns},
                         "spec": {"leaseDurationSeconds": DURATION,
                                  "podDelegation": {"enabled": True}}})
    first = _pod(kwok_cluster, kns, "worker-a")
    wait_for(lambda: _held_by(kwok_cluster, kns, first, 1), 20, "worker-a to hold generation 1")
    ann = _annotations(kwok_cluster, kns, "worker-a")
    assert ann["holder"] == _holder(first) and ann["epoch"] == str(_status(kwok_cluster, kns)
                                                                   ["epoch"])
    second = _pod(kwok_cluster, kns, "worker-b")
    renewed = _status(kwok_cluster, kns)["renewTime"]
    wait_for(lambda: _status(kwok_cluster, kns)["renewTime"] != renewed, DURATION * 2,
             "a renewal while worker-a is Ready")
    assert _held_by(kwok_cluster, kns, first, 1)
    assert _annotations(kwok_cluster, kns, "worker-b") == {}

    # not Ready: renewals stop, the lease expires, worker-b takes over with generation 2
    patch = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    kwok_cluster.kubectl("patch", "pod", "worker-a", "-n", kns, "--subresource=status",
                         "-p", json.dumps(patch), check=True)
    wait_for(lambda: _held_by(kwok_cluster, kns, second, 2), DURATION * 4,
             "worker-b to take over at generation 2")
    wait_for(lambda: _annotations(kwok_cluster, kns, "worker-a") == {}, 10,
             "worker-a's token to be removed")

    # deleted: the lease is released at once and a new pod takes over with generation 3
    third = _pod(kwok_cluster, kns, "worker-c")
    kwok_cluster.kubectl("delete", "pod", "worker-b", "-n", kns, "--wait=true", check=True)
    wait_for(lambda: _held_by(kwok_cluster, kns, third, 3), DURATION * 4,
             "worker-c to take over at generation 3")
    reasons = [e["reason"] for e in kubectl_json(kwok_cluster, "get", "events", "-n", kns,
                                                 "--field-selector",
                                                 "involvedObject.name=work")["items"]]
    # Expired may or may not appear: the operator either marks the lapsed lease Expired
    # first or takes it over for worker-b directly; both are the same protocol decision.
    # Claimed may appear twice for one claim (the watch can beat the writer's own note).
    assert "Released" in reasons and reasons.count("Claimed") >= 3, reasons
    assert forbidden_lines(operator_as_sa.output()) == []


def test_the_operator_may_change_only_token_annotations_of_a_pod(
        kwok_cluster: LocalCluster, kns: str, release: str) -> None:
    """Issue 14 item 10: RBAC lets the operator patch any pod (it must annotate delegating
    pods cluster-wide); the chart's admission policy limits what that identity may change
    to joblease.dev/ annotations, on the API server itself."""
    _pod(kwok_cluster, kns, "victim")
    as_operator = sa_kubeconfig(kwok_cluster, RELEASE_NS, OPERATOR_SA)

    def patch(body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        # the later --kubeconfig wins: kubectl as the operator's ServiceAccount
        return kwok_cluster.kubectl("--kubeconfig", str(as_operator), "patch", "pod",
                                    "victim", "-n", kns, "--type=merge", "-p",
                                    json.dumps(body))

    def allowed() -> bool:
        return patch({"metadata": {"annotations": {"joblease.dev/generation": "7"}}}
                     ).returncode == 0

    wait_for(allowed, 30, "the operator to annotate a pod with its token")
    for forbidden in ({"metadata": {"labels": {"app": "hijacked"}}},
                      {"metadata": {"annotations": {"other.io/owner": "operator"}}},
                      {"metadata": {"labels": {"joblease.dev/lease": None}}}):
        refused = wait_for(lambda b=forbidden: (out := patch(b)).returncode != 0 and out,
                           30, f"the policy to refuse {forbidden}")
        assert "may change only joblease.dev/ annotations" in refused.stderr, refused.stderr
    pod = kubectl_json(kwok_cluster, "get", "pod", "victim", "-n", kns)
    assert pod["metadata"]["labels"] == {"joblease.dev/lease": "work"}
    assert pod["metadata"]["annotations"].get("joblease.dev/generation") == "7"
