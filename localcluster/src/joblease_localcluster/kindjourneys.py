"""The journeys on kind's pod network, against the chart installed with its defaults (issue 32).

What ``make e2e-kind`` runs after the chart (docs/kind.md): each journey is a user's path,
driven with ``kubectl`` only (this package never imports joblease; the workers run the
operator image, the host's ``joblease`` CLI claims once), each in its own namespace, each
wait bounded. A journey that fails raises :class:`JourneyFailed` naming the step.

1. **leases expired**: the operator pod Ready through its HTTP probes on its pod IP (no
   host network, no override); a JobLease claimed with a 3 s lease and never renewed is
   marked ``Expired`` by that operator.
2. **delegated workers and the fence**: PostgreSQL in a pod behind a Service, two pods of
   ``examples/worker-deployment.yaml`` (no API credentials; the token through the downward
   API), the holder frozen with SIGSTOP past its lease, the other takes over with the next
   generation, the frozen one resumes into a write and is refused by the fence.
3. **a pool Deployment**: ``joblease work`` pods (``examples/pool-workers.yaml``, turns: no
   dispatcher) drain N jobs; one pod is deleted mid-job; its job expires and is claimed
   again; every job ends ``Completed``, its command finished exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
LEASE_API = "jobleases.joblease.dev"
FENCE_LEASE = "nightly-report"
POOL_SELECTOR = "batch=journey"


class JourneyFailed(RuntimeError):  # noqa: N818 - reads as the sentence it reports
    """A journey's step did not happen in time; the message names the step."""


