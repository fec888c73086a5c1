"""Text no database can hold, refused at the door: NUL characters, lone surrogates, NaN and Infinity.

PostgreSQL refuses U+0000 in text and JSON, no driver writes a lone surrogate (it is not Unicode text), and
JSON has no NaN or Infinity (Python's ``json`` accepts them; they would be stored as null, or refused deep
inside a transaction). :class:`InputCheckMiddleware` runs in front of everything else, the long-poll
middleware and authentication included, and answers 400 naming the field for any of them in

- a path parameter, named by the route's template (``runner_id: must not contain NUL characters``),
- a query parameter or a header (their names),
- a JSON body at any depth, keys included (``manifest.workloads.shop.params.name: ...``).

Opaque bodies, which the server stores or seals as bytes and never reads as text (a Terraform state
document), are marked with :func:`opaque_body` on their route and pass unchecked: refusing a state write
would lose the state.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl

from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.domain.validation import Loc, describe_errors
from orchestrator.errors import InvalidInputError
from orchestrator.protocol.results import MAX_RESULTS_BYTES
from orchestrator.web import errors

__all__ = ["InputCheckMiddleware", "json_problems", "opaque_body", "text_problem"]

NUL_MESSAGE: Final = "must not contain NUL characters"
SURROGATE_MESSAGE: Final = "must not contain lone surrogates (it is not Unicode text)"
NON_FINITE_MESSAGE: Final = "must be a finite number (JSON has no NaN or Infinity)"
#: Bodies up to this size are checked (the largest JSON body any route takes); a larger one goes on
#: unchecked to its route, whose own limit refuses it.
MAX_CHECKED_BODY_BYTES: Final = MAX_RESULTS_BYTES
#: At most this many problems are listed in the answer's details.
MAX_PROBLEMS: Final = 10

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
#: A JSON text can hold a NUL or a lone surrogate only as a ``\\u`` escape or raw bytes (a raw NUL, a
#: surrogate's UTF-8 form, which ``json`` decodes with surrogatepass), and a non-finite number only as
#: NaN/Infinity or a float whose exponent or digits run past ~1e308. Bodies without any of these (nearly
#: all) are not parsed here at all.
_SUSPECT_JSON = re.compile(rb"\\u|\x00|\xed[\xa0-\xbf]|NaN|Infinity|[eE][+-]?\d{3}|\d{100}")
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_OPAQUE_ATTRIBUTE = "__po_opaque_body__"

_Endpoint = TypeVar("_Endpoint", bound=Callable[..., Any])


def opaque_body(endpoint: _Endpoint) -> _Endpoint:
    """Mark a route whose body is bytes to keep as they are, never text to store: its body is not checked."""
    setattr(endpoint, _OPAQUE_ATTRIBUTE, True)
    return endpoint


def text_problem(text: str) -> str | None:
    """What is wrong with ``text`` for a database, or None."""
    found = _BAD_TEXT.search(text)
    if found is None:
        return None
    return NUL_MESSAGE if found.group() == "\x00" else SURROGATE_MESSAGE


class _NonFinite:
    """Stands for a NaN or an infinity in a parsed body, so that the walk can say where it was."""


_NON_FINITE: Final = _NonFinite()
_NOT_JSON: Final = object()


def _float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NON_FINITE


def _parse(body: bytes) -> Any:
    """The body as JSON, NaN and infinities as ``_NON_FINITE``; ``_NOT_JSON`` if it is no JSON at all.

    Raw control characters in strings are accepted on a second try, so that a raw NUL is found too (the
    route's own parsing would refuse it, but not every parser does).
    """
    for strict in (True, False):
        try:
            return json.loads(body, parse_constant=lambda _: _NON_FINITE, parse_float=_float, strict=strict)
        except (ValueError, RecursionError):
            continue
    return _NOT_JSON


def _key(key: str) -> str:
    """A key that holds bad characters, printable in a field path (``a<U+0000>b``)."""
    return _BAD_TEXT.sub(lambda found: f"<U+{ord(found.group()):04X}>", key)


@dataclass(frozen=True)
class _BadKey:
    """Stands for the value of a key that holds bad text, in the walk: the key is the problem."""

    problem: str


def json_problems(value: Any, *, limit: int = MAX_PROBLEMS) -> list[tuple[Loc, str]]:
    """Where ``value`` (parsed JSON) holds bad text or a non-finite number, in document order."""
    problems: list[tuple[Loc, str]] = []
    stack: list[tuple[Loc, Any]] = [((), value)]
    while stack and len(problems) < limit:
        loc, item = stack.pop()
        if isinstance(item, str):
            found = text_problem(item)
            if found:
                problems.append((loc, found))
        elif item is _NON_FINITE:
            problems.append((loc, NON_FINITE_MESSAGE))
        elif isinstance(item, _BadKey):
            problems.append((loc, f"key {item.problem}"))
        elif isinstance(item, dict):
            children: list[tuple[Loc, Any]] = []
            for key, child in item.items():
                found = text_problem(key)
                children.append(((*loc, _key(key)), _BadKey(found)) if found else ((*loc, key), child))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend(reversed([((*loc, index), child) for index, child in enumerate(item)]))
    return problems[:limit]


def _invalid(problems: list[tuple[Loc, str]]) -> InvalidInputError:
    message, details = describe_errors(
        {"type": "value_error", "loc": loc, "msg": msg} for loc, msg in problems
    )
    return InvalidInputError(message, details={"errors": details})


@dataclass(frozen=True)
class _Route:
    pattern: re.Pattern[str]
    methods: frozenset[str]
    opaque: bool

    @classmethod
    def of(cls, route: Any) -> _Route:
        pattern, _, _ = compile_path(route.path)
        methods = frozenset(getattr(route, "methods", None) or ())
        return cls(pattern, methods, bool(getattr(route.endpoint, _OPAQUE_ATTRIBUTE, False)))


class InputCheckMiddleware:
    """Answer 400 to a request holding text no database can hold (see the module's docstring).

    ``routes`` are the app's routes (anything with ``path``, ``methods`` and ``endpoint``, as FastAPI's
    ``APIRoute``): their templates name the path parameters, and mark the opaque bodies.
    """

    def __init__(
        self, app: ASGIApp, *, routes: Iterable[Any], max_checked_body_bytes: int = MAX_CHECKED_BODY_BYTES
    ) -> None:
        self.app = app
        self.routes = [_Route.of(route) for route in routes]
        self.max_checked_body_bytes = max_checked_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problems = self._path_problems(scope) or _query_problems(scope) or _header_problems(scope)
        if problems:
            await errors.error_response(_invalid(problems))(scope, receive, send)
            return
        if scope["method"] in _NO_BODY_METHODS:
            await self.app(scope, receive, send)
            return
        received, body = await self._read(scope, receive)
        if body is not None and _SUSPECT_JSON.search(body) and not self._opaque(scope):
            parsed = _parse(body)
            problems = [] if parsed is _NOT_JSON else json_problems(parsed)
            if problems:
                await errors.error_response(_invalid(problems))(scope, receive, send)
                return

        async def replay() -> Message:
            return received.pop(0) if received else await receive()

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> tuple[list[Message], bytes | None]:
        """The request's messages read so far, and its whole body if it is small enough to check."""
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_checked_body_bytes:
                return [], None
        received: list[Message] = []
        size = 0
        while True:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":
                return received, None  # the client is gone: the route will see that too
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return received, b"".join(m.get("body", b"") for m in received)
            if size > self.max_checked_body_bytes:
                return received, None

    def _match(self, scope: Scope) -> tuple[_Route, dict[str, str]] | None:
        """The route for the request's path (preferring one of its method) and its path parameters."""
        other: tuple[_Route, dict[str, str]] | None = None
        for route in self.routes:
            found = route.pattern.match(scope["path"])
            if found is None:
                continue
            if scope["method"] in route.methods:
                return route, found.groupdict()
            other = other or (route, found.groupdict())
        return other

    def _opaque(self, scope: Scope) -> bool:
        matched = self._match(scope)
        return matched is not None and scope["method"] in matched[0].methods and matched[0].opaque

    def _path_problems(self, scope: Scope) -> list[tuple[Loc, str]]:
        found = text_problem(scope["path"])
        if found is None:
            return []
        matched = self._match(scope)
        params = matched[1] if matched else {}
        named: list[tuple[Loc, str]] = [
            ((name,), problem) for name, value in params.items() if (problem := text_problem(value))
        ]
        return named or [(("path",), found)]


def _query_problems(scope: Scope) -> list[tuple[Loc, str]]:
    query: bytes = scope.get("query_string", b"")
    # Decoded as Starlette decodes it (UTF-8, invalid bytes replaced): only a NUL can come through.
    if b"%00" not in query and b"\x00" not in query:
        return []
    problems: list[tuple[Loc, str]] = []
    for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if found := text_problem(name):
            problems.append((("query",), f"parameter name {found}"))
        elif found := text_problem(value):
            problems.append(((name,), found))
    return problems


def _header_problems(scope: Scope) -> list[tuple[Loc, str]]:
    problems: list[tuple[Loc, str]] = []
    for name, value in scope["headers"]:
        if b"\x00" in value:
            problems.append(((name.decode("latin-1"),), NUL_MESSAGE))
    return problems
