"""A work pool's decisions, written once: what to claim, how long to wait, what a refusal means.

``joblease.sdk.Pool`` (threads and a condition) and ``joblease.aio.AsyncPool`` (a task and an
event) used to carry each its own copy of this logic, and the copies drifted: one timed its
deadlines on ``time.monotonic``, the other on the transport's clock; only one had a least
wait; ``live_workers`` sent a request in one and read the clock estimate in the other; one
``unfinished()`` waited for the first list and the other answered 0 before it. A
:class:`PoolEngine` is the one copy. It performs no I/O and never waits: its drivers feed it
(it is the feed's :class:`~joblease.core.feed.FeedSink` and presence's
:class:`~joblease.core.presence.PresenceSink`), ask it what to do, and do it:

* :meth:`PoolEngine.decide` answers one round of a ``claim_next``: a lease to claim (it is
  then marked as being claimed, so sibling claimers choose others), ``None`` (give up: the
  timeout passed, the pool is closed, or ``until_empty`` found nothing unfinished), a
  :class:`ConfirmEmpty` (a narrow worker about to stop on the dispatcher's word that the
  pool is empty asks the API server first; the driver answers with
  :meth:`PoolEngine.confirmed`), or a :class:`Wait` (how long at most; any change wakes
  the driver sooner). It raises what the
  caller must see: a refused first list at once, an unreachable or missing one once the
  timeout passed, the cause of a dead feed;
* :meth:`PoolEngine.settle` folds a claim's outcome in (``joblease.core.claiming`` made it):
  a won lease is learned, a refusal sets the name aside until a newer version (a claim that
  itself wrote Failed is learned instead), and the name is handed back to the siblings;
* :meth:`PoolEngine.unfinished`, :meth:`PoolEngine.live_workers`, :meth:`PoolEngine.announce`;
* :meth:`PoolEngine.wanted_scope` says what the feed must list and watch (issue 30): the
  whole pool, or, while a dispatcher lives, only this worker's jobs and the jobs that did
  not opt in (``joblease.core.scope``); :meth:`PoolEngine.open_scope` and
  :meth:`PoolEngine.stream_sink` fold the new scope's streams into the view, which keeps
  the old scope's content until every new stream has listed. The drivers run one feed per
  stream and switch when the wanted scope changes (a presence list, or the record's lapse,
  :meth:`PoolEngine.scope_wake`).

**One clock** (:class:`PoolClock`): the client's transport. Deadlines and waits are counted on
its ``monotonic()``, the jobs are judged on its server-time estimate at that instant, and a
wake-up's server time becomes local seconds through the same estimate
(``ServerClock.monotonic_certain``). Reading time never sends a request: every answer the
pool waits for before choosing (its first list) carries the ``Date`` header the estimate is
made of. Tests move time by faking the transport, for both pools alike.

**Locking.** The engine takes its driver's ``guard`` (the thread pool's ``Condition``; a
no-op for the asyncio pool, whose callers all run on one loop) around every change, and calls
``wake`` (``notify_all``; replacing the event) after it, with the guard held. A driver waits
for :attr:`PoolEngine.changes` to move past the value it read before :meth:`decide`, so no
change slips in between the decision and the wait.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from joblease.core.claiming import PooledLease
from joblease.core.inbox import Inbox
from joblease.core.presence import Presence
from joblease.core.scope import FULL, PENDING, Scope, StreamMerge
from joblease.domain.clock import ServerClock, ServerNow
from joblease.domain.dispatch import Proposal
from joblease.domain.errors import LeaseFinishedError, PoolClosedError
from joblease.domain.lease import Observed
from joblease.domain.pool import PoolView, seconds_until_wake
from joblease.kube.api import ApiError, UnavailableError
from joblease.kube.requests import server_time

L = TypeVar("L", bound=PooledLease)

MIN_WAIT = 0.01  # the least wait for a wake-up: an estimate that lands on "now" must not spin
# the longest a worker that announced its slots waits for its presence's first list before
# it lists the whole pool anyway (a presence that fails or is refused must not stop it)
FIRST_PRESENCE_WAIT = 2.0
PROPOSAL_RETRY = 1.0  # a proposal tried and still proposed is read again after this long
# a dispatcher's word that the pool is empty, found wrong by the API server, is checked again
# after this long if it has not changed meanwhile (a dead dispatcher's word does not change)
RECONFIRM_SECONDS = 2.0

log = logging.getLogger(__name__)


class ClockSource(Protocol):
    """What :class:`PoolClock` reads: a transport's clocks (``Transport``, ``AsyncTransport``)."""

    clock: ServerClock

    def monotonic(self) -> float:
        """The local monotonic clock every deadline is counted on."""


