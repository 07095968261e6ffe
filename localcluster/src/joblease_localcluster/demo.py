"""``joblease-localcluster demo``: the A/B fencing example, real processes, a local cluster.

1. Start etcd + kube-apiserver + controller-manager + scheduler on 127.0.0.1, install the
   CRD, start the operator, start a fenced HTTP target.
2. Six earlier claim/release cycles bring the JobLease to generation 6.
3. Worker A (a separate process) claims generation 7 and is paused with SIGSTOP.
4. After A's lease ends on the server's clock, worker B (another process) claims
   generation 8 and writes to the target with its token.
5. A is resumed. Its local deadline has passed, so a well-behaved worker stops; the demo's
   A carries on as a delayed request would: its target write with token 7 is refused by
   the target, its renew and its complete with generation 7 are refused by the API server.
6. B completes; the final status shows who completed and with which generation.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import IO, Any

from joblease_localcluster.crd import CRD_NAME, crd_path

DEMO_LEASE = "nightly-report"
DURATION = 4


class Narrator:
    """Prints numbered steps with the time since the start."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def say(self, who: str, text: str) -> None:
        """Print one line."""
        print(f"[{time.monotonic() - self.started:6.2f}s] {who:<9} {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    """Run the whole demo; return 0 only if every refusal happened as it must."""
    from joblease_localcluster.cluster import LocalCluster

    out = Narrator()
    out.say("demo", "starting the local control plane (etcd, kube-apiserver, "
                    "controller-manager, scheduler) on 127.0.0.1 …")
    with LocalCluster(keep_dir=args.keep) as cluster:
        out.say("demo", f"control plane ready in {cluster.ready_seconds or 0:.1f}s at "
                        f"{cluster.server}")
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        _install_crd(cluster, out)
        operator = _start_operator(cluster, env, out)
        try:
            return _play(cluster, env, out)
        finally:
            operator.terminate()
            operator.wait(10)
            if args.keep:
                out.say("demo", f"logs kept in {cluster.dir / 'logs'}")


def _install_crd(cluster: Any, out: Narrator) -> None:
    cluster.kubectl("apply", "-f", str(crd_path()), check=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    f"crd/{CRD_NAME}", check=True)
    out.say("demo", f"CRD {CRD_NAME} installed and Established")


def _start_operator(cluster: Any, env: dict[str, str], out: Narrator) -> subprocess.Popen[bytes]:
    log = (cluster.dir / "logs" / "operator.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "joblease", "--metrics-port", "0",
                             "--health-addr", "127.0.0.1:0"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    out.say("operator", f"started (pid {proc.pid}, log {log.name})")
    return proc


def _play(cluster: Any, env: dict[str, str], out: Narrator) -> int:
    from joblease import LeaseClient
    from joblease.fencing.http_example import FencedHTTPServer

    target = FencedHTTPServer()
    import threading
    threading.Thread(target=target.serve_forever, daemon=True).start()
    out.say("target", f"fenced HTTP target at {target.url} (refuses tokens lower than seen)")
    try:
        client = LeaseClient("default", kubeconfig=str(cluster.kubeconfig))
        client.store.create("default", DEMO_LEASE, {"leaseDurationSeconds": DURATION})
        out.say("demo", f"JobLease default/{DEMO_LEASE} created (leaseDurationSeconds "
                        f"{DURATION})")
        for i in range(6):
            lease = client.claim(DEMO_LEASE, holder=f"earlier-{i + 1}")
            lease.release()
        out.say("demo", f"six earlier claim/release cycles: generation is now "
                        f"{client.get(DEMO_LEASE).status.generation}")
        return _ab(env, target.url, out)
    finally:
        target.shutdown()


def _ab(env: dict[str, str], target: str, out: Narrator) -> int:
    worker_a = _worker(env, "a", target)
    line = _expect(worker_a, "claimed", out, "A")
    gen_a = line["generation"]
    os.kill(worker_a.pid, signal.SIGSTOP)
    out.say("A", f"paused with SIGSTOP (pid {worker_a.pid}) while holding generation {gen_a}")
    worker_b = _worker(env, "b", target)
    line = _expect(worker_b, "claimed", out, "B")
    gen_b = line["generation"]
    _expect(worker_b, "target", out, "B")
    os.kill(worker_a.pid, signal.SIGCONT)
    out.say("A", "resumed with SIGCONT")
    _send(worker_a, "go")
    results = {step: _expect(worker_a, step, out, "A") for step in
               ("deadline", "target", "renew", "complete")}
    worker_a.wait(30)
    _send(worker_b, "go")
    done = _expect(worker_b, "complete", out, "B")
    worker_b.wait(30)
    ok = (gen_b == gen_a + 1 and not results["target"]["ok"] and not results["renew"]["ok"]
          and not results["complete"]["ok"] and done["ok"] and results["deadline"]["lost"])
    out.say("demo", "RESULT: " + ("fencing held: A's stale generation was refused by the "
                                  "API server and by the target; B completed."
                                  if ok else "UNEXPECTED: see the lines above"))
    return 0 if ok else 1


def _worker(env: dict[str, str], role: str, target: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "joblease_localcluster.demo", role, target],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _send(proc: subprocess.Popen[str], text: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(text + "\n")
    proc.stdin.flush()


def _expect(proc: subprocess.Popen[str], step: str, out: Narrator, who: str) -> dict[str, Any]:
    assert proc.stdout is not None
    raw = proc.stdout.readline()
    if not raw:
        raise RuntimeError(f"worker {who} exited before step {step!r} (code {proc.wait()})")
    line: dict[str, Any] = json.loads(raw)
    if line.get("step") != step:
        raise RuntimeError(f"worker {who}: expected step {step!r}, got {line}")
    out.say(who, line["text"])
    return line


# --- the worker processes --------------------------------------------------------------------

def _emit(step: str, text: str, **fields: Any) -> None:
    print(json.dumps({"step": step, "text": text, **fields}), flush=True)


def _write_target(target: str, token: Any, who: str) -> tuple[bool, str]:
    request = urllib.request.Request(f"{target}/resources/{DEMO_LEASE}",
                                     data=f"report written by {who}".encode(), method="PUT",
                                     headers={"X-Joblease-Token": str(token),
                                              "Idempotency-Key": f"report-{who}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return True, f"{reply.status} accepted"
    except urllib.error.HTTPError as err:
        body = json.loads(err.read() or b"{}")
        return False, f"{err.code} refused: {body.get('message') or body}"


def worker_main(role: str, target: str, stdin: IO[str] = sys.stdin) -> int:
    """Worker A or B of the demo (run as ``python -m joblease_localcluster.demo a|b TARGET``)."""
    from joblease import LeaseClient, LeaseError

    client = LeaseClient("default")
    if role == "a":
        lease = client.claim(DEMO_LEASE, holder="worker-a")
    else:
        lease = client.wait_claim(DEMO_LEASE, holder="worker-b", timeout=60, poll=0.1)
    _emit("claimed", f"claimed generation {lease.generation} (token {lease.token}), lease "
                     f"ends {lease.lease_until:%H:%M:%S.%f} server time",
          generation=lease.generation)
    if role == "b":
        ok, text = _write_target(target, lease.token, "worker-b")
        _emit("target", f"target write with token {lease.token}: {text}", ok=ok)
        stdin.readline()
        lease.complete("report sent")
        _emit("complete", f"completed with generation {lease.generation}", ok=True)
        return 0
    stdin.readline()  # the pause happens here
    lost = not lease.valid()
    _emit("deadline", f"local deadline passed {-lease.remaining():.1f}s ago: a well-behaved "
                      "worker stops here; this one carries on like a delayed request",
          lost=lost)
    ok, text = _write_target(target, lease.token, "worker-a")
    _emit("target", f"target write with token {lease.token}: {text}", ok=ok)
    for step, action in (("renew", lease.renew), ("complete", lambda: lease.complete("late"))):
        try:
            action()
            _emit(step, f"{step} with generation {lease.generation}: accepted (WRONG)", ok=True)
        except LeaseError as err:
            _emit(step, f"{step} with generation {lease.generation} refused: "
                        f"{type(err).__name__}: {err}", ok=False)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1], sys.argv[2]))
