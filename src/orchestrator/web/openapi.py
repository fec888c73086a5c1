"""What ``/openapi.json`` says beyond FastAPI's defaults: who may call each operation, and its error answers.

Security: the credentials a route needs are declared by documentation-only dependencies (:data:`API_TOKEN`,
:data:`AGENT_TOKEN`, :data:`DEPLOYMENT_TOKEN`, :data:`STATE_CREDENTIALS`, :data:`MANAGED_RUNNER_TOKEN`)
placed beside the code that checks them; they read nothing, so authentication stays where it is
(``api.context``, ``gateway``) and answers as before. An operation without any says ``security: []``.

Error answers are derived per operation, in one place (:func:`error_statuses`), from what the route is:

- 400 when it takes any input (parameters, a body); FastAPI's validation errors are answered 400 naming
  the field (``web.errors``), so FastAPI's 422 is dropped everywhere;
- 401 and 503 when it needs credentials (checking them reads the database);
- 403 when a dependency or the route is marked :func:`may_answer` ``403`` (a permission beyond reading);
- 404 when its path has parameters (an organization or object that may not exist);
- 409 for writes (POST, PUT, PATCH, DELETE) unless marked :func:`never_answers` ``409``;
- 413 for requests with a body (POST, PUT, PATCH);
- whatever a route adds with its decorator's ``responses`` or :func:`may_answer`.

Every one of them has the error body ``{error, message, details?}`` (``web.errors.error_body``).

Bodies that a route reads itself (the gateway's, size-limited first) are shown with :func:`json_body` or
:func:`raw_body`. The document also lists itself and ``/docs``, which need no credentials.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, TypeVar

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.models import APIKey, APIKeyIn, HTTPBase, HTTPBearer
from fastapi.openapi.models import SecurityBase as SecurityModel
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from fastapi.security.base import SecurityBase
from pydantic import BaseModel

__all__ = [
    "AGENT_TOKEN",
    "API_TOKEN",
    "DEPLOYMENT_TOKEN",
    "MANAGED_RUNNER_TOKEN",
    "STATE_CREDENTIALS",
    "install",
    "json_body",
    "may_answer",
    "never_answers",
    "raw_body",
]

ERROR_SCHEMA_NAME: Final = "Error"
ERROR_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "title": ERROR_SCHEMA_NAME,
    "description": "Every error answer: a code (`API-<status>`), a message naming the field or the cause, "
    "and sometimes details (`errors`: one per field; `error_id` of a 500).",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "examples": ["API-404"]},
        "message": {"type": "string", "examples": ["organization 'acme' not found"]},
        "details": {"type": "object", "additionalProperties": True},
    },
}

DESCRIPTIONS: Final[dict[int, str]] = {
    400: "Invalid input: the message names the field.",
    401: "No, invalid or expired credentials.",
    403: "The credentials do not allow this action.",
    404: "Not found (or of another organization).",
    409: "Conflicts with the stored state.",
    413: "The request body is too large.",
    503: "A dependency of the server failed (database, object store): try again (`Retry-After`).",
}

_HEADERS: Final[dict[int, dict[str, Any]]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "The scheme to use."}},
    503: {"Retry-After": {"schema": {"type": "string"}, "description": "Seconds, when retrying can help."}},
}

_WRITES: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_WITH_BODY: Final = frozenset({"POST", "PUT", "PATCH"})
#: The methods an OpenAPI 3.1 path item can hold; others (the state backend's LOCK, UNLOCK) cannot be
#: described as operations and are named in their path item's description instead.
_PATH_ITEM_FIELDS: Final = frozenset(
    {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
    | {"$ref", "summary", "description", "servers", "parameters"}
)
_ADDS: Final = "__po_openapi_adds__"
_OMITS: Final = "__po_openapi_omits__"

_F = TypeVar("_F", bound=Callable[..., Any])
#: Models of bodies that routes read themselves (:func:`json_body`), by component name.
_BODY_MODELS: dict[str, type[BaseModel]] = {}


class DocumentedCredentials(SecurityBase):
    """A security scheme for the OpenAPI document only: as a dependency it reads nothing and returns None;
    the route's own code checks the credentials (and says what was wrong)."""

    def __init__(self, model: SecurityModel, scheme_name: str) -> None:
        self.model = model
        self.scheme_name = scheme_name

    async def __call__(self) -> None:
        return None


API_TOKEN: Final = DocumentedCredentials(
    HTTPBearer(description="An API token (`po_...`) of an organization, or a platform token."),
    "ApiToken",
)
AGENT_TOKEN: Final = DocumentedCredentials(
    HTTPBearer(
        bearerFormat="JWT",
        description="A short-lived JWT (EdDSA) signed with the runner's agent key; each is accepted once.",
    ),
    "AgentJWT",
)
DEPLOYMENT_TOKEN: Final = DocumentedCredentials(
    APIKey(
        **{"in": APIKeyIn.header},
        name="X-Deployment-Token",
        description="The token of one deployment, given to the runner that executes it.",
    ),
    "DeploymentToken",
)
MANAGED_RUNNER_TOKEN: Final = DocumentedCredentials(
    HTTPBearer(
        description="A managed runner's token, minted by POST /runner/register (never the shared secret)."
    ),
    "ManagedRunnerToken",
)
STATE_CREDENTIALS: Final = DocumentedCredentials(
    HTTPBase(
        scheme="basic",
        description="Terraform's http backend: user = the deployment id, password = its deployment token.",
    ),
    "StateBasicAuth",
)


