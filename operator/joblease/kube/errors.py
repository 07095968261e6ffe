"""The errors of talking to the API server, one class per meaning, for every transport.

A status code is mapped to its class once (``joblease.kube.requests.error_for``), so the
thread-based ``KubeApi``, the CLI's light transport and the asyncio ``AsyncKubeApi`` raise
the same error for the same answer (``tests/unit/test_transports.py`` runs one table of
answers through all three). Every one is a ``JobleaseError``: one ``except`` covers the
protocol's refusals and the API server's.
"""

from __future__ import annotations

from joblease.domain.errors import JobleaseError


class ApiError(JobleaseError):
    """A request the API server answered with an error status (or that did not arrive).

    A ``JobleaseError``, so one ``except`` covers protocol refusals and API failures alike.
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status, self.reason, self.message = status, reason, message


class ConfigError(ApiError):
    """No usable Kubernetes configuration: nothing can be asked.

    No kubeconfig, an unreadable one, no context of that name, and not in a pod either;
    the message says what was tried (the CLI exits 6 with it instead of a traceback).
    """

    def __init__(self, message: str) -> None:
        super().__init__(0, "NoConfiguration", message)


class ConflictError(ApiError):
    """409: the object changed since it was read. Re-read and decide again; never retry blindly."""


class NotFoundError(ApiError):
    """404: no such object."""


class GoneError(ApiError):
    """410: the ``resourceVersion`` a list or watch resumed from is too old; list again."""


class InvalidError(ApiError):
    """422 (or 400): the API server's schema, CEL rules or admission refused the write."""


class ForbiddenError(ApiError):
    """403: RBAC or an admission policy refused the request."""


class UnavailableError(ApiError):
    """The request did not get an answer (connection refused, timeout, 5xx)."""


BY_STATUS: dict[int, type[ApiError]] = {  # the rest: 5xx and 429 unavailable, else ApiError
    409: ConflictError, 404: NotFoundError, 410: GoneError, 422: InvalidError,
    400: InvalidError, 403: ForbiddenError,
}
