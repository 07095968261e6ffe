"""A stateful model of the pure protocol: many holders, an operator, a clock, re-creation.

Hypothesis drives random sequences of claims, renewals, completions, releases, expiries,
initializations, clock ticks (with an error interval, as ``ServerNow`` gives it) and a
delete-and-recreate of the JobLease, against ``joblease.domain.lease`` alone. Each decided
transition is "stored" the way the API server stores it (``to_dict`` → JSON →
``from_dict``, a new resourceVersion from one cluster-wide revision counter). The model
predicts every refusal, so a wrong error type or a wrong name in it fails here.

Invariants (after every step):

* the generation never decreases within an incarnation, and rises by exactly one per claim;
* a Completed lease stays Completed and its completion record never changes;
* at most one (holder, generation) is current, and only the holder that claimed a
  generation ever renews, completes or releases under it;
* tokens ``(epoch, generation)`` never repeat and only grow, also across delete and
  re-create (the new incarnation's epoch comes from a larger resourceVersion).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from joblease.domain.clock import ServerNow
from joblease.domain.errors import (
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseHeldError,
    StaleLeaseError,
)
from joblease.domain.lease import (
    Claim,
    LeaseSpec,
    LeaseStatus,
    Observed,
    Phase,
    Transition,
    decide_claim,
    decide_complete,
    decide_expire,
    decide_release,
    decide_renew,
    is_expired,
)
from joblease.domain.token import FencingToken

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
MARGIN = timedelta(milliseconds=250)
HOLDERS = st.sampled_from(["a", "b", "c"])
ERRORS = st.sampled_from([0.0, 0.001, 0.3, 2.0])  # half-widths of the server-time interval


class ProtocolMachine(RuleBasedStateMachine):
    """The model: one JobLease name, its current incarnation, and everything ever issued."""

    @initialize(max_attempts=st.none() | st.integers(1, 6), duration=st.integers(1, 60))
    def create(self, max_attempts: int | None, duration: int) -> None:
        self.revision = 1000
        self.now = T0
        self.spec = LeaseSpec(lease_duration_seconds=duration, max_attempts=max_attempts)
        self.issued: list[FencingToken] = []  # every token ever handed out, in order
        self.owner: dict[FencingToken, str] = {}  # who claimed each token
        self.known: dict[str, list[int]] = {"a": [], "b": [], "c": []}  # generations seen
        self._new_incarnation()

    # -- the "server" -------------------------------------------------------------------------

    def _new_incarnation(self) -> None:
        self.revision += 1
        self.obs = Observed("ns", "job", f"uid-{self.revision}", str(self.revision), 1,
                            self.spec, LeaseStatus(), has_status=False)
        self.completed_record = None
        self.last_generation = 0

    def _store(self, transition: Transition) -> None:
        """Store a decided status as the API server would (JSON, new resourceVersion)."""
        self.revision += 1
        stored = LeaseStatus.from_dict(json.loads(json.dumps(transition.status.to_dict())))
        self.obs = Observed("ns", "job", self.obs.uid, str(self.revision), 1, self.spec,
                            stored, has_status=True)

    def _server_now(self, error: float) -> ServerNow:
        half = timedelta(seconds=error)
        return ServerNow(self.now - half, self.now + half)

    # -- rules ----------------------------------------------------------------------------------

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 5.0, 30.0, 61.0]))
    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def read_through_the_defaulting_crd(self) -> None:
        """The CRD upgrade (issue 28): the same stored object now reads with a default status.

        No write: the resourceVersion stays, and the status is the one a missing status
        already parsed as (Available, generation 0, no epoch).
        """
        if not self.obs.has_status:
            defaulted = LeaseStatus.from_dict({"phase": "Available", "generation": 0,
                                               "attempts": 0})
            assert defaulted == self.obs.status
            self.obs = replace(self.obs, status=defaulted, has_status=True)

    @rule(holder=HOLDERS, error=ERRORS)
    def claim(self, holder: str, error: float) -> None:
        before, now = self.obs.status, self._server_now(error)
        try:
            t = decide_claim(self.obs, holder, now, MARGIN)
        except LeaseFinishedError as err:
            assert before.phase.finished
            assert (err.phase, err.generation) == (before.phase.value, before.generation)
            return
        except LeaseHeldError as err:
            assert before.phase is Phase.HELD and before.holder
            assert not is_expired(before.lease_until, now, MARGIN)
            assert (err.holder, err.generation) == (before.holder, before.generation)
            assert f"{before.holder!r} at generation {before.generation}" in str(err)
            return
        assert not before.phase.finished
        if t.kind == "failed":
            assert self.spec.max_attempts is not None
            assert t.status.generation == before.generation
            self._store(t)
            return
        assert t.kind == "claimed"
        st_ = t.status
        assert (st_.holder, st_.phase, st_.generation) == (holder, Phase.HELD,
                                                             before.generation + 1)
        assert st_.epoch == (before.epoch if before.epoch is not None
                             else int(self.obs.resource_version))
        assert st_.lease_until == now.midpoint + self.spec.duration
        self._store(t)
        token = self.obs.status.token()
        assert not self.issued or token > self.issued[-1], (token, self.issued[-1:])
        assert token not in self.owner
        self.issued.append(token)
        self.owner[token] = holder
        self.known[holder].append(token)

    def _held_op(self, holder: str, pick: int, error: float, op: str, failed: bool = False
                 ) -> None:
        tokens = self.known[holder] or [FencingToken(0, 0)]
        token = tokens[pick % len(tokens)]
        generation = token.generation
        claim = Claim(holder, token)
        before, now = self.obs.status, self._server_now(error)
        current = (before.phase is Phase.HELD and before.holder == holder
                   and before.token() == token)
        try:
            if op == "renew":
                t = decide_renew(self.obs, claim, now, MARGIN)
            elif op == "complete":
                t = decide_complete(self.obs, claim, "done", now, MARGIN)
            else:
                t = decide_release(self.obs, claim, now, MARGIN, failed)
        except StaleLeaseError as err:
            assert not current
            assert (err.current_holder, err.current_token, err.phase) == (
                before.holder, before.token(), before.phase.value)
            assert (err.holder, err.generation) == (holder, generation)
            assert f"the current generation is {before.generation}" in str(err)
            return
        except LeaseExpiredError as err:
            assert current
            assert before.lease_until is None or now.latest > before.lease_until - MARGIN
            assert (err.holder, err.generation) == (holder, generation)
            return
        if t is None:  # this very claim's completion, recognised (a retry after a lost answer)
            record = before.completion
            assert op == "complete" and before.phase is Phase.COMPLETED and record is not None
            assert (record.holder, record.generation, before.token()) == (
                holder, generation, token)
            return
        assert current, "a non-current token was accepted"
        assert self.owner[before.token()] == holder
        self._store(t)
        after = self.obs.status
        assert (after.generation, after.epoch) == (before.generation, before.epoch)
        if op == "renew":
            assert after.phase is Phase.HELD
            assert after.lease_until == now.midpoint + self.spec.duration
        elif op == "complete":
            assert after.phase is Phase.COMPLETED and after.completion is not None
            assert (after.completion.holder, after.completion.generation) == (holder, generation)
            self.completed_record = after.completion
        else:
            assert after.phase in (Phase.AVAILABLE, Phase.FAILED) and after.holder in (None,
                                                                                       holder)

    @rule(holder=HOLDERS, pick=st.integers(0, 5), error=ERRORS)
    def renew(self, holder: str, pick: int, error: float) -> None:
        self._held_op(holder, pick, error, "renew")

    @rule(holder=HOLDERS, pick=st.integers(0, 5), error=ERRORS)
    def complete(self, holder: str, pick: int, error: float) -> None:
        self._held_op(holder, pick, error, "complete")

    @rule(holder=HOLDERS, pick=st.integers(0, 5), error=ERRORS, failed=st.booleans())
    def release(self, holder: str, pick: int, error: float, failed: bool) -> None:
        self._held_op(holder, pick, error, "release", failed)

    @rule(error=ERRORS)
    def expire(self, error: float) -> None:
        before, now = self.obs.status, self._server_now(error)
        t = decide_expire(self.obs, now, MARGIN)
        due = before.phase is Phase.HELD and is_expired(before.lease_until, now, MARGIN)
        assert (t is not None) == due
        if t is not None:
            assert t.kind in ("expired", "failed")
            assert (t.status.holder, t.status.generation) == (before.holder, before.generation)
            assert t.status.attempts == before.attempts + 1
            self._store(t)

    @precondition(lambda self: self.obs.has_status)
    @rule()
    def delete_and_recreate(self) -> None:
        """``kubectl delete`` then ``apply``: a new incarnation, generation from 0 again."""
        self._new_incarnation()

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def generation_never_decreases(self) -> None:
        assert self.obs.status.generation >= self.last_generation
        assert self.obs.status.generation <= self.last_generation + 1
        self.last_generation = self.obs.status.generation

    @invariant()
    def completed_stays_completed(self) -> None:
        if self.completed_record is not None:
            assert self.obs.status.phase is Phase.COMPLETED
            assert self.obs.status.completion == self.completed_record

    @invariant()
    def at_most_one_current_token(self) -> None:
        st_ = self.obs.status
        current = [(h, g) for h, gens in self.known.items() for g in set(gens)
                   if st_.phase is Phase.HELD and st_.holder == h and st_.generation == g
                   and self.owner.get(FencingToken(st_.epoch or 0, g)) == h]
        assert len(current) <= 1
        if st_.phase is Phase.HELD:
            assert self.owner.get(st_.token()) == st_.holder

    @invariant()
    def tokens_never_repeat(self) -> None:
        assert len(set(self.issued)) == len(self.issued)
        assert self.issued == sorted(self.issued)


# Under `make mutate` every surviving domain mutant reruns this machine: fewer runs there
# (still derandomized, so the same runs for every mutant), the full 150 otherwise.
MUTATING = os.environ.get("HYPOTHESIS_PROFILE") == "mutate"
ProtocolMachine.TestCase.settings = settings(max_examples=30 if MUTATING else 150,
                                             stateful_step_count=40, deadline=None)
test_protocol_state_machine = ProtocolMachine.TestCase
