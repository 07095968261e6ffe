"""``helm install`` into a real control plane: the operator pod lands on a kwok node."""

# ruff: noqa: F811  (pytest fixtures imported from kwok_support are redefined as arguments)
from __future__ import annotations

from kwok_support import (
    RELEASE_NS,
    apply,
    helm,
    kubectl_json,
    kwok_cluster,  # noqa: F401  (fixture)
    release,  # noqa: F401  (fixture)
)

from joblease_localcluster.cluster import LocalCluster
from support.paths import CHART
from support.waiting import wait_for


def test_operator_pod_is_scheduled_on_a_kwok_node_and_runs(kwok_cluster: LocalCluster,
                                                             release: str) -> None:
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"

    def running() -> dict[str, object] | None:
        pods = kubectl_json(kwok_cluster, "get", "pods", "-n", RELEASE_NS, "-l", selector)
        live = [p for p in pods["items"] if p["status"].get("phase") == "Running"]
        return live[0] if live else None

    pod = wait_for(running, 60, "the operator pod to be Running")
    assert pod["spec"]["nodeName"] == "kwok-node-0"
    assert pod["spec"]["serviceAccountName"] == f"{release}-joblease-operator"
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True"


def test_release_objects_exist_and_the_crd_is_served(kwok_cluster: LocalCluster,
                                                     release: str) -> None:
    listed = helm(kwok_cluster.kubeconfig, "list", "-n", RELEASE_NS, "-o", "json")
    assert '"status":"deployed"' in listed.stdout
    policy = kubectl_json(kwok_cluster, "get", "validatingadmissionpolicy",
                          f"{release}-joblease-operator-holder-only")
    assert policy["spec"]["failurePolicy"] == "Fail"
    out = apply(kwok_cluster, {"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
                               "metadata": {"name": "from-kubectl", "namespace": RELEASE_NS},
                               "spec": {"leaseDurationSeconds": 5}})
    assert out.returncode == 0, out.stderr


def test_uninstall_keeps_the_crd(kwok_cluster: LocalCluster) -> None:
    helm(kwok_cluster.kubeconfig, "install", "jl-extra", str(CHART), "-n", "jl-extra",
         "--create-namespace", "--set", "admission.enabled=false")
    helm(kwok_cluster.kubeconfig, "uninstall", "jl-extra", "-n", "jl-extra", "--wait")
    crd = kwok_cluster.kubectl("get", "crd", "jobleases.joblease.dev")
    assert crd.returncode == 0, crd.stderr
    gone = kwok_cluster.kubectl("get", "clusterrole", "jl-extra-joblease-operator")
    assert gone.returncode != 0


def test_default_install_needs_no_prometheus_operator_crds(kwok_cluster: LocalCluster,
                                                           release: str) -> None:
    """ServiceMonitor and PrometheusRule are opt-in: this cluster has neither CRD."""
    for crd in ("servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com"):
        out = kwok_cluster.kubectl("get", "crd", crd)
        assert out.returncode != 0 and "NotFound" in out.stderr, out.stderr
    listed = helm(kwok_cluster.kubeconfig, "list", "-n", RELEASE_NS, "-o", "json")
    assert f'"name":"{release}"' in listed.stdout and '"status":"deployed"' in listed.stdout
