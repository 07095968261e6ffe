"""Schema-driven fuzzing: every JobLease the API server may store, fed to every reader.

The objects come from the CRD's own schema (``fuzz_strategies``), so a failure here is an
object a real cluster can hold — written by another tool, an older joblease, or a person
with ``kubectl edit --subresource=status`` — that breaks the SDK, the operator, the CLI or
the pod-side token reader. The properties:

* nothing schema-valid raises an unexpected exception (parsing, formatting, reconciling);
* what joblease writes, it reads back as the same instant (``to_dict`` round trip);
* one malformed JobLease never stops the operator's work on another: an ordinary expired
  lease in the same pass is still marked Expired.

These tests are *expected to fail* until the production fixes land (issue 15): each
failure's minimal example is listed in ``docs/mutation.md`` ("Bugs the fuzzing found").
Bounded: ``max_examples`` and ``deadline`` keep the module well under a minute.
"""

from __future__ import annotations

import contextlib
import io
import json
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from fuzz_strategies import (
    FEATURES,
    K8S_DATE_TIME,
    annotation_values,
    generation_schema,
    k8s_date_times,
    kube_openapi_is_date_time,
    lease_objects,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from joblease import cli
from joblease.cli import verbs
from joblease.cli.exits import EXIT_OK
from joblease.controller.reconciler import LeaseView, Reconciler
from joblease.domain.lease import LeaseStatus, Observed, Phase
from joblease.domain.time import format_time, parse_time
from joblease.kube.leases import LeaseStore
from joblease.pod.downward import (
    DelegatedToken,
    go_unquote,
    parse_annotations,
    token_from_annotations,
)
from joblease.sdk.client import LeaseClient
from support.fakekube import FakeKubeApi, lease_object

FUZZ = settings(max_examples=150, deadline=timedelta(seconds=2), report_multiple_bugs=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MARGIN = timedelta(milliseconds=250)

# Known falsifying examples (issue 15), pinned in test_known_* below so they fail the same
# way on every machine; the generated tests find their own (minimal) examples.
OVERFLOW_UNTIL = "9999-12-31T23:59:59.999Z"


def with_status(status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return lease_object("fuzzed", status, namespace="fz", **spec)


HELD_AT_THE_END_OF_TIME = with_status({"phase": "Held", "holder": "h", "generation": 1,
                                       "epoch": 1, "leaseUntil": OVERFLOW_UNTIL})
YEAR_ZERO = with_status({"phase": "Available", "acquireTime": "0000-01-01T00:00:00Z"})
LOWER_Z = with_status({"phase": "Held", "holder": "h", "generation": 1,
                       "leaseUntil": "2026-12-03T12:00:00z"})


# --- the generator itself ------------------------------------------------------------------

@pytest.mark.parametrize(("text", "accepted"), [
    # kube-openapi's own test vectors (strfmt/time_test.go)
    ("2014-12-15T08:00:00.000Z", True), ("2011-08-18T19:03:37.000000000+01:00", True),
    ("0001-01-01T00:00:00Z", True), ("zor", False), ("zorg", False), ("zorgTx", False),
    ("1972-12-31Tx", False), ("1972-12-31T24:40:00.000Z", False),
    ("1972-12-31T23:63:00.000Z", False), ("1972-12-31T23:59:60.000Z", False),
    # what the port must also get right: case, year 0, calendar, offsets, the unescaped '.'
    ("0000-02-29t00:00:00z", True), ("2023-02-29T00:00:00Z", False),
    ("2026-12-03T12:00:00+99:99", True), ("2026-12-03T12:00:00,5Z", True),
    ("2026-12-03T12:00:00Zt garbage", True), ("2026-12-03T12:00:00", False),
    ("2026-12-03T12:00:00\n5Z", False), ("2026-12-03T12:00:00Z\n", False),
    ("99999-12-03T12:00:00Z", False), ("2026-12-03 12:00:00Z", False),
])
def test_date_time_port_agrees_with_kube_openapi(text: str, accepted: bool) -> None:
    """The port of ``strfmt.IsDateTime`` is what the generator is held to: check it first."""
    assert kube_openapi_is_date_time(text) is accepted


@settings(max_examples=300, deadline=None)
@given(k8s_date_times())
def test_generated_date_times_are_accepted_by_the_api_server(text: str) -> None:
    """Never generate what the API server would refuse: a failure would be a false alarm."""
    assert kube_openapi_is_date_time(text), text


def test_generation_schema_keeps_every_field_of_the_crd() -> None:
    """The adjusted schema must not lose a field (a lost field is a field never fuzzed)."""
    props = generation_schema()["properties"]
    assert set(props["spec"]["properties"]) == {
        "leaseDurationSeconds", "ttlSecondsAfterFinished", "maxAttempts", "description",
        "podDelegation", "priority", "backoff", "dispatch"}
    status = props["status"]["properties"]
    assert {k for k, v in status.items() if v.get("format") == K8S_DATE_TIME} == {
        "acquireTime", "renewTime", "leaseUntil", "finishTime", "notBefore"}
    assert status["completion"]["properties"]["time"]["format"] == K8S_DATE_TIME
    assert status["generation"]["maximum"] == 2**63 - 1
    assert status["attempts"]["maximum"] == 2**31 - 1


# --- the SDK's parsing --------------------------------------------------------------------

@FUZZ
@given(lease_objects() | lease_objects(apply_defaults=False))
def test_sdk_parses_every_stored_object(obj: dict[str, Any]) -> None:
    """``Observed.from_object`` is how the SDK, the CLI and the operator read a JobLease."""
    obs = Observed.from_object(obj)
    status = obj.get("status") or {}
    assert (obs.name, obs.resource_version) == (obj["metadata"]["name"],
                                                obj["metadata"]["resourceVersion"])
    assert obs.status.phase.value == status.get("phase", "Available")
    assert obs.status.generation == status.get("generation", 0)
    assert obs.status.token().generation == obs.status.generation


@FUZZ
@given(lease_objects())
def test_status_round_trips_through_to_dict(obj: dict[str, Any]) -> None:
    """What joblease writes (``to_dict``) it must read back as the same state and instants.

    Times are stored with millisecond resolution, so instants compare truncated to the ms.
    """
    status = Observed.from_object(obj).status
    again = LeaseStatus.from_dict(json.loads(json.dumps(status.to_dict())))
    for field in ("acquire_time", "renew_time", "lease_until", "finish_time"):
        before, after = getattr(status, field), getattr(again, field)
        if before is None:
            assert after is None
        else:
            assert after == before - timedelta(microseconds=before.microsecond % 1000), field
    assert (again.phase, again.holder, again.generation, again.epoch, again.attempts) == (
        status.phase, status.holder, status.generation, status.epoch, status.attempts)
    assert again.conditions == status.conditions


# --- the CLI's `get` ------------------------------------------------------------------------

def _run_cli_get(api: FakeKubeApi, namespace: str, name: str, output: str) -> tuple[int, str]:
    client = LeaseClient(namespace, api=api, calibrate=False)  # type: ignore[arg-type]
    out = io.StringIO()
    with mock.patch.object(verbs, "_client", return_value=client), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(["get", name, "-n", namespace, "-o", output])
    return code, out.getvalue()


@FUZZ
@given(lease_objects(), st.sampled_from(["text", "json"]))
def test_cli_get_prints_every_stored_object(obj: dict[str, Any], output: str) -> None:
    """``joblease get`` must print any stored JobLease (exit 0), never a traceback."""
    api = FakeKubeApi()
    stored = api.put_object(obj, keep_revision=True)
    meta = stored["metadata"]
    code, printed = _run_cli_get(api, meta["namespace"], meta["name"], output)
    assert code == EXIT_OK
    generation = (obj.get("status") or {}).get("generation", 0)
    if output == "json":
        data = json.loads(printed)
        assert (data["name"], data["generation"]) == (meta["name"], generation)
    else:
        assert f"{meta['namespace']}/{meta['name']}: phase" in printed
        assert f"generation {generation}," in printed


# --- the operator's reconcile pass --------------------------------------------------------

class EventRecorder:
    """Stands in for ``EventPoster`` (which posts from a thread): records what is announced."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post(self, obs: Observed, type_: str, reason: str, message: str) -> None:
        self.posted.append((obs.name, reason, message))


ORDINARY_STATUS = {"phase": "Held", "holder": "worker-a", "generation": 3, "epoch": 42,
                   "acquireTime": "2026-12-03T11:59:30.000Z",
                   "renewTime": "2026-12-03T11:59:30.000Z",
                   "leaseUntil": "2026-12-03T12:00:00.000Z", "attempts": 0}


@FUZZ
@given(lease_objects())
def test_one_malformed_lease_never_stops_the_reconciler(obj: dict[str, Any]) -> None:
    """A pass over the fuzzed lease and one ordinary lease that expired 10 s ago.

    The fuzzed lease is visited first, so anything it raises would skip the other. Like
    the watch handler, a lease that cannot be parsed never enters the view.
    """
    api = FakeKubeApi()  # server time 2026-12-03T12:00:10Z
    ordinary = Observed.from_object(api.put_object(lease_object("ordinary", ORDINARY_STATUS)))
    view = LeaseView()
    stored = api.put_object(obj, keep_revision=True)
    try:
        fuzzed: Observed | None = Observed.from_object(stored)
    except Exception as err:  # the handler stops before view.put: see the parse test
        event(f"unparsable: {type(err).__name__}")
        fuzzed = None
    if fuzzed is not None:
        view.put(fuzzed)
    view.put(ordinary)
    reconciler = Reconciler(LeaseStore(api), view, MARGIN,  # type: ignore[arg-type]
                            events=EventRecorder())  # type: ignore[arg-type]
    try:
        wakeup = reconciler.pass_once()
    finally:
        reconciler.close()
    after = api.stored("ns", "ordinary")
    assert after is not None and after["status"]["phase"] == Phase.EXPIRED.value
    assert after["status"]["generation"] == 3 and after["status"]["epoch"] == 42
    assert 0.02 <= wakeup <= 5.0
    if fuzzed is not None:  # the operator never claims: the token is untouched
        now = api.stored(fuzzed.namespace, fuzzed.name)
        if now is not None:
            st_now = (now.get("status") or {})
            assert st_now.get("generation", 0) == fuzzed.status.generation
            if fuzzed.has_status:
                assert st_now.get("epoch") == fuzzed.status.epoch
            else:  # born initialised (issue 28): nothing is written for a new lease
                assert "epoch" not in st_now


# --- the pod-side token reader (downward API) --------------------------------------------

def go_quote(value: str) -> str:
    """Go's ``strconv.Quote`` (the kubelet's ``%q``): printable runes kept, the rest escaped."""
    named = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
             "\v": "\\v", "\\": "\\\\", '"': '\\"'}
    out = []
    for char in value:
        code = ord(char)
        if char in named:
            out.append(named[char])
        elif char == " " or (char.isprintable() and code != 0x7f):
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


ANNOTATION_KEYS = st.sampled_from(["joblease.dev/epoch", "joblease.dev/generation",
                                   "joblease.dev/holder", "joblease.dev/lease-until",
                                   "other.example/x"])


@FUZZ
@given(st.dictionaries(ANNOTATION_KEYS, st.text(st.characters(exclude_categories=["Cs"]),
                                                max_size=40), max_size=5))
def test_annotations_file_round_trips_any_value(annotations: dict[str, str]) -> None:
    """Whatever the annotations hold, the kubelet's file format must read back exactly."""
    text = "\n".join(f"{k}={go_quote(annotations[k])}" for k in sorted(annotations))
    assert parse_annotations(text) == annotations
    for value in annotations.values():
        assert go_unquote(go_quote(value)) == value


@FUZZ
@given(st.dictionaries(ANNOTATION_KEYS, annotation_values(), max_size=5))
def test_token_reader_refuses_or_returns_a_token(annotations: dict[str, str]) -> None:
    """Annotations anyone may write: the reader returns a token, None, or a ValueError."""
    try:
        token = token_from_annotations(annotations)
    except ValueError:
        return
    assert token is None or isinstance(token, DelegatedToken)


@FUZZ
@given(lease_objects(), st.integers(1, 2**63 - 1))
def test_token_reader_reads_what_the_operator_writes(obj: dict[str, Any], epoch: int) -> None:
    """The operator writes ``str(epoch)``, ``str(generation)`` and ``format_time(leaseUntil)``
    from any stored status (``controller.pods``); the pod must read that same token and
    instant back (ms resolution)."""
    status = Observed.from_object(obj).status
    until = status.lease_until
    annotations = {"joblease.dev/epoch": str(epoch),
                   "joblease.dev/generation": str(status.generation),
                   "joblease.dev/holder": status.holder or "",
                   "joblease.dev/lease-until": format_time(until) if until else ""}
    text = "\n".join(f"{k}={go_quote(annotations[k])}" for k in sorted(annotations))
    token = token_from_annotations(parse_annotations(text))
    assert token is not None
    assert (token.token.epoch, token.token.generation) == (epoch, status.generation)
    if until is None:
        assert token.lease_until is None
    else:
        assert token.lease_until == until - timedelta(microseconds=until.microsecond % 1000)


@pytest.mark.parametrize("feature", FEATURES)
@FUZZ
@given(data=st.data())
def test_parse_time_reads_every_date_time_the_server_accepts(feature: str, data: st.DataObject
                                                             ) -> None:
    """``parse_time`` is the one reader of stored timestamps (status, annotations).

    One run per feature of the format, so each failure names what the parser misses.
    """
    text = data.draw(k8s_date_times(only=feature), label="text")
    parsed = parse_time(text)
    assert parsed.tzinfo is not None


# --- the known falsifying examples, pinned ------------------------------------------------

@pytest.mark.parametrize("obj", [HELD_AT_THE_END_OF_TIME, YEAR_ZERO, LOWER_Z],
                         ids=["leaseUntil-9999-12-31", "year-0000", "lowercase-z"])
def test_known_objects_parse_and_reconcile(obj: dict[str, Any]) -> None:
    """The examples issue 15 names, through the parse and the reconciler properties."""
    test_sdk_parses_every_stored_object.hypothesis.inner_test(obj)  # type: ignore[attr-defined]
    test_one_malformed_lease_never_stops_the_reconciler.hypothesis.inner_test(  # type: ignore[attr-defined]
        obj)


def test_known_offset_time_is_written_back_as_the_same_instant() -> None:
    """``+05:00`` stored, written back by ``to_dict``: must stay the same instant."""
    test_status_round_trips_through_to_dict.hypothesis.inner_test(  # type: ignore[attr-defined]
        with_status({"phase": "Held", "holder": "h", "generation": 1,
                     "leaseUntil": "2026-12-03T17:00:00+05:00"}))


def test_known_year_one_reaches_the_pod_as_a_token() -> None:
    """``leaseUntil`` in year 1 (schema-valid): the pod must still read its token."""
    test_token_reader_reads_what_the_operator_writes.hypothesis.inner_test(  # type: ignore[attr-defined]
        with_status({"phase": "Held", "holder": "h", "generation": 1, "epoch": 7,
                     "leaseUntil": "0001-01-01T00:00:00Z"}), 7)
