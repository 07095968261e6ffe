"""The simulator in CI: a bounded set of seeds, and proof that it finds the known bugs.

Each rediscovery test re-introduces one bug of the safety track record (docs/safety.md)
with a switch *in this test* (monkeypatch), never in production code, and requires the
right oracle to report it within a bounded number of seeds. A verifier that has never
caught a bug proves nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

import joblease.controller.pods as pods_module
import joblease.domain.lease as lease_module
import joblease.domain.pool as pool_module
from joblease.controller.pods import Delegator
from joblease.controller.reconciler import Reconciler
from joblease.core.steps import drive
from joblease.domain import holder as holder_module  # ClaimDecider calls decide_claim
from joblease.domain.clock import ServerClock
from joblease.domain.errors import LeaseLostError
from joblease.domain.lease import EARLIEST_TIME, Claim, LeaseSpec, LeaseStatus, Observed
from joblease.sdk.client import Lease

from .sim import Config, Simulation, Worker, shrink
from .world import Faults, inject, injected

CI_SEEDS = 1500  # about 45 s of one core here; `make sim` runs as long as asked
FOUND: dict[str, tuple[int, str]] = {}


def test_a_bounded_set_of_seeds_finds_no_violation() -> None:
    started, ops, violations = time.monotonic(), 0, Counter[str]()
    failing: list[int] = []
    pool_claims = pool_409s = delegated = 0
    for seed in range(CI_SEEDS):
        sim = Simulation(seed).run()
        ops += sim.ops
        pool_claims, pool_409s = pool_claims + sim.pool_claims, pool_409s + sim.pool_conflicts
        delegated += sim.delegated_claims
        violations.update(sim.oracles.violations)
        if sim.oracles.violations:
            failing.append(seed)
    elapsed = time.monotonic() - started
    print(f"\nsim: {CI_SEEDS} seeds, {ops} operations, {ops / elapsed * 60:,.0f} ops/min; "
          f"{pool_claims} pool claims, {pool_409s / max(1, pool_claims):.2f} wasted 409s per "
          f"claimed job; {delegated} claims for pods")
    assert not failing, (failing[:5], shrink(failing[0]).oracles.messages)
    assert ops > CI_SEEDS * 20  # the runs did something
    assert pool_claims > CI_SEEDS and delegated > CI_SEEDS / 20  # the new parts ran too


def test_the_same_seed_replays_the_same_run() -> None:
    first, second = Simulation(42, trace=True).run(), Simulation(42, trace=True).run()
    assert first.trace == second.trace and first.ops == second.ops


def _find(oracle: str, config: Config, max_seeds: int) -> int:
    for seed in range(max_seeds):
        sim = Simulation(seed, replace(config, faults=replace(config.faults, counts={}))).run()
        if sim.oracles.violations.get(oracle):
            return seed + 1
    raise AssertionError(f"oracle {oracle} never fired in {max_seeds} seeds")


def _record(bug: str, oracle: str, seeds: int) -> None:
    FOUND[bug] = (seeds, oracle)
    print(f"\nrediscovered {bug} with oracle {oracle} after {seeds} seed(s)")


# -- bug 1: renew/complete ignore the epoch, and the SDK adopts the server's token -----------

def test_rediscovers_adopting_another_incarnations_token(monkeypatch: pytest.MonkeyPatch) -> None:
    def old_same_claim(st: LeaseStatus, claim: Any) -> bool:
        return st.holder == claim.holder and st.generation == claim.token.generation

    old_apply = Lease._apply

    def adopt(self: Lease, outcome: Any, now: Any, resumed: bool = False) -> None:
        self.token = outcome.observed.status.token()  # the old SDK overwrote its token
        self.uid = outcome.observed.uid
        old_apply(self, outcome, now, resumed)

    monkeypatch.setattr(lease_module, "_same_claim", old_same_claim)
    monkeypatch.setattr(Lease, "_apply", adopt)
    monkeypatch.setattr(Lease, "_op_steps", _without_uid_check(Lease._op_steps))
    config = Config(workers=4, leases=1, shared_holder=True, duration=3, recreate=0.3,
                    seconds=30)
    _record("1 token adopted across incarnations", "c", _find("c", config, 200))


def _without_uid_check(op_steps: Callable[..., Any]) -> Callable[..., Any]:
    def patched(self: Lease, decide: Any, until_deadline: bool = False) -> Any:
        with contextlib.suppress(Exception):  # the old SDK pinned no uid: follow the name
            self.uid = self._client.get(self.name).uid
        return op_steps(self, decide, until_deadline)
    return patched


# -- bug 2: one hostile timestamp halts the operator's pass ------------------------------------

def test_rediscovers_a_hostile_timestamp_halting_the_operator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def old_parse(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    def overflowing_add(when: datetime, delta: timedelta) -> datetime:
        return when + delta

    def no_isolation(self: Reconciler, obs: Any, stage: str, err: BaseException) -> None:
        raise err

    monkeypatch.setattr(lease_module, "parse_time", old_parse)
    monkeypatch.setattr(lease_module, "add_time", overflowing_add)
    import joblease.controller.reconciler as reconciler_module
    import joblease.domain.time as time_module
    monkeypatch.setattr(reconciler_module, "add_time", overflowing_add)
    # The one expiry rule (domain.time.expiry_at/expiry_due, which the reconciler's heaps
    # judge by) adds through its own module's add_time: the old, overflowing one there too.
    monkeypatch.setattr(time_module, "add_time", overflowing_add)
    monkeypatch.setattr(Reconciler, "object_failed", no_isolation)
    # Fewer workers than leases: a crashed holder's lease waits for the operator's expiry.
    config = Config(workers=2, leases=3, duration=2, hostile=True, crash=0.05, seconds=30,
                    effects=10)
    _record("2 hostile timestamp halts the operator", "g", _find("g", config, 50))


# -- bug 3: the renewal loop dies on an exception it did not plan for ------------------------

def test_rediscovers_a_renewal_loop_that_dies_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    def dies(self: Worker) -> None:
        self.watchdog = self.sentinel = False  # c20062d had neither
        lease = self.lease
        if lease is None or self.lost:
            return
        try:
            lease.renew()
        except LeaseLostError:
            self.lose()
            return
        except Exception:
            return
        self.schedule(self.interval, self.renew)

    monkeypatch.setattr(Worker, "renew", dies)
    config = Config(workers=3, leases=1, duration=3, seconds=30, effects=60,
                    faults=Faults(conflict_storm=0.3, exception=0.1))
    _record("3 renewal thread dies silently", "d", _find("d", config, 100))


# -- bug 4: a hung request delays the stop (no watchdog, requests not bounded) ----------------

def test_rediscovers_a_hung_request_delaying_the_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    def unbounded(self: Lease) -> None:
        claim = self.claim
        drive(self._op_steps(lambda obs, now, m: lease_module.decide_renew(obs, claim, now, m)),
              self._client._port)

    monkeypatch.setattr(Lease, "renew", unbounded)
    original_claim = Worker.claim

    def without_watchdog(self: Worker) -> None:
        self.watchdog = self.sentinel = False
        original_claim(self)

    monkeypatch.setattr(Worker, "claim", without_watchdog)
    config = Config(workers=3, leases=1, duration=3, seconds=30, effects=60,
                    faults=Faults(hung=0.2))
    _record("4 hung request delays the stop", "d", _find("d", config, 100))


# -- bug 6: the holder's deadline ignores drift ------------------------------------------------

def test_rediscovers_a_deadline_without_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    def old_monotonic_at(self: ServerClock, when: datetime) -> float:
        return when.timestamp() - (max(t.high for t in self._tracks) + self.max_skew)

    monkeypatch.setattr(ServerClock, "monotonic_at", old_monotonic_at)
    config = Config(workers=2, leases=1, duration=86400, seconds=400_000, pause=0.5,
                    shared_holder=False, poll=600.0)
    _record("6 deadline without drift", "a", _find("a", config, 100))


# -- bug 7: a claim whose answer was lost is refused by itself --------------------------------

def test_rediscovers_a_lost_claim_answer_left_orphaned(monkeypatch: pytest.MonkeyPatch) -> None:
    original = holder_module.decide_claim

    def no_adoption(obs: Any, who: str, now: Any, margin: Any, claim_id: Any = None,
                    **rest: Any) -> Any:
        return original(obs, who, now, margin, None, **rest)

    monkeypatch.setattr(holder_module, "decide_claim", no_adoption)
    config = Config(workers=3, leases=1, duration=20, seconds=30,
                    faults=Faults(response_lost=0.2))
    _record("7 lost claim answer orphans the lease", "f", _find("f", config, 100))


def test_a_failure_shrinks_to_a_smaller_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    def old_same_claim(st: LeaseStatus, claim: Any) -> bool:
        return st.holder == claim.holder and st.generation == claim.token.generation

    monkeypatch.setattr(lease_module, "_same_claim", old_same_claim)
    monkeypatch.setattr(Lease, "_op_steps", _without_uid_check(Lease._op_steps))
    config = Config(workers=5, leases=3, shared_holder=True, duration=3, recreate=0.3,
                    seconds=40, crash=0.01, faults=Faults(request_lost=0.02))
    seed = next(s for s in range(200)
                if Simulation(s, replace(config, faults=replace(config.faults, counts={})))
                .run().oracles.violations)
    small = shrink(seed, config)
    assert small.oracles.violations
    assert (small.config.workers, small.config.leases, small.config.seconds) <= (
        config.workers, config.leases, config.seconds)
    assert small.trace and any("wrote" in line for line in small.trace)


# -- work pools: priority (i), backoff (j), one completion (h) ---------------------------------

POOL = Config(workers=0, leases=1, pool_workers=3, pool_jobs=6, seconds=20, pool_fail=0.4)


def test_rediscovers_a_pool_view_that_ignores_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    def fifo_only(obs: Observed) -> tuple[Any, str]:
        return (obs.created or EARLIEST_TIME, obs.name)

    monkeypatch.setattr(pool_module, "_order_key", fifo_only)
    _record("pool view ignores priority", "i", _find("i", POOL, 50))


def _without_rest(obs: Observed) -> Observed:
    return replace(obs, spec=replace(obs.spec, backoff=None),
                   status=replace(obs.status, not_before=None))


def _view_ignores_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool view takes resting jobs for candidates (both names it judges them by)."""
    original_at, original_now = pool_module.claimable_at, pool_module.claimable_now
    monkeypatch.setattr(pool_module, "claimable_at",
                        lambda obs, margin: original_at(_without_rest(obs), margin))
    monkeypatch.setattr(pool_module, "claimable_now",
                        lambda obs, now, margin: original_now(_without_rest(obs), now, margin))


