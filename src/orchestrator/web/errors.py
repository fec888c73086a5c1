"""Every error becomes JSON ``{error, message, details?}``; one mapping, no try/except in routes.

Operational faults (``ServiceUnavailableError``: the database, the object store, a secret that does not
open) answer 503 with what failed, and ``Retry-After`` when retrying can help. Anything unexpected answers
500 with an error id that the server's log line carries too, so an operator can find the traceback; the
answer itself never holds one.
"""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy.exc
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchestrator.domain.validation import describe_errors
from orchestrator.errors import (
    ConflictError,
    ForbiddenError,
    GoneError,
    InvalidInputError,
    NotFoundError,
    OrchestratorError,
    PayloadTooLargeError,
    ServiceUnavailableError,
    UnauthenticatedError,
)

log = structlog.get_logger(__name__)

_SOURCES = ("body", "query", "path", "header", "cookie")

STATUS: dict[type[OrchestratorError], int] = {
    InvalidInputError: 400,
    UnauthenticatedError: 401,
    ForbiddenError: 403,
    NotFoundError: 404,
    ConflictError: 409,
    GoneError: 410,
    PayloadTooLargeError: 413,
    ServiceUnavailableError: 503,
}


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": code, "message": message}
    if details:
        body["details"] = details
    return body


def error_response(exc: OrchestratorError) -> JSONResponse:
    """The JSON answer to ``exc`` (also for handlers that run outside FastAPI's routing)."""
    status = next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 500)
    if status == 500:
        return internal_error_response(exc)
    headers: dict[str, str] | None = None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, ServiceUnavailableError):
        # Logged without a traceback: the message says what failed; the cause is chained for debug.
        log.warning("service unavailable", error=exc.message, cause=repr(exc.__cause__))
        if exc.retryable:
            headers = {"Retry-After": str(exc.retry_after_seconds)}
    return JSONResponse(error_body(exc.code, exc.message, exc.details), status_code=status, headers=headers)


def internal_error_response(exc: BaseException) -> JSONResponse:
    """500 for a bug: the traceback goes to the log under a fresh error id, the answer names only the id."""
    error_id = uuid.uuid4().hex[:16]
    log.error("unexpected error", error_id=error_id, exc_info=exc)
    return JSONResponse(
        error_body(
            "API-500",
            f"internal error (error id {error_id}; the server log has the details)",
            {"error_id": error_id},
        ),
        status_code=500,
    )


async def _orchestrator_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OrchestratorError)
    return error_response(exc)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # FastAPI prefixes each location with where it was found ("body", "query", ...): name the field alone.
    found = [
        {**e, "loc": tuple(e["loc"])[1:] if e["loc"] and e["loc"][0] in _SOURCES else e["loc"]}
        for e in exc.errors()
    ]
    message, errors = describe_errors(found)
    return JSONResponse(error_body("API-400", message, {"errors": errors}), status_code=400)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse(
        error_body(f"API-{exc.status_code}", str(exc.detail)),
        status_code=exc.status_code,
        headers=exc.headers,
    )


def busy_response(exc: sqlalchemy.exc.TimeoutError) -> JSONResponse:
    """Every database connection stayed busy for the pool's whole timeout: overload, not a bug."""
    log.warning("no database connection free in time", error=str(exc))
    return JSONResponse(
        error_body("API-503", "the server is busy, try again shortly"),
        status_code=503,
        headers={"Retry-After": "5"},
    )


async def _unexpected_error(_request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, sqlalchemy.exc.TimeoutError):
        return busy_response(exc)
    if isinstance(exc, OrchestratorError):
        # Raised in a middleware, outside the routes' handlers (Starlette's last-resort handler).
        return error_response(exc)
    return internal_error_response(exc)


def install(app: FastAPI) -> None:
    app.add_exception_handler(OrchestratorError, _orchestrator_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
