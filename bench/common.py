"""Shared helpers: progress output, statistics, the cluster's own metrics, object set-up."""

from __future__ import annotations

import json
import math
import os
import ssl
import sys
import time
import urllib.request
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.support.paths import CRD, REPO

from bench.procstat import CpuWindow, host_cpu_seconds, proc_cpu_seconds
from joblease.domain.lease import LeaseStatus, Observed, Phase
from joblease.kube.api import MERGE_PATCH, KubeApi
from joblease.kube.leases import LeaseStore, lease_path

__all__ = ["CRD", "REPO", "CpuWindow", "host_cpu_seconds", "proc_cpu_seconds"]  # re-exported:
# the bench's modules take them from here
RESULTS = Path(__file__).resolve().parent / "results"
_T0 = time.monotonic()


def progress(message: str) -> None:
    """One progress line on stderr, with the seconds since the bench started."""
    print(f"[bench {time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def loadavg() -> str:
    """The 1/5/15-minute load averages (what `uptime` prints)."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN when empty."""
    data = sorted(values)
    if not data:
        return math.nan
    pos = (len(data) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return data[low] + (data[high] - data[low]) * (pos - low)


def summary(values: list[float]) -> dict[str, float]:
    """n, p50, p90, p99, mean, max of a sample."""
    return {"n": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99),
            "mean": sum(values) / len(values) if values else math.nan,
            "max": max(values) if values else math.nan}


def proc_rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MB (zeros if it is gone)."""
    fields: dict[str, float] = {}
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0, 0.0
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = float(rest.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


def reset_peak_rss(pid: int) -> bool:
    """Reset a process's ``VmHWM`` to its current RSS, so the next peak is one phase's own.

    Writes ``5`` to ``/proc/PID/clear_refs`` (Linux 4.0+; only for a process we may
    ptrace, i.e. our own child). Returns whether it worked; if not, ``VmHWM`` stays the
    process's lifetime peak and the phase's peak is only what the RSS samples saw.
    """
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def install_crd(cluster: Any) -> None:
    """Apply the canonical CRD and wait until the API server serves it."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD), check=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/jobleases.joblease.dev", check=True)


def create_namespace(api: KubeApi, name: str) -> None:
    """Create a namespace (409 if it exists is fine)."""
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    try:
        api.request("POST", "/api/v1/namespaces", body)
    except Exception as err:  # an existing namespace is fine
        if "AlreadyExists" not in str(err) and "409" not in str(err):
            raise


def create_leases(api: KubeApi, namespace: str, names: list[str], duration: int) -> None:
    """POST JobLeases (no status: as a user's `kubectl apply` would leave them)."""
    store = LeaseStore(api)
    for name in names:
        store.create(namespace, name, {"leaseDurationSeconds": duration})


def floor_write(api: KubeApi, namespace: str, obs: Observed, holder: str) -> Observed:
    """One write of the floor: a bare conditional merge patch of a Held-shaped status.

    It carries the cached ``resourceVersion`` (a compare-and-swap, as every protocol write
    is) and raises the generation by one, so the CRD's rules accept it, but reads nothing and
    decides nothing: the cheapest write the protocol could possibly make. Returns the new
    version, the next call's cache.
    """
    now = api.server_now().midpoint
    # a claimed status needs an epoch (CRD rule); the first write sets it
    epoch = obs.status.epoch if obs.status.epoch is not None else int(obs.resource_version)
    status = LeaseStatus(phase=Phase.HELD, holder=holder, generation=obs.status.generation + 1,
                         epoch=epoch, acquire_time=now, renew_time=now,
                         lease_until=now + timedelta(seconds=30))
    patch = {"metadata": {"resourceVersion": obs.resource_version}, "status": status.to_dict()}
    return Observed.from_object(api.request("PATCH", lease_path(namespace, obs.name, "status"),
                                            patch, content_type=MERGE_PATCH).body)


def apiserver_metric(cluster: Any, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of one metric family in kube-apiserver's ``/metrics``: (labels, value)."""
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    req = urllib.request.Request(f"{cluster.server}/metrics",
                                 headers={"Authorization": f"Bearer {cluster.token_for('admin')}"})
    with urllib.request.urlopen(req, context=context, timeout=30) as reply:
        text = reply.read().decode()
    prefix = name + "{"
    samples: list[tuple[dict[str, str], float]] = []
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        labels_text, _, value = line[len(prefix):].rpartition("} ")
        labels = dict(part.split("=", 1) for part in _split_labels(labels_text))
        samples.append((labels, float(value)))
    return samples


def apiserver_requests(cluster: Any) -> dict[tuple[str, str, str, str], float]:
    """kube-apiserver's `apiserver_request_total`, summed by (verb, resource, subresource, code).

    The metric has no user-agent or user label, so callers attribute writes by
    subtracting the requests they sent themselves (they know exactly how many).
    """
    totals: dict[tuple[str, str, str, str], float] = {}
    for labels, value in apiserver_metric(cluster, "apiserver_request_total"):
        key = (labels.get("verb", ""), labels.get("resource", ""),
               labels.get("subresource", ""), labels.get("code", ""))
        totals[key] = totals.get(key, 0.0) + value
    return totals


def _split_labels(text: str) -> list[str]:
    parts = [p for p in text.split('",') if p]
    return [p.replace('"', "") for p in parts]


def count(totals: dict[tuple[str, str, str, str], float], *, verbs: tuple[str, ...],
          resource: str, subresource: str | None = None, code: str | None = None) -> float:
    """Sum of `apiserver_request_total` entries matching the filters."""
    return sum(v for (verb, res, sub, c), v in totals.items()
               if verb in verbs and res == resource
               and (subresource is None or sub == subresource) and (code is None or c == code))


WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")


def delete_namespace(api: KubeApi, name: str) -> None:
    """Delete a namespace without waiting (best effort)."""
    try:
        api.request("DELETE", f"/api/v1/namespaces/{name}")
    except Exception as err:  # best effort clean-up
        progress(f"could not delete namespace {name}: {err}")


def list_leases(api: KubeApi, namespace: str) -> list[dict[str, Any]]:
    """Every JobLease object in a namespace (raw dicts), paginated."""
    items: list[dict[str, Any]] = []
    token = ""
    for _ in range(10_000):  # bounded: 500 per page
        query = {"limit": "500", **({"continue": token} if token else {})}
        body = api.request("GET", lease_path(namespace), query=query, timeout=60).body
        items.extend(body.get("items", []))
        token = body.get("metadata", {}).get("continue", "")
        if not token:
            break
    return items


def write_json(path: Path, data: Any) -> None:
    """Write JSON (creating the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