def test_rediscovers_claims_that_skip_the_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    original_decide = holder_module.decide_claim

    def decide_without_rest(obs: Observed, who: str, now: Any, margin: Any,
                            claim_id: Any = None, **rest: Any) -> Any:
        return original_decide(_without_rest(obs), who, now, margin, claim_id, **rest)

    monkeypatch.setattr(holder_module, "decide_claim", decide_without_rest)
    _view_ignores_rest(monkeypatch)
    _record("claims skip the backoff", "j", _find("j", POOL, 50))


def test_a_view_that_ignores_the_rest_starves_the_job_but_never_breaks_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool view that chooses resting jobs: decide_claim (from the version the claim
    writes against) still refuses every early claim, so j never fires; but the refused job
    is set aside until the watch shows a newer version — and a resting job's rest ends
    without any new version, so it is never tried again: h's liveness half finds it."""
    _view_ignores_rest(monkeypatch)
    starved: list[int] = []
    for seed in range(20):
        sim = Simulation(seed, replace(POOL, faults=Faults())).run()
        assert not sim.oracles.violations.get("j"), sim.oracles.messages
        if sim.oracles.violations.get("h"):
            starved.append(seed)
    assert starved, "a pool view choosing resting jobs never starved one in 20 seeds"
    _record("pool view chooses resting jobs (starves them)", "h", starved[0] + 1)


