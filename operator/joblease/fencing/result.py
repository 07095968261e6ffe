"""The two successful outcomes of a fenced write.

A fenced write either happened now (:class:`Applied`) or had already happened for the same
``(resource, token, idempotency key)`` (:class:`Duplicate`). Both are successes from the
caller's point of view — a retry after a lost reply must not look like a failure — but only
``Applied`` means the caller's effect ran during this call. Refusals are exceptions
(:class:`~joblease.fencing.errors.StaleTokenError`) so they cannot be ignored by accident.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from joblease.domain.token import FencingToken

T = TypeVar("T")


@dataclass(frozen=True)
class Applied(Generic[T]):
    """The write was accepted and its effect ran in this call.

    Attributes:
        resource: The fenced resource.
        token: The token that was accepted; it is now the target's highest.
        previous: The highest token before this write, ``None`` for a never-fenced resource.
        value: What the caller's write function returned (``None`` for a bare check).

    """

    resource: str
    token: FencingToken
    previous: FencingToken | None
    value: T


@dataclass(frozen=True)
class Duplicate:
    """The same ``(resource, token, idempotency key)`` was applied before: nothing ran now.

    Attributes:
        resource: The fenced resource.
        token: The presented token (equal to the target's highest).
        idempotency_key: The key that identified the earlier, identical write.

    """

    resource: str
    token: FencingToken
    idempotency_key: str


Decision = Applied[None] | Duplicate
"""The outcome of a bare check (:meth:`TokenGate.accept`)."""
