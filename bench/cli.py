"""6. The CLI's wall time per verb, side by side with `kubectl get jl` (issue 18, item 5).

Every measurement is a whole process, as a user or a script pays it: interpreter start,
imports, kubeconfig, TLS handshake, the requests, the output. Verbs are interleaved (each
round runs every command once, in a shuffled order) so background load hits all alike,
and the median of N rounds is reported with p90 and the child's CPU time (user + system),
which load on a shared machine disturbs less than wall time.

Rows:
* ``kubectl get jl`` / ``kubectl get jl NAME``: the floor a Go binary sets on this machine.
* ``get``, ``ls``, ``describe``: no calibration, light transport (``joblease.kube.lite``).
* ``get (kubernetes client)``: the same ``get`` with ``JOBLEASE_KUBE_CLIENT=kubernetes``,
  i.e. what the light transport saves.
* ``claim``: a successful claim of a fresh lease each round (one read, one CAS write).
* ``claim (held, refused)``: a claim that finds the lease held (exit 3).

Bytecode: the product's modules are compiled first (``compileall``), as a wheel install
does. Without it, under ``PYTHONDONTWRITEBYTECODE=1`` (set in some shells and CI images)
an editable install recompiles about 14 modules on every call, 35-100 ms of CPU that no
installed CLI pays.

Targets (this machine): ``get`` ≤ 0.3 s, ``claim`` ≤ 0.5 s (median wall).
"""

from __future__ import annotations

import compileall
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from typing import Any

import joblease
from bench.common import create_leases, progress, summary
from joblease.kube.api import KubeApi
from joblease.sdk.client import LeaseClient
from joblease_localcluster import build

TARGETS = {"get": 0.3, "claim": 0.5}


def _timed(argv: list[str], env: dict[str, str], ok: tuple[int, ...]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def run(kubeconfig: str, namespace: str, rounds: int) -> dict[str, Any]:
    compileall.compile_dir(os.path.dirname(joblease.__file__), quiet=1)
    api = KubeApi.from_kubeconfig(kubeconfig)
    create_leases(api, namespace, ["show", "held"] + [f"fresh-{i}" for i in range(rounds)],
                  duration=600)
    LeaseClient(namespace, api=api, calibrate=False).claim("held", "bench-holder")
    LeaseClient(namespace, api=api, calibrate=False).claim("show", "bench-holder")
    api.close()
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    env.pop("JOBLEASE_KUBE_CLIENT", None)
    full_env = {**env, "JOBLEASE_KUBE_CLIENT": "kubernetes"}
    jl = [sys.executable, "-m", "joblease.cli"]
    binary = build.find_binary("kubectl") or shutil.which("kubectl")
    if binary is None:
        raise RuntimeError("no kubectl: `make control-plane` builds it")
    kubectl = [str(binary), "--kubeconfig", kubeconfig, "-n", namespace]
    ns = ["-n", namespace]
    commands: dict[str, Any] = {
        "kubectl get jl": lambda i: ([*kubectl, "get", "jl"], env, (0,)),
        "kubectl get jl NAME": lambda i: ([*kubectl, "get", "jl", "show"], env, (0,)),
        "get": lambda i: ([*jl, "get", "show", *ns], env, (0,)),
        "get (kubernetes client)": lambda i: ([*jl, "get", "show", *ns], full_env, (0,)),
        "ls": lambda i: ([*jl, "ls", *ns], env, (0,)),
        "describe": lambda i: ([*jl, "describe", "show", *ns], env, (0,)),
        "claim": lambda i: ([*jl, "claim", f"fresh-{i}", "--holder", "bench", *ns], env,
                            (0,)),
        "claim (held, refused)": lambda i: ([*jl, "claim", "held", "--holder", "other", *ns],
                                            env, (3,)),
    }
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    # one unmeasured round: the page cache and .pyc files are warm for every command alike
    for name, make in commands.items():
        if name != "claim":
            _timed(*make(0))
    for i in range(rounds):
        order = list(commands)
        random.shuffle(order)
        for name in order:
            wall, cpu = _timed(*commands[name](i))
            walls[name].append(wall)
            cpus[name].append(cpu)
        if (i + 1) % max(1, rounds // 4) == 0:
            progress(f"cli: round {i + 1}/{rounds}")
    out: dict[str, Any] = {"rounds": rounds, "verbs": {}}
    for name in commands:
        out["verbs"][name] = {"wall_s": summary(walls[name]), "cpu_s": summary(cpus[name])}
    for verb, target in TARGETS.items():
        out["verbs"][verb]["target_s"] = target
        out["verbs"][verb]["met"] = out["verbs"][verb]["wall_s"]["p50"] <= target
    return out
