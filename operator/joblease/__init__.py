"""joblease: leases with expiry and fencing tokens for distributed jobs on Kubernetes.

Quick use::

    import joblease
    client = joblease.LeaseClient("default")
    lease = client.claim("nightly-report", holder="worker-a")   # raises LeaseHeldError if taken
    with joblease.Holding(lease) as holding:                   # renews in the background
        holding.check()                                        # before every effect
        write_to_target(token=lease.token)                     # targets fence on the token
        holding.complete("ok")

A lease is temporary ownership, not exactly-once: see ``joblease.domain.lease`` for what is
and is not guaranteed, and ``joblease.fencing`` for the target-side check.
"""

from typing import TYPE_CHECKING, Any

from joblease.domain.errors import (
    LeaseError,
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseHeldError,
    LeaseLostError,
    LeaseNotFoundError,
    LeaseUnavailableError,
    StaleLeaseError,
)
from joblease.domain.lease import Phase
from joblease.domain.token import FencingToken

if TYPE_CHECKING:
    from joblease.sdk import AsyncHolding, Holding, Lease, LeaseClient, default_holder

__version__ = "0.1.0"

__all__ = [
    "AsyncHolding", "FencingToken", "Holding", "Lease", "LeaseClient", "LeaseError",
    "LeaseExpiredError", "LeaseFinishedError", "LeaseHeldError", "LeaseLostError",
    "LeaseNotFoundError", "LeaseUnavailableError", "Phase", "StaleLeaseError",
    "default_holder",
]


_SDK = ("AsyncHolding", "Holding", "Lease", "LeaseClient", "default_holder")


def __getattr__(name: str) -> Any:
    # The SDK loads on first use, not with the package: every `joblease.*` import (the CLI's
    # included) runs this file first, and the SDK brings asyncio and the HTTP client along
    # (issue 18, item 5). `joblease.LeaseClient` works exactly as before.
    if name in _SDK:
        import joblease.sdk

        value = getattr(joblease.sdk, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