def test_rediscovers_a_completion_adopted_from_another_claim(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two defences removed: a completion recognises any recorded completion as its own,
    and the SDK adopts the server's token (as bug 1's did) instead of refusing it."""
    def any_completion(obs: Observed, claim: Claim) -> bool:
        return obs.status.phase.value == "Completed"

    old_apply = Lease._apply

    def adopt(self: Lease, outcome: Any, now: Any, resumed: bool = False) -> None:
        self.token = outcome.observed.status.token()
        old_apply(self, outcome, now, resumed)

    monkeypatch.setattr(lease_module, "_completed_by", any_completion)
    monkeypatch.setattr(Lease, "_apply", adopt)
    config = replace(POOL, pool_workers=4, pool_jobs=3, pool_fail=0.0, pause=0.5,
                     pool_effects=4)
    _record("a completion adopted from another claim", "h", _find("h", config, 100))


# -- pod delegation (k) and the admission policies (l) --------------------------------------

PODS = Config(workers=0, leases=1, pods=True, seconds=30)


def test_rediscovers_the_confused_deputy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Track record 8: any labelled pod got any lease (no opt-in, any ServiceAccount)."""
    from_dict = LeaseSpec.from_dict.__func__  # type: ignore[attr-defined]

    def everything_delegated(cls: type[LeaseSpec], spec: Any) -> LeaseSpec:
        return replace(from_dict(cls, spec), pod_delegation=True,
                       delegation_service_account=None)

    monkeypatch.setattr(LeaseSpec, "from_dict", classmethod(everything_delegated))
    _record("8 confused deputy", "k", _find("k", PODS, 50))


