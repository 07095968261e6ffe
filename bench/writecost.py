"""What one request of each kind a pool makes costs kube-apiserver and etcd (issue 30).

``python -m bench.writecost [--count N] [--threads T]``. On the suite's local control plane,
``T`` threads send ``N`` requests of one kind, one kind at a time, and the server's CPU
(kube-apiserver + etcd, from ``/proc``) is divided by ``N``:

* ``status write``: a JobLease status merge patch as the floor writes it (``floor_write``:
  conditional, raising the generation; the CRD's schema and CEL rules run);
* ``lease annotation patch``: a merge patch of one annotation of a ``coordination.k8s.io``
  Lease (what a dispatcher writing a worker's inbox would send);
* ``get``: a JobLease read by name (quorum);
* ``list by name``: a list of one JobLease by ``metadata.name`` and a label selector
  (what a worker reading a proposed job of its pool would send);
* ``version``: ``GET /version`` (what a worker's clock calibration sends, tens at start-up);
* ``presence list``: a list of a pool's coordination Leases by label (each worker's
  presence round, every 5 s);
* ``metrics scrape``: kube-apiserver's ``/metrics`` read and parsed as the bench's drains
  read it (``count // 20`` of them), the bench's own cost.

Each kind's ``client_cpu_ms`` is this process's CPU per request (all threads).

Why: the dispatcher's protocol trades one JobLease status write per job (the adoption)
for other requests; which trade pays is a measured question on this host.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench import common
from joblease.domain.lease import Observed
from joblease.kube.api import MERGE_PATCH, KubeApi
from joblease.kube.leases import lease_path
from joblease_localcluster.cluster import LocalCluster

NAMESPACE = "writecost"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/writecost/leases"


def _server_cpu(cluster: LocalCluster) -> float:
    return sum(common.proc_cpu_seconds(p.pid) for p in cluster.processes
               if p.pid is not None and p.name in ("etcd", "kube-apiserver"))


def _phase(cluster: LocalCluster, what: str, count: int, threads: int,
           one: Callable[[int], Any]) -> dict[str, float]:
    cpu, client, began = _server_cpu(cluster), time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(count)))
    wall = time.perf_counter() - began
    per = (_server_cpu(cluster) - cpu) / count
    mine = (time.process_time() - client) / count
    common.progress(f"writecost: {what}: {per * 1000:.2f} ms server CPU each "
                    f"(client {mine * 1000:.2f}), {count / wall:.0f}/s")
    return {"server_cpu_ms": round(per * 1000, 3), "client_cpu_ms": round(mine * 1000, 3),
            "per_s": round(count / wall, 1)}


def measure(cluster: LocalCluster, count: int, threads: int) -> dict[str, Any]:
    """Each kind's server CPU per request (see the module doc)."""
    api = KubeApi.from_kubeconfig(str(cluster.kubeconfig_for("admin")))
    common.create_namespace(api, NAMESPACE)
    names = [f"wc-{i:05d}" for i in range(count)]
    common.create_leases(api, NAMESPACE, names, 30)
    for name in names:
        api.request("PATCH", lease_path(NAMESPACE, name), {"metadata": {"labels": {"p": "x"}}},
                    content_type=MERGE_PATCH)
    observed = {n: Observed.from_object(api.request("GET", lease_path(NAMESPACE, n)).body)
                for n in names}
    inboxes = [f"inbox-{i:02d}" for i in range(threads)]
    for name in inboxes:
        api.request("POST", LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                     "metadata": {"name": name, "labels": {"p": "x"}},
                                     "spec": {"holderIdentity": "bench"}})
    figures = {
        "status write": _phase(cluster, "status write", count, threads,
                               lambda i: common.floor_write(api, NAMESPACE, observed[names[i]],
                                                            "bench")),
        "lease annotation patch": _phase(cluster, "lease annotation patch", count, threads,
                                         lambda i: api.request(
            "PATCH", f"{LEASES}/{inboxes[i % threads]}",
            {"metadata": {"annotations": {"joblease.dev/proposals": json.dumps(
                [[names[i], str(i)], [names[(i + 1) % count], str(i + 1)]])}}},
            content_type=MERGE_PATCH)),
        "get": _phase(cluster, "get", count, threads,
                      lambda i: api.request("GET", lease_path(NAMESPACE, names[i]))),
        "list by name": _phase(cluster, "list by name", count, threads, lambda i: api.request(
            "GET", lease_path(NAMESPACE),
            query={"labelSelector": "p=x", "fieldSelector": f"metadata.name={names[i]}"})),
        "version": _phase(cluster, "version", count, threads,
                          lambda i: api.request("GET", "/version")),
        "presence list": _phase(cluster, "presence list", count, threads,
                                lambda i: api.request("GET", LEASES,
                                                      query={"labelSelector": "p=x"})),
        "metrics scrape": _phase(cluster, "metrics scrape", max(1, count // 20), 1,
                                 lambda i: common.apiserver_requests(cluster)),
    }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=600)
    parser.add_argument("--threads", type=int, default=10)
    args = parser.parse_args(argv)
    with LocalCluster() as cluster:
        common.install_crd(cluster)
        figures = measure(cluster, args.count, args.threads)
    json.dump(figures, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
