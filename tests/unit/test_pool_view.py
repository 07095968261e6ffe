"""PoolView: the pure cache a work pool chooses from (joblease.domain.pool)."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import joblease.domain.lease as lease_module
import joblease.domain.pool as pool_module
from joblease.domain.clock import ServerNow
from joblease.domain.lease import LeaseSpec, LeaseStatus, Observed, Phase, claimable_at
from joblease.domain.pool import (
    TURN_GUARD,
    TURN_STEP,
    PoolView,
    _rank,
    creation_revision,
    owner_rank,
    turn_origin,
)
from support.builders import T0, at

MARGIN = timedelta(milliseconds=250)
NAMES = [f"job-{i}" for i in range(12)]



def job(name: str, rv: int = 100, *, priority: int = 0, created: float = 0.0,
        phase: Phase = Phase.AVAILABLE, until: float | None = None,
        rest: float | None = None, uid: str | None = None) -> Observed:
    status = LeaseStatus(
        phase=phase, holder="someone" if phase in (Phase.HELD, Phase.EXPIRED) else None,
        generation=1, epoch=1,
        lease_until=T0 + timedelta(seconds=until) if until is not None else None,
        not_before=T0 + timedelta(seconds=rest) if rest is not None else None)
    return Observed("ns", name, uid or f"uid-{name}", str(rv), 1, LeaseSpec(priority=priority),
                    status, created=T0 + timedelta(seconds=created))


@st.composite
def jobs(draw: st.DrawFn) -> Observed:
    phase = draw(st.sampled_from(list(Phase)))
    return job(draw(st.sampled_from(NAMES)), draw(st.integers(1, 10_000)),
               priority=draw(st.sampled_from([0, 5, 10])),
               created=draw(st.integers(-100, 0)), phase=phase,
               until=draw(st.one_of(st.none(), st.floats(-60, 60))) if phase is Phase.HELD
               else None,
               rest=draw(st.one_of(st.none(), st.floats(-60, 60))))


views = st.builds(lambda items, aside: _view(items, aside), st.lists(jobs(), max_size=12),
                  st.sets(st.sampled_from(NAMES), max_size=4))


def _view(items: list[Observed], aside: set[str]) -> PoolView:
    view = PoolView()
    view.replace({o.name: o for o in items}.values(), "1")
    for name in aside:
        view.set_aside(name)
    return view


def _cached(view: PoolView) -> list[Observed]:
    return [o for name in NAMES if (o := view.get(name)) is not None]


# --- choose --------------------------------------------------------------------------------

WORKERS = st.sets(st.sampled_from(["w-a", "w-b", "w-c", "w-d"]), max_size=4)


def _key(o: Observed) -> tuple[int, datetime, int, str]:
    return (-o.spec.priority, o.created or T0, creation_revision(o), o.name)


@given(views, st.floats(-60, 60), st.integers(1, 8), st.text(min_size=1, max_size=8), WORKERS)
def test_choose_returns_a_ready_candidate_of_the_top_priority_within_the_window(
        view: PoolView, t: float, spread: int, worker: str, workers: set[str]) -> None:
    """Whatever it chooses is claimable, of the top priority, within the window; when it
    chooses nothing although something is claimable, ``next_wake`` names a later moment
    (the worker's next turn), so a waiting worker is never left asleep."""
    now = at(t)
    ready = view.candidates(now, MARGIN)
    chosen = view.choose(worker, now, MARGIN, spread, workers=workers)
    if not ready:
        assert chosen is None
        return
    if chosen is None:
        wake = view.next_wake(now, MARGIN)
        assert wake is not None and wake > now.earliest
        return
    assert chosen in ready
    assert not view.is_set_aside(chosen.name)
    at_ = claimable_at(chosen, MARGIN)
    assert at_ is not None and at_ <= now.earliest
    assert chosen.spec.priority == max(o.spec.priority for o in ready)  # never a lower one
    assert chosen in ready[:view.window(spread, workers=len(workers | {worker}))]
    # nothing claimable by now is missing from the candidates
    for o in _cached(view):
        when = claimable_at(o, MARGIN)
        if when is not None and when <= now.earliest and not view.is_set_aside(o.name):
            assert o in ready


def _my_turn(obs: Observed, worker: str, workers: set[str], now: ServerNow) -> bool:
    """Whether it is ``worker``'s turn on ``obs`` now, written from docs/pools.md."""
    if len(workers) == 1:
        return True
    ranked = sorted(workers, key=lambda w: (_rank(w, obs.name), w), reverse=True)
    phase = int.from_bytes(_rank("", obs.name), "big") / 2**64
    first = turn_origin(obs, MARGIN) + TURN_STEP * phase
    if now.midpoint < first + TURN_STEP:
        return ranked[0] == worker  # the owner's first turn, from the origin on
    turn = (now.midpoint - first) // TURN_STEP
    into = now.midpoint - (first + turn * TURN_STEP)
    return ranked[turn % len(workers)] == worker and into >= TURN_GUARD


def brute_force_choice(view: PoolView, worker: str, now: ServerNow, spread: int,
                       exclude: set[str], per_holder: int,
                       workers: set[str]) -> Observed | None:
    """The choice as specified, by scanning everything (the reference for the index)."""
    live = workers | {worker}
    window = max(1, spread, per_holder * len(live))
    ready = sorted((o for o in _cached(view) if not view.is_set_aside(o.name)
                    and o.name not in exclude
                    and (when := claimable_at(o, MARGIN)) is not None and when <= now.earliest),
                   key=_key)
    if not ready:
        return None
    top = [o for o in ready[:window] if o.spec.priority == ready[0].spec.priority]
    return next((o for o in top if _my_turn(o, worker, live, now)), None)


ops = st.lists(st.tuples(st.sampled_from(["apply", "learn", "delete", "aside"]), jobs(),
                         st.sampled_from(["a", "b", "c"])), max_size=25)


@given(views, ops, st.floats(-60, 60), st.integers(1, 4), st.sets(st.sampled_from(NAMES)),
       st.integers(0, 2), st.sampled_from(["w-a", "w-b", "w-z"]), WORKERS)
@settings(max_examples=150)
def test_indexed_choice_equals_the_brute_force_reference_after_any_updates(
        view: PoolView, changes: list[tuple[str, Observed, str]], t: float, spread: int,
        exclude: set[str], per_holder: int, worker: str, workers: set[str]) -> None:
    for kind, obs, holder in changes:  # the index is kept by replace/apply/learn/set_aside
        if obs.status.phase is Phase.HELD:
            obs = replace(obs, status=replace(obs.status, holder=f"w-{holder}"))
        if kind == "apply":
            view.apply("MODIFIED", obs)
        elif kind == "learn":
            view.learn(obs)
        elif kind == "delete" and (cached := view.get(obs.name)) is not None:
            view.apply("DELETED", cached)
        else:
            view.set_aside(obs.name)
    now = at(t)
    assert view.choose(worker, now, MARGIN, spread, exclude, per_holder,
                       workers=workers) == brute_force_choice(
        view, worker, now, spread, exclude, per_holder, workers)
    assert view.unfinished() == sum(1 for o in _cached(view) if not o.status.phase.finished)
    assert view.active_holders() == len({o.status.holder for o in _cached(view)
                                         if o.status.phase is Phase.HELD and o.status.holder})
    assert view.candidates(now, MARGIN) == [
        o for o in sorted(_cached(view), key=_key) if not view.is_set_aside(o.name)
        and (when := claimable_at(o, MARGIN)) is not None and when <= now.earliest]


def test_choose_with_10000_cached_examines_only_the_front_of_the_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """20 workers hold the 20 oldest of 10,000: a choice reads those, then the candidates
    only up to its own first one (the first of its turns), never past its window."""
    view = PoolView()
    view.replace([job(f"j{i:05d}", created=i, phase=Phase.COMPLETED) for i in range(5_000)]
                 + [replace(held := job(f"k{i:05d}", created=5_000 + i, phase=Phase.HELD,
                                        until=60),
                            status=replace(held.status, holder=f"w{i}")) for i in range(20)]
                 + [job(f"m{i:05d}", created=6_000 + i) for i in range(5_000)], "1")
    examined: list[str] = []

    def counting(obs: Observed, margin: timedelta) -> datetime | None:
        examined.append(obs.name)
        return claimable_at(obs, margin)

    monkeypatch.setattr(pool_module, "claimable_at", counting)
    monkeypatch.setattr(lease_module, "claimable_at", counting)  # through claimable_now
    chosen = view.choose("w0", at(1), MARGIN, spread=32, per_holder=4)
    assert chosen is not None and chosen.name.startswith("m")
    assert view.live_workers(at(1)) == sorted(f"w{i}" for i in range(20))  # the holders
    assert view.window(32, per_holder=4) == 80
    # the jobs are new (created after now: the owner's turn): w0 takes the first it owns
    owned = [f"m{i:05d}" for i in range(80)
             if owner_rank("w0", f"m{i:05d}", [f"w{i}" for i in range(20)]) == 0]
    assert chosen.name == owned[0]
    read = set(examined)
    assert len(read) <= 20 + 80  # the held ones skipped, then at most the window; not 10,020
    assert read >= {f"k{i:05d}" for i in range(20)} | {chosen.name}
    assert view.unfinished() == 5_020


def test_the_window_widens_with_the_active_holders_and_narrows_as_they_leave() -> None:
    view = PoolView()
    view.replace([job(f"j{i}", created=i) for i in range(100)], "1")
    assert view.window(8, per_holder=4) == 8
    for i in range(5):  # five workers each claim one
        claimed = view.get(f"j{i}")
        assert claimed is not None
        view.learn(replace(claimed, resource_version="200", status=replace(
            claimed.status, phase=Phase.HELD, holder=f"w{i}",
            lease_until=T0 + timedelta(seconds=60))))
    assert view.active_holders() == 5 and view.window(8, per_holder=4) == 20
    done = view.get("j0")
    assert done is not None
    view.apply("MODIFIED", replace(done, resource_version="300",
                                   status=replace(done.status, phase=Phase.COMPLETED)))
    assert view.active_holders() == 4 and view.window(8, per_holder=4) == 16


@given(views, st.floats(-60, 60))
def test_candidates_are_ordered_by_priority_then_creation_then_name(view: PoolView,
                                                                     t: float) -> None:
    ready = view.candidates(at(t), MARGIN)
    keys = [_key(o) for o in ready]
    assert keys == sorted(keys)


def test_all_high_priority_jobs_come_before_any_low_one() -> None:
    view = PoolView()
    view.replace([job(f"low-{i}", created=-100 + i) for i in range(5)]
                 + [job(f"high-{i}", priority=10, created=i) for i in range(5)], "1")
    taken = []
    for _ in range(10):
        chosen = view.choose("w", at(10), MARGIN, spread=32)
        assert chosen is not None
        taken.append(chosen.name)
        view.learn(replace(chosen, resource_version="200",
                           status=replace(chosen.status, phase=Phase.COMPLETED)))
    assert all(name.startswith("high") for name in taken[:5])
    assert all(name.startswith("low") for name in taken[5:])


def test_a_workers_choice_is_stable_while_its_window_is_unchanged() -> None:
    view = PoolView()
    view.replace([job(f"j{i}", created=i) for i in range(40)], "1")
    first = view.choose("worker-a", at(10), MARGIN, spread=8)
    view.apply("ADDED", job("j-late", rv=300, created=100))  # beyond the window
    assert view.choose("worker-a", at(11), MARGIN, spread=8) == first


# --- one owner per job (issue 22): turns instead of independent draws -------------------

@pytest.mark.parametrize(("workers", "jobs_"), [(8, 100), (20, 200), (4, 4), (12, 160)])
def test_workers_that_see_the_same_live_workers_never_choose_the_same_job_at_once(
        workers: int, jobs_: int) -> None:
    """At any instant a job is the turn of exactly one live worker, so workers choosing at
    the same moment from the same view pick different jobs: no first pick collides.

    Before issue 22 each worker took the job of a window that ranked highest *for it*:
    independent uniform draws, which collide at the birthday bound (8 workers over 32
    candidates: 0.82 of 8 first picks; 20 over 32: 4.96 of 20). Over 300 seeded pools with
    random names, creation times and moments, none collides now, and every worker whose
    choice is ``None`` has a next wake (its next turn).
    """
    rng = random.Random(f"{workers}/{jobs_}")
    for _ in range(300):
        view = PoolView()
        view.replace([job(f"job-{rng.getrandbits(48):x}", created=rng.uniform(-30, 0))
                      for _ in range(jobs_)], "1")
        names = [f"worker-{rng.getrandbits(32):x}" for _ in range(workers)]
        now = at(rng.uniform(0, 30))
        chosen = []
        for name in names:
            pick = view.choose(name, now, MARGIN, workers=names)
            if pick is None:  # next_wake right after the choice: that worker's next turn
                wake = view.next_wake(now, MARGIN)
                assert wake is not None and wake > now.earliest
            else:
                chosen.append(pick.name)
        assert len(chosen) == len(set(chosen))


def test_a_dead_workers_jobs_pass_to_the_next_rank_once_its_presence_lapses() -> None:
    """The owner's presence runs out: it leaves every ranking, and the job's turns cycle
    over the workers left (before, the dead owner's turns came round too)."""
    view = PoolView()
    view.replace([job("j", created=0)], "1")
    workers = ["w-a", "w-b", "w-c"]
    for name in workers:
        view.note_worker(name, T0 + timedelta(seconds=60))
    owner = min(workers, key=lambda w: owner_rank(w, "j", workers))
    others = [w for w in workers if w != owner]
    view.note_worker(owner, T0 + timedelta(seconds=10))  # later wins: still 60
    assert [view.choose(w, at(0.1), MARGIN) for w in others] == [None, None]
    assert view.choose(owner, at(0.1), MARGIN) is not None
    view.forget_worker(owner)
    view.note_worker(owner, T0 + timedelta(seconds=1))  # its last renewal: live until 1 s
    assert owner in view.live_workers(at(0.5))
    assert owner not in view.live_workers(at(1.0))
    turns = {w: [t / 20 for t in range(20, 60)
                 if view.choose(w, at(t / 20), MARGIN) is not None] for w in others}
    assert all(turns.values())  # both get turns within two seconds
    assert not set(turns[others[0]]) & set(turns[others[1]])  # never at the same moment


def test_a_holder_counts_as_live_until_its_last_lease_ends_even_after_completing() -> None:
    """Sticky on purpose: a worker that just completed a job is alive and about to claim
    again. Dropping it at once (tried in this issue) made the workers of a drain see
    themselves alone between two jobs and herd onto the first candidate (0.095 wasted writes
    per job against 0.005, ``python -m bench --quick --only pool``). A holder whose lease
    ran out is no rank any more (a silent, dead one)."""
    view = PoolView()
    held = replace(job("a", until=30, phase=Phase.HELD),
                   status=replace(job("a", until=30, phase=Phase.HELD).status, holder="h1"))
    silent = replace(job("b", until=2, phase=Phase.HELD),
                     status=replace(job("b", until=2, phase=Phase.HELD).status, holder="h2"))
    view.replace([held, silent], "5")
    assert view.live_workers(at(1)) == ["h1", "h2"]
    assert view.live_workers(at(3)) == ["h1"]  # h2's lease ran out: not waited for
    done = replace(held, resource_version="200",
                   status=replace(held.status, phase=Phase.COMPLETED))
    view.apply("MODIFIED", done)
    assert view.live_workers(at(3)) == ["h1"]  # completed: still alive until 30 s
    assert view.live_workers(at(31)) == []
    view.note_worker("present", T0 + timedelta(seconds=45))  # presence outlasts it
    assert view.live_workers(at(31)) == ["present"]


def test_a_job_not_yet_due_for_a_worker_wakes_it_at_its_turn() -> None:
    """``next_wake`` after a ``None`` choice names the worker's next turn on the job, and at
    that moment the worker's choice is the job (so an idle worker is never stranded)."""
    view = PoolView()
    view.replace([job("j", created=0)], "1")
    workers = ["w-a", "w-b", "w-c", "w-d"]
    last = max(workers, key=lambda w: owner_rank(w, "j", workers))
    assert owner_rank(last, "j", workers) == 3
    assert view.choose(last, at(0.1), MARGIN, workers=workers) is None
    wake = view.next_wake(at(0.1), MARGIN)
    assert wake is not None
    assert view.choose(last, ServerNow.exact(wake), MARGIN, workers=workers) is not None
    early = ServerNow.exact(wake - timedelta(milliseconds=1))
    assert view.choose(last, early, MARGIN, workers=workers) is None


def test_same_second_jobs_keep_their_creation_order_stamped_or_not() -> None:
    """Order within one creationTimestamp second: the creation revision (``status.epoch``
    when the operator or a first claim stamped it, else the first version's
    resourceVersion), not the name."""
    view = PoolView()
    jobs_ = [job("zz", rv=101), replace(job("mm", rv=180), status=replace(
        job("mm").status, phase=Phase.AVAILABLE, holder=None, epoch=102)),
             replace(job("aa", rv=103), has_status=False, status=replace(
                 job("aa").status, epoch=None, generation=0))]
    view.replace([replace(jobs_[0], status=replace(jobs_[0].status, epoch=None,
                                                   generation=0), has_status=False),
                  *jobs_[1:]], "200")
    assert [o.name for o in view.candidates(at(1), MARGIN)] == ["zz", "mm", "aa"]
    assert view.choose("alone", at(1), MARGIN).name == "zz"  # type: ignore[union-attr]


# --- next_wake -----------------------------------------------------------------------------

@given(views, st.floats(-60, 60))
def test_next_wake_is_the_earliest_future_claimable_at_of_a_non_set_aside_job(
        view: PoolView, t: float) -> None:
    now = at(t)
    wake = view.next_wake(now, MARGIN)
    future = [w for o in _cached(view) if not view.is_set_aside(o.name)
              and (w := claimable_at(o, MARGIN)) is not None and w > now.earliest]
    assert wake == min(future, default=None)
    if wake is not None:
        later = ServerNow.exact(wake)
        woken = {o.name for o in view.candidates(later, MARGIN)}
        assert woken - {o.name for o in view.candidates(now, MARGIN)}  # someone became ready


def test_a_held_job_wakes_a_waiter_at_lease_until_plus_margin_without_any_event() -> None:
    view = PoolView()
    view.replace([job("j", phase=Phase.HELD, until=30)], "1")
    assert view.choose("w", at(20), MARGIN) is None
    assert view.next_wake(at(20), MARGIN) == T0 + timedelta(seconds=30) + MARGIN
    assert view.choose("w", at(30.25), MARGIN) is not None


# --- apply / replace / learn / set_aside ---------------------------------------------------

events = st.lists(st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
                            st.sampled_from(NAMES[:4]), st.booleans()), max_size=30)


