"""A worker's inbox (issue 30): what it reads, how it follows it, what a refusal changes.

The inbox is written by the operator, but read as hostile input: any value, of any shape,
yields a bounded tuple of well-formed proposals and never an exception.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from joblease.core.inbox import Inbox, inbox_name, read_inbox, write_inbox_steps
from joblease.core.presence import (
    EMPTY_WAIT_ANNOTATION,
    INBOX_ANNOTATION,
    SLOTS_ANNOTATION,
    Presence,
    pool_key,
)
from joblease.core.steps import Call, Sleep, Watch
from joblease.domain.dispatch import (
    MAX_PROPOSALS,
    POOL_EMPTY_ANNOTATION,
    PROPOSALS_ANNOTATION,
    Proposal,
    decode_proposals,
    encode_proposals,
)
from joblease.kube.api import ForbiddenError, GoneError, UnavailableError

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=20)


@given(JSON)
def test_any_json_value_decodes_to_well_formed_proposals_or_none(value: Any) -> None:
    for raw in (value, json.dumps(value)):
        out = decode_proposals(raw)
        assert len(out) <= MAX_PROPOSALS
        assert len({p.name for p in out}) == len(out)
        assert all(p.name and p.resource_version.isdigit() for p in out)


@given(st.lists(st.tuples(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
                          st.integers(min_value=0).map(str)), max_size=80))
def test_proposals_round_trip_in_order_first_of_each_name_and_at_most_the_cap(
        entries: list[tuple[str, str]]) -> None:
    proposals = [Proposal(name, rv) for name, rv in entries]
    out = decode_proposals(encode_proposals(proposals))
    first: dict[str, Proposal] = {}
    for p in proposals:
        first.setdefault(p.name, p)
    assert list(out) == list(first.values())[:MAX_PROPOSALS]


def test_names_that_are_no_object_names_and_bad_shapes_are_skipped() -> None:
    raw = json.dumps([["ok", "1"], ["Bad_Name", "2"], ["x", "v3"], ["y"], "z", ["../etc", "4"],
                      ["ok", "5"], ["fine.name", "6"]])
    assert decode_proposals(raw) == (Proposal("ok", "1"), Proposal("fine.name", "6"))
    assert decode_proposals("{not json") == () and decode_proposals(None) == ()
    assert decode_proposals('{"a": 1}') == () and decode_proposals("[" * 5000) == ()


def test_an_inbox_object_of_any_shape_reads_as_its_proposals_or_none() -> None:
    good = {"metadata": {"annotations": {PROPOSALS_ANNOTATION: '[["a","1"]]'}}}
    assert read_inbox(good) == (Proposal("a", "1"),)
    for bad in (None, [], {"metadata": None}, {"metadata": {"annotations": []}},
                {"metadata": {"annotations": {PROPOSALS_ANNOTATION: 7}}}):
        assert read_inbox(bad) == ()


class Sink:
    def __init__(self) -> None:
        self.seen: list[tuple[Proposal, ...]] = []
        self.marks: list[bool] = []  # pool_empty, delivery by delivery
        self.refused = 0

    def inbox(self, proposals: tuple[Proposal, ...], pool_empty: bool = False) -> None:
        self.seen.append(proposals)
        self.marks.append(pool_empty)

    def inbox_refused(self) -> None:
        self.refused += 1


def inbox_object(version: str, *names: str) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": version, "annotations": {
        PROPOSALS_ANNOTATION: encode_proposals(Proposal(n, "1") for n in names)}}}


def test_the_inbox_is_read_then_watched_by_name_and_read_again_after_a_410() -> None:
    inbox, sink = Inbox("ns", "team=batch", "w", watch_seconds=60), Sink()
    steps = inbox.steps(sink)
    read = steps.send(None)
    assert isinstance(read, Call) and read.call.method == "GET"
    assert read.call.query == {"fieldSelector": f"metadata.name={inbox.name}"}
    watch = steps.send({"items": [inbox_object("5", "a")], "metadata": {"resourceVersion": "9"}})
    assert isinstance(watch, Watch) and watch.query["resourceVersion"] == "9"
    assert watch.query["fieldSelector"] == f"metadata.name={inbox.name}"
    watch.on_event("MODIFIED", inbox_object("11", "b", "c"))
    watch.on_event("BOOKMARK", {"metadata": {"resourceVersion": "12"}})
    watch.on_event("DELETED", inbox_object("13"))
    assert sink.seen == [(Proposal("a", "1"),), (Proposal("b", "1"), Proposal("c", "1")), ()]
    assert inbox.events == 2
    again = steps.send(None)  # the watch ended: resumed from the last version
    assert isinstance(again, Watch) and again.query["resourceVersion"] == "13"
    reread = steps.throw(GoneError(410, "Expired", "too old"))
    assert isinstance(reread, Call) and reread.call.method == "GET"
    pause = steps.throw(UnavailableError(0, "Unavailable", "reset"))
    assert isinstance(pause, Sleep) and pause.seconds > 0


def test_a_refused_inbox_is_emptied_and_the_worker_announces_it_reads_none() -> None:
    inbox, sink = Inbox("ns", "team=batch", "w"), Sink()
    steps = inbox.steps(sink)
    steps.send(None)
    with contextlib.suppress(StopIteration):
        steps.throw(ForbiddenError(403, "Forbidden", "cannot watch leases"))
    assert inbox.enabled is False and sink.seen == [()] and sink.refused == 1
    presence = Presence("ns", "team=batch", "w", slots=2)
    # a stale announcement of an earlier process of this holder is removed (null)
    assert _annotations(presence) == {SLOTS_ANNOTATION: "2", INBOX_ANNOTATION: "1",
                                      EMPTY_WAIT_ANNOTATION: None}
    assert _annotations(presence) is None  # announced once, then only renewed
    presence.stop_reading_inbox()
    assert _annotations(presence) == {SLOTS_ANNOTATION: "2", INBOX_ANNOTATION: None,
                                      EMPTY_WAIT_ANNOTATION: None}
    assert _annotations(presence) is None


def test_a_worker_announces_once_that_it_stops_when_the_pool_is_empty() -> None:
    presence = Presence("ns", "team=batch", "w", slots=1)
    assert _annotations(presence) is not None
    presence.wait_for_empty()
    presence.wait_for_empty()  # asked again by every claim: announced once
    assert _annotations(presence) == {SLOTS_ANNOTATION: "1", INBOX_ANNOTATION: "1",
                                      EMPTY_WAIT_ANNOTATION: "1"}
    assert _annotations(presence) is None


def _annotations(presence: Presence) -> dict[str, Any] | None:
    """The annotations one renewal of ``presence`` patches (``None``: none)."""
    from joblease.domain.clock import ServerNow
    from support.fakekube import T_NOW

    steps = presence._renew_steps()
    steps.send(None)
    patch = steps.send(ServerNow.exact(T_NOW))
    assert isinstance(patch, Call)
    with contextlib.suppress(StopIteration):
        steps.send({})
    metadata = patch.call.body.get("metadata")
    return None if metadata is None else dict(metadata["annotations"])


def test_an_inbox_is_created_with_the_pools_label_an_inbox_role_and_no_renew_time() -> None:
    steps = write_inbox_steps("ns", pool_key("team=batch"), "w", "the-operator",
                              [Proposal("a", "3")])
    patch = steps.send(None)
    assert patch.call.method == "PATCH" and patch.call.body == {"metadata": {"annotations": {
        PROPOSALS_ANNOTATION: '[["a","3"]]', POOL_EMPTY_ANNOTATION: None}}}  # a mark removed
    from joblease.kube.api import NotFoundError
    create = steps.throw(NotFoundError(404, "NotFound", "no inbox"))
    body = create.call.body
    assert body["metadata"]["name"] == inbox_name(pool_key("team=batch"), "w")
    assert body["metadata"]["labels"] == {"joblease.dev/pool": pool_key("team=batch"),
                                          "joblease.dev/role": "inbox"}
    assert body["spec"] == {"holderIdentity": "the-operator"}  # no renewTime: no worker


LEASES = "/apis/coordination.k8s.io/v1/namespaces/ns/leases"


def test_the_inbox_is_read_and_watched_at_the_leases_path_with_the_whole_query() -> None:
    inbox, sink = Inbox("ns", "team=batch", "w", watch_seconds=60), Sink()
    assert inbox.events == 0 and inbox.enabled
    steps = inbox.steps(sink)
    read = steps.send(None)
    assert (read.call.method, read.call.path) == ("GET", LEASES)
    watch = steps.send({"items": []})  # no inbox yet, and a list without metadata
    assert sink.seen == [()]
    assert (watch.path, watch.seconds) == (LEASES, 60)
    assert watch.query == {"fieldSelector": f"metadata.name={inbox.name}",
                           "resourceVersion": "", "allowWatchBookmarks": "true",
                           "timeoutSeconds": "60"}
    watch.on_event("ADDED", inbox_object("4", "a"))  # created: proposals at once
    watch.on_event("MODIFIED", ["not", "an", "object"])  # any shape: read as none
    assert sink.seen == [(), (Proposal("a", "1"),), ()]
    assert steps.send(None).query["resourceVersion"] == "4"  # resumed where it was


def test_failures_back_off_growing_and_a_good_watch_starts_the_count_over(
        monkeypatch: Any) -> None:
    import random
    monkeypatch.setattr(random, "uniform", lambda low, high: high)  # the jitter's top
    inbox, sink = Inbox("ns", "team=batch", "w"), Sink()
    steps = inbox.steps(sink)
    steps.send(None)
    lost = UnavailableError(0, "Unavailable", "reset")
    pauses = [steps.throw(lost).seconds]
    steps.send(None)  # the pause ends: read again
    pauses.append(steps.throw(lost).seconds)
    steps.send(None)
    steps.send({"items": [], "metadata": {"resourceVersion": "5"}})  # read: then a watch
    steps.send(None)  # the watch ended normally: failures start over
    pauses.append(steps.throw(lost).seconds)
    assert pauses == [0.2, 0.4, 0.2]


def test_a_refused_inbox_says_whose_and_what_to_grant(caplog: Any) -> None:
    import logging
    inbox, sink = Inbox("ns", "team=batch", "w"), Sink()
    steps = inbox.steps(sink)
    steps.send(None)
    with caplog.at_level(logging.WARNING, logger="joblease.core.inbox"), \
            contextlib.suppress(StopIteration):
        steps.throw(ForbiddenError(403, "Forbidden", "cannot watch leases"))
    assert caplog.records and inbox.name in caplog.records[0].getMessage()
    assert "grant watch on leases.coordination.k8s.io" in caplog.records[0].getMessage()


def test_an_inbox_is_patched_at_its_path_and_deleted_there_a_missing_one_is_fine() -> None:
    from joblease.core.inbox import delete_inbox_steps
    from joblease.kube.api import MERGE_PATCH, NotFoundError
    name = inbox_name(pool_key("team=batch"), "w")
    steps = write_inbox_steps("ns", pool_key("team=batch"), "w", "op", [Proposal("a", "3")])
    patch = steps.send(None)
    assert (patch.call.path, patch.call.content_type) == (f"{LEASES}/{name}", MERGE_PATCH)
    create = steps.throw(NotFoundError(404, "NotFound", "no inbox"))
    assert (create.call.method, create.call.path, create.call.content_type) == (
        "POST", LEASES, None)
    assert create.call.body["metadata"]["annotations"] == {
        PROPOSALS_ANNOTATION: '[["a","3"]]', "joblease.dev/worker": "w"}
    assert create.call.body["kind"] == "Lease"
    delete = delete_inbox_steps("ns", pool_key("team=batch"), "w")
    call = delete.send(None)
    assert (call.call.method, call.call.path) == ("DELETE", f"{LEASES}/{name}")
    with contextlib.suppress(StopIteration):
        delete.throw(NotFoundError(404, "NotFound", "gone"))  # not raised


def test_a_proposed_job_is_read_by_name_within_the_pools_selector_only() -> None:
    from joblease.core.inbox import read_proposed
    from joblease.kube.leases import Page
    from support.fakekube import lease_object

    def answer(*items: Any) -> Any:
        steps = read_proposed("ns", "team=batch", "job")
        call = steps.send(None)
        assert call.call.query == {"limit": "1", "labelSelector": "team=batch",
                                   "fieldSelector": "metadata.name=job"}
        try:
            steps.send(Page(list(items), "7", ""))
        except StopIteration as done:
            return done.value
        raise AssertionError("read_proposed asked for more")

    assert answer() is None
    assert answer(lease_object("other")) is None  # a name it did not ask for
    assert answer({"metadata": {"name": "job"}}) is None  # unreadable: not a job to claim
    obs = answer(lease_object("job", {"phase": "Available", "generation": 0}))
    assert obs is not None and obs.name == "job"


def test_at_most_the_cap_of_proposals_is_read_the_first_ones() -> None:
    many = json.dumps([[f"job-{i:03d}", str(i)] for i in range(MAX_PROPOSALS + 36)])
    out = decode_proposals(many)
    assert [p.name for p in out] == [f"job-{i:03d}" for i in range(MAX_PROPOSALS)]


def test_a_proposal_stands_while_its_job_is_claimable_on_the_servers_earliest_time() -> None:
    """``proposals_to_keep`` judges a Held job by its end plus the margin, as a claim does:
    kept from that instant on (not a moment later), not before it; and never a job that
    is not among the wanted, nor one gone from the view."""
    from datetime import timedelta

    from joblease.domain.clock import ServerNow
    from joblease.domain.dispatch import proposals_to_keep
    from joblease.domain.errors import format_time
    from joblease.domain.lease import Observed
    from support.fakekube import T_NOW, lease_object

    margin = timedelta(seconds=1)
    ended = Observed.from_object(lease_object("ended", {
        "phase": "Held", "holder": "gone", "generation": 1, "epoch": 1, "claimId": "c",
        "leaseUntil": format_time(T_NOW - margin)}))
    proposed = {"ended": Proposal("ended", "1"), "missing": Proposal("missing", "1")}
    current = {"ended": ended}
    assert proposals_to_keep(proposed, current.get, ServerNow.exact(T_NOW), margin,
                             ["ended", "missing"]) == {"ended": Proposal("ended", "1")}
    early = ServerNow.exact(T_NOW - timedelta(milliseconds=1))
    assert proposals_to_keep(proposed, current.get, early, margin, ["ended"]) == {}
    assert proposals_to_keep(proposed, current.get, ServerNow.exact(T_NOW), margin,
                             []) == {}


def test_the_inboxes_listed_name_only_workers_whose_inbox_it_is() -> None:
    """``list_inboxes_steps`` reads the list as hostile input: an item that is no object,
    metadata or annotations of the wrong type, no worker, or a worker whose inbox has
    another name are skipped, never raised on."""
    from joblease.core.inbox import WORKER_ANNOTATION, inbox_name, list_inboxes_steps

    def item(name: object, worker: object = None) -> dict[str, Any]:
        notes = {} if worker is None else {WORKER_ANNOTATION: worker}
        return {"metadata": {"name": name, "annotations": notes}}

    steps = list_inboxes_steps("ns", "p")
    call = next(steps)
    assert call.call.query == {"labelSelector": "joblease.dev/pool=p,joblease.dev/role=inbox"}
    items = [item(inbox_name("p", "w1"), "w1"), item(inbox_name("p", "w1"), "w2"),
             item("other", "w3"), item(inbox_name("p", "w4")), "no object",
             {"metadata": "no object"}, {"metadata": {"annotations": ["no", "object"]}},
             item(inbox_name("p", "w5"), 5)]
    try:
        steps.send({"items": items})
    except StopIteration as done:
        assert done.value == {"w1"}
    else:
        raise AssertionError("one request only")


def test_the_empty_pool_mark_is_written_removed_and_created_only_when_set() -> None:
    from joblease.kube.api import NotFoundError
    marked = write_inbox_steps("ns", pool_key("team=batch"), "w", "op", [], pool_empty=True)
    patch = marked.send(None)
    assert patch.call.body["metadata"]["annotations"][POOL_EMPTY_ANNOTATION] == "true"
    create = marked.throw(NotFoundError(404, "NotFound", "no inbox"))
    assert create.call.body["metadata"]["annotations"][POOL_EMPTY_ANNOTATION] == "true"
    plain = write_inbox_steps("ns", pool_key("team=batch"), "w", "op", [])
    plain.send(None)
    created = plain.throw(NotFoundError(404, "NotFound", "no inbox"))
    assert POOL_EMPTY_ANNOTATION not in created.call.body["metadata"]["annotations"]


@pytest.mark.parametrize("value", ["true", "True", "1", "yes", True, None, ["true"]])
def test_only_the_exact_mark_says_the_pool_is_empty_read_or_watched(value: Any) -> None:
    """Hostile but storable annotations: anything but the string ``true`` is no mark."""
    obj = inbox_object("7", "a")
    obj["metadata"]["annotations"][POOL_EMPTY_ANNOTATION] = value
    inbox, sink = Inbox("ns", "team=batch", "w", watch_seconds=60), Sink()
    steps = inbox.steps(sink)
    steps.send(None)  # the read
    watch = steps.send({"metadata": {"resourceVersion": "7"}, "items": [obj]})
    assert isinstance(watch, Watch)
    watch.on_event("MODIFIED", obj)
    watch.on_event("DELETED", obj)
    expected = value == "true"
    assert sink.marks == [expected, expected, False]
    assert sink.seen[:2] == [(Proposal("a", "1"),)] * 2
