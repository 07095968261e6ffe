"""Indexed Jobs against the real API server: the mapping, the grant, and every refusal.

The pods here are made by the test, shaped exactly as the Job controller shapes an Indexed
Job's pods (owner reference, ``controller-uid`` and index labels, index annotation,
``spec.hostname``), and owned by real Job objects that the built-in Job controller leaves
alone (``spec.managedBy``): so each hostile variant — a pod of another Job, an edited index
label, a pod that is not Ready — is one precise object, and "Running/Ready/Succeeded/Failed"
are status writes as a kubelet would make them. The Job controller and real containers
are in tests/node/test_indexed_job.py.

The last test repeats the essentials with the operator under the chart's ServiceAccount and
admission policies (kwok cluster): its one new request (reading a JobLease's owners) is
within the chart's rules, and completing for a pod passes the policies.
"""

# ruff: noqa: F811  (pytest fixtures imported from kwok_support are redefined as arguments)
from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

import yaml
from kwok_support import (
    kns,  # noqa: F401  (fixture)
    kwok_cluster,  # noqa: F401  (fixture)
    operator_as_sa,  # noqa: F401  (fixture)
    release,  # noqa: F401  (fixture)
)

from joblease_localcluster import build
from joblease_localcluster.cluster import LocalCluster
from support.operator_process import OperatorProcess, forbidden_lines
from support.paths import REPO
from support.waiting import wait_for

DURATION = 4
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
NOBODY = "joblease.dev/tests-nobody"  # spec.managedBy: the Job controller skips the Job


def kubectl(cluster: LocalCluster, *args: str, check: bool = True) -> Any:
    return cluster.kubectl(*args, check=check)


def apply(cluster: LocalCluster, obj: dict[str, Any]) -> dict[str, Any]:
    """Create or update one object; return it as stored."""
    path = cluster.dir / f"idx-{obj['metadata']['name']}-{os.getpid()}.yaml"
    path.write_text(yaml.safe_dump(obj))
    out = kubectl(cluster, "apply", "-f", str(path), "-o", "json")
    return dict(json.loads(out.stdout))


def job(cluster: LocalCluster, ns: str, name: str, prefix: str) -> dict[str, Any]:
    """An Indexed Job of 4 completions whose template asks for a lease per index."""
    return apply(cluster, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
        "spec": {"completionMode": "Indexed", "completions": 4, "parallelism": 4,
                 "managedBy": NOBODY,
                 "template": {"metadata": {"labels": {
                     "joblease.dev/lease": prefix, "joblease.dev/lease-per-index": "true"}},
                     "spec": {"restartPolicy": "Never",
                              "containers": [{"name": "w", "image": "worker:test"}]}}}})


def job_pod(cluster: LocalCluster, ns: str, owner: dict[str, Any], index: int, name: str,
            prefix: str) -> dict[str, Any]:
    """A pod exactly as the Job controller makes one for ``index`` of ``owner``."""
    meta = owner["metadata"]
    return apply(cluster, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": ns,
            "labels": {"joblease.dev/lease": prefix, "joblease.dev/lease-per-index": "true",
                       INDEX_KEY: str(index), "batch.kubernetes.io/controller-uid": meta["uid"],
                       "batch.kubernetes.io/job-name": meta["name"]},
            "annotations": {INDEX_KEY: str(index)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True}]},
        "spec": {"hostname": f"{meta['name']}-{index}", "schedulerName": NOBODY,
                 "automountServiceAccountToken": False, "restartPolicy": "Never",
                 "containers": [{"name": "w", "image": "worker:test"}]}})