class Kubectl(Protocol):
    """What a journey needs of kindrun's tools."""

    def kubectl(self, *args: str, timeout: float = 240, stdin: str | None = None
                ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the kind cluster."""


@dataclass(frozen=True)
class Cluster:
    """The kind cluster as the journeys see it."""

    tools: Kubectl
    kubeconfig: Path
    node_exec: Callable[[str], subprocess.CompletedProcess[str]]
    image: str
    postgres_image: str

    def run(self, *args: str, timeout: float = 240, stdin: str | None = None) -> str:
        """kubectl, failing the journey on a non-zero exit."""
        out = self.tools.kubectl(*args, timeout=timeout, stdin=stdin)
        if out.returncode != 0:
            raise JourneyFailed(f"kubectl {' '.join(args)}: {out.stderr.strip()[-800:]}")
        return out.stdout

    def get(self, *args: str) -> dict[str, Any]:
        """``kubectl get … -o json``."""
        got: dict[str, Any] = json.loads(self.run("get", *args, "-o", "json"))
        return got

    def apply(self, docs: list[dict[str, Any]], ns: str) -> None:
        """``kubectl apply`` of ``docs`` in ``ns``."""
        self.run("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump_all(docs))

    def namespace(self, ns: str) -> None:
        """A fresh namespace for one journey."""
        self.run("create", "namespace", ns)

    def lease(self, ns: str, name: str) -> dict[str, Any]:
        """A JobLease's status ({} before its first status)."""
        status: dict[str, Any] = self.get(LEASE_API, name, "-n", ns).get("status") or {}
        return status

    def logs(self, ns: str, pod: str, *, previous: bool = False) -> str:
        """A pod's log ('' when there is none yet)."""
        out = self.tools.kubectl("logs", pod, "-n", ns, *(["--previous"] if previous else []),
                                 timeout=60)
        return out.stdout if out.returncode == 0 else ""

    def pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        """The pods of ``selector`` that are not being deleted."""
        items: list[dict[str, Any]] = self.get("pods", "-n", ns, "-l", selector)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    """Whether a pod's Ready condition is True."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []))


def wait_for(check: Callable[[], T | None], timeout: float, what: str, poll: float = 0.5
             ) -> T:
    """Poll ``check`` until it returns a truthy value; fail the journey naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:  # bounded by the deadline
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise JourneyFailed(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def say(line: str) -> None:
    """A journey's progress line."""
    print(f"[e2e-kind journey] {line}", file=sys.stderr, flush=True)


# -- 1. leases expired ----------------------------------------------------------------


def operator_on_pod_ip(pod: dict[str, Any]) -> str:
    """'' if the operator pod runs on the pod network, Ready through HTTP probes; else why."""
    spec, status = pod["spec"], pod.get("status", {})
    probes = [spec["containers"][0].get(k) or {} for k in ("readinessProbe", "livenessProbe")]
    if spec.get("hostNetwork"):
        return "the operator pod uses the host network"
    if not status.get("podIP") or status.get("podIP") == status.get("hostIP"):
        return f"no pod IP of its own ({status.get('podIP')} on host {status.get('hostIP')})"
    if not all("httpGet" in p and not p["httpGet"].get("host") for p in probes):
        return f"the probes are not HTTP on the pod IP: {probes}"
    if not ready(pod):
        return "the operator pod is not Ready"
    return ""


def leases_expired(c: Cluster, operator_ns: str) -> str:
    """Journey 1; returns its summary line."""
    pod = c.get("pods", "-n", operator_ns, "-l", "app.kubernetes.io/instance=jl")["items"][0]
    why = operator_on_pod_ip(pod)
    if why:
        raise JourneyFailed(why)
    ns = "journey-expiry"
    c.namespace(ns)
    c.apply([{"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
              "metadata": {"name": "short"}, "spec": {"leaseDurationSeconds": 3}}], ns)
    joblease = Path(sys.executable).with_name("joblease")
    claimed = subprocess.run([str(joblease), "claim", "short", "-n", ns, "--holder",
                              "@identity", "--kubeconfig", str(c.kubeconfig), "-o", "json"],
                             capture_output=True, text=True, check=False, timeout=60)
    if claimed.returncode != 0:
        raise JourneyFailed(f"joblease claim: {claimed.stderr.strip()[-800:]}")
    began = time.monotonic()
    held = c.lease(ns, "short")
    if held.get("phase") != "Held":
        raise JourneyFailed(f"the claim left phase {held.get('phase')}")
    wait_for(lambda: c.lease(ns, "short").get("phase") == "Expired", 30,
             "the operator to mark the 3 s lease Expired")
    return (f"operator {pod['metadata']['name']} Ready on pod IP {pod['status']['podIP']} "
            f"(HTTP probes); lease 'short' held by {held.get('holder')} marked Expired "
            f"{time.monotonic() - began:.1f}s after the claim")


# -- 2. delegated workers and the fence ----------------------------------------------


def postgres_docs(image: str) -> list[dict[str, Any]]:
    """PostgreSQL as one pod behind the Service ``postgres`` (the image of pgimage)."""
    labels = {"app": "postgres"}
    pod_spec = {
        "securityContext": {"runAsUser": 999, "runAsGroup": 999, "fsGroup": 999,
                            "runAsNonRoot": True},
        "containers": [{"name": "postgres", "image": image, "imagePullPolicy": "Never",
                        "ports": [{"containerPort": 5432}],
                        "readinessProbe": {"tcpSocket": {"port": 5432}, "periodSeconds": 1},
                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql"}]}],
        "volumes": [{"name": "data", "emptyDir": {}}]}
    return [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "postgres"},
             "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                      "template": {"metadata": {"labels": labels}, "spec": pod_spec}}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "postgres"},
             "spec": {"selector": labels, "ports": [{"port": 5432, "targetPort": 5432}]}}]


def worker_deployment(image: str, step_seconds: float) -> dict[str, Any]:
    """``examples/worker-deployment.yaml`` with the built image; nothing else changed."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "worker-deployment.yaml").read_text())
    spec = doc["spec"]["template"]["spec"]
    spec["terminationGracePeriodSeconds"] = 2
    container = spec["containers"][0]
    container["image"], container["imagePullPolicy"] = image, "Never"
    container["env"].append({"name": "JOBLEASE_STEP_SECONDS", "value": str(step_seconds)})
    return doc


def sql(c: Cluster, ns: str, query: str) -> list[str]:
    """Rows of ``query`` (psql in the PostgreSQL pod, one line per row, fields by '|')."""
    out = c.run("exec", "-n", ns, "deploy/postgres", "--", "psql", "-h", "/tmp", "-U",
                "postgres", "-At", "-c", query, timeout=60)
    return [line for line in out.splitlines() if line]


def _holder(c: Cluster, ns: str) -> tuple[str, int] | None:
    st = c.lease(ns, FENCE_LEASE)
    holder = str(st.get("holder", ""))
    if st.get("phase") != "Held" or not holder.startswith("pod:"):
        return None
    return holder.split("/")[1], int(st["generation"])


def _last_exit(c: Cluster, ns: str, pod: str) -> int | None:
    for cs in c.get("pod", pod, "-n", ns)["status"].get("containerStatuses", []):
        ended = cs.get("lastState", {}).get("terminated") or cs.get("state", {}).get(
            "terminated")
        if ended:
            return int(ended["exitCode"])
    return None


def _signal(c: Cluster, ns: str, pod: str, sig: str) -> None:
    """Send ``sig`` to the worker container's process (PID 1 of the container) from the node.

    From inside the container PID 1 ignores SIGSTOP; from the node it is an ordinary
    process, found with crictl as ``ctr tasks ps`` finds it on the real node.
    """
    script = (f"p=$(crictl pods -q --namespace {ns} --name {pod} --state ready) && "
              f"c=$(crictl ps -q --pod $p --name worker) && "
              f"crictl inspect $c | jq .info.pid")
    out = c.node_exec(script)
    pid = out.stdout.strip()
    if out.returncode != 0 or not pid.isdigit():
        raise JourneyFailed(f"no process found for {pod}: {out.stderr.strip()[-400:]}")
    sent = c.node_exec(f"kill -{sig} {pid}")
    if sent.returncode != 0:
        raise JourneyFailed(f"kill -{sig} {pid} ({pod}): {sent.stderr.strip()}")


def no_api_credentials(pod: dict[str, Any]) -> str:
    """'' if the pod has no ServiceAccount token mounted; else what it has."""
    mounts = [m["mountPath"] for ct in pod["spec"]["containers"]
              for m in ct.get("volumeMounts", [])]
    if pod["spec"].get("automountServiceAccountToken") is not False or any(
            "serviceaccount" in m for m in mounts):
        return f"{pod['metadata']['name']} has API credentials: {mounts}"
    return ""


def delegated_workers_fenced(c: Cluster) -> str:
    """Journey 2; returns its summary line."""
    ns = "journey-fence"
    c.namespace(ns)
    c.apply(postgres_docs(c.postgres_image), ns)
    wait_for(lambda: any(ready(p) for p in c.pods(ns, "app=postgres")), 120,
             "PostgreSQL Ready")
    lease = yaml.safe_load((EXAMPLES / "jobleases.yaml").read_text())
    lease["spec"]["leaseDurationSeconds"] = 4
    c.apply([lease], ns)
    c.run("create", "configmap", "joblease-worker", "-n", ns,
          f"--from-file=worker.py={EXAMPLES / 'worker.py'}")
    c.run("create", "secret", "generic", "joblease-db", "-n", ns,
          f"--from-literal=url=postgresql://postgres@postgres.{ns}.svc:5432/postgres")
    c.apply([worker_deployment(c.image, 1.0)], ns)
    a, n = wait_for(lambda: _holder(c, ns), 120, "a worker pod to hold the lease")
    wait_for(lambda: "wrote a row" in c.logs(ns, a), 60, f"{a} to write through the Service")
    pods = c.pods(ns, "app=report-worker")
    for pod in pods:
        why = no_api_credentials(pod)
        if why:
            raise JourneyFailed(why)
    b = next(p["metadata"]["name"] for p in pods if p["metadata"]["name"] != a)
    wait_for(lambda: ready(c.get("pod", b, "-n", ns)), 60, f"{b} Ready (standby)")
    _signal(c, ns, a, "STOP")
    paused = time.monotonic()
    try:
        wait_for(lambda: not ready(c.get("pod", a, "-n", ns)), 30, f"{a} not Ready while frozen")
        wait_for(lambda: _holder(c, ns) == (b, n + 1), 60, f"{b} to hold generation {n + 1}")
        wait_for(lambda: "wrote a row" in c.logs(ns, b), 60, f"{b} to write")
        handover = time.monotonic() - paused
    finally:
        _signal(c, ns, a, "CONT")
    wait_for(lambda: _last_exit(c, ns, a) == 4, 60, f"{a} to exit 4 (refused by the fence)")
    refused = wait_for(lambda: next((log for log in (c.logs(ns, a, previous=True),
                                                     c.logs(ns, a))
                                     if "refused by the fence" in log), None),
                       30, f"{a}'s log of the refusal")
    writers = sql(c, ns, "SELECT writer FROM report ORDER BY at")
    fence = sql(c, ns, f"SELECT generation FROM joblease_fence WHERE resource = '{FENCE_LEASE}'")
    first_b = writers.index(b) if b in writers else -1
    if first_b < 0 or any(w != b for w in writers[first_b:]):
        raise JourneyFailed(f"a row of {a} landed after {b}'s first: {writers}")
    if fence != [str(n + 1)]:
        raise JourneyFailed(f"the fence holds generation {fence}, not {n + 1}")
    line = refused.strip().splitlines()[-1]
    return (f"{a} gen {n} frozen → {b} gen {n + 1} after {handover:.1f}s; {a} resumed: "
            f"{line[:120]!r}; {len(writers)} rows, none of {a} after {b}'s first")


# -- 3. a pool Deployment, one pod deleted mid-job -------------------------------------

JOB_SECONDS = 8


def pool_docs(image: str) -> list[dict[str, Any]]:
    """``examples/pool-workers.yaml`` with the built image, this pool, one job at a time.

    Each job's command prints a start and a done line around its work, so the logs show
    which pod ran what, and how many times each command finished.
    """
    docs: list[dict[str, Any]] = list(yaml.safe_load_all(
        (EXAMPLES / "pool-workers.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["image"], container["imagePullPolicy"] = image, "Never"
    command = list(container["command"])
    command[command.index("--selector") + 1] = POOL_SELECTOR
    command[command.index("--concurrency") + 1] = "1"
    cut = command.index("--")
    container["command"] = [*command[:cut + 1], "sh", "-c",
                            f'echo "start $JOBLEASE_NAME $JOBLEASE_TOKEN"; sleep {JOB_SECONDS}; '
                            'echo "done $JOBLEASE_NAME $JOBLEASE_TOKEN"']
    return docs


def pool_jobs(count: int) -> list[dict[str, Any]]:
    """``count`` jobs of the pool: short leases, a short backoff, three attempts."""
    return [{"apiVersion": "joblease.dev/v1alpha1", "kind": "JobLease",
             "metadata": {"name": f"job-{i}", "labels": {"batch": "journey"}},
             "spec": {"leaseDurationSeconds": 6, "maxAttempts": 3,
                      "backoff": {"initialSeconds": 1, "factor": 2, "maxSeconds": 4}}}
            for i in range(count)]


def finished_commands(logs: str) -> list[str]:
    """The jobs whose command printed its done line, once per line (see pool_docs)."""
    return [line.split()[1] for line in logs.splitlines()
            if line.startswith("done ") and len(line.split()) >= 2]


def _running_job(c: Cluster, ns: str, pod: str) -> str | None:
    """The job ``pod`` started last and has not finished, if it is still Held."""
    log = c.logs(ns, pod)
    started = [line.split()[1] for line in log.splitlines() if line.startswith("start ")]
    if not started or started[-1] in finished_commands(log):
        return None
    return started[-1] if c.lease(ns, started[-1]).get("phase") == "Held" else None


def pool_drained(c: Cluster, count: int = 6) -> str:
    """Journey 3; returns its summary line."""
    ns = "journey-pool"
    c.namespace(ns)
    c.apply(pool_docs(c.image), ns)
    wait_for(lambda: sum(ready(p) for p in c.pods(ns, "app=batch-worker")) == 2, 120,
             "two pool workers Ready")
    c.apply(pool_jobs(count), ns)
    began = time.monotonic()
    victim, job = wait_for(lambda: next(
        ((p["metadata"]["name"], j) for p in c.pods(ns, "app=batch-worker")
         if (j := _running_job(c, ns, p["metadata"]["name"]))), None),
        60, "a pool worker to start a job")
    before = c.lease(ns, job)
    finished = finished_commands(c.logs(ns, victim))
    c.run("delete", "pod", victim, "-n", ns, "--grace-period=1", "--wait=false")
    deleted = time.monotonic()
    wait_for(lambda: int(c.lease(ns, job).get("generation", 0)) > int(before["generation"]),
             60, f"{job} claimed again after {victim} was deleted")
    reclaimed = time.monotonic() - deleted
    wait_for(lambda: all(c.lease(ns, f"job-{i}").get("phase") == "Completed"
                         for i in range(count)), 180, f"all {count} jobs Completed")
    drained = time.monotonic() - began
    events = c.get("events", "-n", ns, "--field-selector", f"involvedObject.name={job}")
    reasons = [e.get("reason") for e in events["items"]]
    if "Expired" not in reasons:
        raise JourneyFailed(f"{job} was not Expired after {victim} was deleted: {reasons}")
    for pod in c.pods(ns, "app=batch-worker"):
        finished += finished_commands(c.logs(ns, pod["metadata"]["name"]))
    once = sorted(finished) == sorted(f"job-{i}" for i in range(count))
    if not once:
        raise JourneyFailed(f"the commands that finished are not each job once: {finished}")
    after = c.lease(ns, job)
    return (f"{count} jobs Completed in {drained:.1f}s by a pool of 2 replicas; {victim} "
            f"deleted during {job} (gen {before['generation']}): Expired, claimed again at gen "
            f"{after['generation']} {reclaimed:.1f}s after the delete; each command "
            "finished once")


JOURNEYS: tuple[tuple[str, Callable[[Cluster], str]], ...] = (
    ("leases expired by the operator on its pod IP",
     lambda c: leases_expired(c, "joblease-system")),
    ("two delegated workers, one frozen and refused by the fence", delegated_workers_fenced),
    ("a pool Deployment drains its jobs, one pod deleted mid-job", pool_drained),
)


def run_journeys(c: Cluster) -> tuple[str, str]:
    """Run every journey in order; return ('', '') or (the journey, why it failed)."""
    for name, journey in JOURNEYS:
        began = time.monotonic()
        try:
            summary = journey(c)
        except (JourneyFailed, subprocess.TimeoutExpired, KeyError, ValueError,
                IndexError, StopIteration) as err:
            return name, f"{type(err).__name__}: {err}"
        say(f"passed in {time.monotonic() - began:.1f}s: {name}: {summary}")
    return "", ""


__all__ = ["JOURNEYS", "Cluster", "JourneyFailed", "finished_commands", "no_api_credentials",
           "operator_on_pod_ip", "pool_docs", "postgres_docs", "run_journeys",
           "worker_deployment"]
