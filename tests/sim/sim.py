"""One seeded run of the whole protocol: workers, the operator, a fenced target, faults.

The *real* code runs here: ``joblease.domain``, ``kube.leases.LeaseStore``,
``kube.transact``, the SDK's ``LeaseClient``/``Lease`` (claims, renewals, completions, own-
write recognition, the drift-aware deadline), the renewal policy of ``Holding`` (renew
every third, ``retry_delay`` after a failure, loss at the deadline by a watchdog that
sends nothing), the operator's ``Reconciler`` and ``LeaseView``, and the fencing gate
(``TokenGate``). Only the API server (``model.py``), the clocks and the network
(``world.py``) are simulated.

Oracles, checked on the true timeline at every step (``Oracles``):
  a. with drift within the bound, no two claims of a lease are believed valid at once;
  b. a token ``(epoch, generation)`` is held only by the claim that created it;
  c. no renewal, completion or release under a stale claim is accepted by the server;
  d. every effect is checked while its claim is current on the server and before its end;
  e. the fenced target never accepts a lower token after a higher one;
  f. liveness: a lease whose holder died is claimed again within
     ``leaseUntil + margin + poll + one round trip`` (runs without API faults);
  g. one malformed object never stops the operator's work on the others.

Work pools (``PoolWorker``: the real ``PoolView`` over a lagging watch, claims through the
real ``LeaseClient.claim``; jobs with random priorities, maxAttempts and backoff):
  h. no pool job is completed twice: at most one worker ever believes it completed a job,
     and a Completed job's record names a claim a worker really made; and (liveness) by the
     end of a run every pool job is Completed or Failed (the run drains up to ``DRAIN``
     seconds past its horizon while any is open);
  i. a worker never chooses a job while a higher-priority job is claimable *by its own
     view's knowledge*: judged from the view's cached versions (minus the names it set
     aside after a failed claim) at the very server-time estimate the worker chose with.
     The server's truth is not the standard: a lagging view may rightly not know yet;
  j. no claim is accepted before the lease's rest ends (``status.notBefore``, or for a Held
     lease that ran out, ``leaseUntil`` plus the backoff its expiry earns) on the true
     server timeline (within the drift bound).

Pod delegation (the operator's real ``Delegator``; pods.py): oracle k. And with the chart's
admission policies in the model (half the runs; holders are then usernames):
  l. no write of joblease's own code is ever refused by a policy (403): claims, renewals,
     completions and releases (own-write recognition included) by workers and pool
     workers, the operator's writes and its token annotations on pods.

Every handler of a worker, pool worker or the operator that retries on ``except
Exception``:
  m. catches only what was planned: a fault the world injected (``world.injected``: itself
     or the cause/context of what arrived) or an error the protocol raises on purpose (a
     ``JobleaseError``: ``LeaseError``, ``ApiError``/``UnavailableError``, ...). Anything
     else (a ``TypeError`` of a changed signature, an ``AttributeError`` of a refactor) is
     a bug the retry would otherwise hide.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from joblease.controller.pods import Delegator, PodView
from joblease.controller.reconciler import LeaseView, Reconciler
from joblease.domain.clock import ServerNow
from joblease.domain.errors import (
    JobleaseError,
    LeaseError,
    LeaseFinishedError,
    LeaseHeldError,
    LeaseLostError,
)
from joblease.domain.lease import Observed
from joblease.domain.lease import parse_time as _parse_time
from joblease.domain.token import FencingToken
from joblease.fencing.check import TokenGate
from joblease.fencing.errors import StaleTokenError
from joblease.kube.leases import LeaseStore
from joblease.kube.pods import PodInfo, PodStore
from joblease.sdk.client import DEFAULT_MARGIN, Lease, LeaseClient, new_claim_id
from joblease.sdk.hold import RENEW_FRACTION, retry_delay

from .model import ModelError, ModelServer
from .pods import PodChurn, annotation_violation, delegated_jobs, delegation_violation
from .pool import POOL_LABEL, PoolWatch, claimable_in_view, draw_jobs, rest_end
from .world import BASE, Faults, LocalClock, SimApi, World, injected

parse_time = functools.lru_cache(maxsize=4096)(_parse_time)  # the oracles re-read the same
POLL = 0.5  # LeaseClient.wait_claim's default poll
ORPHAN_AFTER = 5.0  # seconds a claim may stay unadopted (its retries back off 0.2 s) ...
HUNG_RETRY = 2 * 10.0 + 0.2  # ... or, after a hung request, this long (timeout, then a wait)
ORACLES = "abcdefghijklm"
DRAIN = 300.0  # seconds a run may go on past its horizon while pool jobs are open


@dataclass
class Config:
    """What one run simulates; ``draw`` picks it from the seed."""

    workers: int = 4
    leases: int = 2
    shared_holder: bool = True  # replicas of one ServiceAccount: one holder name
    duration: int = 3
    drift: float = 1e-4  # the bound; clocks' rates are drawn within it (or beyond: fencing only)
    beyond_drift: bool = False
    faults: Faults = field(default_factory=Faults)
    pause: float = 0.0  # probability per effect of a process pause (GC, SIGSTOP)
    crash: float = 0.0  # probability per step of a worker crash
    recreate: float = 0.0  # probability per operator pass of deleting and re-creating a lease
    hostile: bool = False  # one lease with a hostile status the operator must survive
    operator_crash: float = 0.0
    seconds: float = 30.0
    effects: int = 3  # effects per holding before it completes
    poll: float = POLL  # a waiting claimer re-reads at most this often (wait_claim's poll)
    pool_workers: int = 0  # workers of a work pool (claim_next over a PoolView)
    pool_jobs: int = 0
    pool_fail: float = 0.0  # probability that a pool holding ends in release(failed=True)
    pool_effects: int = 2
    admission: bool = False  # the chart's admission policies; holders are usernames then
    pods: bool = False  # pods that delegate leases to the operator, and their churn

    @classmethod
    def draw(cls, world: World) -> Config:
        r = world.rng
        api_faults = r.random() < 0.6
        p = (lambda: r.choice([0.0, 0.01, 0.03])) if api_faults else (lambda: 0.0)
        return cls(workers=r.randint(2, 5), leases=r.randint(1, 3),
                   shared_holder=r.random() < 0.5, duration=r.choice([2, 3, 5, 20, 3600]),
                   beyond_drift=r.random() < 0.1,
                   faults=Faults(p(), p(), p() / 3, p(), p()),
                   pause=r.choice([0.0, 0.02, 0.05]), crash=r.choice([0.0, 0.01]),
                   recreate=r.choice([0.0, 0.0, 0.02]), hostile=r.random() < 0.3,
                   operator_crash=r.choice([0.0, 0.01]), seconds=r.choice([20.0, 40.0]),
                   effects=r.choice([1, 3, 10, 40]), pool_workers=r.choice([0, 2, 3, 5]),
                   pool_jobs=r.randint(2, 8), pool_fail=r.choice([0.0, 0.2, 0.4]),
                   pool_effects=r.choice([1, 2, 4]), admission=r.random() < 0.5,
                   pods=r.random() < 0.5)


@dataclass
class Claimed:
    """One successful claim as the oracles know it."""

    lease: str
    token: FencingToken
    worker: str
    claim_id: str | None
    at: float
    incarnation: str


class Oracles:
    """The properties; ``violations`` counts each by its letter."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.violations: Counter[str] = Counter()
        self.messages: list[str] = []
        self.claims: dict[tuple[str, FencingToken], Claimed] = {}
        self.pending: dict[tuple[str, FencingToken], tuple[str, float]] = {}
        self.crashed: dict[str, tuple[float, str]] = {}  # lease → (deadline true time, worker)
        self.completions: dict[tuple[str, str], list[tuple[str, FencingToken]]] = {}

    def fail(self, oracle: str, message: str) -> None:
        self.violations[oracle] += 1
        if len(self.messages) < 20:
            self.messages.append(f"[{oracle}] t={self.sim.world.now:.3f} {message}")

    def on_caught(self, process: str, handler: str, err: Exception) -> None:
        """Oracle m: a retrying handler caught ``err``; only planned exceptions may arrive.

        Planned: the protocol's own errors (every ``JobleaseError``) and the world's
        injected faults, also when the product wrapped one or failed while handling it.
        """
        if isinstance(err, JobleaseError) or injected(err):
            return
        where = err.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        origin = (f" (raised at {where.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:"
                  f"{where.tb_lineno})" if where is not None else "")
        self.fail("m", f"{process}'s {handler} caught an unplanned {type(err).__name__}: "
                       f"{err}{origin}")

    def on_claim(self, worker: Worker, lease: Lease) -> None:
        key = (lease.name, lease.token)
        known = self.claims.get(key)
        if known is not None and (known.worker, known.claim_id) != (worker.name, lease.claim_id):
            self.fail("b", f"{worker.name} holds token {lease.token} of {lease.name}, created "
                           f"by {known.worker}'s claim {known.claim_id}")
        incarnation = self.sim.server.objects[lease.name]["metadata"]["uid"]
        self.claims.setdefault(key, Claimed(lease.name, lease.token, worker.name,
                                            lease.claim_id, self.sim.world.now, incarnation))
        if not self.sim.config.beyond_drift:
            for other in self.sim.workers:
                held = other.lease
                if other is worker or held is None or other.lost or held.name != lease.name:
                    continue
                if held.uid != lease.uid:
                    continue  # deleting a JobLease revokes its claims at once (docs/safety.md)
                if other.name in self.sim.world.dead:
                    continue
                end = other.clock.true(held.deadline)
                if end > self.sim.world.now:
                    self.fail("a", f"{worker.name} claimed {lease.name} at {lease.token} while "
                                   f"{other.name} believes {held.token} valid until t={end:.3f}")
        self.pending.pop(key, None)
        crashed = self.crashed.pop(lease.name, None)
        if crashed is not None and self.sim.liveness_applies():
            until, who = crashed
            allowance = self.sim.claim_allowance()
            waiting = worker.waiting_since <= until  # a claimer was waiting when it ended
            if waiting and self.sim.world.now > until + allowance:
                self.fail("f", f"{lease.name} claimed {self.sim.world.now - until:.3f}s after "
                               f"{who}'s lease ended (allowance {allowance:.3f}s)")

    def on_choice(self, worker: PoolWorker, chosen: Observed, now: ServerNow,
                  margin: timedelta) -> None:
        """Oracle i: nothing of higher priority is claimable by the view's own knowledge."""
        view = worker.pool.view
        aside = view._set_aside
        better = [obs for name in list(view._items) if name not in aside
                  and (obs := view._items[name]).spec.priority > chosen.spec.priority
                  and claimable_in_view(obs, now, margin)]
        if better:
            self.fail("i", f"{worker.name} chose {chosen.name} (priority "
                           f"{chosen.spec.priority}) while its view had {better[0].name} "
                           f"(priority {better[0].spec.priority}) claimable")

    def on_completed(self, worker: Worker, lease: Lease) -> None:
        """Oracle h: at most one worker ever believes it completed a job (incarnation)."""
        believers = self.completions.setdefault((lease.name, lease.uid), [])
        believers.append((worker.name, lease.token))
        if len(believers) > 1:
            self.fail("h", f"{lease.name} completed twice: by {believers}")

    def at_end(self) -> None:
        """Oracle h: each Completed job's record is a real claim's; every job has ended.
        Oracle l: no admission policy refused any of joblease's writes."""
        sim = self.sim
        known = sim.exhausted_takeovers_refused
        refused = {w.name: w.api.forbidden - known[w.name] for w in sim.workers
                   if w.api.forbidden > known[w.name]}
        if sim.operator.api.forbidden:
            refused["operator"] = sim.operator.api.forbidden
        if refused:
            self.fail("l", f"admission policies refused writes: {refused}")
        for name in sim.pool_names:
            obj = sim.server.objects[name]
            status = obj.get("status") or {}
            record = status.get("completion")
            if record is not None:
                self._check_record(name, obj["metadata"]["uid"], status, record)
            elif status.get("phase") != "Failed" and sim.drained:
                self.fail("h", f"{name} still {status.get('phase')} at the end of the run "
                               f"(t={sim.world.now:.0f}s): never completed nor failed")

    def _check_record(self, name: str, uid: str, status: dict[str, Any],
                      record: dict[str, Any]) -> None:
        token = FencingToken(int(status.get("epoch") or 0), int(record["generation"]))
        claim = self.claims.get((name, token))
        if claim is None or claim.incarnation != uid:
            self.fail("h", f"{name}'s completion record {token} names no claim a worker made")
        believers = self.completions.get((name, uid), [])
        if any(t != token for _, t in believers):
            self.fail("h", f"{name}: believed completed as {believers}, recorded as {token}")

    def on_write(self, writer: str, name: str, before: dict[str, Any], after: dict[str, Any],
                 incarnation: str) -> None:
        """Every status write the server accepted (c; j for claims; a claim's adoption: f)."""
        if after.get("generation", 0) > before.get("generation", 0):
            self.check_rest(writer, name, before)
            self.sim.delegated_claims += writer == "operator"
        if writer == "operator":
            problem = delegation_violation(self.sim, name, before, after,
                                           self.sim.operator.pod_lag + 0.02)
            if problem is not None:
                self.fail("k", problem)
        if writer != "operator" and after.get("generation", 0) != before.get("generation", 0):
            token = FencingToken(int(after.get("epoch") or 0), int(after["generation"]))
            self.pending[(name, token)] = (writer, self.sim.world.now)
        if writer == "operator" or after.get("generation", 0) != before.get("generation", 0):
            return
        token = FencingToken(int(after.get("epoch") or 0), int(after.get("generation", 0)))
        claim = self.claims.get((name, token))
        if claim is None or claim.worker != writer or claim.incarnation != incarnation:
            if after.get("phase") == "Failed" and self._ended(before):
                return  # a claim that found the lease ended and its attempts used up
            owner = f"{claim.worker} (incarnation {claim.incarnation})" if claim else "nobody"
            self.fail("c", f"{writer}'s write on {name} ({before.get('phase')} → "
                           f"{after.get('phase')}) accepted under token {token} of {owner}")

    def _ended(self, before: dict[str, Any]) -> bool:
        """Whether the claim ``before`` records has ended on the true timeline (or, beyond
        the drift bound, may be judged ended early: there only fencing is checked)."""
        until = before.get("leaseUntil")
        if before.get("phase") != "Held" or not until or self.sim.config.beyond_drift:
            return True
        return self.sim.world.server_time(serving=True) >= parse_time(until)

    def check_rest(self, writer: str, name: str, before: dict[str, Any]) -> None:
        """Oracle j: a claim is accepted only once the lease's rest is over (server time)."""
        if self.sim.config.beyond_drift:
            return  # an estimate beyond the drift bound may be wrong: only fencing holds
        spec = self.sim.server.objects[name]["spec"]
        end = rest_end(before, spec)
        now = self.sim.world.server_time(serving=True)
        if end is not None and now < end:
            self.fail("j", f"{writer} claimed {name} {(end - now).total_seconds():.3f}s "
                           f"before its rest ended ({before.get('phase')}, attempts "
                           f"{before.get('attempts', 0)}, notBefore {before.get('notBefore')})")

    def on_effect(self, worker: Worker, lease: Lease) -> None:
        """An effect whose check passed now (oracle d)."""
        obj = self.sim.server.objects.get(lease.name)
        status = (obj or {}).get("status") or {}
        current = FencingToken(int(status.get("epoch") or 0), int(status.get("generation", 0)))
        until = status.get("leaseUntil")
        if obj is None or obj["metadata"]["uid"] != lease.uid:
            return  # revoked by deletion: only the target's fencing protects (oracle e)
        if status.get("phase") != "Held" or current != lease.token or until is None:
            self.fail("d", f"{worker.name} acted under {lease.token} of {lease.name}, but the "
                           f"server has {current} ({status.get('phase')})")
        elif self.sim.world.server_time() > parse_time(until):
            late = (self.sim.world.server_time() - parse_time(until)).total_seconds()
            self.fail("d", f"{worker.name} acted under {lease.token} {late:.3f}s after its end")

    def on_target(self, resource: str, token: FencingToken, accepted: bool) -> None:
        history = self.sim.target_history.setdefault(resource, [])
        if accepted and history and token < max(history):
            self.fail("e", f"target accepted {token} after {max(history)} on {resource}")
        if accepted:
            history.append(token)

    def at_step(self) -> None:
        """Oracle g, and f for claims the server accepted but no live worker adopted."""
        sim = self.sim
        for key, (writer, at) in list(self.pending.items()):
            hung = sim.hung_at.get(writer, -1e9)  # a hung request delays the adoption
            if sim.world.now - at > ORPHAN_AFTER and sim.world.now - hung > HUNG_RETRY:
                del self.pending[key]
                if writer not in sim.world.dead and sim.liveness_applies(orphans=True):
                    self.fail("f", f"{writer}'s claim {key[1]} of {key[0]} was accepted but "
                                   f"nobody holds it: the lease is held by no worker")
        if not sim.operator_up:
            return
        lag = sim.expiry_allowance()
        now = sim.world.server_time()
        for name, obj in sim.server.objects.items():
            status = obj.get("status") or {}
            if name == sim.hostile_name or status.get("phase") != "Held":
                continue
            until = status.get("leaseUntil")
            if until and now > parse_time(until) + timedelta(seconds=lag) \
                    and sim.world.now - sim.operator_since > lag:
                self.fail("g", f"{name} still Held {(now - parse_time(until)).total_seconds():.2f}"
                               f"s after its end with the operator up")


