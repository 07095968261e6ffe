"""A fault-suite worker: a real process using the SDK, recording every operation.

Run as ``python -m tests.faults.worker ROLE --lease NAME …`` from the repository root.
Roles:

* ``hold``: claim (waiting while held), then loop: check the lease, write to the fenced
  PostgreSQL target, sleep; renewals run in the SDK's ``Holding`` thread. After ``--work``
  seconds complete. When the lease is lost it stops writing; with ``--probe-after-loss``
  it then sends its renew, complete and target write anyway, as a stale process would
  (they must be refused).
* ``race``: at each of ``--rounds`` instants (shared monotonic clock) try one claim; the
  winner writes once and releases.

``--delay-write S`` holds every target write back S seconds after the validity check (a
request stuck on the way). ``JOBLEASE_TEST_BROKEN=skip-generation-check`` (honoured only
here) makes the probe's completion a raw status write without the holder/generation check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseHeldError,
    LeaseLostError,
    StaleLeaseError,
)
from joblease.domain.token import FencingToken
from joblease.fencing.errors import StaleTokenError
from joblease.fencing.postgres import PostgresFence
from joblease.kube.api import ApiError, InvalidError, UnavailableError
from joblease.kube.leases import MERGE_PATCH, lease_path
from joblease.kube.transact import ContentionError
from joblease.sdk.client import Lease, LeaseClient
from joblease.sdk.hold import Holding

from .history import OK, REFUSED, UNKNOWN, Recorder

BROKEN_ENV = "JOBLEASE_TEST_BROKEN"


def ms(when: datetime | None) -> float | None:
    return None if when is None else when.timestamp() * 1000.0


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "mono_ns": time.monotonic_ns(), **fields}), flush=True)


def classify(err: BaseException) -> tuple[str, dict[str, Any]]:
    """Map an exception to (status, result fields)."""
    name = type(err).__name__
    reasons: list[tuple[type[BaseException], str]] = [
        (LeaseHeldError, "held"), (LeaseFinishedError, "finished"), (StaleLeaseError, "stale"),
        (LeaseExpiredError, "expired"), (StaleTokenError, "stale"),
        (ContentionError, "contention"), (InvalidError, "invalid")]
    for kind, reason in reasons:
        if isinstance(err, kind):
            return REFUSED, {"reason": reason, "error": name, "message": str(err)[:300]}
    if isinstance(err, UnavailableError | ApiError | OSError | psycopg.OperationalError):
        return UNKNOWN, {"error": name, "message": str(err)[:300]}
    return UNKNOWN, {"error": name, "message": str(err)[:300]}


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.holder = args.holder
        self.client = LeaseClient(args.namespace, kubeconfig=args.kubeconfig)
        self.client.calibrate()  # once, before anything is recorded

        def bounds() -> tuple[float, float]:
            now = self.client.api.server_now()
            return now.earliest.timestamp() * 1000.0, now.latest.timestamp() * 1000.0

        self.rec = Recorder(Path(args.history) / f"{self.holder}.jsonl", self.holder, bounds)
        self.conn = psycopg.connect(args.dsn, autocommit=True)
        self.fence = PostgresFence()
        self.writes = 0
        self.finished = False

    # -- recorded operations ---------------------------------------------------------------

    def claim(self) -> Lease | None:
        op = self.rec.invoke("claim", self.args.lease, holder=self.holder)
        try:
            lease = self.client.claim(self.args.lease, self.holder)
        except Exception as err:
            status, fields = classify(err)
            self.rec.complete(op, status, **fields)
            self.finished = isinstance(err, LeaseFinishedError)
            return None
        self.rec.complete(op, OK, generation=lease.generation, epoch=lease.token.epoch,
                          lease_until=ms(lease.lease_until), holder=self.holder)
        self._wrap_renew(lease)
        return lease

    def _wrap_renew(self, lease: Lease) -> None:
        original = lease.renew

        def renew() -> None:
            self.held_op(lease, "renew", original)

        lease.renew = renew  # type: ignore[method-assign]

    def held_op(self, lease: Lease, op: str, action: Any) -> None:
        op_id = self.rec.invoke(op, lease.name, holder=self.holder,
                                generation=lease.generation, epoch=lease.token.epoch)
        try:
            action()
        except BaseException as err:
            status, fields = classify(err)
            self.rec.complete(op_id, status, **fields)
            raise
        self.rec.complete(op_id, OK, generation=lease.generation,
                          lease_until=ms(lease.lease_until))

    def write(self, token: FencingToken, note: str) -> bool:
        if self.args.delay_write:
            time.sleep(self.args.delay_write)  # the request is stuck on its way
        self.writes += 1
        key = f"{self.holder}-{self.writes}"
        op = self.rec.invoke("write", self.args.lease, holder=self.holder,
                             token=[token.epoch, token.generation], key=key)
        try:
            self.fence.write(self.conn, self.args.lease, token, key, lambda cur: cur.execute(
                "INSERT INTO effects (resource, holder, epoch, generation, note) "
                "VALUES (%s, %s, %s, %s, %s)",
                (self.args.lease, self.holder, token.epoch, token.generation, note)))
        except Exception as err:
            status, fields = classify(err)
            self.rec.complete(op, status, **fields)
            return False
        self.rec.complete(op, OK)
        return True

    # -- roles ---------------------------------------------------------------------------

    def hold(self) -> int:
        deadline = time.monotonic() + self.args.claim_timeout
        lease = None
        while lease is None and time.monotonic() < deadline and not self.finished:
            lease = self.claim()
            if lease is None:
                time.sleep(self.args.poll)
        if lease is None and self.finished:
            say("finished")
            return 0
        if lease is None:
            say("gave-up")
            return 3
        say("claimed", generation=lease.generation, lease_until=ms(lease.lease_until))
        if self.args.no_renew:
            return self.one_shot(lease)
        holding = RecordedHolding(lease, self)
        ended = time.monotonic() + self.args.work
        with holding:
            try:
                while time.monotonic() < ended:
                    holding.check()
                    if self.write(lease.token, "work"):
                        say("wrote", generation=lease.generation)
                    time.sleep(self.args.write_every)
                holding.check()
                self.held_op(lease, "complete", lambda: holding.complete("done"))
                say("completed", generation=lease.generation)
                return 0
            except LeaseLostError as err:
                say("lost", error=type(err).__name__, writes=self.writes)
            except Exception as err:
                say("error", error=f"{type(err).__name__}: {err}")
        if self.args.probe_after_loss:
            self.probe(lease)
        return 4

    def one_shot(self, lease: Lease) -> int:
        """No renewals: check once, write (perhaps held back), then try to complete."""
        if not lease.valid():
            say("lost", error="deadline")
            return 4
        ok = self.write(lease.token, "one shot")
        say("wrote" if ok else "lost", ok=ok, error=None if ok else "refused by the target")
        try:
            self.held_op(lease, "complete", lambda: lease.complete("one shot"))
        except Exception as err:
            say("complete-refused", error=type(err).__name__)
            return 4
        say("completed", generation=lease.generation)
        return 0

    def probe(self, lease: Lease) -> None:
        """Act like a stale process after the loss: each of these must be refused."""
        self.args.delay_write = 0
        ok = self.write(lease.token, "stale")
        say("probe-write", ok=ok)
        for op in ("renew", "complete"):
            action = lease.renew if op == "renew" else (lambda: self._complete(lease))
            try:
                if op == "renew":
                    action()
                else:
                    self.held_op(lease, "complete", action)
                say(f"probe-{op}", ok=True)
            except Exception as err:
                say(f"probe-{op}", ok=False, error=type(err).__name__)

    def _complete(self, lease: Lease) -> None:
        if os.environ.get(BROKEN_ENV) == "skip-generation-check":
            self._raw_complete(lease)
        else:
            lease.complete("late")

    def _raw_complete(self, lease: Lease) -> None:
        """BROKEN on purpose: record a completion for our generation whatever is current."""
        obs = self.client.get(lease.name)
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        patch = {"metadata": {"resourceVersion": obs.resource_version},
                 "status": {"phase": "Completed", "leaseUntil": None, "finishTime": at,
                            "completion": {"generation": lease.generation,
                                           "holder": self.holder, "time": at,
                                           "result": "broken client"}}}
        self.client.api.request("PATCH", lease_path(lease.namespace, lease.name, "status"),
                                patch, content_type=MERGE_PATCH)

    def race(self) -> int:
        start_ns = self.args.start_ns or int(sys.stdin.readline() or 0)  # the harness's "go"
        start = start_ns / 1e9
        won = 0
        for r in range(self.args.rounds):
            at = start + r * self.args.interval
            time.sleep(max(0.0, at - time.monotonic()))
            lease = self.claim()
            if lease is None:
                continue
            won += 1
            self.write(lease.token, f"round {r}")
            try:
                self.held_op(lease, "release", lease.release)
            except Exception as err:
                say("release-failed", error=type(err).__name__)
        say("done", won=won)
        return 0


class RecordedHolding(Holding):
    """``Holding`` whose release on exit is recorded like every other operation.

    Why: ``Holding`` releases the lease when the body ends without completing it (here:
    a completion that met a 503 while kube-apiserver restarted). Unrecorded, that release
    left the checker believing the old generation was valid until its ``leaseUntil``, so
    the next holder's legitimate claim showed up as an ``overlap`` (found by the 200-run
    soak of 2026-12-03; Porcupine, which does not model time, agreed the history was fine).
    """

    def __init__(self, lease: Lease, worker: Worker) -> None:
        super().__init__(lease)
        self.worker = worker

    def _release_on_exit(self, failed: bool) -> None:
        self.worker.held_op(self.lease, "release", lambda: super(
            RecordedHolding, self)._release_on_exit(failed))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="faults-worker")
    p.add_argument("role", choices=["hold", "race"])
    p.add_argument("--lease", required=True)
    p.add_argument("--holder", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--history", required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--work", type=float, default=3.0)
    p.add_argument("--write-every", type=float, default=0.3)
    p.add_argument("--delay-write", type=float, default=0.0)
    p.add_argument("--claim-timeout", type=float, default=30.0)
    p.add_argument("--poll", type=float, default=0.2)
    p.add_argument("--probe-after-loss", action="store_true")
    p.add_argument("--no-renew", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--start-ns", type=int, default=0)
    p.add_argument("--interval", type=float, default=2.0)
    args = p.parse_args(argv)
    worker = Worker(args)
    say("ready")
    return worker.hold() if args.role == "hold" else worker.race()


if __name__ == "__main__":
    sys.exit(main())
