"""4. Handover after the holder dies (SIGKILL), joblease versus the peer, side by side.

Per round and lease duration D: K leases held by one joblease holder process and K Lease
locks held by one peer holder process (the ``kubernetes`` client's leader election with
``LeaseLock``, client-go's default proportions at duration D). A claimer process per
system waits on the same names. Both holders get SIGKILL at the same instant, at a random
phase of their renewal cycle. Handover = the claimer's wall-clock time right after its
successful write minus the dead holder's last ``leaseUntil`` (joblease: ``status.leaseUntil``;
peer: ``spec.renewTime + leaseDurationSeconds``), both read after the kill. Everything
runs on this machine, so the API server's clock and the processes' clocks are one clock.
"""

from __future__ import annotations

import json
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from typing import IO, Any

from bench.common import REPO, progress, summary
from joblease.domain.lease import parse_time
from joblease.kube.api import KubeApi
from joblease.kube.leases import LeaseStore


class Worker:
    """One ``bench.handover_worker`` process, its stdout lines read by a thread."""

    def __init__(self, mode: str, kubeconfig: str, namespace: str, names: list[str],
                 duration: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.handover_worker", mode, "--kubeconfig", kubeconfig,
             "--namespace", namespace, "--names", ",".join(names), "--duration", str(duration)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.mode = mode
        self.margins: list[float] = []
        self.lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line.strip())

    def line(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=max(0.01, timeout))
        except queue.Empty:
            err = ""
            if self.proc.poll() is not None and self.proc.stderr is not None:
                err = self.proc.stderr.read()[-2000:]
            raise TimeoutError(f"{self.mode}: no output in time (exit {self.proc.poll()}) "
                               f"{err}") from None

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.line(deadline - time.monotonic()) == "READY":
                return
        raise TimeoutError(f"{self.mode}: not READY in {timeout}s")

    def results(self, count: int, timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        won: dict[str, float] = {}
        while len(won) < count and time.monotonic() < deadline:
            data = json.loads(self.line(deadline - time.monotonic()))
            won[data["name"]] = float(data["won_at"])
            if "margin" in data:
                self.margins.append(float(data["margin"]))
        return won

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _peer_until(api: KubeApi, namespace: str, name: str) -> float:
    body = api.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}").body
    spec = body["spec"]
    assert spec["holderIdentity"] == "holder", spec
    renew: datetime = parse_time(spec["renewTime"])
    return (renew + timedelta(seconds=int(spec["leaseDurationSeconds"]))).timestamp()


def run(kubeconfig: str, namespace: str, durations: list[int], rounds: int, per_round: int
        ) -> dict[str, Any]:
    api = KubeApi.from_kubeconfig(kubeconfig)
    store = LeaseStore(api)
    rng = random.Random(66)
    out: dict[str, Any] = {"per_round": per_round, "rounds": rounds, "durations": {}}
    for duration in durations:
        samples: dict[str, list[float]] = {"ours": [], "peer": []}
        margins: list[float] = []
        for r in range(rounds):
            ours = [f"jl-{duration}s-{r}-{i}" for i in range(per_round)]
            peers = [f"le-{duration}s-{r}-{i}" for i in range(per_round)]
            for name in ours:
                store.create(namespace, name, {"leaseDurationSeconds": duration})
            workers: list[Worker] = []
            try:
                holders = [Worker("ours-holder", kubeconfig, namespace, ours, duration),
                           Worker("peer-holder", kubeconfig, namespace, peers, duration)]
                workers += holders
                for w in holders:
                    w.wait_ready(120)
                claimers = [Worker("ours-claimer", kubeconfig, namespace, ours, duration),
                            Worker("peer-claimer", kubeconfig, namespace, peers, duration)]
                workers += claimers
                for w in claimers:
                    w.wait_ready(120)
                time.sleep(duration / 3 + rng.uniform(0, duration / 3))  # random phase
                for w in holders:
                    w.kill()
                time.sleep(0.5)  # an in-flight renewal lands or dies
                until = {n: store.get(namespace, n).status.lease_until for n in ours}
                peer_until = {n: _peer_until(api, namespace, n) for n in peers}
                won = claimers[0].results(per_round, duration * 3 + 60)
                peer_won = claimers[1].results(per_round, duration * 3 + 60)
                margins += claimers[0].margins
            finally:
                for w in workers:
                    w.kill()
            for n in ours:
                end = until[n]
                if n in won and end is not None:
                    samples["ours"].append(won[n] - end.timestamp())
            for n in peers:
                if n in peer_won:
                    samples["peer"].append(peer_won[n] - peer_until[n])
            missing = (2 * per_round - len(won) - len(peer_won))
            progress(f"handover {duration}s lease, round {r + 1}/{rounds}: joblease p50 "
                     f"{summary(samples['ours'])['p50']:.2f}s, peer p50 "
                     f"{summary(samples['peer'])['p50']:.2f}s so far"
                     + (f"; {missing} claims did not happen in time" if missing else ""))
        out["durations"][str(duration)] = {
            "ours": summary(samples["ours"]), "peer": summary(samples["peer"]),
            "samples": samples, "margin": summary(margins),
            "peer_settings": {"lease_duration": duration,
                              "renew_deadline": max(2, round(duration * 10 / 15)),
                              "retry_period": max(1, round(duration * 2 / 15))}}
    api.close()
    return out