class PoolClock:
    """A pool's one clock: its transport's monotonic clock and server-time estimate.

    Args:
        api: The client's transport (either kind).
        estimate: Reads the server time at ``api.monotonic()`` (default: ``api.clock``'s
            estimate). The thread pool passes ``KubeApi.server_now``, the same reading taken
            under the transport's lock, since its request threads fold ``Date`` headers into
            the estimate meanwhile; it sends a request only when no answer has been seen,
            which :meth:`PoolEngine.decide` never lets happen (it reads time after a list).
    """

    def __init__(self, api: ClockSource, estimate: Callable[[], ServerNow] | None = None
                 ) -> None:
        self._api = api
        self._estimate = estimate or self._read

    def monotonic(self) -> float:
        """Local seconds, the clock of every deadline and wait."""
        return self._api.monotonic()

    def known(self) -> bool:
        """Whether any answer has told the server's time yet."""
        return self._api.clock.known

    def server_now(self) -> ServerNow:
        """The server's time now, as the transport estimates it (no request)."""
        return self._estimate()

    def seconds_until(self, wake: datetime) -> float:
        """Local seconds until the server's earliest time has certainly reached ``wake``."""
        return seconds_until_wake(self._api.clock, wake, self._api.monotonic())

    def _read(self) -> ServerNow:
        return server_time(self._api.clock, self._api.monotonic(), "the API server")


@dataclass(frozen=True)
class Ask:
    """One ``claim_next`` call: who claims, until when (engine clock), how, and when to stop."""

    who: str
    end: float | None
    spread: int
    until_empty: bool = False


@dataclass(frozen=True)
class Adopt:
    """A dispatcher claimed ``job`` for this worker: adopt it (a renewal), then run it."""

    job: Observed


@dataclass(frozen=True)
class Propose:
    """A dispatcher proposed ``proposal`` to this worker: read it and claim it yourself."""

    proposal: Proposal


@dataclass(frozen=True)
class Wait:
    """Nothing to claim yet: wait for a change, at most ``seconds`` (``None``: no bound)."""

    seconds: float | None


@dataclass(frozen=True)
class ConfirmEmpty:
    """Ask the API server whether the pool has an unfinished job, then decide again.

    A narrow worker (it watches only its own jobs) knows that the pool is empty only from
    the dispatcher's word: its record's count, or the mark in this worker's inbox. A
    dispatcher that died leaves its last word in place until its record lapses, so an
    ``until_empty`` claim stops only once one list (:func:`unfinished_probe`) agrees
    (safety.md #63). ``word``: the dispatcher's word it checks (:meth:`PoolEngine.confirmed`).
    """

    word: int


@dataclass(frozen=True)
class _Confirmed:
    word: int
    empty: bool
    at: float  # the engine's clock


Decision = Observed | Adopt | Propose | Wait | ConfirmEmpty | None


