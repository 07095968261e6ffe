"""Where the operator's memory goes with N JobLeases: tracemalloc with every frame.

``python -m bench.opmem [--leases 10000] [--frames 64]``: a fresh local control plane, N
JobLeases created, then two operators, each under tracemalloc (``bench/tracemalloc_site``):

1. **start over new JobLeases**: started over the N just created, dumped once it has caught
   up (every JobLease shows a status, it knows all N) and 10 s more;
2. **restart over initialized JobLeases**: that operator stopped, a new one started over the
   same N (now initialized, whichever operator or default did it), dumped the same way.

Each dump is printed grouped by *owner* (the innermost frame outside the standard library and
generated code: who asked for the memory, e.g. kopf for its ``ResourceMemory`` dataclass
instances) and, for comparison with docs/benchmarks.md's older figures, by the *allocating
file*'s package (what one-frame tracemalloc reports), with the owners' top lines. "Caught
up" is judged as in the scale section (bench/opwatch.py), so this works on an operator that
writes nothing per creation too; not "idle", which a traced operator may never reach.
tracemalloc slows the operator and adds its own memory (more with more frames), so the RSS
here is not the benchmark's; the shares are what this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import create_namespace, install_crd, progress
from bench.opwatch import Operator, unstatused
from bench.scale import LABELS
from joblease.kube.api import KubeApi
from joblease.kube.leases import LeaseStore
from joblease_localcluster.cluster import LocalCluster

SITE = Path(__file__).resolve().parent / "tracemalloc_site"
NAMESPACE = "opmem"
SETTLE_SECONDS = 10.0  # after it knows all N: its last events processed, before the dump
Row = tuple[str, str, int, int, int]  # allocating file, owner file, owner line, bytes, blocks


def package_of(filename: str) -> str:
    """A short owner for a source file: the package under site-packages, or its module."""
    parts = Path(filename).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    for top in ("joblease", "bench", "tests"):
        if top in parts:
            at = parts.index(top)
            return "/".join(parts[at:at + 3]) if top == "joblease" else top
    if filename.startswith("<"):
        return filename
    return "stdlib:" + Path(filename).stem


def short(filename: str) -> str:
    """A file's path from its package on (no machine-specific prefix)."""
    if "site-packages/" in filename:
        return filename.split("site-packages/")[-1]
    parts = Path(filename).parts
    for top in ("joblease", "bench", "tests"):
        if top in parts:
            return "/".join(parts[parts.index(top):])
    return filename if filename.startswith("<") else "stdlib:" + Path(filename).name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.opmem", description=__doc__)
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--frames", type=int, default=64,
                        help="tracemalloc frames per allocation (1 = the old one-frame view)")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the control plane and the operator are stopped, not orphaned
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="joblease-opmem-"))
    timeout = 0.2 * args.leases + 300  # tracemalloc with all frames is slow
    with LocalCluster() as cluster:
        install_crd(cluster)
        kubeconfig = str(cluster.kubeconfig_for("admin"))
        api = KubeApi.from_kubeconfig(kubeconfig)
        create_namespace(api, NAMESPACE)
        store = LeaseStore(api)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: store.create(NAMESPACE, f"m-{i:06d}",
                                                 {"leaseDurationSeconds": 30}, LABELS),
                          range(args.leases)))
        progress(f"opmem: created {args.leases}")
        dumps = {}
        for phase in ("start over new JobLeases", "restart over initialized JobLeases"):
            progress(f"opmem: {phase}: operator under tracemalloc ({args.frames} frames)")
            dumps[phase] = _traced_run(api, kubeconfig, work, phase, args.leases, args.frames,
                                       timeout)
        api.close()
    for phase, (rows, rss, hwm) in dumps.items():
        _print(phase, rows, rss, hwm, args.leases, args.frames)
    return 0


def _traced_run(api: KubeApi, kubeconfig: str, work: Path, phase: str, leases: int,
                frames: int, timeout: float) -> tuple[list[Row], float, float]:
    dump = work / f"tracemalloc-{phase.split()[0]}.json"
    pythonpath = os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")]))
    op = Operator(kubeconfig, work / "operator.log", NAMESPACE, extra_env={
        "PYTHONPATH": pythonpath, "JOBLEASE_TRACEMALLOC_OUT": str(dump),
        "JOBLEASE_TRACEMALLOC_FRAMES": str(frames)})
    try:
        op.launch(timeout=300)
        began = time.monotonic()
        last_report = began
        while unstatused(api, NAMESPACE) and time.monotonic() < began + timeout:
            op.alive()
            if time.monotonic() - last_report >= 10:
                last_report = time.monotonic()
                progress(f"opmem: {phase}: {last_report - began:.0f}s, some JobLeases still "
                         f"without a status, RSS {op.rss_mb()[0]:.0f} MB")
            time.sleep(2)
        # not "idle" as in the scale section: under tracemalloc with every frame the
        # operator's passes cost several times more, so it may never get under that bound
        while (op.known() or 0) < leases and time.monotonic() < began + timeout:
            op.alive()
            time.sleep(2)
        time.sleep(SETTLE_SECONDS)
        progress(f"opmem: {phase}: knows all {leases} after {time.monotonic() - began:.0f}s "
                 f"(+{SETTLE_SECONDS:.0f}s); dumping")
        rss, hwm = op.rss_mb()
        os.kill(op.pid, signal.SIGUSR2)
        for _ in range(600):
            if dump.exists():
                break
            time.sleep(0.5)
    finally:
        op.stop()
    rows = [(str(a), str(b), int(c), int(d), int(e)) for a, b, c, d, e in
            json.loads(dump.read_text())]
    return rows, rss, hwm


def _print(phase: str, rows: list[Row], rss: float, hwm: float, leases: int,
           frames: int) -> None:
    total = sum(r[3] for r in rows)
    print(f"\n## {phase}: operator with {leases} JobLeases under tracemalloc ({frames} "
          f"frames)\n\nRSS {rss:.0f} MB (peak {hwm:.0f} MB), traced Python allocations "
          f"{total / 2**20:.1f} MB ({total / leases / 1024:.2f} KB per lease)\n")
    for title, column in (("owner (innermost frame outside the standard library)", 1),
                          ("allocating file's package (the one-frame view)", 0)):
        by: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for row in rows:
            entry = by[package_of(str(row[column]))]
            entry[0] += row[3]
            entry[1] += row[4]
        print(f"| {title} | MB | KB per lease | blocks |\n|---|---|---|---|")
        for owner, (size, blocks) in sorted(by.items(), key=lambda kv: -kv[1][0])[:20]:
            print(f"| {owner} | {size / 2**20:.1f} | {size / leases / 1024:.2f} | {blocks} |")
        print()
    lines: dict[str, int] = defaultdict(int)
    for _inner, owner, line, size, _blocks in rows:
        lines[f"{short(owner)}:{line}"] += size
    print("| owner line | MB | KB per lease |\n|---|---|---|")
    for where, size in sorted(lines.items(), key=lambda kv: -kv[1])[:25]:
        print(f"| {where} | {size / 2**20:.1f} | {size / leases / 1024:.2f} |")


if __name__ == "__main__":
    raise SystemExit(main())
