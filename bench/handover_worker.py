"""Processes for the handover benchmark (killed with SIGKILL by ``bench.handover``).

    python -m bench.handover_worker MODE --kubeconfig K --namespace N --names a,b --duration D

MODE is ``ours-holder`` / ``ours-claimer`` (the joblease SDK) or ``peer-holder`` /
``peer-claimer`` (the ``kubernetes`` client's leader election with its ``LeaseLock``).
Holders print ``READY`` once they hold every name, then keep renewing until killed.
Claimers print one JSON line per name when they hold it: ``{"name", "won_at"}`` with
``won_at`` the wall-clock time (``time.time()``) right after the successful write.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

LIFETIME = 600.0  # every loop here ends by then, even if nobody kills us


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def ours_holder(args: argparse.Namespace) -> None:
    from joblease.sdk.client import LeaseClient

    client = LeaseClient(args.namespace, kubeconfig=args.kubeconfig)
    leases = [client.claim(name, "holder") for name in args.names]
    say("READY")
    deadline = time.monotonic() + LIFETIME
    while time.monotonic() < deadline:
        time.sleep(args.duration / 3)
        for lease in leases:
            lease.renew()


def ours_claimer(args: argparse.Namespace) -> None:
    from joblease.sdk.client import LeaseClient

    client = LeaseClient(args.namespace, kubeconfig=args.kubeconfig)
    client.calibrate()  # before the race

    def claim(name: str) -> None:
        own = LeaseClient(args.namespace, api=client.api, calibrate=False)
        own.wait_claim(name, "claimer", timeout=args.duration * 4 + 60)
        won_at = time.time()
        margin = own.margin().total_seconds()  # base margin + clock error bound
        say(json.dumps({"name": name, "won_at": won_at, "margin": margin}))

    threads = [threading.Thread(target=claim, args=(n,), daemon=True) for n in args.names]
    for t in threads:
        t.start()
    say("READY")
    for t in threads:
        t.join(timeout=LIFETIME)


def peer(args: argparse.Namespace, identity: str) -> None:
    from kubernetes import config
    from kubernetes.leaderelection import electionconfig, leaderelection
    from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

    config.load_kube_config(config_file=args.kubeconfig)
    duration = args.duration
    # client-go's default proportions (15 s / 10 s / 2 s), at the same lease duration
    renew_deadline = max(2, round(duration * 10 / 15))
    retry = max(1, round(duration * 2 / 15))
    leading = threading.Semaphore(0)

    def elect(name: str) -> None:
        def started() -> None:
            if identity == "claimer":
                say(json.dumps({"name": name, "won_at": time.time()}))
            leading.release()
            time.sleep(LIFETIME)

        lock = LeaseLock(name, args.namespace, identity)
        cfg = electionconfig.Config(lock, lease_duration=duration,
                                    renew_deadline=renew_deadline, retry_period=retry,
                                    onstarted_leading=started, onstopped_leading=None)
        leaderelection.LeaderElection(cfg).run()

    for name in args.names:
        threading.Thread(target=elect, args=(name,), daemon=True).start()
    if identity == "holder":
        for _ in args.names:
            if not leading.acquire(timeout=120):
                raise SystemExit("peer holder: not leading in 120 s")
    say("READY")
    time.sleep(LIFETIME)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["ours-holder", "ours-claimer", "peer-holder",
                                         "peer-claimer"])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--names", required=True, type=lambda s: s.split(","))
    parser.add_argument("--duration", required=True, type=int)
    args = parser.parse_args()
    if args.mode == "ours-holder":
        ours_holder(args)
    elif args.mode == "ours-claimer":
        ours_claimer(args)
    else:
        peer(args, args.mode.split("-")[1])


if __name__ == "__main__":
    main()
