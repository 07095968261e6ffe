"""The chart's RBAC, proved: the operator runs under its ServiceAccount's token.

The token comes from the TokenRequest API (``kubectl create token``), exactly what a pod's
projected token is. The whole lifecycle must work with the chart's rules — expire, TTL
delete, Events — and anything outside them must be refused by the API server.
"""

# ruff: noqa: F811  (pytest fixtures imported from kwok_support are redefined as arguments)
from __future__ import annotations

import json

from kwok_support import (
    OPERATOR_SA,
    RELEASE_NS,
    apply,
    bind_worker,
    kns,  # noqa: F401  (fixture)
    kubectl_json,
    kwok_cluster,  # noqa: F401  (fixture)
    operator_as_sa,  # noqa: F401  (fixture)
    release,  # noqa: F401  (fixture)
    sa_kubeconfig,
)

from joblease.sdk.client import LeaseClient
from joblease_localcluster.cluster import LocalCluster
from support.operator_process import OperatorProcess, forbidden_lines
from support.waiting import wait_for


def _lease(cluster: LocalCluster, ns: str, name: str, **spec: int) -> None:
    out = apply(cluster, {"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
                          "metadata": {"name": name, "namespace": ns}, "spec": spec})
    assert out.returncode == 0, out.stderr


def _status(cluster: LocalCluster, ns: str, name: str) -> dict[str, object]:
    out = cluster.kubectl("get", "jl", name, "-n", ns, "-o", "json")
    return dict(json.loads(out.stdout).get("status") or {}) if out.returncode == 0 else {}


def test_lifecycle_works_under_the_service_account(
        kwok_cluster: LocalCluster, kns: str, operator_as_sa: OperatorProcess) -> None:
    bind_worker(kwok_cluster, kns, "alice")
    _lease(kwok_cluster, kns, "expires", leaseDurationSeconds=1)
    _lease(kwok_cluster, kns, "ttl", leaseDurationSeconds=30, ttlSecondsAfterFinished=1)
    assert _status(kwok_cluster, kns, "expires").get("phase") == "Available"  # born so
    alice = LeaseClient(kns, kubeconfig=str(kwok_cluster.kubeconfig_for("alice")))
    alice.claim("expires", holder="alice")
    wait_for(lambda: _status(kwok_cluster, kns, "expires").get("phase") == "Expired", 20,
             "the operator to mark the lease Expired")
    alice.claim("ttl", holder="alice").complete("done")
    wait_for(lambda: kwok_cluster.kubectl("get", "jl", "ttl", "-n", kns).returncode != 0, 20,
             "the operator to delete the finished lease after its TTL")
    reasons = {e["reason"] for e in kubectl_json(kwok_cluster, "get", "events", "-n",
                                                 kns)["items"]}
    assert {"Claimed", "Expired", "Completed"} <= reasons
    log = operator_as_sa.output()
    assert forbidden_lines(log) == [] and "permissions" not in log, log


def test_writes_outside_its_rules_are_denied(kwok_cluster: LocalCluster, kns: str,
                                             release: str) -> None:
    kubeconfig = str(sa_kubeconfig(kwok_cluster, RELEASE_NS, OPERATOR_SA))
    _lease(kwok_cluster, kns, "job", leaseDurationSeconds=5)

    def as_operator(*args: str) -> tuple[int, str]:
        out = kwok_cluster.kubectl("--kubeconfig", kubeconfig, *args)
        return out.returncode, out.stderr

    allowed = [("get", "jl", "job", "-n", kns), ("get", "pods", "-A")]
    for args in allowed:
        assert as_operator(*args)[0] == 0, args
    denied = [
        ("get", "secrets", "-n", kns),
        ("get", "configmaps", "-n", RELEASE_NS),
        ("patch", "jl", "job", "-n", kns, "--type=merge", "-p",
         '{"spec":{"leaseDurationSeconds":99}}'),
        ("delete", "pod", "any-pod", "-n", kns),
        ("create", "namespace", "not-allowed"),
        ("get", "namespaces"),
    ]
    for args in denied:
        code, err = as_operator(*args)
        assert code != 0 and "forbidden" in err.lower(), (args, err)