@given(events)
@settings(max_examples=200)
def test_applying_a_stream_in_order_keeps_the_latest_version_of_every_live_object(
        stream: list[tuple[str, str, bool]]) -> None:
    view, truth = PoolView(), {}
    rv = 100
    for kind, name, recreate in stream:
        rv += 1
        old = truth.get(name)
        if kind == "DELETED":
            if old is None:
                continue
            del truth[name]
            view.apply("DELETED", replace(old, resource_version=str(rv)))
        else:
            uid = f"{name}-{rv}" if old is None or recreate else old.uid
            if old is not None and recreate:  # a delete and re-create: two events
                view.apply("DELETED", replace(old, resource_version=str(rv)))
                rv += 1
            truth[name] = job(name, rv, uid=uid)
            view.apply(kind, truth[name])
        assert view.resource_version == str(rv)
    assert {o.name: o for o in _cached(view)} == truth
    assert len(view) == len(truth)


def test_an_older_event_never_replaces_a_version_learned_from_a_write() -> None:
    view = PoolView()
    view.replace([job("j", 100)], "100")
    view.learn(job("j", 105, phase=Phase.HELD, until=30))
    view.apply("MODIFIED", job("j", 103))  # the watch lags behind our own write
    assert view.get("j").resource_version == "105"  # type: ignore[union-attr]
    assert view.resource_version == "103"


