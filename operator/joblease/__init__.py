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
from joblease.sdk import AsyncHolding, Holding, Lease, LeaseClient, default_holder

__version__ = "0.1.0"

__all__ = [
    "AsyncHolding", "FencingToken", "Holding", "Lease", "LeaseClient", "LeaseError",
    "LeaseExpiredError", "LeaseFinishedError", "LeaseHeldError", "LeaseLostError",
    "LeaseNotFoundError", "LeaseUnavailableError", "Phase", "StaleLeaseError",
    "default_holder",
]
