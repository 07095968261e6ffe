"""Where the compare-and-swap loop used to live; kept as a re-export for its old importers.

The sans-IO loop (``transaction``), its steps and its drivers' loops moved to
``joblease.core.transaction``, and the operator's blocking entry point ``transact`` to
``joblease.core.steps`` (issue 31): the loop is the protocol's client side, not HTTP. The
asyncio path that only a test fake used (``atransact``, ``AsyncStore``, and an
``AsyncTransport`` that shadowed ``joblease.kube.transport``'s) is gone: the asyncio
client drives the same loop through ``joblease.core.asteps``.

Why this module stays: the operator's reconciler and pod delegation, and a few modules of
``core``, still import these names from here (other branches' code at the time of the
move). It is the one import from ``kube`` up into ``core``, allowed by name in
pyproject.toml's layers contract; import ``joblease.core.transaction`` in new code.
"""

from __future__ import annotations

from joblease.core.steps import transact
from joblease.core.transaction import (
    MAX_CONFLICTS,
    ContentionError,
    Decide,
    Outcome,
    Read,
    ServerTime,
    Transaction,
    Write,
    arun_steps,
    run_steps,
    transaction,
)
from joblease.core.transaction import TransactionStep as Step

__all__ = ["MAX_CONFLICTS", "ContentionError", "Decide", "Outcome", "Read", "ServerTime",
           "Step", "Transaction", "Write", "arun_steps", "run_steps", "transact",
           "transaction"]
