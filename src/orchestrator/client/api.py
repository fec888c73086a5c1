"""``ApiClient``: a synchronous httpx client of the control-plane API, as ``octl`` uses it.

Every method maps one API operation; list methods follow ``next_page_token`` and answer every item.
A non-2xx answer raises :class:`ApiError`, an unreachable server :class:`ApiConnectionError`.
The transport is injectable (``httpx.MockTransport``, a WSGI app, the network), as in httpx.

This module imports no server code: the CLI ships without the ``server`` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from orchestrator.errors import OrchestratorError

JsonObject = dict[str, Any]

#: Items asked for per page when listing; the server caps it at 1000.
DEFAULT_PAGE_SIZE = 100
DEFAULT_TIMEOUT_SECONDS = 30.0

#: Short names of the HTTP error classes, as the CLI prints them ("conflict: ...").
STATUS_KINDS: Mapping[int, str] = {
    400: "bad request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not found",
    405: "method not allowed",
    409: "conflict",
    413: "payload too large",
    422: "unprocessable request",
    429: "too many requests",
}


class ApiError(OrchestratorError):
    """The API answered with an error."""

    def __init__(
        self, status: int, code: str, message: str, *, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, details=details)
        #: The HTTP status code.
        self.status = status
        #: The ``error`` field of the body (e.g. ``API-409``); ``code`` itself is the class-wide ``API-000``.
        self.error = code

    @property
    def kind(self) -> str:
        """A short name of the error class: ``conflict``, ``not found``, ``server error``, ..."""
        if self.status in STATUS_KINDS:
            return STATUS_KINDS[self.status]
        return "server error" if self.status >= 500 else f"HTTP {self.status}"

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class ApiConnectionError(OrchestratorError):
    """The API could not be reached."""


def _segment(value: str) -> str:
    # Ids go into the path; quoting keeps "a/b" or ".." from addressing another resource.
    return quote(value, safe="")


def _error_from(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        details = body.get("details")
        return ApiError(
            response.status_code,
            str(body.get("error") or f"API-{response.status_code}"),
            body["message"],
            details=details if isinstance(details, dict) else None,
        )
    text = response.text.strip().splitlines()[0][:200] if response.text.strip() else ""
    return ApiError(response.status_code, f"API-{response.status_code}", text or response.reason_phrase)


class ApiClient:
    """A client of one control-plane API with one bearer token (``None`` sends no Authorization)."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        page_size: int = DEFAULT_PAGE_SIZE,
        on_request: Callable[[httpx.Request], None] | None = None,
        on_response: Callable[[httpx.Response], None] | None = None,
    ) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"invalid API URL '{base_url}': it must be http(s)://host[:port]")
        self.base_url = str(base_url).rstrip("/")
        self.page_size = page_size
        headers = {"Accept": "application/json", "User-Agent": "octl"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            transport=transport,
            timeout=timeout,
            event_hooks={
                "request": [on_request] if on_request else [],
                "response": [on_response] if on_response else [],
            },
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | list[str]] | None = None,
        body: Any = None,
    ) -> httpx.Response:
        try:
            response = self._http.request(method, path, params=params, json=body)
        except httpx.TimeoutException as exc:
            raise ApiConnectionError(f"cannot reach the API at {self.base_url}: timed out") from exc
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise ApiConnectionError(f"cannot reach the API at {self.base_url}: {reason}") from exc
        if not response.is_success:
            raise _error_from(response)
        return response

    def _object(self, method: str, path: str, **kwargs: Any) -> JsonObject:
        response = self._send(method, path, **kwargs)
        try:
            data = response.json()
        except ValueError as exc:
            raise ApiError(
                response.status_code, "API-000", "the API answered with a body that is not JSON"
            ) from exc
        if not isinstance(data, dict):
            raise ApiError(
                response.status_code, "API-000", "the API answered with a body that is not an object"
            )
        return data

    def _delete(self, path: str, *, params: Mapping[str, str] | None = None) -> None:
        self._send("DELETE", path, params=params)

    def _pages(self, path: str, params: Mapping[str, str] | None = None) -> Iterator[JsonObject]:
        query: dict[str, str] = {**(params or {}), "per_page": str(self.page_size)}
        while True:
            page = self._object("GET", path, params=query)
            items = page.get("items")
            if not isinstance(items, list):
                raise ApiError(200, "API-000", f"the API answered a list without items at {path}")
            yield from items
            token = page.get("next_page_token")
            if not token:
                return
            query["page"] = str(token)

    def _list(self, path: str, params: Mapping[str, str | None] | None = None) -> list[JsonObject]:
        """Every item of a paged list, in the server's order."""
        given = {k: v for k, v in (params or {}).items() if v is not None}
        return list(self._pages(path, given))

    # -- organizations --------------------------------------------------------------------------------

    def create_org(self, org_id: str | None = None) -> JsonObject:
        return self._object("POST", "/orgs", body={"id": org_id} if org_id else {})

    def get_org(self, org: str) -> JsonObject:
        return self._object("GET", f"/orgs/{_segment(org)}")

    def list_orgs(self) -> list[JsonObject]:
        return self._list("/orgs")

    # -- runners --------------------------------------------------------------------------------------

    def create_runner(self, org: str, body: JsonObject) -> JsonObject:
        return self._object("POST", f"/orgs/{_segment(org)}/runners", body=body)

    def get_runner(self, org: str, runner_id: str) -> JsonObject:
        return self._object("GET", f"/orgs/{_segment(org)}/runners/{_segment(runner_id)}")

    def list_runners(self, org: str) -> list[JsonObject]:
        return self._list(f"/orgs/{_segment(org)}/runners")

    def update_runner(self, org: str, runner_id: str, patch: JsonObject) -> JsonObject:
        return self._object("PATCH", f"/orgs/{_segment(org)}/runners/{_segment(runner_id)}", body=patch)

    def delete_runner(self, org: str, runner_id: str) -> None:
        self._delete(f"/orgs/{_segment(org)}/runners/{_segment(runner_id)}")

    def compatibility_matrix(self) -> dict[str, list[str]]:
        """Runner type to the state storage types it accepts."""
        matrix = self._object("GET", "/runner-compatibility").get("matrix")
        if not isinstance(matrix, dict):
            raise ApiError(200, "API-000", "the API answered a compatibility matrix without 'matrix'")
        return {str(k): [str(s) for s in v] for k, v in matrix.items()}

    # -- runner rules ---------------------------------------------------------------------------------

    def create_runner_rule(self, org: str, body: JsonObject) -> JsonObject:
        return self._object("POST", f"/orgs/{_segment(org)}/runner-rules", body=body)

    def get_runner_rule(self, org: str, rule_id: str) -> JsonObject:
        return self._object("GET", f"/orgs/{_segment(org)}/runner-rules/{_segment(rule_id)}")

    def list_runner_rules(
        self,
        org: str,
        *,
        runner_id: str | None = None,
        project_id: str | None = None,
        env_type_id: str | None = None,
    ) -> list[JsonObject]:
        return self._list(
            f"/orgs/{_segment(org)}/runner-rules",
            {"byRunnerId": runner_id, "byProjectId": project_id, "byEnvTypeId": env_type_id},
        )

    def delete_runner_rule(self, org: str, rule_id: str) -> None:
        self._delete(f"/orgs/{_segment(org)}/runner-rules/{_segment(rule_id)}")

    # -- projects -------------------------------------------------------------------------------------

    def create_project(self, org: str, body: JsonObject) -> JsonObject:
        return self._object("POST", f"/orgs/{_segment(org)}/projects", body=body)

    def get_project(self, org: str, project_id: str) -> JsonObject:
        return self._object("GET", f"/orgs/{_segment(org)}/projects/{_segment(project_id)}")

    def list_projects(self, org: str) -> list[JsonObject]:
        return self._list(f"/orgs/{_segment(org)}/projects")

    def update_project(self, org: str, project_id: str, patch: JsonObject) -> JsonObject:
        return self._object("PATCH", f"/orgs/{_segment(org)}/projects/{_segment(project_id)}", body=patch)

    def delete_project(self, org: str, project_id: str, *, delete_rules: bool = False) -> None:
        self._delete(
            f"/orgs/{_segment(org)}/projects/{_segment(project_id)}",
            params={"deleteRules": "true"} if delete_rules else None,
        )

    # -- environment types ----------------------------------------------------------------------------

    def create_env_type(self, org: str, body: JsonObject) -> JsonObject:
        return self._object("POST", f"/orgs/{_segment(org)}/env-types", body=body)

    def get_env_type(self, org: str, env_type_id: str) -> JsonObject:
        return self._object("GET", f"/orgs/{_segment(org)}/env-types/{_segment(env_type_id)}")

    def list_env_types(self, org: str) -> list[JsonObject]:
        return self._list(f"/orgs/{_segment(org)}/env-types")

    def update_env_type(self, org: str, env_type_id: str, patch: JsonObject) -> JsonObject:
        return self._object("PATCH", f"/orgs/{_segment(org)}/env-types/{_segment(env_type_id)}", body=patch)

    def delete_env_type(self, org: str, env_type_id: str) -> None:
        self._delete(f"/orgs/{_segment(org)}/env-types/{_segment(env_type_id)}")

    # -- environments ---------------------------------------------------------------------------------

    def _env_path(self, org: str, project_id: str, env_id: str | None = None) -> str:
        path = f"/orgs/{_segment(org)}/projects/{_segment(project_id)}/envs"
        return f"{path}/{_segment(env_id)}" if env_id is not None else path

    def create_env(self, org: str, project_id: str, body: JsonObject) -> JsonObject:
        return self._object("POST", self._env_path(org, project_id), body=body)

    def get_env(self, org: str, project_id: str, env_id: str) -> JsonObject:
        return self._object("GET", self._env_path(org, project_id, env_id))

    def list_envs(
        self, org: str, project_id: str | None = None, *, env_type_id: str | None = None
    ) -> list[JsonObject]:
        """The environments of one project, or of the whole organization when ``project_id`` is None."""
        path = self._env_path(org, project_id) if project_id is not None else f"/orgs/{_segment(org)}/envs"
        return self._list(path, {"byEnvTypeId": env_type_id})

    def update_env(self, org: str, project_id: str, env_id: str, patch: JsonObject) -> JsonObject:
        return self._object("PATCH", self._env_path(org, project_id, env_id), body=patch)

    def delete_env(self, org: str, project_id: str, env_id: str, *, force: bool = False) -> None:
        self._delete(self._env_path(org, project_id, env_id), params={"force": "true"} if force else None)

    def refresh_runner(self, org: str, project_id: str, env_id: str, *, dry_run: bool) -> JsonObject:
        """Re-link the environment to the runner its rules select: ``{runner_id, updated}``."""
        return self._object(
            "POST",
            f"{self._env_path(org, project_id, env_id)}/actions/refresh_runner",
            params={"dry_run": "true" if dry_run else "false"},
        )

    # -- tokens ---------------------------------------------------------------------------------------

    def create_token(self, org: str, body: JsonObject) -> JsonObject:
        """A new API token; the answer holds the secret ``token``, which is never answered again."""
        return self._object("POST", f"/orgs/{_segment(org)}/tokens", body=body)

    def list_tokens(self, org: str) -> list[JsonObject]:
        return self._list(f"/orgs/{_segment(org)}/tokens")

    def delete_token(self, org: str, token_id: str) -> None:
        self._delete(f"/orgs/{_segment(org)}/tokens/{_segment(token_id)}")