def test_learn_never_resurrects_what_the_watch_removed() -> None:
    view = PoolView()
    view.replace([job("j", 100)], "100")
    view.apply("DELETED", job("j", 106))  # deleted (or left the selector) after our write
    view.learn(job("j", 105, phase=Phase.HELD, until=30))
    assert view.get("j") is None and view.unfinished() == 0


def test_learn_of_an_old_incarnation_does_not_replace_the_new_one() -> None:
    view = PoolView()
    view.replace([job("j", 200, uid="new")], "200")
    view.learn(job("j", 150, uid="old", phase=Phase.HELD, until=30))
    assert view.get("j").uid == "new"  # type: ignore[union-attr]


def test_a_stale_delete_of_another_incarnation_is_ignored() -> None:
    view = PoolView()
    view.replace([job("j", 200, uid="new")], "200")
    view.apply("DELETED", job("j", 201, uid="old"))
    assert view.get("j") is not None


def test_set_aside_until_a_newer_version_arrives() -> None:
    view = PoolView()
    view.replace([job("j", 100), job("k", 100, created=1)], "100")
    view.set_aside("j", "100")
    assert [o.name for o in view.candidates(at(0), MARGIN)] == ["k"]
    assert view.next_wake(at(0), MARGIN) is None
    view.apply("MODIFIED", job("j", 100))  # the same version again: still aside
    assert view.is_set_aside("j")
    view.apply("MODIFIED", job("j", 101))
    assert not view.is_set_aside("j")


