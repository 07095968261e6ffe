"""Errors raised by fencing targets.

They carry both tokens and the resource because the two people who read them need them:
the operator debugging a lost write wants to see *which* holder won, and the worker that
receives the error must learn it no longer owns the job (it should stop, not retry).
"""

from __future__ import annotations

from joblease.domain.errors import JobleaseError
from joblease.domain.token import FencingToken


class FencingError(JobleaseError):
    """Base class for every refusal by a fencing target (a ``JobleaseError``)."""


class StaleTokenError(FencingError):
    """A write presented a token lower than one the target has already accepted.

    This is the expected outcome for a holder whose lease expired while it was paused: the
    write must not happen, and retrying it with the same token can never succeed.

    Attributes:
        resource: The fenced resource the write was for.
        presented: The token the refused write carried.
        highest: The highest token the target had accepted for ``resource``.

    """

    def __init__(self, resource: str, presented: FencingToken, highest: FencingToken) -> None:
        self.resource = resource
        self.presented = presented
        self.highest = highest
        super().__init__(
            f"stale fencing token {presented} for resource {resource!r}: "
            f"target has already accepted {highest}"
        )

    def __reduce__(self) -> tuple[type[StaleTokenError], tuple[str, FencingToken, FencingToken]]:
        # Exceptions pickle via ``args`` by default, which here is the formatted message only;
        # keep the structured fields when the error crosses a process boundary.
        return (type(self), (self.resource, self.presented, self.highest))
