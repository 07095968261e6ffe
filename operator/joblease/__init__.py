"""joblease: leases with expiry and fencing tokens for distributed jobs on Kubernetes.

Quick use::

    import joblease
    with joblease.LeaseClient("default") as client:              # closed on exit
        lease = client.claim("nightly-report", holder="worker-a")  # LeaseHeldError if taken
        with joblease.Holding(lease) as holding:                  # renews in the background
            holding.check()                                       # before every effect
            write_to_target(token=lease.token)                    # targets fence on the token
            holding.complete("ok")

Every error joblease raises on purpose is a ``JobleaseError``; the reference of this
package and ``joblease.sdk`` is ``docs/sdk.md``.

A lease is temporary ownership, not exactly-once: see ``joblease.domain.lease`` for what is
and is not guaranteed, and ``joblease.fencing`` for the target-side check.
"""

from joblease.domain.errors import (
    JobleaseError,
    LeaseError,
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseGoneError,
    LeaseHeldError,
    LeaseLostError,
    LeaseNotFoundError,
    LeaseUnavailableError,
    StaleLeaseError,
)
from joblease.domain.lease import Phase
from joblease.domain.token import FencingToken
from joblease.kube.api import (
    ApiError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    UnavailableError,
)
from joblease.kube.transact import ContentionError
from joblease.sdk import AsyncHolding, Holding, Lease, LeaseClient, default_holder

__version__ = "0.1.0"

__all__ = [
    "ApiError", "AsyncHolding", "ConflictError", "ContentionError", "FencingToken",
    "ForbiddenError", "Holding", "InvalidError", "JobleaseError", "Lease", "LeaseClient",
    "LeaseError", "LeaseExpiredError", "LeaseFinishedError", "LeaseGoneError",
    "LeaseHeldError", "LeaseLostError", "LeaseNotFoundError", "LeaseUnavailableError",
    "NotFoundError", "Phase", "StaleLeaseError", "UnavailableError", "default_holder",
]