def test_a_409_caused_by_a_version_already_cached_does_not_hide_that_version() -> None:
    """Regression: the claim was decided from rv 100; the watch brought 101 (the operator's
    first status write) before the 409 came back. Version 101 was never tried, so it must
    stay a candidate; setting the name aside at 101 made a lone worker wait forever."""
    view = PoolView()
    view.replace([job("j", 100)], "100")
    view.apply("MODIFIED", job("j", 101))
    view.set_aside("j", tried="100")
    assert not view.is_set_aside("j")
    assert view.choose("w", at(0), MARGIN) is not None


def test_replace_keeps_set_aside_only_for_unchanged_versions_and_drops_the_gone() -> None:
    view = PoolView()
    view.replace([job("a", 100), job("b", 100), job("c", 100)], "100")
    for name in "abc":
        view.set_aside(name)
    view.replace([job("a", 100), job("b", 120)], "130")
    assert view.is_set_aside("a") and not view.is_set_aside("b")
    assert not view.is_set_aside("c") and view.get("c") is None
    assert view.resource_version == "130"


@given(views)
def test_unfinished_counts_the_cached_jobs_that_are_not_completed_or_failed(
        view: PoolView) -> None:
    assert view.unfinished() == sum(1 for o in _cached(view) if not o.status.phase.finished)


