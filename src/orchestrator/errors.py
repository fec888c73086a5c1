"""The one error root of the orchestrator, and its tree.

    OrchestratorError
    ├── InvalidInputError        bad input: a 400 naming the field
    ├── UnauthenticatedError     no or bad credentials: a 401
    ├── ForbiddenError           authenticated, but the role does not allow it: a 403
    ├── NotFoundError            nothing of that id in the caller's organization: a 404
    ├── ConflictError            the request conflicts with stored state: a 409
    ├── GoneError                what was asked for existed and will never be there again: a 410
    ├── PayloadTooLargeError     a body over its size limit: a 413
    ├── ServiceUnavailableError  an operational fault: a dependency of the server failed (a 503)
    │   ├── DatabaseUnavailableError   the database cannot be reached or written (transient)
    │   ├── ObjectStoreError           the object store failed: disk full, read-only, S3 down (transient)
    │   └── SealedValueError           a stored secret does not open with the server key (permanent)
    └── ConfigurationError       the process is configured wrongly (raised at start-up)

Each class is defined by its docstring, which is the default message. Foreign errors are translated into
these at the edge that owns the dependency, always ``from exc``: ``store.db`` for the database driver,
``blobs`` for the filesystem and S3, ``secretbox`` for the cipher. Their messages say what failed and never
hold a secret, since they are answered to API clients. This module imports nothing of ours.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

T = TypeVar("T")


class OrchestratorError(Exception):
    """Unexpected orchestrator error."""

    #: Short machine-readable class of the error, answered as ``error`` in API bodies.
    code: ClassVar[str] = "API-000"

    def __init__(self, message: str | None = None, *, details: dict[str, Any] | None = None) -> None:
        self.message = message or (self.__doc__ or "").strip()
        self.details = details
        super().__init__(self.message)


class InvalidInputError(OrchestratorError):
    """The request is invalid."""

    code = "API-400"


class UnauthenticatedError(OrchestratorError):
    """Authentication required."""

    code = "API-401"


class ForbiddenError(OrchestratorError):
    """The credentials do not allow this action."""

    code = "API-403"


class NotFoundError(OrchestratorError):
    """Not found."""

    code = "API-404"


def found(value: T | None, message: str) -> T:
    """``value``, or NotFoundError ``message`` when it is None (a lookup that found nothing)."""
    if value is None:
        raise NotFoundError(message)
    return value


class ConflictError(OrchestratorError):
    """The request conflicts with the current state."""

    code = "API-409"


class GoneError(OrchestratorError):
    """It is gone for good."""

    code = "API-410"


class PayloadTooLargeError(OrchestratorError):
    """The request body is too large."""

    code = "API-413"


class ServiceUnavailableError(OrchestratorError):
    """The service is unavailable."""

    code = "API-503"
    #: Whether trying again later can help (a dependency coming back): answered with ``Retry-After``.
    retryable: ClassVar[bool] = True
    retry_after_seconds: ClassVar[int] = 5


class DatabaseUnavailableError(ServiceUnavailableError):
    """The database is unavailable."""


class ObjectStoreError(ServiceUnavailableError):
    """The object store is unavailable."""


class SealedValueError(ServiceUnavailableError):
    """A stored secret does not open with the server key."""

    #: The value was sealed under another key: only an operator (the right key, new secrets) can help.
    retryable = False


class ConfigurationError(OrchestratorError):
    """The orchestrator is not configured correctly."""