class Worker:
    """A worker process: claims, holds (renewer + watchdog), acts through the fence, completes."""

    def __init__(self, sim: Simulation, index: int, prefix: str = "w") -> None:
        self.sim, self.name = sim, f"{prefix}{index}"
        world = sim.world
        bound = sim.config.drift * (30 if sim.config.beyond_drift else 1)
        self.clock = LocalClock(world.rng.uniform(0, 1e4), world.rng.uniform(-bound, bound))
        self.holder = "replicas" if sim.config.shared_holder and prefix == "w" else self.name
        # Under the holder-only policy a holder is the worker's username: replicas that
        # share a holder name share one identity (one ServiceAccount).
        self.api = SimApi(world, sim.server, self.clock, self.name, sim.config.faults,
                          user=self.holder)
        self.client = LeaseClient("sim", api=self.api, calibrate=False)  # type: ignore[arg-type]
        self.hold_seconds = float(sim.config.duration)  # the scale of a pause
        self.effects_wanted = sim.config.effects
        self.lease: Lease | None = None
        self.lost = False
        self.failures = 0
        self.effects = 0
        self.claim_id = new_claim_id()
        self.target_lease = world.rng.choice(sim.lease_names)
        self.waiting_since = world.now
        # Like `joblease run`: the command does not check the lease before each effect; it
        # stops only when the holding declares the loss (renewer refusal or watchdog).
        self.run_like = world.rng.random() < 0.5
        self.watchdog = self.sentinel = True  # switches for the rediscovery tests

    def schedule(self, delay: float, action: Any, owner: str = "") -> None:
        self.sim.world.after(self.api.elapsed + delay, lambda: self._step(action),
                             owner or self.name)

    @property
    def command(self) -> str:
        """The process effects come from: the runner's command is a process of its own
        (a pause of the runner does not pause it; the sentinel kills it at the deadline)."""
        return f"{self.name}-cmd" if self.run_like else self.name

    def _step(self, action: Any) -> None:
        self.api.elapsed = 0.0
        self.api.blocked = 0.0
        if self.sim.world.rng.random() < self.sim.config.crash:
            self.crash()
            return
        action()

    def crash(self) -> None:
        world = self.sim.world
        world.dead.update((self.name, self.command))  # the sentinel takes the command along
        if self.lease is not None and not self.lost and self.lease.name in self.sim.lease_names:
            obj = self.sim.server.objects.get(self.lease.name) or {}
            until = (obj.get("status") or {}).get("leaseUntil")
            if until and (obj.get("status") or {}).get("generation") == self.lease.generation:
                end = (parse_time(until) - BASE).total_seconds()
                self.sim.oracles.crashed.setdefault(self.lease.name, (end, self.name))
        self.sim.spawn(type(self))  # a replacement, as a Deployment would start

    # -- claiming ---------------------------------------------------------------------------
    def claim(self) -> None:
        self.sim.ops += 1
        name = self.target_lease
        try:
            lease = self.client.claim(name, self.holder, claim_id=self.claim_id)
        except LeaseHeldError as held:
            wait = self.client._seconds_until(held.lease_until)
            self.schedule(max(0.01, min(self.sim.config.poll, wait)), self.claim)
            return
        except LeaseFinishedError:
            self.pick_another()
            return
        except LeaseError:  # not found (being re-created)
            self.schedule(POLL, self.claim)
            return
        except Exception as err:
            self.sim.oracles.on_caught(self.name, "claim", err)
            self.schedule(0.2 + self.api.blocked, self.claim)
            return
        self.start_holding(lease)

    def start_holding(self, lease: Lease) -> None:
        self.lease, self.lost, self.failures, self.effects = lease, False, 0, 0
        self.sim.oracles.on_claim(self, lease)
        self.interval = max(0.05, lease.remaining() * RENEW_FRACTION)
        self.schedule(self.interval, self.renew)
        self.watch()
        self.schedule(self.sim.world.rng.uniform(0, self.interval), self.act, self.command)

    def pick_another(self) -> None:
        open_ = [n for n, o in self.sim.server.objects.items() if n not in self.sim.not_named
                 and (o.get("status") or {}).get("phase") not in ("Completed", "Failed")]
        if open_:
            self.target_lease = self.sim.world.rng.choice(open_)
            self.claim_id = new_claim_id()
            self.waiting_since = self.sim.world.now
            self.schedule(POLL, self.claim)

    # -- holding ----------------------------------------------------------------------------
    def watch(self) -> None:
        """The watchdog: at the deadline (on this clock), declare the loss unless renewed."""
        lease = self.lease
        if lease is None or self.lost or not self.watchdog:
            return
        due = self.clock.true(lease.deadline) - self.sim.world.now
        self.sim.world.after(max(0.0, due), lambda: self._watchdog(lease), self.name)

    def _watchdog(self, lease: Lease) -> None:
        if self.lease is not lease or self.lost or not self.watchdog:
            return
        self.api.elapsed = 0.0
        if lease.remaining() > 0:
            self.watch()  # renewed meanwhile
            return
        self.lose()

    def lose(self) -> None:
        self.lost = True
        self.next_claim()

    def next_claim(self) -> None:
        self.lease = None
        self.claim_id = new_claim_id()
        self.waiting_since = self.sim.world.now
        self.schedule(POLL, self.claim)

    def renew(self) -> None:
        lease = self.lease
        if lease is None or self.lost:
            return
        self.sim.ops += 1
        if lease.remaining() <= 0:
            self.lose()
            return
        try:
            lease.renew()
        except LeaseLostError:
            self.lose()
            return
        except Exception as err:
            self.sim.oracles.on_caught(self.name, "renew", err)
            self.failures += 1
            self.schedule(retry_delay(self.failures), self.renew)
            return
        self.failures = 0
        self.schedule(self.interval, self.renew)

    def act(self) -> None:
        lease = self.lease
        if lease is None or self.lost:
            return
        self.sim.ops += 1
        if not self.run_like and not lease.valid():  # Holding.check()
            if lease.remaining() <= 0:
                self.lose()
            return
        if self.run_like and self.sentinel and self.clock.local(self.sim.world.now) \
                >= lease.deadline:
            self.lose()  # the sentinel killed the command at the last deadline it was sent
            return
        self.sim.note(f"{self.name:>8} acts under {lease.token} of {lease.name}")
        self.sim.oracles.on_effect(self, lease)
        self.effects += 1
        token, resource = lease.token, lease.name
        transit = self.api.rtt
        if self.sim.world.rng.random() < self.sim.config.pause:
            pause = self.sim.world.rng.uniform(0.5, 3 * self.hold_seconds)
            self.sim.world.paused_until[self.name] = self.sim.world.now + pause
            transit += pause  # the write was on its way when the process stopped
        self.sim.world.after(transit, lambda: self.sim.deliver(resource, token), "")
        if self.effects >= self.effects_wanted:
            self.schedule(0.01, self.complete)
        else:
            self.schedule(self.sim.world.rng.uniform(0.05, self.interval), self.act,
                          self.command)

    def complete(self) -> None:
        lease = self.lease
        if lease is None or self.lost:
            return
        self.sim.ops += 1
        try:
            lease.complete("done")
        except LeaseLostError:
            self.lose()
            return
        except LeaseError:
            self.lose()
            return
        except Exception as err:
            self.sim.oracles.on_caught(self.name, "complete", err)
            self.schedule(retry_delay(1), self.complete)
            return
        self.lease = None
        self.sim.completed += 1
        self.on_completed(lease)

    def on_completed(self, lease: Lease) -> None:
        self.pick_another()


