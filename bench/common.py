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
from pathlib import Path
from typing import Any

from tests.support.paths import CRD, REPO

from joblease.kube.api import KubeApi
from joblease.kube.leases import LeaseStore, lease_path

__all__ = ["CRD", "REPO"]  # re-exported: the bench's modules take them from here
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


def apiserver_requests(cluster: Any) -> dict[tuple[str, str, str, str], float]:
    """kube-apiserver's `apiserver_request_total`, summed by (verb, resource, subresource, code).

    The metric has no user-agent or user label, so callers attribute writes by
    subtracting the requests they sent themselves (they know exactly how many).
    """
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    req = urllib.request.Request(f"{cluster.server}/metrics",
                                 headers={"Authorization": f"Bearer {cluster.token_for('admin')}"})
    with urllib.request.urlopen(req, context=context, timeout=30) as reply:
        text = reply.read().decode()
    totals: dict[tuple[str, str, str, str], float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line[len("apiserver_request_total{"):].rpartition("} ")
        labels = dict(part.split("=", 1) for part in _split_labels(labels_text))
        key = (labels.get("verb", ""), labels.get("resource", ""),
               labels.get("subresource", ""), labels.get("code", ""))
        totals[key] = totals.get(key, 0.0) + float(value)
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
