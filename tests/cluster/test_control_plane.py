"""Proof that the test cluster is a real Kubernetes control plane, not a fake.

Each test shows one behaviour the lease protocol relies on: CRDs are served, writes are
compare-and-swap on resourceVersion, the Date header is the server's clock, the
controller-manager finalizes namespaces, and RBAC denies until a binding allows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from email.utils import parsedate_to_datetime
from typing import Any

import pykube
import pytest

from joblease_localcluster.cluster import ClusterHandle
from support.waiting import wait_for

GROUP = "proof.joblease.dev"
VERSION = f"{GROUP}/v1"
PLURAL = "widgets"
CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                "status": {"type": "object", "properties": {"seen": {"type": "integer"}}},
            }}},
        }],
    },
}


def _established(kube: pykube.HTTPClient) -> bool:
    response = kube.get(version="apiextensions.k8s.io/v1",
                        url=f"customresourcedefinitions/{PLURAL}.{GROUP}")
    conditions = (response.json().get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="module")
def widget_crd(kube: pykube.HTTPClient) -> Iterator[str]:
    response = kube.post(version="apiextensions.k8s.io/v1", url="customresourcedefinitions",
                         data=json.dumps(CRD))
    assert response.status_code in (201, 409), response.text  # 409: left by an earlier run
    wait_for(lambda: _established(kube), 30, "the CRD to become Established")
    # Established means the API is served; discovery may lag by a moment.
    wait_for(lambda: kube.get(version=VERSION, url="").ok, 30, "discovery of the CRD")
    yield f"{PLURAL}.{GROUP}"
    kube.delete(version="apiextensions.k8s.io/v1",
                url=f"customresourcedefinitions/{PLURAL}.{GROUP}")


def test_crd_is_established_and_serves_objects(kube: pykube.HTTPClient, widget_crd: str,
                                               namespace: str) -> None:
    assert _established(kube)
    body = {"apiVersion": VERSION, "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"size": 1}}
    created = kube.post(version=VERSION, namespace=namespace, url=PLURAL, data=json.dumps(body))
    assert created.status_code == 201, created.text
    assert created.json()["spec"] == {"size": 1}


def test_stale_resource_version_is_a_conflict(kube: pykube.HTTPClient, widget_crd: str,
                                              namespace: str) -> None:
    body = {"apiVersion": VERSION, "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"size": 1}}
    first = kube.post(version=VERSION, namespace=namespace, url=PLURAL, data=json.dumps(body))
    assert first.status_code == 201, first.text
    stale = first.json()

    fresh = dict(stale, spec={"size": 2})
    updated = kube.put(version=VERSION, namespace=namespace, url=f"{PLURAL}/w",
                       data=json.dumps(fresh))
    assert updated.status_code == 200, updated.text
    current_rv = updated.json()["metadata"]["resourceVersion"]
    assert current_rv != stale["metadata"]["resourceVersion"]

    # The same write again, carrying the resourceVersion we read before: refused.
    again = kube.put(version=VERSION, namespace=namespace, url=f"{PLURAL}/w",
                     data=json.dumps(dict(stale, spec={"size": 3})))
    assert again.status_code == 409, again.text
    assert again.json()["reason"] == "Conflict"

    # The status subresource with a merge patch behaves the same way.
    def patch_status(rv: str, seen: int) -> Any:
        return kube.patch(version=VERSION, namespace=namespace, url=f"{PLURAL}/w/status",
                          headers={"Content-Type": "application/merge-patch+json"},
                          data=json.dumps({"metadata": {"resourceVersion": rv},
                                           "status": {"seen": seen}}))

    assert patch_status(stale["metadata"]["resourceVersion"], 1).status_code == 409
    ok = patch_status(current_rv, 1)
    assert ok.status_code == 200, ok.text
    assert ok.json()["status"] == {"seen": 1}


def test_date_header_is_the_servers_clock(kube: pykube.HTTPClient) -> None:
    before = time.time()
    response = kube.get(url="namespaces/default")
    after = time.time()
    server = parsedate_to_datetime(response.headers["Date"]).timestamp()
    # One-second resolution; the server runs on this machine, so the clocks agree.
    assert before - 2 <= server <= after + 2, (before, server, after)


def test_namespace_deletion_finishes(kube: pykube.HTTPClient) -> None:
    name = f"t-gone-{int(time.time() * 1000) % 100000}"
    pykube.Namespace(kube, {"metadata": {"name": name}}).create()
    pykube.ConfigMap(kube, {"metadata": {"name": "cm", "namespace": name},
                            "data": {"k": "v"}}).create()
    assert kube.delete(url=f"namespaces/{name}").ok
    # Only the controller-manager's namespace controller empties it and drops the
    # `kubernetes` finalizer; without it the namespace stays Terminating forever.
    wait_for(lambda: kube.get(url=f"namespaces/{name}").status_code == 404, 60,
             f"namespace {name} to be finalized")


def test_rbac_denies_alice_until_a_rolebinding(cluster: ClusterHandle,
                                               kube: pykube.HTTPClient,
                                               namespace: str) -> None:
    alice = pykube.HTTPClient(pykube.KubeConfig.from_file(str(cluster.kubeconfig_for("alice"))))
    denied = alice.get(namespace=namespace, url="configmaps")
    assert denied.status_code == 403, denied.text

    pykube.Role(kube, {"metadata": {"name": "read-cm", "namespace": namespace},
                       "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                                  "verbs": ["get", "list"]}]}).create()
    pykube.RoleBinding(kube, {
        "metadata": {"name": "alice-reads-cm", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "read-cm"},
        "subjects": [cluster.rbac_subject("alice")]}).create()
    wait_for(lambda: alice.get(namespace=namespace, url="configmaps").status_code == 200,
             10, "alice's RoleBinding to take effect")
    # Bob was granted nothing.
    bob = pykube.HTTPClient(pykube.KubeConfig.from_file(str(cluster.kubeconfig_for("bob"))))
    assert bob.get(namespace=namespace, url="configmaps").status_code == 403
    # And the grant is only what the Role says.
    assert alice.get(namespace=namespace, url="secrets").status_code == 403
