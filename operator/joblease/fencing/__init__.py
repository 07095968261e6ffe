"""Fencing at the target: refuse writes that carry a token older than one already accepted.

A lease is temporary ownership, not exactly-once execution. A worker that was paused (GC,
SIGSTOP, a slow disk) or whose request sat in a network queue can deliver a write *after*
its lease expired and another holder took over. The lease service cannot stop that write:
it has already left the worker. Only the target that receives it can, by comparing the
request's :class:`~joblease.domain.token.FencingToken` with the highest one it has accepted
for the same resource, in the same atomic step as the write itself.

Modules:
    errors: :class:`StaleTokenError`, raised when a target refuses a token.
    result: :class:`Applied` / :class:`Duplicate`, the two ways a fenced write can succeed.
    check: :class:`TokenGate`, an in-memory gate for any target (HTTP service, queue consumer).
    filestore: :class:`FencedFileStore`, a persistent gate for files (value and token in one
        atomically renamed file).
    postgres: :class:`PostgresFence`, the same check as one PostgreSQL transaction (psycopg 3).
    http_example: a runnable, fenced stdlib HTTP endpoint (documented in ``docs/fencing.md``).
    metrics: Prometheus counters of accepted and refused writes, per helper (every helper
        above counts; ``docs/operations.md``).

``postgres`` needs the optional ``psycopg`` dependency, so it is not imported here.
"""

from joblease.fencing.check import TokenGate
from joblease.fencing.errors import FencingError, StaleTokenError
from joblease.fencing.filestore import FencedFileStore
from joblease.fencing.result import Applied, Decision, Duplicate

__all__ = [
    "Applied",
    "Decision",
    "Duplicate",
    "FencedFileStore",
    "FencingError",
    "StaleTokenError",
    "TokenGate",
]
