"""``HeldToken``: the token's written forms, one codec (issue 31).

The CLI's JSON, the environment of a command under ``joblease run``/``work`` and a
delegated pod's annotations were each written by hand; the environment lacked the claim id
that ``renew/complete/release --claim-id`` asks for. Each form is pinned here field by
field, and each is read back to the same token.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from joblease.domain.token import ANNOTATION_KEYS, FencingToken, HeldToken, no_token_annotations
from joblease.kube.pods import ANNOTATION_PREFIX, TOKEN_ANNOTATIONS
from joblease.pod.downward import DownwardFormatError, token_from_annotations

pytestmark = pytest.mark.unit

UNTIL = datetime(2026, 12, 3, 12, 0, 30, 250000, tzinfo=UTC)
HELD = HeldToken("job", "batch", "worker-a", FencingToken(8812, 7), "c1a1", UNTIL)


def test_the_json_of_a_claim() -> None:
    assert HELD.to_json() == {
        "name": "job", "namespace": "batch", "holder": "worker-a", "token": "8812/7",
        "epoch": 8812, "generation": 7, "claimId": "c1a1",
        "leaseUntil": "2026-12-03T12:00:30.250Z"}
    assert HeldToken("j", "n", "h", FencingToken(1, 1)).to_json()["leaseUntil"] is None


def test_the_environment_carries_the_claim_id_and_reads_back() -> None:
    env = HELD.to_environment()
    assert env == {
        "JOBLEASE_NAME": "job", "JOBLEASE_NAMESPACE": "batch", "JOBLEASE_HOLDER": "worker-a",
        "JOBLEASE_TOKEN": "8812/7", "JOBLEASE_EPOCH": "8812", "JOBLEASE_GENERATION": "7",
        "JOBLEASE_CLAIM_ID": "c1a1", "JOBLEASE_LEASE_UNTIL": "2026-12-03T12:00:30.250Z"}
    assert HeldToken.from_environment(env) == HELD
    bare = HeldToken("j", "n", "h", FencingToken(1, 2))
    assert bare.to_environment()["JOBLEASE_CLAIM_ID"] == ""
    assert HeldToken.from_environment(bare.to_environment()) == bare


def test_an_environment_without_the_variables_says_which() -> None:
    env = HELD.to_environment()
    del env["JOBLEASE_CLAIM_ID"]
    with pytest.raises(ValueError, match=r"\$JOBLEASE_CLAIM_ID is not set"):
        HeldToken.from_environment(env)
    with pytest.raises(ValueError, match="not a fencing token"):
        HeldToken.from_environment({**HELD.to_environment(), "JOBLEASE_TOKEN": "7"})


def test_the_annotations_are_the_operators_keys_and_read_back_without_a_claim_id() -> None:
    assert ANNOTATION_KEYS == TOKEN_ANNOTATIONS  # the operator's list of keys it owns
    plain = HELD.to_annotations()
    assert plain == {"holder": "worker-a", "epoch": "8812", "generation": "7",
                     "lease-until": "2026-12-03T12:00:30.250Z"}
    prefixed = HELD.to_annotations(ANNOTATION_PREFIX)
    assert set(prefixed) == {ANNOTATION_PREFIX + k for k in ANNOTATION_KEYS}
    back = HeldToken.from_annotations(prefixed, ANNOTATION_PREFIX, name="job", namespace="batch")
    assert back == HeldToken("job", "batch", "worker-a", FencingToken(8812, 7), None, UNTIL)
    assert no_token_annotations() == dict.fromkeys(ANNOTATION_KEYS)
    assert HeldToken.from_annotations({}) is None
    assert HeldToken.from_annotations({"epoch": "1"}) is None  # half a token is none


def test_the_downward_reader_uses_the_same_codec() -> None:
    pod_holder = "pod:batch/p/uid-1"
    annotations = {k: v for k, v in HeldToken("job", "batch", pod_holder, FencingToken(9, 3),
                                              None, UNTIL).to_annotations(ANNOTATION_PREFIX)
                   .items() if v is not None}
    read = token_from_annotations(annotations, pod_uid="uid-1")
    assert read is not None and (read.token, read.holder, read.lease_until) == (
        FencingToken(9, 3), pod_holder, UNTIL)
    assert token_from_annotations(annotations, pod_uid="uid-2") is None  # another pod's
    with pytest.raises(DownwardFormatError, match=r"joblease.dev/generation='x'"):
        token_from_annotations({**annotations, ANNOTATION_PREFIX + "generation": "x"})
