"""Worker SDK: claim, renew, complete and release JobLeases; hold one while work runs.

Reference: ``docs/sdk.md``.
"""

from typing import TYPE_CHECKING, Any

from joblease.sdk.client import DEFAULT_MARGIN, Lease, LeaseClient, default_holder
from joblease.sdk.pool import Pool  # (loaded by the client anyway: ``LeaseClient.pool``)

if TYPE_CHECKING:
    from joblease.domain.errors import PoolClosedError
    from joblease.sdk.hold import AsyncHolding, Holding, RenewalStoppedError

__all__ = ["DEFAULT_MARGIN", "AsyncHolding", "Holding", "Lease", "LeaseClient", "Pool",
           "PoolClosedError", "RenewalStoppedError", "default_holder"]


def __getattr__(name: str) -> Any:
    # Holding/AsyncHolding load on first use: they import asyncio (tens of milliseconds),
    # which one-shot CLI verbs that only claim or read never need (issue 18, item 5).
    if name in ("AsyncHolding", "Holding", "RenewalStoppedError"):
        from joblease.sdk import hold

        return getattr(hold, name)
    if name == "PoolClosedError":
        from joblease.domain.errors import PoolClosedError

        return PoolClosedError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