def set_status(cluster: LocalCluster, ns: str, pod: str, phase: str, ready: bool) -> None:
    """Write the pod's status as a kubelet would (phase and Ready condition)."""
    status = {"status": {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}
    kubectl(cluster, "patch", "pod", pod, "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps(status))


def lease(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any]:
    out = kubectl(cluster, "get", "jl", name, "-n", ns, "-o", "json")
    return dict(json.loads(out.stdout).get("status") or {})


def holder(pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    return f"pod:{meta['namespace']}/{meta['name']}/{meta['uid']}"


def pod_tokens(cluster: LocalCluster, ns: str, pod: str) -> dict[str, str]:
    out = kubectl(cluster, "get", "pod", pod, "-n", ns, "-o", "json")
    ann = json.loads(out.stdout)["metadata"].get("annotations") or {}
    return {k.removeprefix("joblease.dev/"): v for k, v in ann.items()
            if k.startswith("joblease.dev/")}


def recipe(cluster: LocalCluster, ns: str, job_name: str, prefix: str) -> None:
    """examples/indexed-leases.sh: the user's way to make the leases, owned by the Job."""
    binary = build.find_binary("kubectl")
    assert binary is not None
    env = {**os.environ, "PATH": f"{binary.parent}:{os.environ['PATH']}",
           "KUBECONFIG": str(cluster.kubeconfig), "KUBECTL_ARGS": f"-n {ns}"}
    out = subprocess.run(["sh", str(REPO / "examples" / "indexed-leases.sh"), job_name, prefix,
                          str(DURATION), "3"], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr


def test_each_index_pod_gets_its_own_lease_and_nothing_else(
        cluster: LocalCluster, namespace: str,
        start_operator: Callable[..., OperatorProcess]) -> None:
    ns = namespace
    wait_for(lambda: kubectl(cluster, "get", "sa", "default", "-n", ns,
                             check=False).returncode == 0, 30, "the default ServiceAccount")
    # the example a user runs is valid as it stands (the API server's own validation);
    # before our Job of the same name exists
    example = kubectl(cluster, "apply", "--dry-run=server", "-n", ns, "-f",
                      str(REPO / "examples" / "indexed-job.yaml"), check=False)
    assert example.returncode == 0, example.stderr
    ours, theirs = job(cluster, ns, "ingest", "ingest"), job(cluster, ns, "other", "ingest")
    recipe(cluster, ns, "ingest", "ingest")
    # a lease whose name a pod of ours can ask for, opted in, but granted to no Job
    apply(cluster, {"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
                    "metadata": {"name": "solo-0", "namespace": ns},
                    "spec": {"leaseDurationSeconds": DURATION,
                             "podDelegation": {"enabled": True}}})
    # ingest-2: owned by our Job, but the delegation opt-in switched off
    kubectl(cluster, "patch", "jl", "ingest-2", "-n", ns, "--type=merge", "-p",
            '{"spec":{"podDelegation":{"enabled":false}}}')

    # hostile pods first (the oldest eligible pod is tried first)
    other = job_pod(cluster, ns, theirs, 0, "other-0", "ingest")  # a pod of another Job
    forged = job_pod(cluster, ns, ours, 1, "ingest-1-x", "ingest")
    kubectl(cluster, "label", "pod", "ingest-1-x", "-n", ns, f"{INDEX_KEY}=2", "--overwrite")
    kubectl(cluster, "annotate", "pod", "ingest-1-x", "-n", ns, f"{INDEX_KEY}=2", "--overwrite")
    # the hostname, the one record that cannot be edited, still says index 1
    refused = kubectl(cluster, "patch", "pod", "ingest-1-x", "-n", ns, "--type=merge", "-p",
                      '{"spec":{"hostname":"ingest-2"}}', check=False)
    assert refused.returncode != 0 and "Forbidden" in refused.stderr, refused.stderr
    solo = job_pod(cluster, ns, ours, 0, "solo-asker", "solo")
    first = job_pod(cluster, ns, ours, 0, "ingest-0-a", "ingest")
    third = job_pod(cluster, ns, ours, 3, "ingest-3-a", "ingest")
    second = job_pod(cluster, ns, ours, 2, "ingest-2-a", "ingest")
    for pod in (other, forged, solo, first, second):
        set_status(cluster, ns, pod["metadata"]["name"], "Running", ready=True)
    set_status(cluster, ns, "ingest-3-a", "Running", ready=False)

    operator = start_operator(namespaces=[ns])
    wait_for(lambda: lease(cluster, ns, "ingest-0").get("holder") == holder(first), 20,
             "ingest-0 held for the pod of index 0 of its own Job")
    assert lease(cluster, ns, "ingest-0")["generation"] == 1
    wait_for(lambda: pod_tokens(cluster, ns, "ingest-0-a").get("generation") == "1", 10,
             "the token in the holder's annotations")
    # index 3 only once its pod is Ready
    assert lease(cluster, ns, "ingest-3").get("generation", 0) == 0
    set_status(cluster, ns, "ingest-3-a", "Running", ready=True)
    wait_for(lambda: lease(cluster, ns, "ingest-3").get("holder") == holder(third), 20,
             "ingest-3 held once its pod is Ready")
    # every refusal: nothing claimed, no token written on a refused pod
    assert lease(cluster, ns, "ingest-1").get("generation", 0) == 0  # forged index
    assert lease(cluster, ns, "ingest-2").get("generation", 0) == 0  # no opt-in
    assert lease(cluster, ns, "solo-0").get("generation", 0) == 0  # granted to no Job
    for refused_pod in ("other-0", "ingest-1-x", "solo-asker", "ingest-2-a"):
        assert pod_tokens(cluster, ns, refused_pod) == {}, refused_pod
    # the opt-in was what held index 2 back: switched on, its pod gets it
    kubectl(cluster, "patch", "jl", "ingest-2", "-n", ns, "--type=merge", "-p",
            '{"spec":{"podDelegation":{"enabled":true}}}')
    wait_for(lambda: lease(cluster, ns, "ingest-2").get("holder") == holder(second), 20,
             "ingest-2 held once it opted in")

    # a Succeeded holder completes its lease with its token; a Failed one releases it
    set_status(cluster, ns, "ingest-0-a", "Succeeded", ready=False)
    done = wait_for(lambda: (s := lease(cluster, ns, "ingest-0")).get("phase") == "Completed"
                    and s, 20, "ingest-0 Completed")
    assert (done["completion"]["holder"], done["completion"]["generation"]) == (
        holder(first), 1)
    set_status(cluster, ns, "ingest-3-a", "Failed", ready=False)
    freed = wait_for(lambda: (s := lease(cluster, ns, "ingest-3")).get("phase") == "Available"
                     and s, 20, "ingest-3 released")
    assert freed["attempts"] == 1 and not freed.get("holder")

    table = kubectl(cluster, "get", "jl", "-n", ns, "-l", "joblease.dev/job=ingest").stdout
    lines = table.splitlines()[1:]
    assert sorted(line.split()[0] for line in lines) == [f"ingest-{i}" for i in range(4)], table
    assert forbidden_lines(operator.output()) == []
    # the leases go with their Job (the garbage collector follows the owner references);
    # a re-created Job of the same name has a new uid, so nothing of the old one grants it
    kubectl(cluster, "delete", "job", "ingest", "-n", ns, "--wait=false")
    wait_for(lambda: not json.loads(kubectl(cluster, "get", "jl", "-n", ns, "-l",
                                            "joblease.dev/job=ingest", "-o", "json").stdout
                                    )["items"], 60, "the Job's leases to be collected with it")
    # not owned by it: stays
    assert kubectl(cluster, "get", "jl", "solo-0", "-n", ns, check=False).returncode == 0
    print(f"\n{table}")


def test_an_index_lease_under_the_charts_service_account_and_policies(
        kwok_cluster: LocalCluster, kns: str, operator_as_sa: OperatorProcess) -> None:
    cluster, ns = kwok_cluster, kns
    wait_for(lambda: kubectl(cluster, "get", "sa", "default", "-n", ns,
                             check=False).returncode == 0, 30, "the default ServiceAccount")
    owner = job(cluster, ns, "ingest", "ingest")
    recipe(cluster, ns, "ingest", "ingest")
    # not bound to a node (schedulerName): kwok, which completes Job pods, leaves it alone
    pod = job_pod(cluster, ns, owner, 1, "ingest-1-a", "ingest")
    set_status(cluster, ns, "ingest-1-a", "Running", ready=True)
    wait_for(lambda: pod_tokens(cluster, ns, "ingest-1-a").get("holder") == holder(pod), 30,
             "the pod's token, claimed and annotated under the chart's identity")
    set_status(cluster, ns, "ingest-1-a", "Succeeded", ready=False)
    done = wait_for(lambda: (s := lease(cluster, ns, "ingest-1")).get("phase") == "Completed"
                    and s, 30, "ingest-1 Completed for its pod")
    assert done["completion"]["holder"] == holder(pod)
    out = operator_as_sa.output()
    assert forbidden_lines(out) == [], out[-2000:]
