"""The one error tree of the orchestrator's HTTP clients (``octl``'s, the runner's, the agent's).

    ClientError              the request did not succeed: an error answer (``status_code``) or none
    ├── AuthError            the credentials were refused: 401, 403, or the gateway's "token not valid" 400
    ├── UnavailableError     no answer at all: connection refused or reset, timeout, TLS failure
    └── (client.api) ApiError, and ApiConnectionError below UnavailableError: ``octl``'s names

``retryable`` says another attempt may help: no answer, or a transient status (:data:`RETRY_STATUSES`).
An error answer's body is read once, by :func:`read_answer`: the server's ``{error, message, details}``
when it is one, else its first characters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from orchestrator import errors

#: Statuses worth another attempt: the server is busy or briefly unavailable.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: How much of a body that is not the server's error object a message quotes.
TEXT_LIMIT = 500


class ClientError(errors.OrchestratorError):
    """The request did not succeed."""

    def __init__(
        self,
        message: str | None = None,
        *,
        status_code: int | None = None,
        error: str | None = None,
        details: dict[str, Any] | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message, details=details)
        #: The answer's HTTP status; None when there was no answer.
        self.status_code = status_code
        #: The ``error`` field of the server's body (e.g. ``API-409``), else ``API-<status>``.
        self.error = error or (f"API-{status_code}" if status_code is not None else self.code)
        #: Worth another attempt: no answer at all or a transient status.
        self.retryable = (
            (status_code is None or status_code in RETRY_STATUSES) if retryable is None else retryable
        )


class AuthError(ClientError):
    """The server refused the credentials."""


class UnavailableError(ClientError):
    """The server could not be reached."""


@dataclass(frozen=True)
class Answer:
    """An error answer's body, read once: the server's error object, or its text."""

    #: The body's text, stripped, at most :data:`TEXT_LIMIT` characters.
    text: str
    #: The ``error`` field of the server's error object, if the body is one.
    error: str | None = None
    #: Its ``message``; None when the body is not the server's error object.
    message: str | None = None
    details: dict[str, Any] | None = None


def read_answer(response: httpx.Response) -> Answer:
    """The body of an error answer (already read): ``{error, message, details}`` or text."""
    text = response.text[:TEXT_LIMIT].strip()
    try:
        body = response.json()
    except ValueError:
        return Answer(text)
    if not isinstance(body, dict) or not isinstance(body.get("message"), str):
        return Answer(text)
    details = body.get("details")
    return Answer(
        text,
        error=str(body["error"]) if body.get("error") else None,
        message=body["message"],
        details=details if isinstance(details, dict) else None,
    )


def no_answer(what: str, exc: httpx.TransportError) -> UnavailableError:
    """The error of a request that got no answer: ``what`` failed, and why (httpx's words)."""
    return UnavailableError(f"{what}: {exc}")
