"""A second local control plane with kwok, the chart installed into it, and helpers.

Why a separate cluster: the chart installs a cluster-wide ValidatingAdmissionPolicy and the
operator watches every pod and JobLease; in the shared ``cluster`` they would act on other
tests' objects. kwok simulates Nodes (and the Pods bound to them), so the chart's
Deployment is scheduled and reaches Running without a container runtime.

Import the fixtures into a test module (``from kwok_support import ...``).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from joblease_localcluster import build
from joblease_localcluster.cluster import LocalCluster
from support.operator_process import OperatorProcess
from support.paths import CHART, CRD

RELEASE, RELEASE_NS = "jl", "joblease-system"
OPERATOR_SA = f"{RELEASE}-joblease-operator"
OPERATOR_USER = f"system:serviceaccount:{RELEASE_NS}:{OPERATOR_SA}"
WORKER_ROLE = f"{RELEASE}-joblease-operator-worker"
ENFORCED = {"joblease.dev/admission": "enforced"}
# What the tests install: the admission policy only in namespaces labelled ENFORCED, the
# operator image never pulled (kwok runs no containers).
TEST_VALUES = {"image": {"repository": "localhost/joblease-operator", "tag": "test",
                         "pullPolicy": "Never"},
               "admission": {"namespaceSelector": {"matchLabels": ENFORCED}}}


def helm_binary() -> Path:
    """The cached helm (built from helm.sh/helm/v4 when missing)."""
    return build.ensure_binaries(["helm"])["helm"]


def helm(kubeconfig: Path | None, *args: str, check: bool = True
         ) -> subprocess.CompletedProcess[str]:
    """Run helm (against ``kubeconfig`` if given) with a private cache and config."""
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/joblease-helm/cache",
           "HELM_CONFIG_HOME": "/tmp/joblease-helm/config",
           "HELM_DATA_HOME": "/tmp/joblease-helm/data"}
    argv = [str(helm_binary()), *args, *(["--kubeconfig", str(kubeconfig)] if kubeconfig else [])]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180)
    if check and out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {out.returncode}:\n{out.stderr}")
    return out


def kubectl_json(cluster: LocalCluster, *args: str, user: str = "admin") -> Any:
    """Run kubectl ``-o json`` and decode."""
    return json.loads(cluster.kubectl(*args, "-o", "json", user=user, check=True).stdout)


def apply(cluster: LocalCluster, obj: dict[str, Any], user: str = "admin"
          ) -> subprocess.CompletedProcess[str]:
    """``kubectl apply`` one object given as a dict."""
    path = cluster.dir / f"obj-{secrets.token_hex(4)}.yaml"
    path.write_text(yaml.safe_dump(obj))
    return cluster.kubectl("apply", "-f", str(path), user=user)


def sa_kubeconfig(cluster: LocalCluster, namespace: str, sa: str) -> Path:
    """A kubeconfig authenticating as ServiceAccount ``namespace/sa`` (TokenRequest API)."""
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration=1h",
                            check=True).stdout.strip()
    config = {"apiVersion": "v1", "kind": "Config",
              "clusters": [{"name": "c", "cluster": {
                  "server": cluster.server, "certificate-authority": str(cluster.ca_file)}}],
              "users": [{"name": sa, "user": {"token": token}}],
              "contexts": [{"name": sa, "context": {"cluster": "c", "user": sa}}],
              "current-context": sa}
    path = cluster.dir / f"kubeconfig-sa-{namespace}-{sa}"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# -- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def kwok_cluster() -> Iterator[LocalCluster]:
    """A local control plane with kwok, for the chart, RBAC, admission and pod tests."""
    if os.environ.get("JOBLEASE_E2E_KUBECONFIG"):
        pytest.skip("kwok tests run on the local control plane; on kind, e2e/run-kind.sh "
                    "installs the chart and runs the examples on real nodes instead")
    cluster = LocalCluster(kwok=True, name="joblease-local-kwok")
    cluster.start()
    try:
        cluster.create_fake_node("kwok-node-0")
        cluster.kubectl("apply", "--server-side", "-f", str(CRD), check=True)
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/jobleases.joblease.dev", check=True)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def release(kwok_cluster: LocalCluster) -> Iterator[str]:
    """The chart installed as release ``jl`` in ``joblease-system`` (test values)."""
    values = kwok_cluster.dir / "values-test.yaml"
    values.write_text(yaml.safe_dump(TEST_VALUES))
    helm(kwok_cluster.kubeconfig, "install", RELEASE, str(CHART), "-n", RELEASE_NS,
         "--create-namespace", "-f", str(values), "--wait=false")
    yield RELEASE
    helm(kwok_cluster.kubeconfig, "uninstall", RELEASE, "-n", RELEASE_NS, check=False)


@pytest.fixture
def kns(kwok_cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace in the kwok cluster where the admission policy is enforced."""
    name = f"t-{secrets.token_hex(4)}"
    apply(kwok_cluster, {"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": name, "labels": ENFORCED}})
    yield name
    kwok_cluster.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture
def operator_as_sa(kwok_cluster: LocalCluster, release: str, tmp_path: Path
                   ) -> Iterator[OperatorProcess]:
    """The operator running under the chart's ServiceAccount (a TokenRequest token)."""
    kubeconfig = sa_kubeconfig(kwok_cluster, RELEASE_NS, OPERATOR_SA)
    run = OperatorProcess(kubeconfig, tmp_path / "operator.log", extra_args=["--verbose"])
    run.start()
    yield run
    run.stop()


def bind_worker(cluster: LocalCluster, namespace: str, *users: str) -> None:
    """Grant ``users`` the chart's worker ClusterRole in ``namespace``."""
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "joblease-workers", "namespace": namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": WORKER_ROLE},
               "subjects": [cluster.rbac_subject(u) for u in users]}
    out = apply(cluster, binding)
    assert out.returncode == 0, out.stderr
