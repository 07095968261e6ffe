"""Where the operator's memory goes with N JobLeases: tracemalloc grouped by module.

``python -m bench.opmem [--leases 10000]``: a fresh local control plane, N JobLeases
created, then the operator started under tracemalloc (``bench/tracemalloc_site``); once it
has initialized all of them, its live Python allocations are dumped and printed grouped by
package (kopf, joblease, aiohttp, the standard library, ...) with the process's RSS.
tracemalloc itself slows the operator and adds its own memory, so the RSS here is not the
benchmark's; the shares are what this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import create_namespace, install_crd, progress
from bench.scale import LABELS, Operator
from joblease.kube.api import KubeApi
from joblease.kube.leases import LeaseStore
from joblease_localcluster.cluster import LocalCluster

SITE = Path(__file__).resolve().parent / "tracemalloc_site"


def package_of(filename: str) -> str:
    """A short owner for a source file: the package under site-packages, or its module."""
    parts = Path(filename).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    for top in ("joblease", "bench", "tests"):
        if top in parts:
            at = parts.index(top)
            return "/".join(parts[at:at + 3]) if top == "joblease" else top
    return "stdlib:" + Path(filename).stem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.opmem", description=__doc__)
    parser.add_argument("--leases", type=int, default=10_000)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="joblease-opmem-"))
    dump = work / "tracemalloc.json"
    with LocalCluster() as cluster:
        install_crd(cluster)
        kubeconfig = str(cluster.kubeconfig_for("admin"))
        api = KubeApi.from_kubeconfig(kubeconfig)
        create_namespace(api, "opmem")
        store = LeaseStore(api)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: store.create("opmem", f"m-{i:06d}",
                                                 {"leaseDurationSeconds": 30}, LABELS),
                          range(args.leases)))
        progress(f"opmem: created {args.leases}")
        pythonpath = os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))
        op = Operator(kubeconfig, work / "operator.log", "opmem", extra_env={
            "PYTHONPATH": pythonpath, "JOBLEASE_TRACEMALLOC_OUT": str(dump)})
        deadline = time.monotonic() + 0.1 * args.leases + 120
        while op.writes("initialized") < args.leases and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(5)  # the last events and Events drain
        rss, hwm = op.rss_mb()
        os.kill(op.pid, signal.SIGUSR2)
        for _ in range(120):
            if dump.exists():
                break
            time.sleep(0.5)
        op.stop()
        api.close()
    rows = json.loads(dump.read_text())
    by: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for filename, size, blocks in rows:
        entry = by[package_of(filename)]
        entry[0] += size
        entry[1] += blocks
    total = sum(size for size, _ in by.values())
    print(f"operator with {args.leases} JobLeases under tracemalloc: RSS {rss:.0f} MB "
          f"(peak {hwm:.0f} MB), traced Python allocations {total / 2**20:.1f} MB "
          f"({total / args.leases / 1024:.2f} KB per lease)")
    print("| owner (file's package) | MB | KB per lease | blocks |\n|---|---|---|---|")
    for owner, (size, blocks) in sorted(by.items(), key=lambda kv: -kv[1][0])[:20]:
        print(f"| {owner} | {size / 2**20:.1f} | {size / args.leases / 1024:.2f} | {blocks} |")
    files = sorted(rows, key=lambda r: -r[1])[:15]
    print("\n| file | MB |\n|---|---|")
    for filename, size, _ in files:
        print(f"| {filename.split('site-packages/')[-1].split('/operator/')[-1]} | "
              f"{size / 2**20:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
