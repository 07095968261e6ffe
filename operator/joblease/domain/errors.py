"""Errors of the lease protocol, each naming the lease, the holder and the generation.

``JobleaseError`` is the root of every error joblease raises on purpose — the protocol's
(here), the API server's (``joblease.kube.api.ApiError``), a fencing target's
(``joblease.fencing.errors.FencingError``) and the downward API reader's
(``joblease.pod.downward.DownwardFormatError``). It lives in this module because this is the
bottom layer every other one may import (``pyproject.toml``'s import contracts), so one
``except joblease.JobleaseError`` catches them all without the layers depending upward.

They are distinct types (temporal#2538: users who got a generic "invalid argument" for a
stale task token could not tell it from a bug) so callers can tell three situations apart:

* ``LeaseUnavailableError``: a claim was refused; someone else holds it, or it is finished.
* ``LeaseLostError``: a renew/complete/release was refused; the caller no longer holds it.
  ``StaleLeaseError`` (another generation or holder is current) and ``LeaseExpiredError``
  (the caller's lease ran out on the server's clock) are its kinds. A worker seeing any
  ``LeaseLostError`` must stop producing effects.
"""

from __future__ import annotations

from datetime import datetime

from joblease.domain.time import format_time as format_time  # re-exported, see below
from joblease.domain.token import FencingToken

# ``format_time`` lives in ``joblease.domain.time``; it stays importable from here because
# controller/pods.py (pod delegation, another branch's) still imports it from this module.


class JobleaseError(Exception):
    """Root of every error the SDK, the CLI and the helpers raise on purpose.

    Catch it to tell "joblease said no" (a refusal, a lost lease, an API server that
    refused or did not answer, a stale token at a target) from a bug. Misuse of an argument
    (a negative token part, a malformed ``EPOCH/GENERATION``) stays ``ValueError``, as in
    the standard library.
    """


class PoolClosedError(JobleaseError, RuntimeError):
    """A work pool was closed, or its watch stopped on an unexpected error (the cause).

    One class for the thread-based ``joblease.sdk.Pool`` and ``joblease.aio.AsyncPool``, so
    code that uses both catches one error.
    """


class LeaseError(JobleaseError):
    """Base of every joblease protocol error."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class LeaseUnavailableError(LeaseError):
    """A claim was refused."""


class LeaseHeldError(LeaseUnavailableError):
    """Someone else holds the lease and it has not expired on the server's clock.

    Attributes:
        holder: The current holder.
        token: The current holder's whole token (``EPOCH/GENERATION``).
        generation: ``token.generation`` (kept from before the error carried the token).
        lease_until: The end of the current claim on the server's clock, if known.
    """

    def __init__(self, name: str, holder: str, token: FencingToken, lease_until: datetime | None
                 ) -> None:
        until = format_time(lease_until) if lease_until else "an unknown time"
        super().__init__(name, f"lease {name!r} is held by {holder!r} at generation "
                               f"{token.generation} (token {token}) until {until} "
                               "(server time)")
        self.holder, self.token, self.lease_until = holder, token, lease_until
        self.generation = token.generation


class LeaseNotReadyError(LeaseUnavailableError):
    """The lease rests after an attempt that ended without completion (``spec.backoff``)."""

    def __init__(self, name: str, not_before: datetime, attempts: int) -> None:
        super().__init__(name, f"lease {name!r} is backing off after {attempts} failed "
                               f"attempt(s) until {format_time(not_before)} (server time)")
        self.not_before, self.attempts = not_before, attempts


class LeaseFinishedError(LeaseUnavailableError):
    """The lease is Completed or Failed and is never claimed again.

    Attributes:
        phase: ``Completed`` or ``Failed``.
        token: The token of the last claim (``EPOCH/GENERATION``); ``generation`` is its
            second part (kept from before the error carried the token).
        written: The JobLease as stored after *this caller's* write made it Failed (a
            claim that found the attempts used up, a failed release that used the last),
            else ``None``. A work pool folds it into its cache instead of waiting for the
            watch to bring it.
    """

    def __init__(self, name: str, phase: str, token: FencingToken, detail: str = "",
                 written: object | None = None) -> None:
        extra = f": {detail}" if detail else ""
        super().__init__(name, f"lease {name!r} is {phase} at generation {token.generation} "
                               f"(token {token}) and cannot be claimed again{extra}")
        self.phase, self.token, self.generation = phase, token, token.generation
        self.written = written


class LeaseLostError(LeaseError):
    """The caller's lease is no longer valid; it must stop producing effects."""


class StaleLeaseError(LeaseLostError):
    """The caller's claim (holder, token ``epoch/generation``, claim id) is not the current one."""

    def __init__(self, name: str, holder: str, token: FencingToken,
                 current_holder: str | None, current_token: FencingToken, phase: str) -> None:
        now_held = f"held by {current_holder!r}" if current_holder else "not held"
        super().__init__(
            name,
            f"stale lease token for {name!r}: {holder!r} presented generation "
            f"{token.generation} (token {token}), but the current generation is "
            f"{current_token.generation} (token {current_token}, {now_held}, phase {phase})",
        )
        self.holder, self.token, self.generation = holder, token, token.generation
        self.current_holder, self.current_token, self.phase = (
            current_holder, current_token, phase)
        self.current_generation = current_token.generation


class LeaseGoneError(LeaseLostError):
    """The JobLease the caller held was deleted, or re-created under the same name."""

    def __init__(self, name: str, namespace: str, detail: str) -> None:
        super().__init__(name, f"JobLease {namespace}/{name} held by this caller is gone: "
                               f"{detail}")


class LeaseExpiredError(LeaseLostError):
    """The caller still matches, but its lease has run out on the server's clock.

    Attributes:
        holder: The caller's holder.
        token: The caller's whole token; ``generation`` is its second part (kept from
            before the error carried the token).
        lease_until: The end that passed, if known.
    """

    def __init__(self, name: str, holder: str, token: FencingToken, lease_until: datetime | None
                 ) -> None:
        until = format_time(lease_until) if lease_until else "an unknown time"
        super().__init__(name, f"lease {name!r} of {holder!r} at generation {token.generation} "
                               f"(token {token}) expired at {until} (server time); claim it "
                               "again")
        self.holder, self.token, self.lease_until = holder, token, lease_until
        self.generation = token.generation


class RenewalStoppedError(LeaseLostError):
    """A holding's renewal ended without a requested stop (an error nobody planned for).

    Declared as a loss because nothing renews the lease any more: fail safe, never silent.
    Raised by both holdings (``joblease.sdk.Holding``, ``joblease.aio.AsyncLeaseHolding``).
    """


class LeaseNotFoundError(LeaseError):
    """No JobLease of that name exists."""

    def __init__(self, name: str, namespace: str) -> None:
        super().__init__(name, f"JobLease {namespace}/{name} not found "
                               "(create it with `kubectl apply -f …`)")
