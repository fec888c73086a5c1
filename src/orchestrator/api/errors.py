"""Every error becomes JSON ``{error, message, details?}``; one mapping, no try/except in routes."""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchestrator.errors import (
    ConflictError,
    ForbiddenError,
    InvalidInputError,
    NotFoundError,
    OrchestratorError,
    PayloadTooLargeError,
    UnauthenticatedError,
)

log = structlog.get_logger(__name__)

STATUS: dict[type[OrchestratorError], int] = {
    InvalidInputError: 400,
    UnauthenticatedError: 401,
    ForbiddenError: 403,
    NotFoundError: 404,
    ConflictError: 409,
    PayloadTooLargeError: 413,
}


def _field(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + str(part)
    return path


def describe_errors(errors: Any, *, strip_location: bool) -> tuple[str, list[dict[str, str]]]:
    """TEMPORARY: replaced by the domain formatter."""
    out = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        if strip_location and loc and loc[0] in ("body", "query", "path", "header"):
            loc = loc[1:]
        msg = "unknown field" if err.get("type") == "extra_forbidden" else str(err.get("msg", "invalid"))
        out.append({"field": _field(loc), "message": msg})
    first = out[0] if out else {"field": "", "message": "invalid request"}
    return (f"{first['field']}: {first['message']}" if first["field"] else first["message"]), out


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": code, "message": message}
    if details:
        body["details"] = details
    return body


async def _orchestrator_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OrchestratorError)
    status = next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 500)
    if status == 500:
        log.error("unexpected error", exc_info=exc)
        return JSONResponse(error_body("API-500", "internal error"), status_code=500)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(exc.code, exc.message, exc.details), status_code=status, headers=headers)


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, errors = describe_errors(exc.errors(), strip_location=True)
    return JSONResponse(error_body("API-400", message, {"errors": errors}), status_code=400)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse(
        error_body(f"API-{exc.status_code}", str(exc.detail)), status_code=exc.status_code, headers=exc.headers
    )


async def _unexpected_error(_request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error", exc_info=exc)
    return JSONResponse(error_body("API-500", "internal error"), status_code=500)


def install(app: FastAPI) -> None:
    app.add_exception_handler(OrchestratorError, _orchestrator_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
