"""Issue 14: the promises tried just beside the scenarios the suite was designed around.

Every test here failed on c20062d (the closing note quotes how) and runs against the real
kube-apiserver + etcd. Each names the item of issue 14 it reproduces; docs/safety.md lists
them in the track record.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from joblease import LeaseLostError, Phase
from joblease.domain.time import parse_time
from joblease.kube.api import InvalidError, KubeApi, UnavailableError
from joblease.kube.leases import lease_path
from joblease.sdk.client import LeaseClient
from support.hangproxy import HangingProxy, api_port, kubeconfig_via

JOBLEASE = [sys.executable, "-m", "joblease.cli"]
MERGE = "application/merge-patch+json"


def _delete(client: LeaseClient, name: str) -> None:
    client.api.request("DELETE", lease_path(client.namespace, name))


def _patch_status(client: LeaseClient, name: str, status: dict[str, Any]) -> None:
    obs = client.get(name)
    client.api.request("PATCH", lease_path(client.namespace, name, "status"),
                       {"metadata": {"resourceVersion": obs.resource_version},
                        "status": status}, content_type=MERGE)


# -- item 1: a holder never adopts another incarnation's token ---------------------------

def test_shared_identity_never_adopts_the_recreated_leases_token(
        make_client: Callable[..., LeaseClient]) -> None:
    a, b = make_client(), make_client()
    a.store.create(a.namespace, "job", {"leaseDurationSeconds": 30})
    old = a.claim("job", holder="replicas")
    _delete(a, "job")
    a.store.create(a.namespace, "job", {"leaseDurationSeconds": 30})
    new = b.claim("job", holder="replicas")  # the same holder name: one ServiceAccount
    assert new.token > old.token and new.token.generation == old.token.generation == 1
    with pytest.raises(LeaseLostError):
        old.renew()
    with pytest.raises(LeaseLostError):
        old.complete("completes the other replica's job")
    assert str(old.token) != str(new.token) and old.loss is not None
    status = b.get("job").status
    assert (status.phase, status.token(), status.completion) == (Phase.HELD, new.token, None)
    new.complete("ok")  # the rightful holder is unaffected


def test_shared_identity_same_incarnation_tells_claims_apart_by_claim_id(
        make_client: Callable[..., LeaseClient]) -> None:
    """Two replicas named alike: one's claim expires and the other takes over at g+1; the
    first cannot renew (token), and a forged token without its claim id is refused too."""
    a, b = make_client(), make_client()
    a.store.create(a.namespace, "job", {"leaseDurationSeconds": 1})
    first = a.claim("job", holder="replicas")
    second = b.wait_claim("job", holder="replicas", timeout=10)
    assert second.token.generation == 2
    with pytest.raises(LeaseLostError):
        first.renew()  # past its deadline, refused by the server
    stale = a.resume("job", "replicas", first.token)
    with pytest.raises(LeaseLostError, match="current generation is 2"):
        stale.complete("late")
    forged = a.resume("job", "replicas", second.token, claim_id="not-the-claim")
    with pytest.raises(LeaseLostError):
        forged.complete("forged")
    second.complete("ok")


# -- item 2: one hostile timestamp ------------------------------------------------------

@pytest.mark.parametrize("until", ["9999-12-31T23:59:59.999Z", "0000-01-01T00:00:00Z",
                                   "9500-01-01T00:00:00Z", "1969-12-31T23:59:59Z"])
def test_the_api_server_refuses_out_of_range_lease_ends(leases: LeaseClient, until: str) -> None:
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 30})
    lease = leases.claim("job", holder="h")
    with pytest.raises(InvalidError) as refused:
        _patch_status(leases, "job", {"leaseUntil": until, "renewTime": until})
    assert "leaseUntil" in refused.value.message or "renewTime" in refused.value.message
    assert leases.get("job").status.lease_until == lease.lease_until


def test_lowercase_timestamps_are_refused_by_the_crds_rules(leases: LeaseClient) -> None:
    """RFC 3339 allows ``t``/``z``; the schema's date-time format accepts them, but the CEL
    rules that bound the time fields cannot parse them, so the server refuses the write
    (and the code tolerates them anyway: tests/unit/test_safety_pure.py)."""
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 30})
    leases.claim("job", holder="h")
    with pytest.raises(InvalidError, match="date-time"):
        _patch_status(leases, "job", {"renewTime": "2026-12-03t10:00:00.123456789z",
                                      "leaseUntil": "2026-12-03t10:00:30.123456789z"})
    assert leases.get("job").status.holder == "h"


def test_one_hostile_lease_end_never_stops_expiry_elsewhere(
        cluster: Any, make_client: Callable[..., LeaseClient],
        start_operator: Callable[..., Any]) -> None:
    """The most hostile lease end the CRD still accepts sits in one namespace; an
    ordinary 2 s lease in another namespace must still be marked Expired on time."""
    hostile = make_client()
    other_ns = f"{hostile.namespace}-b"
    cluster.kubectl("create", "namespace", other_ns, check=True)
    try:
        ordinary = _client_in(make_client, other_ns)
        hostile.store.create(hostile.namespace, "bad", {"leaseDurationSeconds": 86400})
        hostile.claim("bad", holder="h")
        _patch_status(hostile, "bad", {"renewTime": "8999-12-31T00:00:00.000Z",
                                       "leaseUntil": "8999-12-31T23:59:59.999999999Z"})
        start_operator(namespaces=[hostile.namespace, other_ns])
        ordinary.store.create(other_ns, "good", {"leaseDurationSeconds": 2})
        assert ordinary.get("good").status.phase is Phase.AVAILABLE  # born so (issue 28)
        lease = ordinary.claim("good", holder="w")
        assert lease.lease_until is not None
        _wait(lambda: ordinary.get("good").status.phase is Phase.EXPIRED, 15, "expired")
        assert hostile.get("bad").status.phase is Phase.HELD
    finally:
        cluster.kubectl("delete", "namespace", other_ns, "--wait=false")


def _client_in(make_client: Callable[..., LeaseClient], namespace: str) -> LeaseClient:
    client = make_client()
    client.namespace = namespace
    return client


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# -- items 3, 4, 5: the command under `joblease run` never outlives its lease -------------



class Run:
    """``joblease run`` as a real process whose command writes a wall-clock heartbeat."""

    def __init__(self, kubeconfig: Path, namespace: str, tmp_path: Path, seconds: float,
                 grace: float = 1.0) -> None:
        self.beat, self.pidfile = tmp_path / "beat", tmp_path / "cmd.pid"
        script = (f"echo $$ > {self.pidfile}; end=$(($(date +%s) + {int(seconds)})); "
                  f"while [ $(date +%s) -lt $end ]; do date +%s.%N > {self.beat}.tmp; "
                  f"mv {self.beat}.tmp {self.beat}; sleep 0.05; done")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        self.proc = subprocess.Popen(
            [*JOBLEASE, "run", "--lease", "job", "--holder", "runner", "--grace", str(grace),
             "-n", namespace, "--", "sh", "-c", script],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait(lambda: self.beat.exists(), 30, "the command's first heartbeat")
        self.command_pid = int(self.pidfile.read_text())

    def last_beat(self) -> datetime:
        return datetime.fromtimestamp(float(self.beat.read_text()), UTC)

    def command_alive(self) -> bool:
        """Whether the command's shell still runs (a zombie of a paused runner does not)."""
        try:
            stat = Path(f"/proc/{self.command_pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rpartition(")")[2].split()[0] != "Z"

    def stop(self) -> None:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            if self.proc.poll() is None:
                os.kill(self.proc.pid, sig)
        self.proc.wait(10)
        if self.command_alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.command_pid, signal.SIGKILL)


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        run.stop()


