"""Worker SDK: claim, renew, complete and release JobLeases; hold one while work runs."""

from joblease.sdk.client import DEFAULT_MARGIN, Lease, LeaseClient, default_holder
from joblease.sdk.hold import AsyncHolding, Holding

__all__ = ["DEFAULT_MARGIN", "AsyncHolding", "Holding", "Lease", "LeaseClient", "default_holder"]
