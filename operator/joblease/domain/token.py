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
"""

from __future__ import annotations

from dataclasses import dataclass


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