def test_a_409_storm_never_lets_the_command_outlive_its_lease(
        cluster: Any, leases: LeaseClient, tmp_path: Path, runs: list[Run]) -> None:
    """Item 3: another writer rewrites the JobLease's metadata as fast as it can; renewals
    meet 409 after 409. Whatever wins, the command stops by the end of its lease."""
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 3})
    run = Run(Path(cluster.kubeconfig_for("admin")), leases.namespace, tmp_path, seconds=9)
    runs.append(run)
    seen_until: list[datetime] = []
    stop = threading.Event()

    def storm() -> None:
        i, path = 0, lease_path(leases.namespace, "job")
        end = time.monotonic() + 14
        while not stop.is_set() and time.monotonic() < end:  # bounded
            i += 1
            body = leases.api.request("PATCH", path, {"metadata": {"annotations": {
                "storm": str(i)}}}, content_type=MERGE).body
            until = (body.get("status") or {}).get("leaseUntil")
            if until:
                seen_until.append(parse_time(until))

    writer = threading.Thread(target=storm, daemon=True)
    writer.start()
    try:
        code = run.proc.wait(30)
    finally:
        stop.set()
        writer.join(20)
    final = leases.get("job").status
    ends = [*seen_until, *([final.lease_until] if final.lease_until else [])]
    stderr = run.proc.stderr.read() if run.proc.stderr else ""
    assert ends, stderr
    if final.phase is not Phase.COMPLETED:
        assert code == 4, stderr
        assert run.last_beat() <= max(ends), (run.last_beat(), max(ends), stderr)
    assert not run.command_alive()


