"""Worker SDK: claim, renew, complete and release JobLeases; hold one while work runs.

Reference: ``docs/sdk.md``.
"""

from typing import TYPE_CHECKING, Any

from joblease.sdk.client import DEFAULT_MARGIN, Lease, LeaseClient, default_holder
from joblease.sdk.pool import Pool  # (loaded by the client anyway: ``LeaseClient.pool``)

if TYPE_CHECKING:
    from joblease.domain.errors import PoolClosedError
    from joblease.sdk.async_holding import AsyncHolding
    from joblease.sdk.hold import Holding, RenewalStoppedError

__all__ = ["DEFAULT_MARGIN", "AsyncHolding", "Holding", "Lease", "LeaseClient", "Pool",
           "PoolClosedError", "RenewalStoppedError", "default_holder"]


def __getattr__(name: str) -> Any:
    # The holdings load on first use: one-shot CLI verbs that only claim or read never
    # need them (issue 18, item 5); AsyncHolding (deprecated) is the one that imports asyncio.
    if name in ("Holding", "RenewalStoppedError"):
        from joblease.sdk import hold

        return getattr(hold, name)
    if name == "AsyncHolding":
        from joblease.sdk.async_holding import AsyncHolding

        return AsyncHolding
    if name == "PoolClosedError":
        from joblease.domain.errors import PoolClosedError

        return PoolClosedError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