class PoolWorker(Worker):
    """A worker of a work pool: the real ``PoolView``, fed by its own lagging watch, picks
    the job (priority, FIFO, rendezvous spread, set-aside, next wake); the real
    ``LeaseClient.claim`` claims it from the cached version (``transact``: a 409 sends it
    to a fresh read). A claim whose answer is unknown is retried under the same claim id
    before anything else is chosen, or its lease would be left held by nobody. A holding
    ends in ``complete`` or, with probability ``pool_fail``, ``release(failed=True)``.
    """

    def __init__(self, sim: Simulation, index: int) -> None:
        super().__init__(sim, index, prefix="p")
        self.pool = PoolWatch(sim)
        self.effects_wanted = sim.config.pool_effects
        self.retry: tuple[str, str] | None = None  # (job, claim id) of an unanswered claim
        self.idle_until: float | None = None
        self.wake_seq = 0

    def claim(self) -> None:
        self.idle_until = None
        self.sim.ops += 1
        if self.retry is not None:
            name, claim_id = self.retry
            self._claim(name, claim_id, None)
            return
        self.pool.sync()
        try:
            now, margin = self.api.server_now(), self.client.margin()
        except Exception as err:
            self.sim.oracles.on_caught(self.name, "server_now", err)
            self.schedule(0.2, self.claim)
            return
        chosen = self.pool.view.choose(self.holder, now, margin)
        if chosen is None:
            self.idle(now, margin)
            return
        self.sim.oracles.on_choice(self, chosen, now, margin)
        self._claim(chosen.name, new_claim_id(), chosen)

    def _claim(self, name: str, claim_id: str, cached: Observed | None) -> None:
        conflicts = self.api.conflicts
        try:
            lease = self.client.claim(name, self.holder, observed=cached, claim_id=claim_id)
        except LeaseError:  # held, resting, finished (or made Failed by this very claim)
            self.sim.pool_refusals += 1
            self.retry = None
            self.pool.view.set_aside(name)
            self.schedule(0.001, self.claim)
            return
        except Exception as err:  # unknown: the claim may have landed; ask again with its id
            self.sim.oracles.on_caught(self.name, "claim", err)
            self.retry = (name, claim_id)
            self.schedule(0.2, self.claim)  # (after a hung request's timeout, already spent)
            return
        finally:
            self.sim.pool_conflicts += self.api.conflicts - conflicts
        self.retry = None
        self.sim.pool_claims += 1
        observed = lease._observed
        if observed is not None:
            self.pool.view.learn(observed)
            self.hold_seconds = float(observed.spec.lease_duration_seconds)
        self.start_holding(lease)

    def idle(self, now: ServerNow, margin: timedelta) -> None:
        """Sleep until the next wake (a rest or a lease may end) or the next event arrives."""
        wake = self.pool.view.next_wake(now, margin)
        delay = 2.0 if wake is None else (wake - now.earliest).total_seconds() + 0.001
        at = self.sim.world.now + self.api.elapsed + min(2.0, max(0.001, delay))
        arrival = self.pool.next_arrival()
        self.wake_at(min(at, arrival) if arrival is not None else at)

    def wake_at(self, at: float) -> None:
        """(Re)schedule the idle worker's wake-up: an earlier time replaces a later one."""
        if self.idle_until is not None and self.idle_until <= at:
            return
        self.idle_until = at
        self.wake_seq += 1
        seq = self.wake_seq

        def wake() -> None:
            if self.wake_seq == seq:
                self._step(self.claim)

        self.sim.world.at(at, wake, self.name)

    def start_holding(self, lease: Lease) -> None:
        self.fails_job = self.sim.world.rng.random() < self.sim.config.pool_fail
        super().start_holding(lease)

    def complete(self) -> None:
        lease = self.lease
        if lease is None or self.lost:
            return
        if not self.fails_job:
            super().complete()
            return
        self.sim.ops += 1
        try:
            lease.release(failed=True)
        except LeaseFinishedError:
            pass  # the last of maxAttempts: the job is Failed now
        except LeaseError:
            self.lose()
            return
        except Exception as err:
            self.sim.oracles.on_caught(self.name, "release", err)
            self.schedule(retry_delay(1), self.complete)
            return
        self.lease = None
        self.pick_another()

    def on_completed(self, lease: Lease) -> None:
        self.sim.oracles.on_completed(self, lease)
        self.pick_another()

    def pick_another(self) -> None:
        self.lease = None
        self.schedule(0.001, self.claim)


