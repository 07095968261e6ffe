"""CPU readings from ``/proc``, with nothing but the standard library (Linux).

Apart from ``bench.common`` so that a unit test can load it by its path: ``common`` imports
the suite's support code and the product.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (``/proc/PID/stat``; 0 if gone).

    Why from /proc and not from the process's own metrics: the same reading works for any
    version of the operator, and reading it costs the measured process nothing.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rpartition(")")[2].split()  # the command name may contain spaces
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def host_cpu_seconds() -> tuple[float, float]:
    """(busy, all) CPU seconds of every CPU of the host since boot, from ``/proc/stat``.

    Busy is user + nice + system + irq + softirq + steal; all adds idle and iowait. The
    difference of two readings says how much of the host a phase used, whoever used it.
    """
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    tick = os.sysconf("SC_CLK_TCK")
    busy = user + nice + system + irq + softirq + steal
    return busy / tick, (busy + idle + iowait) / tick


class CpuWindow:
    """Where the host's CPU went between two readings: the cluster's processes and the rest.

    Why: the pool's drain is compared with a floor on a 2-CPU host, and what bounds the ratio
    is the CPU each job costs everyone (kube-apiserver, etcd, the clients), not only the
    clients. ``close`` returns CPU seconds per process name (``etcd``, ``kube-apiserver``, …)
    and the host's busy and total seconds over the window.
    """

    def __init__(self, cluster: Any) -> None:
        self._pids = {p.name: p.pid for p in cluster.processes if p.pid}
        self._start = self._read()

    def _read(self) -> tuple[float, float, float, dict[str, float]]:
        busy, total = host_cpu_seconds()
        return (time.monotonic(), busy, total,
                {name: proc_cpu_seconds(pid) for name, pid in self._pids.items()})

    def close(self) -> dict[str, Any]:
        """The window's figures (call once)."""
        at, busy, total, procs = self._read()
        at0, busy0, total0, procs0 = self._start
        return {"seconds": at - at0, "host_busy_cpu_s": busy - busy0,
                "host_cpu_s": total - total0,
                "busy_fraction": (busy - busy0) / (total - total0) if total > total0 else 0.0,
                "processes_cpu_s": {n: procs[n] - procs0.get(n, 0.0) for n in procs}}
