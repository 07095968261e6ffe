"""Only the pool bench's dispatched urgent-job section, repeated (issue 30).

``python -m bench.urgent_rounds [--attempts N] [--workers W] [--rounds R]``: on the suite's
local control plane, ``bench.pool._urgent`` N times (a namespace each: W dispatched
workers busy with ``sleep 1`` jobs, R urgent jobs each created while they are busy),
printing each attempt's waits from a worker freeing to the urgent job's claim (and the
same waits with no slot excused, the slots excused, the slots busy at each creation). Why: the
wait's maximum is one round of eight, and a stalled worker shows as one round of about
11 s (docs/safety.md #54), which one full bench run catches about half the time.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench import common, pool
from joblease.kube.api import KubeApi
from joblease_localcluster.cluster import LocalCluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=pool.URGENT_ROUNDS)
    args = parser.parse_args()
    pool._product()  # compiles the product's modules, as an install would
    with LocalCluster() as cluster, tempfile.TemporaryDirectory() as logs:
        common.install_crd(cluster)
        kubeconfig = str(cluster.kubeconfig_for("admin"))
        api = KubeApi.from_kubeconfig(kubeconfig)
        for attempt in range(args.attempts):
            namespace = f"urgent-rounds-{attempt}"
            common.create_namespace(api, namespace)
            out = pool._urgent(cluster, api, kubeconfig, namespace, args.workers, args.rounds,
                               Path(logs))
            print(json.dumps({"attempt": attempt, "max_s": round(out["wait_s"]["max"], 3),
                              "waits_s": [round(s["wait_s"], 3) for s in out["samples"]],
                              "unexcused_s": [round(s["wait_s_unexcused"], 3)
                                              for s in out["samples"]],
                              "decided_unseen": [s["decided_unseen"] for s in out["samples"]],
                              "busy": [s["busy"] for s in out["samples"]]}),
                  flush=True)


if __name__ == "__main__":
    main()