class Operator:
    """The real ``Reconciler`` and ``Delegator`` over watches fed from the model's event logs
    (with gaps; pod events also with a lag), each in its own loop, as in the runtime."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        world = sim.world
        self.clock = LocalClock(world.rng.uniform(0, 1e4),
                                world.rng.uniform(-sim.config.drift, sim.config.drift))
        self.api = SimApi(world, sim.server, self.clock, "operator")
        self.pod_lag = world.rng.choice([0.0, 0.05, 0.5])
        self.incarnation = 0
        self.start()

    def start(self) -> None:
        self.incarnation += 1
        self.view = LeaseView()
        margin = DEFAULT_MARGIN + timedelta(milliseconds=5)
        self.reconciler = Reconciler(LeaseStore(self.api), self.view,  # type: ignore[arg-type]
                                     margin)
        self.pod_view = PodView()
        self.delegator = Delegator(LeaseStore(self.api), PodStore(self.api),  # type: ignore[arg-type]
                                   self.view, self.pod_view, margin)
        self.seen = len(self.sim.server.events)
        for obj in self.sim.server.list():  # the initial list
            self._put(obj)
        self._relist_pods()
        self.sim.operator_up, self.sim.operator_since = True, self.sim.world.now
        self.sim.world.after(0.01, self.tick, "operator")
        if self.sim.config.pods:
            incarnation = self.incarnation
            self.sim.world.after(0.02, lambda: self.delegate(incarnation), "operator")

    def _relist_pods(self) -> None:
        self.pod_view = self.delegator.pod_view = PodView()
        for obj in self.sim.server.pods.values():
            self.pod_view.put(PodInfo.from_object(obj))
        self.pods_seen = len(self.sim.server.pod_events)

    def delegate(self, incarnation: int) -> None:
        """One pass of the delegation loop (it ends when this operator process crashed)."""
        sim = self.sim
        if incarnation != self.incarnation or not sim.operator_up:
            return
        self.api.elapsed = 0.0
        if sim.world.rng.random() < 0.02:  # a watch gap: resume by relisting
            self._relist_pods()
        stamps, events = sim.pod_event_times, sim.server.pod_events
        while self.pods_seen < len(stamps) and \
                stamps[self.pods_seen] + self.pod_lag <= sim.world.now:
            event = events[self.pods_seen]
            self.pods_seen += 1
            pod = PodInfo.from_object(event.obj)
            if event.type == "DELETED":
                self.pod_view.drop(pod)
            else:
                self.pod_view.put(pod)
        wait = self.delegator.pass_once()
        sim.ops += 1
        sim.world.after(self.api.elapsed + min(wait, 1.0), lambda: self.delegate(incarnation),
                        "operator")

    def _put(self, obj: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # an unreadable object: skipped, like the handler
            self.view.put(Observed.from_object(obj))

    def tick(self) -> None:
        sim = self.sim
        self.api.elapsed = 0.0
        if sim.world.rng.random() < sim.config.operator_crash:
            sim.operator_up = False
            sim.world.after(sim.world.rng.uniform(0.5, 3.0), self.start, "operator")
            return
        if sim.world.rng.random() < 0.02:  # a watch gap: resume by relisting
            self.view = LeaseView()
            self.reconciler.view = self.delegator.lease_view = self.view
            for obj in sim.server.list():
                self._put(obj)
        else:
            for event in sim.server.events[self.seen:]:
                obs = Observed.from_object(event.obj) if event.type != "DELETED" else None
                if obs is None:
                    meta = event.obj["metadata"]
                    self.view.drop(meta["namespace"], meta["name"], meta["uid"])
                else:
                    self.view.put(obs)
        self.seen = len(sim.server.events)
        sim.maybe_recreate()
        try:
            wait = self.reconciler.pass_once()
        except Exception as err:
            self.sim.oracles.on_caught("operator", "reconcile pass", err)
            wait = 1.0
        sim.ops += 1
        sim.world.after(self.api.elapsed + min(wait, 1.0), self.tick, "operator")


class Simulation:
    """One seed: build the world, run it, report the oracles."""

    def __init__(self, seed: int, config: Config | None = None, trace: bool = False) -> None:
        self.world = World(seed)
        drawn = Config.draw(self.world)  # always drawn, so a seed means the same world
        self.config = config or drawn
        self.tracing = trace
        self.trace: list[str] = []
        self.server = ModelServer(admission=self.config.admission,
                                  clock=lambda: self.world.server_time(serving=True))
        self.lease_names = [f"job-{i}" for i in range(self.config.leases)]
        self.pool_names: list[str] = []
        self.not_named: set[str] = set()  # leases named workers leave alone (pool, pods)
        self.event_times: list[float] = []  # when each of server.events happened (true time)
        self.pod_event_times: list[float] = []
        self.pods = PodChurn(self)
        self.pool_claims = self.pool_conflicts = self.pool_refusals = 0
        self.delegated_claims = 0  # the operator's claims for pods
        # A known finding (docs/safety.md): the holder-only policy refuses a claimer's write
        # that marks another holder's expired lease Failed (its last attempt used up).
        self.exhausted_takeovers_refused: Counter[str] = Counter()
        self._parsed: dict[int, Observed] = {}
        self.hung_at: dict[str, float] = {}  # worker → when its last hung request was sent
        self.drained = False
        self.hostile_name = "hostile" if self.config.hostile else ""
        self.target = TokenGate()
        self.target_history: dict[str, list[FencingToken]] = {}
        self.oracles = Oracles(self)
        self.workers: list[Worker] = []
        self.ops = 0
        self.completed = 0
        self.operator_up, self.operator_since = False, 0.0
        self._watch_writes()

    def _watch_writes(self) -> None:
        patch = self.server.patch_status

        def recorded(name: str, body: dict[str, Any], user: str | None = None
                     ) -> dict[str, Any]:
            before = dict((self.server.objects.get(name) or {}).get("status") or {})
            try:
                after = patch(name, body, user)
            except ModelError as err:
                if err.status == 403 and _fails_anothers_lease(before, body):
                    self.exhausted_takeovers_refused[self._writer] += 1
                raise
            if self.tracing:
                st = after.get("status") or {}
                self.trace.append(f"t={self.world.now:9.3f} {self._writer:>8} wrote {name}: "
                                  f"{st.get('phase')} {st.get('holder')} "
                                  f"{st.get('epoch')}/{st.get('generation')} "
                                  f"until {st.get('leaseUntil')}")
            self.oracles.on_write(self._writer, name, before, after.get("status") or {},
                                  after["metadata"]["uid"])
            return after

        self._writer = "operator"
        self.server.patch_status = recorded  # type: ignore[method-assign,assignment]
        patch_pod = self.server.patch_pod

        def annotated(name: str, body: dict[str, Any], user: str | None = None
                      ) -> dict[str, Any]:
            after = patch_pod(name, body, user)
            problem = annotation_violation(after)
            if problem is not None:
                self.oracles.fail("k", problem)
            return after

        self.server.patch_pod = annotated  # type: ignore[method-assign,assignment]

    def run(self) -> Simulation:
        for name in self.lease_names:
            self.server.create(name, {"leaseDurationSeconds": self.config.duration})
        if self.hostile_name:
            obj = self.server.create(self.hostile_name, {"leaseDurationSeconds": 86400})
            self.server.objects[self.hostile_name]["status"] = {  # written before the CRD's bounds
                "phase": "Held", "holder": "h", "generation": 1, "epoch": 1,
                "renewTime": "9999-12-31T00:00:00.000Z",
                "leaseUntil": "9999-12-31T23:59:59.999Z"}
            del obj
        for name, spec in draw_jobs(self.world.rng, self.config.pool_jobs
                                    if self.config.pool_workers else 0):
            self.server.create(name, spec, labels=dict([POOL_LABEL]))
            self.pool_names.append(name)
            self.not_named.add(name)
        if self.config.pods:
            for name, spec in delegated_jobs(self.world.rng):
                self.server.create(name, spec)
                self.not_named.add(name)
            self.pods.start()
        self.operator = Operator(self)
        for _ in range(self.config.workers):
            self.spawn(Worker)
        for _ in range(self.config.pool_workers):
            self.spawn(PoolWorker)
        self.world.run_until(self.config.seconds, self.each)
        end = self.config.seconds
        while self.open_pool_jobs() and end < self.config.seconds + DRAIN:
            end += 10.0
            self.world.run_until(end, self.each)
        self.drained = True
        self.oracles.at_end()
        return self

    def observed_event(self, index: int) -> Observed:
        """``server.events[index]`` parsed once for every watcher (events never change)."""
        obs = self._parsed.get(index)
        if obs is None:
            obs = self._parsed[index] = Observed.from_object(self.server.events[index].obj)
        return obs

    def open_pool_jobs(self) -> int:
        return sum(1 for name in self.pool_names if (self.server.objects[name].get("status")
                   or {}).get("phase") not in ("Completed", "Failed"))

    def each(self) -> None:
        """After every event: stamp new watch events, wake idle pool workers, check."""
        if len(self.pod_event_times) < len(self.server.pod_events):
            self.pod_event_times.extend([self.world.now] * (len(self.server.pod_events)
                                                            - len(self.pod_event_times)))
        stamped = len(self.event_times)
        if stamped < len(self.server.events):
            self.event_times.extend([self.world.now] * (len(self.server.events) - stamped))
            for worker in self.workers:
                if isinstance(worker, PoolWorker) and worker.idle_until is not None:
                    arrival = worker.pool.next_arrival()
                    if arrival is not None:
                        worker.wake_at(arrival)
        self.oracles.at_step()

    def spawn(self, kind: type[Worker]) -> None:
        worker = kind(self, len(self.workers))
        self.workers.append(worker)
        api_request = worker.api.request

        def request(method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
            self._writer = worker.name
            try:
                return api_request(method, path, body, **kwargs)
            finally:
                self._writer = "operator"
                self.hung_at[worker.name] = worker.api.hung_at

        worker.api.request = request  # type: ignore[method-assign]
        worker.schedule(self.world.rng.uniform(0, 0.5), worker.claim)

    def note(self, text: str) -> None:
        if self.tracing:
            self.trace.append(f"t={self.world.now:9.3f} {text}")

    def deliver(self, resource: str, token: FencingToken) -> None:
        try:
            self.target.accept(resource, token)
            self.oracles.on_target(resource, token, True)
        except StaleTokenError:
            self.oracles.on_target(resource, token, False)

    def maybe_recreate(self) -> None:
        if self.world.rng.random() >= self.config.recreate:
            return
        name = self.world.rng.choice(self.lease_names)
        if name in self.server.objects:
            self.server.delete(name)
            self.server.create(name, {"leaseDurationSeconds": self.config.duration})

    def liveness_applies(self, orphans: bool = False) -> bool:
        f = self.config.faults
        if orphans:  # lost answers must be recognised whatever else happens
            return not self.config.beyond_drift and self.config.pause == 0
        return (not self.config.beyond_drift and self.config.pause == 0
                and f.request_lost == f.response_lost == f.hung == f.exception == 0
                and f.conflict_storm == 0)

    def claim_allowance(self) -> float:
        return DEFAULT_MARGIN.total_seconds() + 1.0 + POLL + 0.1  # margin + Date error + poll

    def expiry_allowance(self) -> float:
        return DEFAULT_MARGIN.total_seconds() + 1.0 + 1.0 + 0.2  # margin + Date error + pass

    def summary(self) -> dict[str, Any]:
        return {"seed": self.world.seed, "ops": self.ops, "completed": self.completed,
                "pool_claims": self.pool_claims, "pool_409s": self.pool_conflicts,
                "delegated_claims": self.delegated_claims,
                "exhausted_takeovers_refused": sum(self.exhausted_takeovers_refused.values()),
                "faults": dict(self.config.faults.counts),
                "violations": dict(self.oracles.violations),
                "messages": self.oracles.messages}


def _fails_anothers_lease(before: dict[str, Any], patch: dict[str, Any]) -> bool:
    """A claim that found another holder's lease expired with its attempts used up, and
    marks it Failed without raising the generation (``decide_claim``'s step 4)."""
    status = patch.get("status") or {}
    return (before.get("phase") == "Held" and status.get("phase") == "Failed"
            and "generation" not in status and "holder" not in status)


def shrink(seed: int, config: Config | None = None) -> Simulation:
    """The smallest configuration that still fails with ``seed`` (greedy, one knob at a time).

    Each candidate keeps the seed; a change that makes the failure disappear is undone.
    """
    current = config or Simulation(seed).config
    fails = Simulation(seed, current).run()
    if not fails.oracles.violations:
        return fails
    candidates = [
        lambda c: replace(c, seconds=max(2.0, c.seconds / 2)),
        lambda c: replace(c, workers=max(1, c.workers - 1)),
        lambda c: replace(c, leases=max(1, c.leases - 1)),
        lambda c: replace(c, pool_workers=max(0, c.pool_workers - 1)),
        lambda c: replace(c, pool_jobs=max(1, c.pool_jobs - 1)),
        lambda c: replace(c, admission=False), lambda c: replace(c, pods=False),
        lambda c: replace(c, pause=0.0), lambda c: replace(c, crash=0.0),
        lambda c: replace(c, recreate=0.0), lambda c: replace(c, operator_crash=0.0),
        lambda c: replace(c, hostile=False),
        *(lambda c, n=name: replace(c, faults=replace(c.faults, **{n: 0.0}))
          for name in ("request_lost", "response_lost", "hung", "conflict_storm", "exception")),
    ]
    improved = True
    while improved:
        improved = False
        for change in candidates:
            smaller = change(current)
            if smaller == current:
                continue
            smaller = replace(smaller, faults=replace(smaller.faults, counts={}))
            if Simulation(seed, smaller).run().oracles.violations:
                current, improved = smaller, True
    return Simulation(seed, replace(current, faults=replace(current.faults, counts={})),
                      trace=True).run()