def may_answer(*statuses: int) -> Callable[[_F], _F]:
    """Mark a route or a dependency that can answer ``statuses`` beyond the derived ones."""

    def mark(func: _F) -> _F:
        setattr(func, _ADDS, frozenset(getattr(func, _ADDS, frozenset())) | set(statuses))
        return func

    return mark


def never_answers(*statuses: int) -> Callable[[_F], _F]:
    """Mark a route that cannot answer ``statuses`` although the derivation would say so (a write
    that cannot conflict)."""

    def mark(func: _F) -> _F:
        setattr(func, _OMITS, frozenset(getattr(func, _OMITS, frozenset())) | set(statuses))
        return func

    return mark


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads ``model`` from its JSON body itself (the gateway's routes
    read their bodies with a size limit first): the document shows the body, and ``model`` is added to
    its components."""
    _BODY_MODELS[model.__name__] = model
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def raw_body(media_type: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """``openapi_extra`` of a route that keeps its body as it is (a state, a log ciphertext)."""
    content = {media_type: {"schema": schema}}
    return {"requestBody": {"required": True, "description": description, "content": content}}


def _add_body_models(schemas: dict[str, Any]) -> None:
    for name, model in sorted(_BODY_MODELS.items()):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for sub_name, sub_schema in schema.pop("$defs", {}).items():
            schemas.setdefault(sub_name, sub_schema)
        schemas.setdefault(name, schema)


def error_statuses(route: RouteContext, method: str, operation: dict[str, Any]) -> set[int]:
    """The error statuses the operation ``method`` of ``route`` can answer (see the module docstring)."""
    statuses: set[int] = set()
    if operation.get("parameters") or operation.get("requestBody") or method in _WITH_BODY:
        statuses.add(400)
    if operation.get("security"):
        statuses |= {401, 503}
    if route.param_convertors:
        statuses.add(404)
    if method in _WRITES:
        statuses.add(409)
    if method in _WITH_BODY:
        statuses.add(413)
    calls = [route.endpoint, *_dependency_calls(route.dependant)] if route.dependant else [route.endpoint]
    for call in calls:
        statuses |= getattr(call, _ADDS, frozenset())
    for call in calls:
        statuses -= getattr(call, _OMITS, frozenset())
    return statuses


def _dependency_calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _dependency_calls(sub)


def _error_response(status: int, given: dict[str, Any] | None) -> dict[str, Any]:
    response = dict(given or {})
    response.setdefault("description", DESCRIPTIONS.get(status, "Error."))
    content = response.setdefault("content", {})
    media = content.setdefault("application/json", {})
    if not media.get("schema"):
        media["schema"] = {"$ref": f"#/components/schemas/{ERROR_SCHEMA_NAME}"}
    if status in _HEADERS:
        response.setdefault("headers", _HEADERS[status])
    return response


def _document_operation(route: RouteContext, method: str, operation: dict[str, Any]) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    responses.pop("422", None)
    operation.setdefault("security", [])
    for status in error_statuses(route, method, operation):
        responses.setdefault(str(status), {})
    for code, response in list(responses.items()):
        if code.isdigit() and int(code) >= 400:
            responses[code] = _error_response(int(code), response)
    operation["responses"] = dict(sorted(responses.items()))


def _describe_other_methods(item: dict[str, Any]) -> None:
    """Move operations of methods OpenAPI cannot hold (LOCK, UNLOCK) into the path item's description."""
    other = sorted(key for key in item if key not in _PATH_ITEM_FIELDS)
    if not other:
        return
    lines = []
    for method in other:
        operation = item.pop(method)
        codes = ", ".join(sorted(operation.get("responses", {})))
        lines.append(f"`{method.upper()}`: {operation.get('summary', '')} (answers {codes}).")
    item["description"] = " ".join(
        [item.get("description", ""), "Methods OpenAPI 3.1 cannot describe:", *lines]
    ).strip()


def _meta_paths(app: FastAPI) -> dict[str, Any]:
    """The document itself and the documentation page, which FastAPI leaves out: no credentials needed."""
    paths: dict[str, Any] = {}
    if app.openapi_url:
        paths[app.openapi_url] = {
            "get": {
                "tags": ["Meta"],
                "summary": "This OpenAPI document",
                "operationId": "get_openapi",
                "security": [],
                "responses": {
                    "200": {
                        "description": "The OpenAPI document.",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        }
    return paths


def build(app: FastAPI, *, extra_paths: Iterable[tuple[str, dict[str, Any]]] = ()) -> dict[str, Any]:
    """The OpenAPI document of ``app``: FastAPI's, with security and the error answers of each operation."""
    document = get_openapi(
        title=app.title,
        version=app.version,
        openapi_version=app.openapi_version,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
        servers=app.servers,
    )
    paths: dict[str, Any] = document.setdefault("paths", {})
    for route in iter_route_contexts(app.routes):
        if not isinstance(route.original_route, APIRoute) or not route.include_in_schema:
            continue
        item = paths.get(route.path_format or "", {})
        for method in route.methods or ():
            operation = item.get(method.lower())
            if operation is not None:
                _document_operation(route, method, operation)
    for item in paths.values():
        _describe_other_methods(item)
    paths.update(_meta_paths(app))
    paths.update(dict(extra_paths))
    schemas: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})
    schemas[ERROR_SCHEMA_NAME] = ERROR_SCHEMA
    _add_body_models(schemas)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return document


def install(app: FastAPI, *, extra_paths: Iterable[tuple[str, dict[str, Any]]] = ()) -> None:
    """Serve :func:`build`'s document at ``app.openapi_url`` (built once, on first request)."""
    extra = list(extra_paths)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app, extra_paths=extra)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