def test_a_hung_api_server_stops_the_command_at_its_deadline(
        cluster: Any, leases: LeaseClient, tmp_path: Path, runs: list[Run]) -> None:
    """Item 4: the API server stops answering (connections open, no bytes back). The
    command must be stopped by the lease's end, not a request timeout later."""
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 4})
    with HangingProxy(api_port(cluster)) as proxy:
        run = Run(kubeconfig_via(cluster, proxy.port, tmp_path), leases.namespace,
                  tmp_path, seconds=60)
        runs.append(run)
        proxy.hang()
        hung_at = time.monotonic()
        _wait(lambda: not run.command_alive(), 12, "the command to be stopped")
        stopped_after = time.monotonic() - hung_at
        until = leases.get("job").status.lease_until
        assert until is not None
        assert run.last_beat() <= until, (run.last_beat(), until)
        assert stopped_after < 4.5
        assert run.proc.wait(15) == 4


def test_a_killed_runner_takes_its_command_with_it(
        cluster: Any, leases: LeaseClient, tmp_path: Path, runs: list[Run]) -> None:
    """Item 5: SIGKILL of the runner (or the OOM killer) must not leave the command
    running in its own session."""
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 30})
    run = Run(Path(cluster.kubeconfig_for("admin")), leases.namespace, tmp_path, seconds=60,
              grace=1.0)
    runs.append(run)
    os.kill(run.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    _wait(lambda: not run.command_alive(), 5, "the command to die with its runner")
    assert time.monotonic() - killed < 3


def test_a_paused_runners_command_is_stopped_by_the_deadline(
        cluster: Any, leases: LeaseClient, tmp_path: Path, runs: list[Run]) -> None:
    """Item 5: SIGSTOP of the runner pauses its renewals; the command must stop by the
    lease's end even though the runner cannot act."""
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 3})
    run = Run(Path(cluster.kubeconfig_for("admin")), leases.namespace, tmp_path, seconds=60)
    runs.append(run)
    os.kill(run.proc.pid, signal.SIGSTOP)
    _wait(lambda: not run.command_alive(), 8, "the command to be stopped")
    until = leases.get("job").status.lease_until
    assert until is not None and run.last_beat() <= until, (run.last_beat(), until)


# -- item 7: a retry recognises its own write ---------------------------------------------

class LossyApi(KubeApi):
    """Applies the next matching request on the real API server, then loses the answer."""

    lose_next: str | None = None

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        response = super().request(method, path, body, **kwargs)
        if self.lose_next and method == "PATCH" and path.endswith("/status") \
                and self.lose_next in str(body):
            self.lose_next = None
            raise UnavailableError(0, "Unavailable", f"{method} {path}: response lost")
        return response


@pytest.fixture
def lossy(cluster: Any, jl_crd: str, namespace: str) -> Iterator[LeaseClient]:
    base = KubeApi.from_kubeconfig(str(cluster.kubeconfig_for("admin")))
    api = LossyApi(base._client)
    client = LeaseClient(namespace, api=api)
    yield client
    api.close()


def test_a_claim_whose_answer_was_lost_is_adopted_not_refused(lossy: LeaseClient) -> None:
    lossy.store.create(lossy.namespace, "job", {"leaseDurationSeconds": 60, "maxAttempts": 1})
    lossy.api.lose_next = "holder"  # type: ignore[attr-defined]
    lease = lossy.wait_claim("job", holder="A", timeout=15)
    assert lease.token.generation == 1 and lease.valid()
    status = lossy.get("job").status
    assert (status.phase, status.holder, status.generation) == (Phase.HELD, "A", 1)
    lease.renew()
    lossy.api.lose_next = "completion"  # type: ignore[attr-defined]
    lease.complete("done once")  # the lost answer is recognised: no error, no Failed
    status = lossy.get("job").status
    assert status.phase is Phase.COMPLETED and status.completion is not None
    assert status.attempts == 0


def test_a_release_whose_answer_was_lost_is_recognised(lossy: LeaseClient) -> None:
    lossy.store.create(lossy.namespace, "job", {"leaseDurationSeconds": 60})
    lease = lossy.claim("job", holder="A")
    lossy.api.lose_next = "Released"  # type: ignore[attr-defined]
    lease.release()
    assert lossy.get("job").status.phase is Phase.AVAILABLE


# -- item 10: smaller promises the CRD keeps ----------------------------------------------

def test_a_pod_holder_of_maximal_length_fits(leases: LeaseClient) -> None:
    holder = f"pod:{'n' * 63}/{'p' * 253}/{'0' * 36}"
    assert len(holder) == 358
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 30})
    assert leases.claim("job", holder=holder).token.generation == 1


def test_a_finished_leases_generation_is_frozen(leases: LeaseClient) -> None:
    leases.store.create(leases.namespace, "job", {"leaseDurationSeconds": 30})
    leases.claim("job", holder="a").complete("ok")
    with pytest.raises(InvalidError, match="never claimed again"):
        _patch_status(leases, "job", {"generation": 2, "holder": "b"})
