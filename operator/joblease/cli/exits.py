"""The ``joblease`` command's exit codes, once, and which error means which.

Stable, for scripts (the table is in ``joblease --help`` and docs/cli.md):

    0  success
    1  unexpected error
    2  usage error
    3  the lease is unavailable: held by someone else, or finished (claim refused)
    4  the lease is lost: stale generation or expired (renew/complete/release refused),
       or, for ``run``, lost while the command ran (the command was stopped)
    5  no such JobLease
    6  the API server refused or could not be reached (RBAC, validation, network)
    7  ``work``: drained, but some JobLeases of the selector are Failed
    8  ``work``: its drain timed out and running commands were stopped
"""

from __future__ import annotations

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_LOST, EXIT_NOT_FOUND, EXIT_API = range(7)
EXIT_INTERRUPTED = 130


def exit_code_for(err: Exception) -> int | None:
    """The exit code an error of joblease's means, or ``None`` for one it does not know.

    Imports the error classes only when called: ``--help`` and ``completion`` never are.
    """
    from joblease.domain.errors import (
        LeaseError,
        LeaseLostError,
        LeaseNotFoundError,
        LeaseUnavailableError,
    )
    from joblease.kube.api import ApiError

    for kind, code in ((LeaseNotFoundError, EXIT_NOT_FOUND),
                       (LeaseUnavailableError, EXIT_UNAVAILABLE),
                       (LeaseLostError, EXIT_LOST), (LeaseError, EXIT_ERROR),
                       (ApiError, EXIT_API)):
        if isinstance(err, kind):
            return code
    return None