def test_excluded_names_are_not_chosen_so_sibling_threads_take_different_leases() -> None:
    view = PoolView()
    view.replace([job(f"j{i}", created=i) for i in range(5)], "1")
    taken: set[str] = set()
    for _ in range(5):
        chosen = view.choose("same-worker", at(0), MARGIN, exclude=taken)
        assert chosen is not None and chosen.name not in taken
        taken.add(chosen.name)
    assert view.choose("same-worker", at(0), MARGIN, exclude=taken) is None


def test_learning_a_newer_version_brings_a_set_aside_name_back_and_the_tried_one_does_not(
        ) -> None:
    view = PoolView()
    view.replace([job("j", 100)], "100")
    view.set_aside("j", "100")
    view.learn(job("j", 100))  # the very version the failed claim was decided from
    assert view.is_set_aside("j")
    view.learn(job("j", 105))  # a fresh GET after the 409: not tried yet
    assert not view.is_set_aside("j")
    assert view.choose("w", at(0), MARGIN) is not None


def test_a_deleted_name_leaves_nothing_behind_not_even_its_set_aside_mark() -> None:
    """A long-running worker's view must not grow with every job ever refused and deleted."""
    view = PoolView()
    view.replace([job("j", 100)], "100")
    view.set_aside("j", "100")
    view.apply("DELETED", job("j", 101))
    assert view.get("j") is None and not view.is_set_aside("j") and len(view) == 0


