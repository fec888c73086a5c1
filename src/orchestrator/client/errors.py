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


@dataclass(frozen=True)
class TransportFailure:
    """Why a request got no answer, told apart by its cause: ``kind`` is ``certificate`` (the server's
    certificate did not verify), ``dns`` (its host name does not resolve), ``refused`` (nothing listens at
    the address) or ``other``; ``reason`` names the host or address and the cause. A certificate or DNS
    failure is permanent: trying again does not help until someone changes a setting."""

    kind: str
    reason: str

    @property
    def permanent(self) -> bool:
        return self.kind in ("certificate", "dns")


def transport_failure(exc: httpx.TransportError) -> TransportFailure:
    """What ``exc`` (httpx's, wrapping httpcore's and the socket's or ssl's error) says went wrong."""
    import socket
    import ssl

    try:
        url = exc.request.url
        host, address = url.host, f"{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"
    except RuntimeError:  # no request attached
        host = address = "the server"
    cause: BaseException | None = exc
    seen = 0
    while cause is not None and seen < 10:
        if isinstance(cause, ssl.SSLCertVerificationError):
            detail = cause.verify_message or str(cause)
            return TransportFailure("certificate", f"certificate verify failed for {host}: {detail}")
        if isinstance(cause, socket.gaierror):
            # EAI_AGAIN: the resolver did not answer (an outage of DNS, worth another attempt).
            kind = "other" if cause.errno == socket.EAI_AGAIN else "dns"
            return TransportFailure(kind, f"cannot resolve the host name {host}: {cause.strerror or cause}")
        if isinstance(cause, ConnectionRefusedError):
            return TransportFailure("refused", f"connection refused by {address}")
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    text = str(exc)
    # httpcore sometimes carries only the text of the original error.
    if "CERTIFICATE_VERIFY_FAILED" in text:
        detail = text.split("certificate verify failed:", 1)[-1].split("(_ssl.c", 1)[0].strip()
        return TransportFailure("certificate", f"certificate verify failed for {host}: {detail}")
    if "Name or service not known" in text or "nodename nor servname" in text:
        return TransportFailure("dns", f"cannot resolve the host name {host}: {text}")
    if "Connection refused" in text:
        return TransportFailure("refused", f"connection refused by {address}")
    return TransportFailure("other", f"{address}: {text or type(exc).__name__}")
