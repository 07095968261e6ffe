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

import joblease.domain.lease as lease_module
from joblease.controller.reconciler import Reconciler
from joblease.domain.clock import ServerClock
from joblease.domain.lease import LeaseStatus
from joblease.sdk import client as client_module
from joblease.sdk.client import Lease

from .sim import Config, Simulation, Worker, shrink
from .world import Faults

CI_SEEDS = 1500  # about 10 s here; `make sim` runs as long as asked
FOUND: dict[str, tuple[int, str]] = {}


def test_a_bounded_set_of_seeds_finds_no_violation() -> None:
    started, ops, violations = time.monotonic(), 0, Counter[str]()
    failing: list[int] = []
    for seed in range(CI_SEEDS):
        sim = Simulation(seed).run()
        ops += sim.ops
        violations.update(sim.oracles.violations)
        if sim.oracles.violations:
            failing.append(seed)
    elapsed = time.monotonic() - started
    print(f"\nsim: {CI_SEEDS} seeds, {ops} operations, {ops / elapsed * 60:,.0f} ops/min")
    assert not failing, (failing[:5], shrink(failing[0]).oracles.messages)
    assert ops > CI_SEEDS * 20  # the runs did something


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

    def adopt(self: Lease, outcome: Any, resumed: bool = False) -> None:
        self.token = outcome.observed.status.token()  # the old SDK overwrote its token
        self.uid = outcome.observed.uid
        old_apply(self, outcome, resumed)

    monkeypatch.setattr(lease_module, "_same_claim", old_same_claim)
    monkeypatch.setattr(Lease, "_apply", adopt)
    monkeypatch.setattr(Lease, "_do", _without_uid_check(Lease._do))
    config = Config(workers=4, leases=1, shared_holder=True, duration=3, recreate=0.3,
                    seconds=30)
    _record("1 token adopted across incarnations", "c", _find("c", config, 200))


def _without_uid_check(do: Callable[..., None]) -> Callable[..., None]:
    def patched(self: Lease, decide: Any, until_deadline: bool = False) -> None:
        with contextlib.suppress(Exception):  # the old SDK pinned no uid: follow the name
            self.uid = self._client.get(self.name).uid
        do(self, decide, until_deadline)
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
    monkeypatch.setattr(reconciler_module, "add_time", overflowing_add)
    monkeypatch.setattr(Reconciler, "object_failed", no_isolation)
    config = Config(workers=3, leases=2, duration=2, hostile=True, crash=0.05, seconds=30)
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
        except client_module.LeaseLostError:
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
        self._do(lambda obs, now, m: lease_module.decide_renew(obs, claim, now, m))

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
    original = client_module.decide_claim

    def no_adoption(obs: Any, who: str, now: Any, margin: Any, claim_id: Any = None) -> Any:
        return original(obs, who, now, margin, None)

    monkeypatch.setattr(client_module, "decide_claim", no_adoption)
    config = Config(workers=3, leases=1, duration=20, seconds=30,
                    faults=Faults(response_lost=0.2))
    _record("7 lost claim answer orphans the lease", "f", _find("f", config, 100))


def test_a_failure_shrinks_to_a_smaller_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    def old_same_claim(st: LeaseStatus, claim: Any) -> bool:
        return st.holder == claim.holder and st.generation == claim.token.generation

    monkeypatch.setattr(lease_module, "_same_claim", old_same_claim)
    monkeypatch.setattr(Lease, "_do", _without_uid_check(Lease._do))
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
