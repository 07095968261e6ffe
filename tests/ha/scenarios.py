"""HA scenarios on real processes: a recorded lease workload, faults, skewed Dates, figures.

The workload runs worker *threads*, each with its own ``LeaseClient`` (own connection pool,
own server-clock estimate), so each one reaches the API servers through the load balancer
like a separate process would. Every operation is recorded with the fault suite's
``Recorder`` and judged by its checker (``tests/faults/checker.py``). The recorder's
server-time bounds are the *honest* servers' clock: every kube-apiserver here runs on this
machine, so its clock is ``time.time()``; a skew proxy only changes what clients *see*.
So the checker's timing properties (overlap, used-past-expiry) are judged on the clock
that matters, not on the clients' possibly fooled estimates.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from joblease.domain.errors import LeaseError, LeaseFinishedError
from joblease.fencing.errors import StaleTokenError
from joblease.fencing.filestore import FencedFileStore
from joblease.kube.api import KubeApi
from joblease.sdk.client import Lease, LeaseClient
from joblease_localcluster import certs
from joblease_localcluster.dateskew import DateSkewProxy
from joblease_localcluster.ha import HACluster
from joblease_localcluster.lb import LoadBalancer

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:  # the fault suite's recorder and checker, however we were started
    sys.path.insert(0, _TESTS)

from faults.checker import Violation, check  # noqa: E402
from faults.history import OK, REFUSED, UNKNOWN, Recorder, load  # noqa: E402
from support.paths import CRD  # noqa: E402
from support.waiting import retry  # noqa: E402

FENCING_KINDS = ("token-order", "target-order", "stale-accepted", "reopened",
                 "completion-lost")


def install_crd(cluster: HACluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD), check=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/jobleases.joblease.dev", check=True)


def honest_ms() -> tuple[float, float]:
    now = time.time() * 1000.0
    return now, now


def kubeconfig_via(cluster: HACluster, port: int, name: str) -> Path:
    """A copy of the admin kubeconfig that names 127.0.0.1:``port`` (another LB)."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path = cluster.dir / f"kubeconfig-{name}"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def client(kubeconfig: Path, namespace: str, skew: float | None = None) -> LeaseClient:
    api = KubeApi.from_kubeconfig(str(kubeconfig))
    c = LeaseClient(namespace, api=api,
                    max_server_skew=None if skew is None else timedelta(seconds=skew))
    c.calibrate()  # before anything is recorded (margin() never calibrates)
    return c