class PoolEngine:
    """The state and the decisions of one work pool (see the module doc).

    Args:
        namespace: The pool's namespace (where presence records live).
        selector: The pool's label selector (named in errors).
        clock: The pool's one clock.
        presence: Keep a presence record (``announce`` makes it).
        guard: Held around every change (a ``threading.Condition``; reentrant).
        wake: Called, guard held, after every change: waiting claimers look again.
        slots: This worker's slots, announced in its presence record so that a pool
            dispatcher may claim jobs for it (``None``: not announced; the worker still
            adopts what is claimed for it, and chooses by turns).

    Attributes:
        view: The pool's cache (``PoolView``).
        claims: Claims won.
        conflicts: Claims refused (how often claimers collided).
        watch_errors: Lists or watches that failed and were retried.
        presence: This worker's presence (``None`` until announced, or when off).
        changes: Moves on every change; a driver waits for it to move.
        events: Watch events with an object the feeds delivered (what a worker decodes
            per job: the narrow scope's point).
        listed: Objects the feeds' lists delivered.
        scope: The scope the view is complete for (the last whose every stream listed).
        scopes: Scopes opened (the first one included): how often the feed switched.
        pool_unfinished: The unfinished jobs of the whole pool as the dispatcher last
            published them in its record (``None``: not published): how a narrow worker
            knows the pool is empty (``until_empty``).
        inbox_says_empty: The dispatcher marked this worker's inbox: it counts no unfinished
            job (sooner than the record, read at presence's next list); a narrow view's
            pool count is then 0.
    """

    def __init__(self, namespace: str, selector: str | None, clock: PoolClock, *,
                 presence: bool = True,
                 guard: AbstractContextManager[Any] | None = None,
                 wake: Callable[[], None] = lambda: None, slots: int | None = None) -> None:
        self.namespace = namespace
        self.slots = slots
        self.dispatcher_until: datetime | None = None  # the dispatcher's record lapses then
        self.selector = selector
        self.clock = clock
        self.view = PoolView()
        self.claims = 0
        self.conflicts = 0
        self.watch_errors = 0
        self.presence: Presence | None = None
        self.inbox_feed: Inbox | None = None  # this worker's inbox, once announced with slots
        self.proposals: tuple[Proposal, ...] = ()  # what the inbox proposes now
        # proposals read and claimed (or refused) → when, on the engine's clock: one still
        # proposed is read again after PROPOSAL_RETRY (a failed read, a clock that judged
        # the job not yet claimable must not strand it)
        self._tried: dict[tuple[str, str], float] = {}
        self._taken: set[tuple[str, str]] = set()  # proposals this worker claimed: done
        self.changes = 0
        self.closed = False
        self._with_presence = presence
        self._guard = guard if guard is not None else contextlib.nullcontext()
        self._wake = wake
        self._synced = False
        self._trouble: ApiError | None = None
        self._dead: Exception | None = None
        self._claiming: set[str] = set()  # names this pool's claimers are claiming now
        self._presence_names: set[str] = set()
        self.events = 0
        self.listed = 0
        self.scope: Scope = FULL
        self.scopes = 0
        self.pool_unfinished: int | None = None
        self.inbox_says_empty = False  # the dispatcher marked this worker's inbox: pool empty
        self._word = 0  # moves whenever the dispatcher's word on the pool's count changes
        self._confirmed: _Confirmed | None = None  # the API server's answer on that word
        self._epoch = 0  # the scope opened last; a stopped scope's late deliveries are dropped
        self._opening: Scope = FULL
        self._merge: StreamMerge | None = None  # None: one stream, the view itself
        self._presence_answered = False  # a presence list has said whether a dispatcher lives
        self._awaiting_since: float | None = None  # when the feed first waited for presence

    # -- what the feed and presence deliver (FeedSink, PresenceSink) -----------------------

    def replace(self, items: list[Observed], resource_version: str) -> None:
        """A complete list: the view starts over; a claimer waiting for it goes on."""
        with self._guard:
            self.listed += len(items)
            self.view.replace(items, resource_version)
            self._synced, self._trouble = True, None
            self._changed()

    def apply(self, event_type: str, obs: Observed) -> None:
        """A watch event."""
        with self._guard:
            self.events += 1
            self.view.apply(event_type, obs)
            self._changed()

    def bookmark(self, resource_version: str) -> None:
        """A BOOKMARK: the resume point moved (nothing a claimer waits for)."""
        with self._guard:
            self.view.bookmark(resource_version)

    def trouble(self, error: ApiError) -> None:
        """A list or watch failed (the feed retries): a claimer before the first list sees it."""
        with self._guard:
            self.watch_errors += 1
            self._trouble = error
            self._changed()
        log.warning("JobLease pool %r: list/watch failed (%s); retrying", self.selector, error)

    def workers(self, live: dict[str, datetime]) -> None:
        """The presence records just listed: note them, forget who left (turns change)."""
        with self._guard:
            for name in self._presence_names - live.keys():
                self.view.forget_worker(name)
            for name, until in live.items():
                self.view.note_worker(name, until)
            self._presence_names = set(live)
            self._changed()

    def dispatcher(self, until: datetime | None, unfinished: int | None = None) -> None:
        """The dispatcher's record just listed: while it lives, this worker only adopts.

        ``unfinished``: the pool's unfinished jobs the record publishes (a narrow worker's
        only way to know the pool is empty).
        """
        with self._guard:
            first, self._presence_answered = not self._presence_answered, True
            if first or (until, unfinished) != (self.dispatcher_until, self.pool_unfinished):
                self._word += 1
                self.dispatcher_until, self.pool_unfinished = until, unfinished
                self._changed()

    def inbox(self, proposals: tuple[Proposal, ...], pool_empty: bool = False) -> None:
        """The worker's inbox as just read (``InboxSink``): the jobs proposed to it, in order.

        A proposal claimed is not read again while the inbox still holds it (at that
        version); one read and not claimed is read again after :data:`PROPOSAL_RETRY`;
        one that left the inbox is forgotten. ``pool_empty``: the dispatcher marked it, it
        counts no unfinished job (a narrow view's count, as the record's, at once).
        """
        with self._guard:
            if pool_empty != self.inbox_says_empty:
                self._word += 1
            self.proposals, self.inbox_says_empty = proposals, pool_empty
            listed = {(p.name, p.resource_version) for p in proposals}
            self._tried = {key: at for key, at in self._tried.items() if key in listed}
            self._taken &= listed
            self._changed()

    def inbox_refused(self) -> None:
        """The inbox was refused: presence announces that this worker reads none.

        The feed watches the worker's own jobs again at once (:meth:`wanted_scope`), before
        a dispatcher reads that announcement and claims for it.
        """
        with self._guard:
            if self.presence is not None:
                self.presence.stop_reading_inbox()
            self._changed()

    # -- the feed's scope (issue 30: a dispatched worker watches only its own jobs) ----------

    def wanted_scope(self) -> Scope:
        """What the feed should list and watch now (``joblease.core.scope``).

        Narrow while this worker is dispatched (:meth:`dispatched`: it announced its slots,
        and the dispatcher's record is live on the server's earliest time), without its own
        jobs while it reads its inbox (:attr:`Scope.own`: from the instant the inbox is
        refused, before its presence says so, they are watched again); the whole pool
        otherwise — before the first claim names the worker, and from the instant the
        record lapses, since taking turns needs the whole view.
        """
        with self._guard:
            presence = self.presence
            if self.closed:
                return FULL
            if self._awaiting_presence():
                return PENDING
            if presence is None or not self.clock.known():
                return FULL
            if not self.dispatched(self.clock.server_now()):
                return FULL
            return Scope(presence.holder, own=not presence.reads_inbox)

    def _awaiting_presence(self) -> bool:
        """Whether the feed should list nothing yet: see :data:`~joblease.core.scope.PENDING`.

        Only a worker that announced its slots (it may be dispatched) with presence on, and
        only until its presence's first list answered, or :data:`FIRST_PRESENCE_WAIT` after
        the pool was made, or its presence was refused (RBAC): then it lists as before.
        """
        if self.slots is None or not self._with_presence or self._presence_answered:
            return False
        if self.presence is not None and not self.presence.enabled:
            return False
        return self._presence_wait_left() > 0

    def _presence_wait_left(self) -> float:
        now = self.clock.monotonic()
        if self._awaiting_since is None:
            self._awaiting_since = now
        return self._awaiting_since + FIRST_PRESENCE_WAIT - now

    def scope_wake(self) -> float | None:
        """Local seconds until the wanted scope may change with no event (the record lapses)."""
        with self._guard:
            if self._awaiting_presence():
                return max(MIN_WAIT, self._presence_wait_left())
            until = self.dispatcher_until
            if until is None or not self.clock.known():
                return None
            if not self.dispatched(self.clock.server_now()):
                return None  # lapsed already (or not announced): only a presence list changes it
            return self._until_wake(until)

    def open_scope(self, scope: Scope) -> int:
        """The driver starts ``scope``'s feeds: their sinks are ``stream_sink(epoch, i)``.

        Returns the epoch; what feeds of an earlier one still deliver is dropped. The view
        keeps what it shows until every stream of ``scope`` has listed.
        """
        with self._guard:
            self._epoch += 1
            self.scopes += 1
            self._opening = scope
            self._merge = StreamMerge(len(scope.fields())) if scope.narrow else None
            return self._epoch

    def stream_sink(self, epoch: int, index: int) -> StreamSink:
        """The sink of stream ``index`` of the scope opened as ``epoch``."""
        return StreamSink(self, epoch, index)

    def stream_listed(self, epoch: int, index: int, items: list[Observed],
                      resource_version: str) -> None:
        """A stream's complete list; the view becomes the new scope's once all have listed."""
        with self._guard:
            if epoch != self._epoch:
                return
            self.listed += len(items)
            union = items if self._merge is None else self._merge.listed(index, items)
            if union is None:
                return
            self.view.replace(union, resource_version)
            self.scope = self._opening
            self._synced, self._trouble = True, None
            self._changed()

    def stream_trouble(self, epoch: int, error: ApiError) -> None:
        """A stream's list or watch failed (its feed retries): as :meth:`trouble`."""
        if epoch == self._epoch:
            self.trouble(error)

    def stream_event(self, epoch: int, index: int, event_type: str, obs: Observed) -> None:
        """A stream's watch event (with an object), folded into the view."""
        with self._guard:
            if epoch != self._epoch:
                return
            self.events += 1
            out = ((event_type, obs) if self._merge is None
                   else self._merge.event(index, event_type, obs))
            if out is not None:
                self.view.apply(*out)
                self._changed()

    # -- the pool's life ------------------------------------------------------------------

    def close(self) -> bool:
        """Mark the pool closed (waiting claimers give up); ``False`` if it already was."""
        with self._guard:
            if self.closed:
                return False
            self.closed = True
            self._changed()
            return True

    def died(self, error: Exception) -> None:
        """The feed stopped on an unexpected error: claimers get it as ``PoolClosedError``."""
        log.error("JobLease pool %r: the watch stopped", self.selector, exc_info=error)
        with self._guard:
            self._dead, self.closed = error, True
            self._changed()

    def announce(self, who: str) -> Presence | None:
        """This worker's presence, made once, by the first holder; the driver runs it."""
        with self._guard:
            if not self._with_presence or self.presence is not None or self.closed:
                return None
            self.presence = Presence(self.namespace, self.selector, who, slots=self.slots)
            if self.slots is not None:
                self.inbox_feed = Inbox(self.namespace, self.selector, who)
            return self.presence

    # -- claiming ---------------------------------------------------------------------------

    def ask(self, who: str, timeout: float | None, spread: int, until_empty: bool) -> Ask:
        """One ``claim_next`` call, its ``timeout`` turned into an end on the engine's clock."""
        end = None if timeout is None else self.clock.monotonic() + timeout
        with self._guard:
            if until_empty and self.presence is not None:
                self.presence.wait_for_empty()  # the dispatcher then marks the inbox
        return Ask(who, end, spread, until_empty)

    def decide(self, ask: Ask, margin: timedelta) -> Decision:
        """One round of ``claim_next``: claim this, give up (``None``), or :class:`Wait`.

        Raises:
            ApiError: the first list was refused (403, 404, 400), at once; or it could not
                be had (``UnavailableError``: the feed's last failure, else ``NotSynced``)
                by the end.
            PoolClosedError: the feed died of an unexpected error.
        """
        with self._guard:
            waiting = self.await_list(ask.end)
            if waiting is not None:
                return waiting
            if self.closed:
                self._raise_if_dead()
                return None  # closed under a waiting claim: a worker's loop ends
            now = self.clock.server_now()
            assigned = self._assigned(ask.who)
            if assigned is not None:
                self._claiming.add(assigned.name)
                return Adopt(assigned)
            proposal = self._proposed(ask.who)
            if proposal is not None:
                self._claiming.add(proposal.name)
                self._tried[(proposal.name, proposal.resource_version)] = (
                    self.clock.monotonic())
                return Propose(proposal)
            dispatched = self.dispatched(now)
            chosen = self.view.choose(ask.who, now, margin, ask.spread, exclude=self._claiming,
                                      only=_not_dispatched if dispatched else None)
            if chosen is not None:
                self._claiming.add(chosen.name)  # siblings choose others meanwhile
                return chosen
            recheck: float | None = None
            if ask.until_empty and self._pool_unfinished() == 0:
                emptiness = self._emptiness()
                if emptiness is None or isinstance(emptiness, ConfirmEmpty):
                    return emptiness  # empty (the whole pool in view, or confirmed), or ask
                recheck = emptiness  # the dispatcher's word was wrong: wait, ask again
            left = self._left(ask.end)
            if left is not None and left <= 0:
                return None
            wake = self._until_wake(self.view.next_wake(now, margin))
            if dispatched:  # or to be given work, or for the dispatcher to lapse
                wake = _least(wake, self._until_wake(self.dispatcher_until))
            return Wait(_least(wake, left, self._proposal_retry(), recheck))

    def _emptiness(self) -> ConfirmEmpty | float | None:
        """Whether a pool count of 0 may stop an ``until_empty`` claim (guard held).

        ``None``: yes (the view is the whole pool, or the API server confirmed the
        dispatcher's current word); :class:`ConfirmEmpty`: ask it first; seconds: no, it
        found an unfinished job: wait that long at most before asking again.
        """
        if not self.scope.narrow:
            return None  # its own view is the whole pool
        done = self._confirmed
        if done is None or done.word != self._word:
            return ConfirmEmpty(self._word)
        if done.empty:
            return None
        left = RECONFIRM_SECONDS - (self.clock.monotonic() - done.at)
        return ConfirmEmpty(self._word) if left <= 0 else max(left, MIN_WAIT)

    def confirmed(self, ask: ConfirmEmpty, unfinished: bool | None) -> None:
        """The API server's answer to ``ask``: whether the pool has an unfinished job.

        ``None``: it could not answer (a failed list); counted as unfinished, so that a
        worker stops only on a confirmed count of 0 (it asks again after
        :data:`RECONFIRM_SECONDS`).
        """
        with self._guard:
            self._confirmed = _Confirmed(ask.word, unfinished is False, self.clock.monotonic())
            self._changed()

    def dispatched(self, now: ServerNow) -> bool:
        """Whether a live dispatcher gives this worker the jobs that opted in to it.

        Then the worker takes by turns only the jobs that did not (``spec.dispatch``). Only a
        worker that announced its slots is given work; the others, and every worker once
        the dispatcher's record lapsed (on the server's earliest time), take every job by
        turns.
        """
        until = self.dispatcher_until
        return self.slots is not None and until is not None and now.earliest < until

    def _assigned(self, who: str) -> Observed | None:
        """A claim a dispatcher made for ``who`` that no sibling is adopting yet."""
        for obs in self.view.assigned_to(who):
            if obs.name not in self._claiming and not self.view.is_set_aside(obs.name):
                return obs
        return None

    def _proposed(self, who: str) -> Proposal | None:
        """The first proposal to this worker not tried lately, not being claimed or held."""
        for proposal in self.proposals:
            key = (proposal.name, proposal.resource_version)
            tried = self._tried.get(key)
            if proposal.name in self._claiming or key in self._taken or (
                    tried is not None and self.clock.monotonic() - tried < PROPOSAL_RETRY):
                continue
            mine = self.view.get(proposal.name)
            if mine is not None and mine.status.holder == who and not mine.status.phase.finished:
                continue  # already held by this worker (its claim is in the view)
            return proposal
        return None

    def _proposal_retry(self) -> float | None:
        """Seconds until a proposal tried and still in the inbox may be read again."""
        pending = [at for key, at in self._tried.items() if key not in self._taken]
        if not pending:
            return None
        return max(MIN_WAIT, min(pending) + PROPOSAL_RETRY - self.clock.monotonic())

    def settle_proposal(self, proposal: Proposal, read: Observed | None,
                        outcome: L | Exception | None) -> L | None:
        """Fold a proposal's claim in (``read``: the job as read; ``None``: not in the pool).

        As :meth:`settle`; a proposal that could not be read or was refused is read again
        after :data:`PROPOSAL_RETRY` while the inbox still proposes it at that version (a
        read that failed; a job this worker's clock did not yet judge claimable).
        """
        if read is not None:
            won = self.settle(read, outcome)
            if won is not None:
                with self._guard:
                    self._taken.add((proposal.name, proposal.resource_version))
            return won
        with self._guard:
            self._claiming.discard(proposal.name)
            self._changed()
            return None

    def settle(self, chosen: Observed, outcome: L | Exception | None) -> L | None:
        """Fold a claim's outcome in; the lease won, or ``None`` (choose again, or it raised).

        ``outcome`` is what ``claim_chosen`` returned: the lease, or the refusal; ``None``
        when it raised. Either way the name goes back to the sibling claimers, who look again.
        """
        with self._guard:
            self._claiming.discard(chosen.name)
            self._changed()
            if outcome is None:
                return None
            if isinstance(outcome, Exception):
                self._refused(chosen, outcome)
                return None
            if outcome.observed is not None:
                self.view.learn(outcome.observed)
            self.claims += 1
            return outcome

    def _refused(self, chosen: Observed, refusal: Exception) -> None:
        written = refusal.written if isinstance(refusal, LeaseFinishedError) else None
        if isinstance(written, Observed):  # this claim wrote Failed: the view learns it
            self.view.learn(written)
            return
        self.conflicts += 1
        self.view.set_aside(chosen.name, chosen.resource_version)

    # -- reading ----------------------------------------------------------------------------

    def await_list(self, end: float | None) -> Wait | None:
        """``None`` once the first list arrived (or the pool closed); else how long to wait.

        Raises:
            ApiError: the list was refused (not transient), or ``end`` passed without one.
        """
        with self._guard:
            if self._synced or self.closed:
                return None
            if self._trouble is not None and not isinstance(self._trouble, UnavailableError):
                raise self._trouble  # 403, 404 (no CRD), 400 (bad selector): not transient
            left = self._left(end)
            if left is not None and left <= 0:
                if self._trouble is not None:
                    raise self._trouble
                raise UnavailableError(0, "NotSynced", f"JobLease pool {self.selector!r}: no "
                                       "list of its leases within the timeout")
            return Wait(left)

    def unfinished(self) -> int:
        """Leases not Completed or Failed, as last listed and watched (call after a list).

        A narrow view (:attr:`scope`) holds only this worker's jobs and those that did not
        opt in: the pool's count is then the dispatcher's (:attr:`pool_unfinished`), or
        this view's if that is higher (fresher).

        Raises:
            UnavailableError: narrow, and the dispatcher published no count.
        """
        with self._guard:
            count = self._pool_unfinished()
            if count is None:
                raise UnavailableError(0, "NotSynced", f"JobLease pool {self.selector!r}: "
                                       "watching only its own jobs, and the dispatcher's "
                                       "record tells no count of the pool's")
            return count

    def _pool_unfinished(self) -> int | None:
        """The pool's unfinished jobs as far as known (``None``: not known, narrow)."""
        mine = self.view.unfinished()
        if not self.scope.narrow:
            return mine
        pool = 0 if self.inbox_says_empty else self.pool_unfinished
        return None if pool is None else max(mine, pool)

    def live_workers(self) -> list[str]:
        """The pool's workers alive now as the engine knows them (no request, ever).

        Workers are known only from answers (a list, presence records), and every answer
        tells the server's time: with no time known, no worker is known either.
        """
        with self._guard:
            if not self.clock.known():
                return []
            return self.view.live_workers(self.clock.server_now())

    # -- helpers ---------------------------------------------------------------------------

    def _left(self, end: float | None) -> float | None:
        return None if end is None else end - self.clock.monotonic()

    def _until_wake(self, wake: datetime | None) -> float | None:
        return None if wake is None else max(MIN_WAIT, self.clock.seconds_until(wake))

    def _raise_if_dead(self) -> None:
        if self._dead is not None:
            raise PoolClosedError(f"JobLease pool {self.selector!r}: its watch stopped: "
                                  f"{self._dead!r}") from self._dead

    def _changed(self) -> None:
        self.changes += 1
        self._wake()


