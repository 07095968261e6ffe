"""The pool example on real pods: a Deployment of ``joblease work`` drains a labelled batch.

``examples/pool-batch.yaml`` and ``examples/pool-workers.yaml`` are applied as they are
(ServiceAccount, least-privilege Role, RoleBinding, Deployment), with only what this node
needs changed, as ``test_seed_pods.py`` does for its pods: the working tree instead of the
published image (the base image with the interpreter, the ``.venv`` and the repository
mounted read-only, ``python -m joblease.cli`` for the ``joblease`` entry point, run as
root because that interpreter lives under ``/root``), host network and the API server at
``127.0.0.1`` (no kube-proxy, no pod network here). The
ServiceAccount token is the kubelet's, so the Role in the example is what the workers
really run under; the operator runs on the host. The test waits until every job of the
batch is Completed, checks who completed them (the ServiceAccount's username, through
``--holder @identity``) and reads the workers' progress lines.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import yaml
from node_support import PYTHON_HOME, VENV_PYTHON, NodeCluster

from joblease_localcluster import images
from support.operator_process import OperatorProcess
from support.paths import REPO
from support.waiting import wait_for

EXAMPLES = REPO / "examples"
SELECTOR = "batch=nightly-2026-12-03"
DRAIN_TIMEOUT = 120  # pods scheduled, started, and the batch's 5 jobs (2 s each) done


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def _for_this_node(deployment: dict[str, Any], api_port: int) -> dict[str, Any]:
    """The example Deployment with this node's image, mounts and network (module doc)."""
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"][0] == "joblease"
    venv = Path(sys.prefix)
    mounts = [PYTHON_HOME, REPO, *([venv] if not venv.is_relative_to(REPO) else [])]
    container["command"] = [str(VENV_PYTHON), "-m", "joblease.cli", *container["command"][1:]]
    container["image"], container["imagePullPolicy"] = images.BASE_IMAGE, "Never"
    container["env"] += [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)},
        {"name": "PYTHONPATH", "value": f"{REPO / 'operator'}"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"}]
    container["volumeMounts"] = [{"name": f"host{i}", "mountPath": str(p), "readOnly": True}
                                 for i, p in enumerate(mounts)]
    pod["volumes"] = [{"name": f"host{i}", "hostPath": {"path": str(p), "type": "Directory"}}
                      for i, p in enumerate(mounts)]
    pod["hostNetwork"] = True
    # The interpreter mounted from this host lives under /root, which the base image keeps
    # at 0700: uid 65532 cannot reach it (runc: "permission denied"). The published image
    # has its own interpreter and runs as 65532; here the pod runs as root, like the other
    # tests' pods on this node.
    for key in ("runAsNonRoot", "runAsUser"):
        pod["securityContext"].pop(key)
    return deployment


def test_deployment_of_pool_workers_drains_the_batch(node_cluster: NodeCluster, node_ns: str,
                                                    tmp_path: Path) -> None:
    nc, ns = node_cluster, node_ns
    operator = OperatorProcess(nc.cluster.kubeconfig, tmp_path / "operator.log",
                               namespaces=[ns], cwd=REPO).start()
    try:
        batch = _docs("pool-batch.yaml")
        assert batch and all(d["metadata"]["labels"]["batch"] == SELECTOR.split("=")[1]
                             for d in batch)
        for doc in batch:
            doc["metadata"]["namespace"] = ns
            nc.apply(doc)
        api_port = int(nc.cluster.server.rsplit(":", 1)[1])
        workers = _docs("pool-workers.yaml")
        for doc in workers:
            doc["metadata"]["namespace"] = ns
            nc.apply(_for_this_node(doc, api_port) if doc["kind"] == "Deployment" else doc)
        began = time.monotonic()

        def drained() -> list[dict[str, Any]] | None:
            items = nc.api(f"/apis/joblease.dev/v1alpha1/namespaces/{ns}/jobleases?"
                           f"labelSelector={SELECTOR.replace('=', '%3D')}")["items"]
            done = [i for i in items if (i.get("status") or {}).get("phase") == "Completed"]
            return items if len(done) == len(batch) else None

        try:
            items = wait_for(drained, DRAIN_TIMEOUT, "every job of the batch to be Completed",
                             poll=0.5)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{_diagnose(nc, ns)}") from None
        seconds = time.monotonic() - began
        holders = {i["status"]["completion"]["holder"] for i in items}
        assert holders == {f"system:serviceaccount:{ns}:batch-worker"}, holders
        logs = nc.kubectl("logs", "-n", ns, "-l", "app=batch-worker", "--tail=-1",
                          "--prefix").stdout
        assert "working with token" in logs and "busy=" in logs, logs[-3000:]
        completed = [line for line in logs.splitlines() if ": completed" in line]
        assert len(completed) == len(batch), logs[-3000:]
        print(f"pool deployment: {len(batch)} jobs drained by 2 replicas in {seconds:.1f}s")
    finally:
        nc.kubectl("delete", "deployment", "batch-worker", "-n", ns, "--wait=false")
        operator.stop()


def _diagnose(nc: NodeCluster, ns: str) -> str:
    """What the pods and the batch look like (for a failure message)."""
    parts = [nc.kubectl("get", "pods,rs,deploy,jl", "-n", ns, "-o", "wide").stdout,
             nc.kubectl("describe", "pods", "-n", ns).stdout[-4000:],
             nc.kubectl("logs", "-n", ns, "-l", "app=batch-worker", "--tail=40",
                        "--prefix").stdout[-4000:],
             nc.kubectl("get", "events", "-n", ns).stdout[-3000:]]
    return "\n".join(parts)
