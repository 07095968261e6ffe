"""The fencing check for any target, and an in-memory gate that applies it.

The rule, shared by every target in this package (and by the SQL in
:mod:`joblease.fencing.postgres`), evaluated per resource:

1. A token *lower* than the highest accepted one is refused
   (:class:`~joblease.fencing.errors.StaleTokenError`). This comes first, so a retry from a
   holder that has since been superseded is refused, not reported as a harmless duplicate:
   the worker must learn it lost the job.
2. A token *equal to or higher* than the highest is accepted. If it carries an idempotency
   key that was already applied with that same token, the write is a :class:`Duplicate` and
   has no second effect; otherwise it is :class:`Applied` and becomes the highest token.

Only keys applied with the current highest token need remembering: any lower token is
refused by rule 1 before its keys would be looked at. That keeps the memory bounded by the
writes of one holder.

The check and the write must be one atomic step at the target. Checking first and writing
afterwards (or reading an "owner" column and then writing) lets a delayed request slip in
between; that is why :meth:`TokenGate.apply` runs the caller's write while holding the
resource's lock and only records the new token if the write succeeded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from joblease.domain.token import FencingToken
from joblease.fencing import metrics
from joblease.fencing.errors import StaleTokenError
from joblease.fencing.result import Applied, Decision, Duplicate

T = TypeVar("T")


@dataclass(frozen=True)
class FenceState:
    """What a target remembers about one resource.

    Attributes:
        highest: The highest token accepted so far.
        keys: Idempotency keys applied with ``highest`` (older tokens' keys are irrelevant).

    """

    highest: FencingToken
    keys: frozenset[str] = frozenset()


def decide(
    state: FenceState | None,
    resource: str,
    token: FencingToken,
    idempotency_key: str | None,
) -> tuple[Decision, FenceState]:
    """Apply the fencing rule to one write, without side effects.

    Args:
        state: What the target remembers about ``resource``; ``None`` if never fenced.
        resource: The fenced resource (used in the result and error messages).
        token: The token the write presents.
        idempotency_key: Identifies retries of the same logical write; ``None`` disables
            duplicate detection (every accepted write is applied).

    Returns:
        The decision and the state to store *if* the write's effect succeeds (for a
        duplicate, the unchanged state).

    Raises:
        StaleTokenError: ``token`` is lower than ``state.highest``.

    """
    if not resource:
        raise ValueError("a fenced resource needs a non-empty name")
    if state is not None and token < state.highest:
        raise StaleTokenError(resource, token, state.highest)
    if state is not None and token == state.highest:
        if idempotency_key is not None and idempotency_key in state.keys:
            return Duplicate(resource, token, idempotency_key), state
        keys = state.keys | _key_set(idempotency_key)
        return Applied(resource, token, state.highest, None), FenceState(token, keys)
    previous = None if state is None else state.highest
    return Applied(resource, token, previous, None), FenceState(token, _key_set(idempotency_key))


def _key_set(idempotency_key: str | None) -> frozenset[str]:
    return frozenset() if idempotency_key is None else frozenset({idempotency_key})


class TokenGate:
    """An in-memory, thread-safe fencing gate for a target process.

    Use it inside the service that owns the fenced resource (an HTTP handler, a queue
    consumer). State lives in memory, so it protects against stale writers only while this
    process lives; a target that must survive restarts should persist the token together
    with the data (see :class:`~joblease.fencing.filestore.FencedFileStore` or
    :class:`~joblease.fencing.postgres.PostgresFence`).

    Writes to different resources proceed in parallel; writes to one resource are
    serialized, which is what makes "check, then write" atomic.
    """

    def __init__(self) -> None:
        self._highest: dict[str, FencingToken] = {}
        self._keys: dict[str, set[str]] = {}  # keys applied with the highest token
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def accept(
        self, resource: str, token: FencingToken, idempotency_key: str | None = None
    ) -> Decision:
        """Check ``token`` and, if it is accepted, record it; no caller effect runs.

        Useful when the effect is elsewhere and already idempotent per token; otherwise
        prefer :meth:`apply`, which keeps check and effect atomic.

        Raises:
            StaleTokenError: ``token`` is lower than the highest accepted for ``resource``.

        """
        return self.apply(resource, token, idempotency_key, _no_effect)

    def apply(
        self,
        resource: str,
        token: FencingToken,
        idempotency_key: str | None,
        fn: Callable[[], T],
    ) -> Applied[T] | Duplicate:
        """Check ``token`` and run ``fn`` as one step while holding the resource's lock.

        The token is recorded only if ``fn`` returns; if it raises, the gate is unchanged
        and the exception propagates (``fn`` itself must leave no partial effect). Accepted
        and refused writes are counted in :mod:`joblease.fencing.metrics` (``helper="gate"``);
        a write whose ``fn`` raised is neither.

        Args:
            resource: The fenced resource.
            token: The token the write presents.
            idempotency_key: Identifies retries of the same write; ``None`` disables
                duplicate detection.
            fn: The write; not called for a duplicate or a stale token.

        Returns:
            :class:`Applied` carrying ``fn``'s return value, or :class:`Duplicate`.

        Raises:
            StaleTokenError: ``token`` is lower than the highest accepted for ``resource``.

        """
        if not resource:
            raise ValueError("a fenced resource needs a non-empty name")
        with self._lock_for(resource):
            highest = self._highest.get(resource)
            keys = self._keys.setdefault(resource, set())
            # The rule of :func:`decide`, with the key set kept in place: copying it on every
            # keyed write with the same token made n such writes cost O(n²) (issue 14).
            if highest is not None and token < highest:
                metrics.count_refused("gate")
                raise StaleTokenError(resource, token, highest)
            same = highest is not None and token == highest
            if same and idempotency_key is not None and idempotency_key in keys:
                metrics.count_accepted("gate", duplicate=True)
                return Duplicate(resource, token, idempotency_key)
            value = fn()
            if not same:
                keys.clear()
            if idempotency_key is not None:
                keys.add(idempotency_key)
            self._highest[resource] = token
            metrics.count_accepted("gate", duplicate=False)
            return Applied(resource, token, highest, value)

    def highest(self, resource: str) -> FencingToken | None:
        """Return the highest token accepted for ``resource``, ``None`` if never fenced."""
        with self._lock_for(resource):
            return self._highest.get(resource)

    def _lock_for(self, resource: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(resource, threading.Lock())


def _no_effect() -> None:
    return None
