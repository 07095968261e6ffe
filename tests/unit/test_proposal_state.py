"""A proposal that carries its job's state, claimed unread (issue 30): the pure parts.

The worker decides its claim from what the dispatcher told and its write vouches for it
(``Observed.vouched``: JSON-patch ``test`` operations the API server checks; the cluster
test ``test_proposal_claims`` has the server judge them). Here: a state of any shape is
read or refused, never raised; what the write tests; the patch's shape; a 422 to a
vouched write is a lost compare-and-swap; the spec survives its trip through an inbox.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from joblease.core.inbox import equality_labels, proposed_observed
from joblease.domain.dispatch import Proposal, decode_proposals, encode_proposals, proposal_state
from joblease.domain.lease import Backoff, LeaseSpec, LeaseStatus, Observed, Phase
from joblease.kube.api import ConflictError, InvalidError
from joblease.kube.leases import status_write_call, vouched_patch
from support.fakekube import lease_object

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
STATES = st.fixed_dictionaries({}, optional={"uid": JSON, "spec": JSON, "status": JSON}) | JSON


def job(**status: Any) -> Observed:
    return Observed.from_object(lease_object("job", status=status or None))


@given(STATES)
def test_a_state_of_any_shape_is_claimed_from_or_read_never_raised(state: Any) -> None:
    proposal = Proposal("job", "7", state if isinstance(state, dict) else None)
    told = proposed_observed("ns", "pool=p", proposal)
    if told is not None:  # a state it could read: every write from it is checked
        assert ("/metadata/resourceVersion", "7") in told.vouched
        assert ("/metadata/labels/pool", "p") in told.vouched
        assert told.name == "job" and told.resource_version == "7"
    for entry in ([["job", "7", state]], [["job", "7"]]):  # through the inbox, any shape
        decoded = decode_proposals(json.dumps(entry))
        assert decoded == (Proposal("job", "7"),)


CONDITION = st.fixed_dictionaries(
    {}, optional={"type": st.sampled_from(["Held", "Finished", 1]),
                  "status": st.sampled_from(["True", "False", None]),
                  "lastTransitionTime": st.sampled_from(["2026-01-01T00:00:00.000Z", 5])})
STATUS = st.fixed_dictionaries({}, optional={
    "phase": st.sampled_from(["Available", "Held", "Completed", "Failed", "Bogus", 3]),
    "holder": st.sampled_from(["a", "w", "", None, 4]),
    "generation": st.integers(-2, 5) | st.sampled_from(["7", "x"]),
    "attempts": st.integers(-1, 5) | st.just("2"),
    "leaseUntil": st.sampled_from(["2026-01-01T00:00:00.000Z", "2099-01-01T00:00:00Z",
                                   "yesterday", 9]),
    "notBefore": st.sampled_from(["2026-01-01T00:00:00.000Z", "soon"]),
    "claimId": st.sampled_from(["c1", "dispatch-x", 0]),
    "conditions": st.lists(CONDITION | JSON, max_size=3) | JSON})
SPEC = st.fixed_dictionaries({}, optional={
    "leaseDurationSeconds": st.integers(-5, 100) | st.just("30"),
    "maxAttempts": st.integers(0, 3) | st.none(), "priority": st.integers(-3, 3) | JSON,
    "backoff": st.fixed_dictionaries({}, optional={"initialSeconds": st.integers(-1, 9),
                                                   "factor": st.floats(0, 3) | JSON}) | JSON,
    "dispatch": JSON})


@given(STATUS, SPEC)
@example({"phase": "Completed", "generation": -1}, {})  # FencingToken: ValueError
@example({"conditions": [None]}, {})  # set_condition: AttributeError
@example({"phase": "Held", "holder": "a", "attempts": 1, "leaseUntil": "2026-01-01T00:00:00Z"},
         {"backoff": {"factor": 0}})  # a factor below the schema's 1
def test_claiming_from_any_state_a_worker_accepts_is_decided_never_crashed(
        status: dict[str, Any], spec: dict[str, Any]) -> None:
    """A forged inbox is not checked by the CRD's schema: whatever state the worker accepts
    to claim from, the protocol's decision either decides or refuses (``LeaseError``); an
    error of another kind would escape the pool's claim (safety.md #53: a condition that
    was no object, a negative generation, both found by this test).
    """
    from datetime import UTC, datetime, timedelta

    from joblease.domain.clock import ServerNow
    from joblease.domain.errors import LeaseError
    from joblease.domain.lease import decide_claim

    state = {"uid": "u1", "spec": spec, "status": status}
    told = proposed_observed("ns", "pool=p", Proposal("job", "3", state))
    if told is None:
        return
    now = ServerNow.exact(datetime(2026, 6, 1, tzinfo=UTC))
    with contextlib.suppress(LeaseError):  # a refusal: the only error allowed
        decide_claim(told, "w", now, timedelta(seconds=0.25), "proposed-1")


def test_an_honest_state_is_told_back_with_what_its_write_will_test() -> None:
    obs = job(phase="Held", holder="a", generation=3, epoch=9, attempts=1,
              leaseUntil="2026-01-01T00:00:00.000Z", claimId="c1")
    (decoded,) = decode_proposals(encode_proposals(
        [Proposal("job", obs.resource_version, proposal_state(obs))]))
    told = proposed_observed("ns", "pool=p,tier==batch", decoded)
    assert told is not None and told.status == obs.status and told.spec == obs.spec
    assert dict(told.vouched) == {
        "/metadata/resourceVersion": obs.resource_version, "/metadata/uid": obs.uid,
        "/metadata/labels/pool": "p", "/metadata/labels/tier": "batch",
        "/status/phase": "Held", "/status/holder": "a", "/status/generation": 3,
        "/status/epoch": 9, "/status/attempts": 1,
        "/status/leaseUntil": "2026-01-01T00:00:00.000Z", "/status/claimId": "c1",
        "/spec/leaseDurationSeconds": obs.spec.lease_duration_seconds}


@pytest.mark.parametrize(("selector", "labels"), [
    (None, {}), ("", {}), ("pool=p", {"pool": "p"}), ("a=b,c==d", {"a": "b", "c": "d"}),
    ("example.com/tier=x", {"example.com/tier": "x"}), ("a=", {"a": ""}),
    ("a!=b", None), ("a in (b)", None), ("a notin (b)", None), ("a", None), ("!a", None),
    ("a=b,c", None), ("a=b=c", None), ("=b", None), ("a = b", None)])
def test_only_a_selector_of_plain_equalities_is_tested_the_rest_is_read(
        selector: str | None, labels: dict[str, str] | None) -> None:
    assert equality_labels(selector) == labels
    obs = job()
    proposal = Proposal("job", obs.resource_version, proposal_state(obs))
    assert (proposed_observed("ns", selector, proposal) is None) == (labels is None)


def test_a_label_key_is_one_json_pointer_token() -> None:
    obs = job()
    told = proposed_observed("ns", "example.com/a~b=x",
                             Proposal("job", "1", proposal_state(obs)))
    assert told is not None and ("/metadata/labels/example.com~1a~0b", "x") in told.vouched


def test_the_vouched_write_tests_first_then_adds_and_removes_status_fields() -> None:
    obs = job(phase="Held", holder="a", generation=3, claimId="c1", attempts=0)
    told = proposed_observed("ns", "pool=p", Proposal("job", "5", proposal_state(obs)))
    assert told is not None
    new = LeaseStatus(phase=Phase.HELD, holder="b", generation=4, attempts=1)
    call = status_write_call(told, new)
    ops = call.body
    assert call.content_type == "application/json-patch+json" and call.vouched
    tests = [op for op in ops if op["op"] == "test"]
    assert ops[:len(tests)] == tests and len(tests) == len(told.vouched)  # tests first
    writes = {op["path"]: op for op in ops[len(tests):]}
    assert writes["/status/holder"] == {"op": "add", "path": "/status/holder", "value": "b"}
    assert writes["/status/generation"]["value"] == 4
    assert writes["/status/claimId"] == {"op": "remove", "path": "/status/claimId"}
    assert "/status/phase" not in writes  # unchanged: not written
    unvouched = status_write_call(obs, new)
    assert unvouched.content_type == "application/merge-patch+json" and not unvouched.vouched
    bare = Observed.from_object({**lease_object("job"), "status": None})
    from dataclasses import replace
    whole = vouched_patch(replace(bare, vouched=(("/metadata/uid", "u"),)), {"phase": "Held",
                                                                            "holder": None})
    assert whole[-1] == {"op": "add", "path": "/status", "value": {"phase": "Held"}}


def test_a_422_to_a_vouched_write_is_a_lost_compare_and_swap_only_there() -> None:
    obs = job()
    told = proposed_observed("ns", "pool=p", Proposal("job", "5", proposal_state(obs)))
    assert told is not None
    refused = InvalidError(422, "Unprocessable Entity", "the server rejected our request")
    assert isinstance(status_write_call(told, obs.status).refusal(refused), ConflictError)
    assert status_write_call(obs, obs.status).refusal(refused) is refused  # CEL: as it was


SPECS = st.builds(
    LeaseSpec, lease_duration_seconds=st.integers(1, 86400),
    ttl_seconds_after_finished=st.none() | st.integers(0, 10**6),
    max_attempts=st.none() | st.integers(1, 100), pod_delegation=st.booleans(),
    delegation_service_account=st.none() | st.sampled_from(["sa", "runner"]),
    priority=st.integers(-1000, 1000),
    backoff=st.none() | st.builds(Backoff, st.integers(0, 600), st.floats(1, 10),
                                  st.integers(0, 3600)),
    dispatch_to=st.none() | st.lists(st.sampled_from(["w1", "w2", "w3"]), max_size=3,
                                     unique=True).map(tuple))


@given(SPECS)
def test_a_spec_survives_its_trip_through_a_proposal(spec: LeaseSpec) -> None:
    assert LeaseSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
