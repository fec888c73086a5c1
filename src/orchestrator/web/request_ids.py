"""Request ids: every log line written while a request is served carries ``request_id``, and the answer
carries it back in ``X-Request-ID`` (error answers included).

The id is the request's ``X-Request-ID`` when it is sane (1 to 128 characters of letters, digits and
``._:+=@/-``, as proxies and tracing systems make them), else a new one (32 hex digits). It is bound in
structlog's context variables for the request; standard ``logging`` lines (uvicorn's) get it too
(``orchestrator.logs`` merges the context into them).
"""

from __future__ import annotations

import re
import uuid
from typing import Final

import structlog
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER: Final = "X-Request-ID"
MAX_LENGTH: Final = 128
_SANE: Final = re.compile(rf"[A-Za-z0-9._:+=@/-]{{1,{MAX_LENGTH}}}")
_HEADER_BYTES: Final = HEADER.lower().encode()


def request_id(presented: bytes | None) -> str:
    """``presented`` when it is a sane id, else a new one."""
    if presented is not None:
        text = presented.decode("latin-1")
        if _SANE.fullmatch(text):
            return text
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Binds ``request_id`` for the request and sets ``X-Request-ID`` on its answer. Meant to be the
    outermost layer (outside Starlette's last-resort error handler, so that a 500 carries it too)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        presented = next((value for name, value in scope["headers"] if name == _HEADER_BYTES), None)
        rid = request_id(presented)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = rid
            await send(message)

        # Cleared first: a request never carries the context of an earlier one (a server reusing its task).
        structlog.contextvars.clear_contextvars()
        tokens = structlog.contextvars.bind_contextvars(request_id=rid)
        await self.app(scope, receive, send_with_id)
        # Not reset when the app raised: the server logs the exception next, in this context.
        structlog.contextvars.reset_contextvars(**tokens)
