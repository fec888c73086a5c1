"""``OPTIONS`` and 405 answers that name every method of the path in ``Allow``.

FastAPI makes one route per method, and Starlette answers a method that no route of the path takes with
the methods of the first route whose path matched (``Allow: GET`` on a path that takes GET, PATCH and
DELETE). :class:`AllowedMethodsRoute`, routed after every other route, answers instead: ``OPTIONS`` with
204, any other method with 405, both with ``Allow`` listing the methods of all routes that match the path.
There is no CORS: the API is called by programs (``octl``, runners, agents), not by other sites' pages.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fastapi.routing import iter_route_contexts
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Match
from starlette.types import Receive, Scope, Send

from orchestrator.web import errors

_SCOPE_KEY = "po.allowed_methods"
#: The order methods are listed in (any others follow, sorted).
_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _method_paths(routes: Sequence[BaseRoute]) -> list[tuple[re.Pattern[str], frozenset[str]]]:
    """Each route's path pattern and methods (routes of included routers too; mounts have none)."""
    found = []
    for route in iter_route_contexts(routes):
        if route.methods and route.path_regex is not None:
            found.append((route.path_regex, frozenset(route.methods)))
    return found


def allowed_methods(paths: Sequence[tuple[re.Pattern[str], frozenset[str]]], path: str) -> list[str]:
    """The methods of the routes whose pattern matches ``path`` (OPTIONS included), or [] if none."""
    methods: set[str] = set()
    for pattern, route_methods in paths:
        if pattern.match(path):
            methods |= route_methods
    if not methods:
        return []
    methods.add("OPTIONS")
    return sorted(methods, key=lambda m: (_ORDER.index(m) if m in _ORDER else len(_ORDER), m))


class AllowedMethodsRoute(BaseRoute):
    """Matches any method on a path that one of ``routes`` serves (put it after them)."""

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        self.paths = _method_paths(routes)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http":
            return Match.NONE, {}
        methods = allowed_methods(self.paths, scope["path"])
        if not methods:
            return Match.NONE, {}
        return Match.FULL, {_SCOPE_KEY: methods}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        methods: list[str] = scope[_SCOPE_KEY]
        allow = {"Allow": ", ".join(methods)}
        if scope["method"] == "OPTIONS":
            await send({"type": "http.response.start", "status": 204, "headers": _encode(allow)})
            await send({"type": "http.response.body", "body": b""})
            return
        message = f"method {scope['method']} is not allowed here; allowed: {allow['Allow']}"
        response = JSONResponse(errors.error_body("API-405", message), status_code=405, headers=allow)
        await response(scope, receive, send)


def _encode(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