def test_rediscovers_renewals_for_a_pod_that_no_longer_qualifies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Track record 9: a pod that lost its label (or readiness) kept its lease renewed."""
    def renew_while_it_exists(self: Delegator, obs: Observed) -> tuple[Observed, float]:
        if (wait := self._seconds_until_renewal(obs)) > 0:
            return obs, wait
        holder = obs.status.holder or ""
        namespace, name, uid = pods_module.holder_pod_name(holder) or ("", "", "")
        pod = self.pods.get(namespace, name)
        if pod is None or pod.uid != uid:
            return self._release(obs), pods_module.SOON
        claim, margin = Claim(holder, obs.status.token(), obs.status.claim_id), self.margin
        obs = self._write(obs, lambda o, n: lease_module.decide_renew(o, claim, n, margin))
        return obs, self._seconds_until_renewal(obs)

    monkeypatch.setattr(Delegator, "_keep_or_let_go", renew_while_it_exists)
    _record("9 renewed for a pod that lost its label", "k", _find("k", PODS, 50))


def test_rediscovers_a_holder_that_is_not_the_username(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the holder-only policy a worker whose holder is not its username is refused."""
    original = Worker.__init__

    def another_identity(self: Worker, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.api.user = f"system:serviceaccount:sim:{self.name}"

    monkeypatch.setattr(Worker, "__init__", another_identity)
    config = Config(workers=2, leases=1, shared_holder=False, admission=True, seconds=10)
    _record("holder is not the username", "l", _find("l", config, 10))


# -- unplanned exceptions (m): a retrying handler must not hide a bug -------------------------

def test_an_unplanned_exception_in_a_handler_fires_m_instead_of_being_retried(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stub with ``decide_claim``'s old signature (no ``reassign``): every claim raised
    ``TypeError``, the claim handler retried it forever, and two rediscovery tests only said
    "never fired". Now the first such catch is a violation naming the type, text and worker."""
    original = holder_module.decide_claim

    def old_signature(obs: Any, who: str, now: Any, margin: Any, claim_id: Any = None) -> Any:
        return original(obs, who, now, margin, claim_id)

    monkeypatch.setattr(holder_module, "decide_claim", old_signature)
    config = Config(workers=2, leases=1, duration=3, seconds=10)
    seeds = _find("m", config, 3)
    sim = Simulation(seeds - 1, replace(config, faults=Faults())).run()
    assert any(m.startswith("[m]") and "'s claim caught an unplanned TypeError" in m
               and "reassign" in m for m in sim.oracles.messages), sim.oracles.messages
    _record("a handler retrying a TypeError forever", "m", seeds)


def test_injected_faults_keep_their_type_and_never_fire_m() -> None:
    """The world's generic faults are planned: the product must handle them as the types
    they are (a ``KeyError`` stays exactly a ``KeyError``), and m must not count them,
    also when the product wrapped one or failed while handling it."""
    marked = inject(KeyError("status"))
    assert type(marked) is KeyError and injected(marked)
    try:
        try:
            raise marked
        except KeyError as err:
            raise ValueError("wrapped") from err
    except ValueError as wrapped:
        assert injected(wrapped)
    assert not injected(TypeError("a bug")) and not injected(KeyError("status"))
    faults = Faults(exception=0.2)
    counts = Counter[str]()
    for seed in range(3):
        sim = Simulation(seed, Config(workers=3, leases=1, duration=3, seconds=20,
                                      pool_workers=2, pool_jobs=3,
                                      faults=replace(faults, counts={}))).run()
        assert not sim.oracles.violations.get("m"), sim.oracles.messages
        counts.update(sim.config.faults.counts)
    assert counts["exception"] > 5  # the faults were raised, and handled
