"""Worker SDK: claim, renew, complete and release JobLeases; hold one while work runs.

Reference: ``docs/sdk.md``.
"""

from joblease.sdk.client import DEFAULT_MARGIN, Lease, LeaseClient, default_holder
from joblease.sdk.hold import AsyncHolding, Holding, RenewalStoppedError

__all__ = ["DEFAULT_MARGIN", "AsyncHolding", "Holding", "Lease", "LeaseClient",
           "RenewalStoppedError", "default_holder"]
