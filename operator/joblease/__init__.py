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

from typing import TYPE_CHECKING, Any

from joblease.domain.errors import (
    JobleaseError,
    LeaseError,
    LeaseExpiredError,
    LeaseFinishedError,
    LeaseGoneError,
    LeaseHeldError,
    LeaseLostError,
    LeaseNotFoundError,
    LeaseNotReadyError,
    LeaseUnavailableError,
    StaleLeaseError,
)
from joblease.domain.lease import Phase
from joblease.domain.token import FencingToken

if TYPE_CHECKING:
    from joblease.core.transaction import ContentionError
    from joblease.kube.api import (
        ApiError,
        ConflictError,
        ForbiddenError,
        InvalidError,
        NotFoundError,
        UnavailableError,
    )
    from joblease.sdk import AsyncHolding, Holding, Lease, LeaseClient, default_holder

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (tool.setuptools.dynamic)

__all__ = [
    "ApiError", "AsyncHolding", "ConflictError", "ContentionError", "FencingToken",
    "ForbiddenError", "Holding", "InvalidError", "JobleaseError", "Lease", "LeaseClient",
    "LeaseError", "LeaseExpiredError", "LeaseFinishedError", "LeaseGoneError",
    "LeaseHeldError", "LeaseLostError", "LeaseNotFoundError", "LeaseNotReadyError",
    "LeaseUnavailableError",
    "NotFoundError", "Phase", "StaleLeaseError", "UnavailableError", "default_holder",
]


_SDK = ("AsyncHolding", "Holding", "Lease", "LeaseClient", "default_holder")
# The API errors live in the HTTP adapter layer (joblease.kube: configuration loading,
# request code; the `kubernetes` package itself loads only when a KubeApi is built from a
# kubeconfig), so they load on first use too; the protocol's errors above are pure and
# load at once.
_API_ERRORS = ("ApiError", "ConflictError", "ForbiddenError", "InvalidError", "NotFoundError",
               "UnavailableError")


def __getattr__(name: str) -> Any:
    # The SDK loads on first use, not with the package: every `joblease.*` import (the CLI's
    # included) runs this file first, and the SDK brings asyncio and the HTTP client along
    # (issue 18, item 5). `joblease.LeaseClient` works exactly as before.
    if name in _SDK:
        import joblease.sdk

        value = getattr(joblease.sdk, name)
    elif name in _API_ERRORS:
        import joblease.kube.api

        value = getattr(joblease.kube.api, name)
    elif name == "ContentionError":
        import joblease.core.transaction

        value = joblease.core.transaction.ContentionError
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
