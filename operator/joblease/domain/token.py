"""The fencing token: what a target compares to refuse a stale holder.

A token is the pair ``(epoch, generation)``, compared lexicographically:

* ``generation`` is the JobLease's claim counter (``status.generation``); every claim raises
  it by exactly one, and the API server's CEL rules refuse any write that lowers it.
* ``epoch`` names the *incarnation* of the JobLease. Deleting a JobLease and creating one
  of the same name restarts ``generation`` at 1, which on its own would let a token repeat.
  The first claim of an incarnation records as ``status.epoch`` the ``resourceVersion`` it
  read: an etcd revision, which grows across the whole cluster and is therefore larger than
  every revision (and so every epoch) of any earlier incarnation. So ``(epoch, generation)``
  never repeats for a job id, and a later incarnation always outranks an earlier one.

Targets keep, per fenced resource, the highest token they have accepted and refuse lower ones.

:class:`HeldToken` is the token with what names its claim (lease, holder, claim id, end),
and its written forms, each defined once: the CLI's JSON (``to_json``), a command's
environment under ``joblease run``/``work`` (``to_environment``/``from_environment``), and
a delegated pod's annotations (``to_annotations``/``from_annotations``, without the
``joblease.dev/`` prefix, which ``joblease.kube.pods.ANNOTATION_PREFIX`` defines). They
used to be written by hand in four places, and the environment lacked the claim id that
``joblease renew/complete/release --claim-id`` asks for (issue 31).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from joblease.domain.time import format_time, parse_time

ENV_PREFIX = "JOBLEASE_"
ANNOTATION_KEYS = ("holder", "epoch", "generation", "lease-until")
"""The token annotations of a delegated pod, after the ``joblease.dev/`` prefix."""


@dataclass(frozen=True, order=True)
class FencingToken:
    """A comparable fencing token ``(epoch, generation)``.

    Attributes:
        epoch: Incarnation of the JobLease (the resourceVersion its first claim read).
        generation: Claim counter of that incarnation; starts at 1.
    """

    epoch: int
    generation: int

    def __post_init__(self) -> None:
        if self.epoch < 0 or self.generation < 0:
            raise ValueError(
                f"fencing token parts must be >= 0, got {self.epoch}/{self.generation}")

    def __str__(self) -> str:
        return f"{self.epoch}/{self.generation}"

    @classmethod
    def parse(cls, text: str) -> FencingToken:
        """Parse ``"EPOCH/GENERATION"`` (the form printed by ``str`` and the CLI).

        Raises:
            ValueError: the text is not two non-negative integers separated by ``/``.
        """
        parts = text.strip().split("/")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"not a fencing token (want EPOCH/GENERATION, e.g. 4711/7): {text!r}")
        return cls(int(parts[0]), int(parts[1]))


@dataclass(frozen=True)
class HeldToken:
    """One claim's token and what names the claim: the fields every written form carries.

    Attributes:
        name: The JobLease.
        namespace: Its namespace.
        holder: The holder the claim was written under.
        token: The fencing token ``(epoch, generation)``.
        claim_id: The claim's random id (``None`` where the form does not carry it: a
            delegated pod's annotations).
        lease_until: The lease's end on the server's clock, if known.
    """

    name: str
    namespace: str
    holder: str
    token: FencingToken
    claim_id: str | None = None
    lease_until: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        """The CLI's ``-o json`` of a claim (``generation`` and ``epoch`` also apart)."""
        return {"name": self.name, "namespace": self.namespace, "holder": self.holder,
                "token": str(self.token), "epoch": self.token.epoch,
                "generation": self.token.generation, "claimId": self.claim_id,
                "leaseUntil": _time_or_none(self.lease_until)}

    def to_environment(self) -> dict[str, str]:
        """The ``JOBLEASE_…`` variables a command run under the lease sees.

        ``JOBLEASE_TOKEN`` is the whole token (``EPOCH/GENERATION``: what a target must be
        given); ``JOBLEASE_CLAIM_ID`` lets the command ``renew``/``complete``/``release``
        its own claim with ``--claim-id``. An unknown end or claim id is ``""``.
        """
        return {f"{ENV_PREFIX}{key}": value for key, value in (
            ("NAME", self.name), ("NAMESPACE", self.namespace), ("HOLDER", self.holder),
            ("TOKEN", str(self.token)), ("EPOCH", str(self.token.epoch)),
            ("GENERATION", str(self.token.generation)), ("CLAIM_ID", self.claim_id or ""),
            ("LEASE_UNTIL", _time_or_none(self.lease_until) or ""))}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> HeldToken:
        """Read :meth:`to_environment`'s variables back (a command's view of its claim).

        Raises:
            ValueError: a variable is missing, or the token or end is malformed (named).
        """
        def var(key: str) -> str:
            try:
                return environ[ENV_PREFIX + key]
            except KeyError:
                raise ValueError(f"${ENV_PREFIX}{key} is not set (not run under "
                                 "`joblease run` or `joblease work`?)") from None

        until = var("LEASE_UNTIL")
        return cls(var("NAME"), var("NAMESPACE"), var("HOLDER"), FencingToken.parse(var("TOKEN")),
                   var("CLAIM_ID") or None, parse_time(until) if until else None)

    def to_annotations(self, prefix: str = "") -> dict[str, str | None]:
        """The token annotations of a pod the operator holds the lease for.

        ``prefix``: prepended to every key (``joblease.kube.pods.ANNOTATION_PREFIX``; the
        pod store adds it itself). A key whose value is ``None`` is to be removed.
        """
        values = (self.holder, str(self.token.epoch), str(self.token.generation),
                  _time_or_none(self.lease_until))
        return {prefix + key: value for key, value in zip(ANNOTATION_KEYS, values, strict=True)}

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str], prefix: str = "", *,
                         name: str = "", namespace: str = "") -> HeldToken | None:
        """Read :meth:`to_annotations`' form back; ``None`` while it carries no token.

        Raises:
            ValueError: the epoch, generation or end is malformed (all three named, with
                ``prefix``).
        """
        epoch = annotations.get(prefix + "epoch")
        generation = annotations.get(prefix + "generation")
        if not epoch or not generation:
            return None
        until = annotations.get(prefix + "lease-until")
        try:
            token = FencingToken(int(epoch), int(generation))
            lease_until = parse_time(until) if until else None
        except ValueError as err:
            raise ValueError(f"malformed token annotations {prefix}epoch={epoch!r}, "
                             f"{prefix}generation={generation!r}, {prefix}lease-until="
                             f"{until!r}: {err}") from None
        return cls(name, namespace, annotations.get(prefix + "holder", ""), token, None,
                   lease_until)


def no_token_annotations() -> dict[str, str | None]:
    """The annotation values that remove a token (the pod holds nothing)."""
    return dict.fromkeys(ANNOTATION_KEYS)


def _time_or_none(when: datetime | None) -> str | None:
    return format_time(when) if when else None