class EngineFront:
    """What both pools show of their engine, written once (``Pool`` and ``AsyncPool`` extend it).

    Attributes:
        engine: The pool's engine.
    """

    engine: PoolEngine

    @property
    def presence(self) -> Presence | None:
        """This worker's presence (``None`` until the first ``claim_next``, or when off)."""
        return self.engine.presence

    @property
    def claims(self) -> int:
        """Claims won."""
        return self.engine.claims

    @property
    def conflicts(self) -> int:
        """Claims refused (409s, refusals decided from a stale cache): collisions."""
        return self.engine.conflicts

    @property
    def watch_errors(self) -> int:
        """Lists or watches that failed and were retried (with backoff)."""
        return self.engine.watch_errors

    @property
    def events(self) -> int:
        """Watch events with an object this worker's feeds decoded (every stream, scope)."""
        return self.engine.events

    @property
    def scope(self) -> Scope:
        """What the view is complete for: the whole pool, or only this worker's part."""
        return self.engine.scope

    def live_workers(self) -> list[str]:
        """The pool's workers alive now as it knows them (presence records, holders seen)."""
        return self.engine.live_workers()


class StreamSink:
    """One stream's :class:`~joblease.core.feed.FeedSink`: its deliveries, tagged for the engine.

    Args:
        engine: The pool's engine.
        epoch: The scope the stream belongs to (``PoolEngine.open_scope``).
        index: The stream's place in its scope's ``fields()``.
    """

    def __init__(self, engine: PoolEngine, epoch: int, index: int) -> None:
        self.engine, self.epoch, self.index = engine, epoch, index

    def replace(self, items: list[Observed], resource_version: str) -> None:
        """The stream's complete list."""
        self.engine.stream_listed(self.epoch, self.index, items, resource_version)

    def apply(self, event_type: str, obs: Observed) -> None:
        """The stream's watch event."""
        self.engine.stream_event(self.epoch, self.index, event_type, obs)

    def bookmark(self, resource_version: str) -> None:
        """Nothing to do: each stream's feed keeps its own resume point."""

    def trouble(self, error: ApiError) -> None:
        """A list or watch failed: as for the one feed (``PoolEngine.trouble``)."""
        self.engine.stream_trouble(self.epoch, error)


def _not_dispatched(obs: Observed) -> bool:
    """A job the dispatcher does not give out (it did not opt in): workers take it by turns."""
    return obs.spec.dispatch_to is None


def _least(*seconds: float | None) -> float | None:
    known = [s for s in seconds if s is not None]
    return min(known) if known else None
