"""The lease protocol on an HA control plane: 3 etcd members, 3 API servers, a load balancer.

Real processes throughout; faults are real SIGKILLs of PIDs the cluster started. Each
run is bounded (seconds of workload). Figures are printed (``pytest -s``) and collected in
``docs/ha.md``.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from joblease_localcluster.ha import HACluster
from joblease_localcluster.lb import LoadBalancer

from .scenarios import SkewedFront, Workload, client, fencing, handover, kubeconfig_via


def test_ha_cluster_serves_through_the_load_balancer(ha_cluster: HACluster) -> None:
    assert len(ha_cluster.apiserver_ports) == 3 and len(ha_cluster.etcd_client_urls) == 3
    assert ha_cluster.etcd_leader().startswith("etcd-")
    assert ha_cluster.kubectl("get", "--raw", "/readyz", check=True).stdout.strip() == "ok"
    print(f"figure: HA start-up {ha_cluster.startup_seconds:.1f}s")


def _run(ha_cluster: HACluster, ns: str, tmp_path: Path, fault: object, seconds: float = 8.0
         ) -> Workload:
    seed = random.randrange(1 << 20)
    w = Workload(ha_cluster.kubeconfig, ns, tmp_path / "run", seed=seed).start()
    time.sleep(seconds / 2)
    fault()  # type: ignore[operator]
    time.sleep(seconds / 2)
    w.stop()
    return w


def test_kill9_one_apiserver_mid_run(ha_cluster: HACluster, ha_namespace: str,
                                     tmp_path: Path) -> None:
    killed: list[int] = []
    w = _run(ha_cluster, ha_namespace, tmp_path, lambda: killed.append(
        ha_cluster.kill("kube-apiserver-1")))
    try:
        violations, ops = w.judge()
        print(f"figure: apiserver kill: claims={w.stats['claims']} unknown={w.stats['unknown']}"
              f" operations={ops} violations={len(violations)}")
        assert violations == [], [str(v) for v in violations]
        assert w.stats["claims"] > 3
    finally:
        ha_cluster.restart("kube-apiserver-1")


def test_kill9_etcd_leader_mid_run(ha_cluster: HACluster, ha_namespace: str,
                                   tmp_path: Path) -> None:
    leader = ha_cluster.etcd_leader()
    w = _run(ha_cluster, ha_namespace, tmp_path, lambda: ha_cluster.kill(leader))
    try:
        new_leader = ha_cluster.etcd_leader()
        violations, ops = w.judge()
        print(f"figure: etcd leader kill ({leader} -> {new_leader}): claims={w.stats['claims']}"
              f" unknown={w.stats['unknown']} operations={ops} violations={len(violations)}")
        assert new_leader != leader
        assert violations == [], [str(v) for v in violations]
        assert w.stats["claims"] > 3
    finally:
        ha_cluster.restart(leader)
        ha_cluster.etcd_leader()


def test_partitioned_worker_loses_its_lease_and_stops(ha_cluster: HACluster,
                                                      ha_namespace: str) -> None:
    with LoadBalancer(ha_cluster.apiserver_ports) as own:
        a = client(kubeconfig_via(ha_cluster, own.port, "partitioned"), ha_namespace)
        a.store.create(ha_namespace, "part", {"leaseDurationSeconds": 3})
        lease = a.claim("part", "a")
        own.partition()  # every connection of worker a is dropped
        with pytest.raises(Exception):  # noqa: B017 - any transport error
            lease.renew()
        assert not lease.valid() or lease.remaining() < 3
        deadline = time.monotonic() + 10
        while lease.valid() and time.monotonic() < deadline:
            time.sleep(0.05)
        stopped_at = time.time()
        assert not lease.valid()  # a holder that cannot renew stops on its own deadline
        b = client(ha_cluster.kubeconfig, ha_namespace)
        taken = b.wait_claim("part", "b", timeout=30, poll=0.05)
        assert taken.generation == lease.generation + 1
        assert lease.lease_until is not None
        assert stopped_at <= lease.lease_until.timestamp()  # stopped before its expiry
        own.heal()
        a.api.close()
        b.api.close()


@pytest.mark.parametrize("offset", [0.0, 2.0, -2.0])
def test_handover_with_inter_server_skew(ha_cluster: HACluster, ha_namespace: str,
                                         offset: float) -> None:
    """Three handovers after expiry through a front with one skewed server, side by side.

    Each is its own lease, with its own two clients: they run at once (each waits out a 2 s
    lease plus the margins the skew allows, about 8 s here, which three in a row tripled).
    What is asserted is unchanged: no claim before the lease's end on the honest clock. The
    figures in docs/ha.md were taken one handover at a time; side by side, at load averages
    of 9-20 here, one of the three often came 1-3 s later than the others' 5.3 s.
    """
    skew = 2.5 if offset else None
    suffix = f"{abs(int(offset))}{'n' if offset < 0 else 'p'}"
    with SkewedFront(ha_cluster, offset) as kubeconfig, ThreadPoolExecutor(3) as pool:
        seconds = list(pool.map(
            lambda i: handover(kubeconfig, ha_namespace, f"ho-{i}-{suffix}", skew), range(3)))
    print(f"figure: handover after expiry with {offset:+.0f}s skew (max_skew={skew}): "
          f"{', '.join(f'{s:.2f}' for s in seconds)} s")
    assert all(s >= 0 for s in seconds)  # never before the lease's end (honest clock)


@pytest.mark.parametrize("offset", [2.0, -2.0, 30.0, -30.0, 600.0, -600.0])
def test_skewed_server_never_breaks_fencing(ha_cluster: HACluster, ha_namespace: str,
                                            tmp_path: Path, offset: float) -> None:
    """With JOBLEASE_MAX_SERVER_SKEW=2.5 s: within it every property holds; beyond it the
    clients see the disagreement (jumps) and fencing still holds whatever timing does."""
    with SkewedFront(ha_cluster, offset) as kubeconfig:
        w = Workload(kubeconfig, ha_namespace, tmp_path / "run", skew=2.5,
                     seed=random.randrange(1 << 20)).start()
        time.sleep(8)
        w.stop()
        violations, ops = w.judge()
    jumps = sum(c["jumps"] for c in w.clocks)
    timing = [v for v in violations if v not in fencing(violations)]
    print(f"figure: skew {offset:+.0f}s: claims={w.stats['claims']} operations={ops} "
          f"fencing-violations={len(fencing(violations))} timing-violations={len(timing)} "
          f"jumps={jumps} max_gap={max(c['max_gap'] for c in w.clocks):.1f}s")
    assert fencing(violations) == [], [str(v) for v in violations]
    if abs(offset) <= 2.5:
        assert violations == [], [str(v) for v in violations]
    else:
        assert jumps > 0  # the broken assumption is seen, logged and widens the margin
        assert timing == [], [str(v) for v in timing]


def test_etcd_write_ceiling(ha_cluster: HACluster, ha_namespace: str) -> None:
    """Conditional status writes per second through the LB, 3 API servers, 3 etcd members."""
    from .scenarios import write_ceiling

    rates = {n: write_ceiling(ha_cluster.kubeconfig, ha_namespace, n, seconds=3.0)
             for n in (1, 4, 16)}
    print("figure: conditional status writes/s " +
          ", ".join(f"{n} writers: {r:.0f}" for n, r in rates.items()))
    assert all(r > 0 for r in rates.values())