def test_an_unparsable_resource_version_is_taken_as_newer() -> None:
    """resourceVersions are opaque by contract: what cannot be ordered must not be dropped."""
    view = PoolView()
    view.replace([job("j", 100)], "100")
    newer = replace(job("j", 100, phase=Phase.HELD, until=30), resource_version="x-101")
    view.apply("MODIFIED", newer)
    assert view.get("j") == newer
    learned = replace(newer, resource_version="x-102")
    view.learn(learned)
    assert view.get("j") == learned


def test_fifo_follows_the_creation_timestamp_the_server_stored_not_the_name() -> None:
    def stored(name: str, created: str) -> Observed:
        return Observed.from_object({
            "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}",
                         "resourceVersion": "7", "creationTimestamp": created},
            "spec": {}, "status": {"phase": "Available"}})

    older = stored("zz-older", "2026-12-02T11:00:00Z")
    assert older.created == datetime(2026, 12, 2, 11, 0, tzinfo=UTC)
    view = PoolView()
    view.replace([stored("aa-newer", "2026-12-02T11:30:00Z"), older], "7")
    assert [o.name for o in view.candidates(at(0), MARGIN)] == ["zz-older", "aa-newer"]
    assert view.choose("w", at(0), MARGIN, spread=1) == older


def test_a_worker_holding_two_leases_stays_active_until_it_holds_none() -> None:
    """Threads of one worker share its name: the window counts the worker, not its leases,
    and must not forget it while it still holds one."""
    view = PoolView()
    view.replace([job(f"j{i}", created=i) for i in range(3)], "1")
    for name in ("j0", "j1"):
        claimed = view.get(name)
        assert claimed is not None
        view.learn(replace(claimed, resource_version="200", status=replace(
            claimed.status, phase=Phase.HELD, holder="w", lease_until=T0 + timedelta(seconds=60))))
    assert view.active_holders() == 1
    done = view.get("j0")
    assert done is not None
    view.apply("MODIFIED", replace(done, resource_version="300",
                                   status=replace(done.status, phase=Phase.COMPLETED)))
    assert view.active_holders() == 1  # still holds j1
    view.apply("DELETED", replace(view.get("j1"), resource_version="301"))  # type: ignore[type-var]
    assert view.active_holders() == 0


def test_a_spread_below_one_still_chooses_strictly_first() -> None:
    view = PoolView()
    view.replace([job("late", created=5), job("early", created=1)], "1")
    assert view.window(0) == 1
    chosen = view.choose("w", at(0), MARGIN, spread=0)
    assert chosen is not None and chosen.name == "early"