@dataclass
class Workload:
    """Worker threads claiming, writing (fenced), renewing and releasing a few leases."""

    kubeconfig: Path
    namespace: str
    run_dir: Path
    leases: int = 3
    workers: int = 4
    duration: int = 2
    skew: float | None = None
    seed: int = 0
    stats: dict[str, int] = field(default_factory=lambda: {"claims": 0, "unknown": 0})
    clocks: list[dict[str, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def names(self) -> list[str]:
        return [f"job-{self.seed}-{i}" for i in range(self.leases)]

    def start(self) -> Workload:
        setup = client(self.kubeconfig, self.namespace, self.skew)
        for name in self.names():
            retry(lambda n=name: setup.store.create(  # type: ignore[misc]
                self.namespace, n, {"leaseDurationSeconds": self.duration}))
        setup.api.close()
        self.store = FencedFileStore(self.run_dir / "target")
        for i in range(self.workers):
            t = threading.Thread(target=self._work, args=(f"w{i}",), daemon=True)
            self._threads.append(t)
            t.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] = self.stats.get(key, 0) + 1

    def _work(self, who: str) -> None:
        rng = random.Random(f"{self.seed}-{who}")
        c = retry(lambda: client(self.kubeconfig, self.namespace, self.skew))
        rec = Recorder(self.run_dir / "history" / f"{who}.jsonl", who, honest_ms)
        try:
            while not self._stop.is_set():
                name = rng.choice(self.names())
                lease = self._op(rec, "claim", name, {"holder": who},
                                 lambda n=name: c.claim(n, who))  # type: ignore[misc]
                if isinstance(lease, Lease):
                    self._count("claims")
                    self._hold(rec, c, lease, who, rng)
                else:
                    time.sleep(rng.uniform(0.05, 0.3))
        finally:
            with self._lock:
                self.clocks.append({"jumps": c.api.clock.jumps,
                                    "switches": c.api.clock.switches,
                                    "max_gap": c.api.clock.max_gap})
            rec.close()
            c.api.close()

    def _hold(self, rec: Recorder, c: LeaseClient, lease: Lease, who: str,
              rng: random.Random) -> None:
        held = {"holder": who, "generation": lease.generation, "epoch": lease.token.epoch}
        for step in range(rng.randint(1, 3)):
            if not lease.valid() or self._stop.is_set():
                return
            tok = lease.token
            self._op(rec, "write", lease.name,
                     {"holder": who, "token": [tok.epoch, tok.generation],
                      "key": f"{who}-{tok.generation}-{step}"},
                     lambda t=tok, s=step: self.store.put(  # type: ignore[misc]
                         lease.name, t, f"{who}-{t.generation}-{s}", {"by": who}))
            time.sleep(rng.uniform(0.05, 0.4))
            if not lease.valid():
                return
            if self._op(rec, "renew", lease.name, held, lease.renew) is None:
                return
        end = rng.random()
        if end < 0.15:
            return  # walk away: the next claimer must wait for expiry
        self._op(rec, "release", lease.name, held, lease.release)

    def _op(self, rec: Recorder, op: str, lease: str, args: dict[str, Any],
            action: Callable[[], Any]) -> Any:
        op_id = rec.invoke(op, lease, **args)
        try:
            out = action()
        except (LeaseError, StaleTokenError, LeaseFinishedError) as err:
            rec.complete(op_id, REFUSED, error=type(err).__name__)
            return None
        except Exception as err:
            self._count("unknown")
            rec.complete(op_id, UNKNOWN, error=type(err).__name__, message=str(err)[:200])
            return None
        result: dict[str, Any] = {}
        if isinstance(out, Lease):
            result = {"generation": out.generation, "epoch": out.token.epoch,
                      "lease_until": out.lease_until.timestamp() * 1000.0
                      if out.lease_until else None}
        elif op == "renew":
            lease_obj = action.__self__  # type: ignore[attr-defined]
            result = {"generation": lease_obj.generation,
                      "lease_until": lease_obj.lease_until.timestamp() * 1000.0}
        rec.complete(op_id, OK, **result)
        return out if out is not None else True

    def judge(self) -> tuple[list[Violation], int]:
        """Final read of every lease (recorded), then the fault suite's checker."""
        c = client(self.kubeconfig, self.namespace)
        rec = Recorder(self.run_dir / "history" / "final.jsonl", "final", honest_ms)
        for name in self.names():
            op_id = rec.invoke("read", name)
            st = retry(lambda n=name: c.get(n)).status  # type: ignore[misc]
            rec.complete(op_id, OK, phase=st.phase.value, holder=st.holder,
                         generation=st.generation, epoch=st.epoch,
                         completion=None)
        rec.close()
        c.api.close()
        ops = load(self.run_dir / "history")
        return check(ops), len(ops)


def fencing(violations: list[Violation]) -> list[Violation]:
    return [v for v in violations if v.kind in FENCING_KINDS]


# -- skew ------------------------------------------------------------------------------------

class SkewedFront:
    """A load balancer over [api-0, api-1, proxy→api-2] with api-2's Date shifted."""

    def __init__(self, cluster: HACluster, offset: float) -> None:
        self.cluster = cluster
        pki = cluster.dir / "pki"
        name = f"dateskew-{abs(int(offset * 1000))}"
        pair = certs.make_serving_cert(certs.KeyPair(pki / "ca.crt", pki / "ca.key"), pki, name)
        self.proxy = DateSkewProxy(cluster.apiserver_ports[2], pki / "ca.crt", pair.cert,
                                   pair.key, offset)
        self.lb: LoadBalancer | None = None

    def __enter__(self) -> Path:
        self.proxy.start()
        self.lb = LoadBalancer([*self.cluster.apiserver_ports[:2], self.proxy.port]).start()
        return kubeconfig_via(self.cluster, self.lb.port, f"skew-{self.lb.port}")

    def __exit__(self, *exc: object) -> None:
        if self.lb is not None:
            self.lb.stop()
        self.proxy.stop()


def handover(kubeconfig: Path, namespace: str, name: str, skew: float | None,
             duration: int = 2) -> float:
    """A claims and dies (no release); B waits; seconds from A's leaseUntil (honest clock)
    to B's claim returning. Also asserts B's claim is at generation + 1."""
    a = client(kubeconfig, namespace, skew)
    retry(lambda: a.store.create(namespace, name, {"leaseDurationSeconds": duration}))
    first = retry(lambda: a.claim(name, "a"))
    a.api.close()
    b = client(kubeconfig, namespace, skew)
    second = b.wait_claim(name, "b", timeout=60, poll=0.05)
    returned = time.time()
    b.api.close()
    assert second.generation == first.generation + 1
    assert first.lease_until is not None
    return returned - first.lease_until.timestamp()


# -- etcd write ceiling ----------------------------------------------------------------------

def write_ceiling(kubeconfig: Path, namespace: str, writers: int, seconds: float = 5.0
                  ) -> float:
    """Conditional status writes per second: ``writers`` threads, each renewing its own
    lease in a loop (one resourceVersion-conditional merge patch per renewal)."""
    counts = [0] * writers
    stop = threading.Event()

    def run(i: int) -> None:
        c = client(kubeconfig, namespace)
        name = f"ceiling-{writers}-{i}"
        retry(lambda: c.store.create(namespace, name, {"leaseDurationSeconds": 60}))
        lease = c.claim(name, f"bench-{i}")
        barrier.wait(timeout=60)
        while not stop.is_set():
            lease.renew()
            counts[i] += 1
        c.api.close()

    barrier = threading.Barrier(writers + 1)
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(writers)]
    for t in threads:
        t.start()
    barrier.wait(timeout=120)
    began = time.monotonic()
    time.sleep(seconds)
    stop.set()
    elapsed = time.monotonic() - began
    for t in threads:
        t.join(30)
    return sum(counts) / elapsed
