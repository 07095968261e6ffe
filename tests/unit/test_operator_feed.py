"""Issue 28: the run's own JobLease feed — which namespaces it lists, what it keeps."""

from __future__ import annotations

import random
from typing import Any

from kopf._cogs.structs.references import match_namespace

from joblease.controller import metrics
from joblease.controller.runtime import Operator, ViewSink, feed_scopes, namespace_matches
from joblease.controller.settings import OperatorSettings
from joblease.core.feed import compact_lease
from joblease.domain.lease import Phase
from support.fakekube import lease_object

HELD = {"phase": "Held", "holder": "w", "generation": 1, "epoch": 3,
        "renewTime": "2026-12-03T12:00:00Z", "leaseUntil": "2099-12-03T12:00:30Z"}


def test_every_namespace_one_feed_names_one_each_patterns_one_filtered() -> None:
    [(everything, all_in)] = feed_scopes(())
    assert everything == "" and all_in("any")
    named = feed_scopes(("a", "b"))
    assert [ns for ns, _ in named] == ["a", "b"]
    assert [scope("a") for _, scope in named] == [True, False]
    [(listed, in_scope)] = feed_scopes(("team-*", "ops"))
    assert listed == ""
    assert [in_scope(n) for n in ("team-x", "ops", "other")] == [True, True, False]


def test_namespace_patterns_mean_what_they_mean_to_kopf() -> None:
    rng = random.Random(28)
    names = ["myapp-test", "myapp-pr-123", "myapp-pr-456", "otherapp-pr-123", "ops", "a"]
    globs = ["myapp-*", "!*-pr-*", "*pr-123", "ops", "!ops", "*", "?", "a*", "!a"]
    for _ in range(2_000):
        pattern = ", ".join(rng.choice(globs) for _ in range(rng.randint(1, 4)))
        for name in names:
            assert namespace_matches(name, pattern) == match_namespace(name, pattern), \
                (name, pattern)


def lease(name: str, status: dict[str, Any] | None, rv: str = "7",
          namespace: str = "ns") -> Any:
    obj = lease_object(name, status, namespace=namespace)
    obj["metadata"]["resourceVersion"] = rv
    return compact_lease(obj)


def test_a_restart_over_leases_that_need_nothing_writes_nothing_and_forgets_the_deleted(
) -> None:
    """A re-list through the sink: each lease stored once, nothing due, the unlisted gone."""
    operator = Operator(OperatorSettings())
    sink = ViewSink(operator, lambda ns: ns == "ns")
    sink.list_started()
    sink.list_page([lease("a", None), lease("b", HELD)])
    sink.list_page([lease("c", {"phase": "Available", "generation": 0, "attempts": 0})])
    sink.list_done("10")
    assert operator.view.phases()[Phase.AVAILABLE] == 2
    sink.list_started()
    sink.list_page([lease("a", None), lease("x", HELD, namespace="elsewhere")])
    sink.list_done("20")
    assert sorted(o.name for o in operator.view.snapshot()) == ["a"]  # b, c deleted unseen
    sink.apply("DELETED", lease("a", None))
    assert operator.view.snapshot() == []


def test_an_unreadable_event_is_counted_and_the_next_one_stored() -> None:
    operator = Operator(OperatorSettings())
    before = metrics.OBJECT_ERRORS.labels("read")._value.get()
    bad = lease_object("bad", {"generation": "many"})
    operator.observe_lease({"type": "ADDED", "object": bad})
    operator.observe_lease({"type": "ADDED", "object": lease_object("good", HELD)})
    assert metrics.OBJECT_ERRORS.labels("read")._value.get() == before + 1
    assert [o.name for o in operator.view.snapshot()] == ["good"]


def test_the_reconcile_loop_wakes_when_something_becomes_due_sooner() -> None:
    """The pass planned to sleep 1 s; a new version due now must not wait for that."""
    import asyncio
    import time

    from joblease.controller.runtime import _loop

    async def scenario() -> list[float]:
        passes: list[float] = []
        woken = asyncio.Event()

        def pass_once() -> float:
            passes.append(time.monotonic())
            return 1.0

        task = asyncio.create_task(_loop(pass_once, woken=woken))
        while not passes:
            await asyncio.sleep(0.01)
        woken.set()  # what LeaseView.on_sooner does, through the loop
        while len(passes) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        return passes

    passes = asyncio.run(scenario())
    assert passes[1] - passes[0] < 0.5


def test_an_operator_wakes_its_loop_from_the_feeds_thread() -> None:
    import asyncio
    import threading

    from joblease.controller.runtime import Operator

    async def scenario() -> bool:
        operator = Operator(OperatorSettings())
        operator._loop = asyncio.get_running_loop()
        operator._due_sooner = asyncio.Event()
        thread = threading.Thread(target=operator.observe, args=(lease("due", {
            **HELD, "leaseUntil": "2026-01-01T00:00:00Z"}),))
        thread.start()
        thread.join()
        await asyncio.wait_for(operator._due_sooner.wait(), 2)
        return operator._due_sooner.is_set()

    assert asyncio.run(scenario())
