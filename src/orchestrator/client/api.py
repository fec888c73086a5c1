"""``ApiClient``: a synchronous httpx client of the orchestrator's user API, as ``octl`` uses it.

Every method maps one API operation (control plane, module catalogue, deployments); list methods follow
``next_page_token`` and answer every item. A non-2xx answer raises :class:`ApiError`, an unreachable
server :class:`ApiConnectionError`.
The transport is injectable (``httpx.MockTransport``, a WSGI app, the network), as in httpx. Built on
``client.http`` (TLS, retries) and ``client.errors`` (the error tree ``ApiError`` belongs to).

This module imports no server code: the CLI ships without the ``server`` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast
from urllib.parse import quote

import httpx

from orchestrator.client import sse
from orchestrator.client.errors import (
    AuthError,
    ClientError,
    UnavailableError,
    read_answer,
    transport_failure,
)
from orchestrator.client.http import Backoff, Connection, Retry
from orchestrator.client.tls import GatewayTls

JsonObject = dict[str, Any]

#: Items asked for per page when listing; the server caps it at 1000.
DEFAULT_PAGE_SIZE = 100
DEFAULT_TIMEOUT_SECONDS = 30.0
#: How long one wait-for-complete call may hold the request open on the server (it allows 2 to 60).
DEFAULT_WAIT_SECONDS = 30
#: Extra time the HTTP request of a long poll gets beyond the server's own wait.
LONG_POLL_MARGIN_SECONDS = 15.0
#: A followed log stream that sends nothing this long (three of the server's 15 s keep-alives) is taken
#: for dropped.
FOLLOW_READ_TIMEOUT_SECONDS = 45.0
#: Tries of a deployment POST that carries an Idempotency-Key when the connection fails; the same key
#: makes a repeat safe (the server answers the deployment the first try created).
CREATE_ATTEMPTS = 3
#: The wait before the second try; it doubles before each further one.
CREATE_RETRY_DELAY_SECONDS = 0.5

Params = Mapping[str, str | Sequence[str] | None]

#: Short names of the HTTP error classes, as the CLI prints them ("conflict: ...").
STATUS_KINDS: Mapping[int, str] = {
    400: "bad request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not found",
    405: "method not allowed",
    408: "request timeout",
    409: "conflict",
    413: "payload too large",
    422: "unprocessable request",
    429: "too many requests",
}


class ApiError(ClientError):
    """The API answered with an error."""

    def __init__(
        self, status: int, code: str, message: str, *, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, status_code=status, error=code, details=details)

    @property
    def status(self) -> int:
        """The HTTP status code."""
        return self.status_code or 0

    @property
    def kind(self) -> str:
        """A short name of the error class: ``conflict``, ``not found``, ``server error``, ..."""
        if self.status in STATUS_KINDS:
            return STATUS_KINDS[self.status]
        return "server error" if self.status >= 500 else f"HTTP {self.status}"

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class ApiAuthError(ApiError, AuthError):
    """The API refused the token (401) or its role (403)."""


class ApiConnectionError(UnavailableError):
    """The API could not be reached; ``certificate``: its certificate did not verify."""

    certificate: bool = False


def _segment(value: str) -> str:
    # Ids go into the path; quoting keeps "a/b" or ".." from addressing another resource.
    return quote(value, safe="")


def _error_from(response: httpx.Response) -> ApiError:
    answer = read_answer(response)
    status = response.status_code
    error = ApiAuthError if status in (401, 403) else ApiError
    if answer.message is not None:
        return error(status, answer.error or f"API-{status}", answer.message, details=answer.details)
    text = answer.text.splitlines()[0][:200] if answer.text else ""
    return error(status, f"API-{status}", text or response.reason_phrase)


class ApiClient:
    """A client of one control-plane API with one bearer token (``None`` sends no Authorization)."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        ca_pem: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        on_request: Callable[[httpx.Request], None] | None = None,
        on_response: Callable[[httpx.Response], None] | None = None,
    ) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"invalid API URL '{base_url}': it must be http(s)://host[:port]")
        self.base_url = str(base_url).rstrip("/")
        self.page_size = page_size
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        connection = Connection(
            base_url=self.base_url,
            user_agent="octl",
            timeout_seconds=timeout,
            headers=headers,
            tls=GatewayTls(ca_pem=ca_pem) if ca_pem else None,
        )
        self._http = connection.client(transport, on_request=on_request, on_response=on_response)

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
        params: Params | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        query = {k: v if isinstance(v, str) else list(v) for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(
                method,
                path,
                params=query,
                json=body,
                headers=headers,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TimeoutException as exc:
            raise ApiConnectionError(f"cannot reach the API at {self.base_url}: timed out") from exc
        except httpx.TransportError as exc:
            failure = transport_failure(exc)
            if failure.kind == "certificate":
                error = ApiConnectionError(f"cannot reach the API at {self.base_url}: {failure.reason}")
                error.certificate = True
                raise error from exc
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

    def _pages(
        self, path: str, params: Params | None = None, limit: int | None = None
    ) -> Iterator[JsonObject]:
        per_page = self.page_size if limit is None else max(1, min(self.page_size, limit))
        query: dict[str, str | Sequence[str] | None] = {**(params or {}), "per_page": str(per_page)}
        left = limit
        while True:
            page = self._object("GET", path, params=query)
            items = page.get("items")
            if not isinstance(items, list):
                raise ApiError(200, "API-000", f"the API answered a list without items at {path}")
            if left is not None:
                items = items[:left]
                left -= len(items)
            yield from items
            token = page.get("next_page_token")
            if not token or left == 0:
                return
            query["page"] = str(token)

    def _list(self, path: str, params: Params | None = None, limit: int | None = None) -> list[JsonObject]:
        """Every item of a paged list (the first ``limit`` with one), in the server's order; ``None``
        parameters are left out."""
        return list(self._pages(path, params, limit))

    # -- organizations --------------------------------------------------------------------------------

    def create_org(self, org_id: str | None = None) -> JsonObject:
        return self._object("POST", "/orgs", body={"id": org_id} if org_id else {})

    def get_org(self, org: str) -> JsonObject:
        return self._object("GET", f"/orgs/{_segment(org)}")

    def list_orgs(self) -> list[JsonObject]:
        return self._list("/orgs")

    # -- managed runner registration credentials (platform admin) ---------------------------------------

    def create_managed_registration(self, body: JsonObject) -> JsonObject:
        """A registration credential; the answer holds its ``secret``, which is never answered again."""
        return self._object("POST", "/managed-runner-registrations", body=body)

    def list_managed_registrations(self) -> list[JsonObject]:
        return self._list("/managed-runner-registrations")

    def delete_managed_registration(self, registration_id: str) -> None:
        self._delete(f"/managed-runner-registrations/{_segment(registration_id)}")

    # -- runners --------------------------------------------------------------------------------------

    def create_runner(self, org: str, body: JsonObject) -> JsonObject:
        return self._object("POST", f"/orgs/{_segment(org)}/runners", body=body)

    def get_runner(self, org: str, runner_id: str) -> JsonObject:
        return self._object("GET", f"/orgs/{_segment(org)}/runners/{_segment(runner_id)}")

    def list_runners(
        self, org: str, *, include_managed: bool = False, limit: int | None = None
    ) -> list[JsonObject]:
        """The runners; with ``include_managed`` the managed pool too (ours: upstream ignores it)."""
        params = {"include_managed": "true"} if include_managed else None
        return self._list(f"/orgs/{_segment(org)}/runners", params, limit)

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

    def list_projects(self, org: str, *, limit: int | None = None) -> list[JsonObject]:
        return self._list(f"/orgs/{_segment(org)}/projects", limit=limit)

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
        self,
        org: str,
        project_id: str | None = None,
        *,
        env_type_id: str | None = None,
        limit: int | None = None,
    ) -> list[JsonObject]:
        """The environments of one project, or of the whole organization when ``project_id`` is None."""
        path = self._env_path(org, project_id) if project_id is not None else f"/orgs/{_segment(org)}/envs"
        return self._list(path, {"byEnvTypeId": env_type_id}, limit)

    def update_env(self, org: str, project_id: str, env_id: str, patch: JsonObject) -> JsonObject:
        return self._object("PATCH", self._env_path(org, project_id, env_id), body=patch)

    def delete_env(
        self,
        org: str,
        project_id: str,
        env_id: str,
        *,
        force: bool = False,
        logs_recipient: str | None = None,
    ) -> JsonObject | None:
        """Delete an environment: None when it is gone (204), else the environment, ``deleting`` while
        its destroy deployment runs (202). ``logs_recipient``: the age public key the destroy's logs are
        encrypted to (kept only then)."""
        params = {"force": "true"} if force else {}
        if logs_recipient is not None:
            params["encrypted_logs_recipient"] = logs_recipient
        response = self._send("DELETE", self._env_path(org, project_id, env_id), params=params or None)
        if response.status_code == 202:
            data: JsonObject = response.json()
            return data
        return None

    def refresh_runner(self, org: str, project_id: str, env_id: str, *, dry_run: bool) -> JsonObject:
        """Re-link the environment to the runner its rules select: ``{runner_id, updated}``."""
        return self._object(
            "POST",
            f"{self._env_path(org, project_id, env_id)}/actions/refresh_runner",
            params={"dry_run": "true" if dry_run else "false"},
        )

    # -- state versions (state storage orchestrator) ---------------------------------------------------

    def _state_versions_path(self, org: str, project_id: str, env_id: str, version: int | None = None) -> str:
        path = f"{self._env_path(org, project_id, env_id)}/state-versions"
        return f"{path}/{int(version)}" if version is not None else path

    def list_state_versions(self, org: str, project_id: str, env_id: str) -> list[JsonObject]:
        """The environment's Terraform state versions, newest (the current state) first."""
        return self._list(self._state_versions_path(org, project_id, env_id))

    def current_state_version(self, org: str, project_id: str, env_id: str) -> JsonObject | None:
        """The newest version (the current state), or None when the environment has no state yet."""
        page = self._object(
            "GET", self._state_versions_path(org, project_id, env_id), params={"per_page": "1"}
        )
        items = page.get("items")
        if not isinstance(items, list):
            raise ApiError(200, "API-000", "the API answered a list without items")
        return items[0] if items else None

    def get_state_version(self, org: str, project_id: str, env_id: str, version: int) -> JsonObject:
        return self._object("GET", self._state_versions_path(org, project_id, env_id, version))

    def download_state_version(self, org: str, project_id: str, env_id: str, version: int) -> bytes:
        """The state document of a version, decrypted by the server, as Terraform wrote it (admins only)."""
        return self._send(
            "GET", f"{self._state_versions_path(org, project_id, env_id, version)}/download"
        ).content

    def rollback_state_version(self, org: str, project_id: str, env_id: str, version: int) -> JsonObject:
        """Make ``version`` the environment's current state again; the new version it was written as."""
        return self._object(
            "POST", f"{self._state_versions_path(org, project_id, env_id, version)}/actions/rollback"
        )

    # -- tokens ---------------------------------------------------------------------------------------

    def create_token(self, org: str, body: JsonObject) -> JsonObject:
        """A new API token; the answer holds the secret ``token``, which is never answered again."""
        return self._object("POST", f"/orgs/{_segment(org)}/tokens", body=body)

    def list_tokens(self, org: str) -> list[JsonObject]:
        return self._list(f"/orgs/{_segment(org)}/tokens")

    def delete_token(self, org: str, token_id: str) -> None:
        self._delete(f"/orgs/{_segment(org)}/tokens/{_segment(token_id)}")

    # -- resource types -------------------------------------------------------------------------------

    def create_resource_type(self, org: str, body: JsonObject) -> JsonObject:
        return self._object("POST", f"/orgs/{_segment(org)}/resource-types", body=body)

    def get_resource_type(self, org: str, type_id: str) -> JsonObject:
        return self._object("GET", f"/orgs/{_segment(org)}/resource-types/{_segment(type_id)}")

    def list_resource_types(self, org: str) -> list[JsonObject]:
        return self._list(f"/orgs/{_segment(org)}/resource-types")

    def update_resource_type(self, org: str, type_id: str, patch: JsonObject) -> JsonObject:
        return self._object("PATCH", f"/orgs/{_segment(org)}/resource-types/{_segment(type_id)}", body=patch)

    def delete_resource_type(self, org: str, type_id: str) -> None:
        self._delete(f"/orgs/{_segment(org)}/resource-types/{_segment(type_id)}")

    def list_available_resource_types(
        self, org: str, project_id: str, env_id: str, *, include_non_developer_accessible: bool = False
    ) -> list[JsonObject]:
        """The resource types a deployment to the environment can request, with the modules serving them."""
        return self._list(
            f"{self._env_path(org, project_id, env_id)}/available-resource-types",
            {"include_non_developer_accessible": "true" if include_non_developer_accessible else None},
        )

    # -- module providers -----------------------------------------------------------------------------

    def _provider_path(self, org: str, provider_type: str, provider_id: str) -> str:
        return f"/orgs/{_segment(org)}/module-providers/{_segment(provider_type)}/{_segment(provider_id)}"

    def create_module_provider(self, org: str, body: JsonObject) -> JsonObject:
        """A module provider; the body names both ``provider_type`` and ``id``."""
        return self._object("POST", f"/orgs/{_segment(org)}/module-providers", body=body)

    def get_module_provider(self, org: str, provider_type: str, provider_id: str) -> JsonObject:
        return self._object("GET", self._provider_path(org, provider_type, provider_id))

    def list_module_providers(self, org: str, *, provider_type: str | None = None) -> list[JsonObject]:
        return self._list(f"/orgs/{_segment(org)}/module-providers", {"byProviderType": provider_type})

    def update_module_provider(
        self, org: str, provider_type: str, provider_id: str, patch: JsonObject
    ) -> JsonObject:
        return self._object("PATCH", self._provider_path(org, provider_type, provider_id), body=patch)

    def delete_module_provider(self, org: str, provider_type: str, provider_id: str) -> None:
        self._delete(self._provider_path(org, provider_type, provider_id))

    # -- modules --------------------------------------------------------------------------------------

    def create_module(self, org: str, body: JsonObject) -> JsonObject:
        return self._object("POST", f"/orgs/{_segment(org)}/modules", body=body)

    def get_module(self, org: str, module_id: str) -> JsonObject:
        return self._object("GET", f"/orgs/{_segment(org)}/modules/{_segment(module_id)}")

    def list_modules(self, org: str, *, resource_type: str | None = None) -> list[JsonObject]:
        return self._list(f"/orgs/{_segment(org)}/modules", {"byResourceType": resource_type})

    def update_module(self, org: str, module_id: str, patch: JsonObject) -> JsonObject:
        """A new version of the module: the fields given replace the current ones."""
        return self._object("PATCH", f"/orgs/{_segment(org)}/modules/{_segment(module_id)}", body=patch)

    def delete_module(self, org: str, module_id: str) -> None:
        self._delete(f"/orgs/{_segment(org)}/modules/{_segment(module_id)}")

    def list_module_versions(self, org: str, module_id: str) -> list[JsonObject]:
        return self._list(f"/orgs/{_segment(org)}/modules/{_segment(module_id)}/versions")

    def get_module_version(self, org: str, module_id: str, version_id: str) -> JsonObject:
        return self._object(
            "GET", f"/orgs/{_segment(org)}/modules/{_segment(module_id)}/versions/{_segment(version_id)}"
        )

    # -- module rules ---------------------------------------------------------------------------------

    def create_module_rule(self, org: str, body: JsonObject) -> JsonObject:
        return self._object("POST", f"/orgs/{_segment(org)}/module-rules", body=body)

    def get_module_rule(self, org: str, rule_id: str) -> JsonObject:
        return self._object("GET", f"/orgs/{_segment(org)}/module-rules/{_segment(rule_id)}")

    def list_module_rules(
        self,
        org: str,
        *,
        resource_type: str | None = None,
        module_id: str | None = None,
        project_id: str | None = None,
        env_id: str | None = None,
    ) -> list[JsonObject]:
        """Module rules; ``env_id`` filters only with ``project_id`` (the server refuses it alone)."""
        return self._list(
            f"/orgs/{_segment(org)}/module-rules",
            {
                "byResourceType": resource_type,
                "byModuleId": module_id,
                "byProjectId": project_id,
                "byEnvId": env_id,
            },
        )

    def delete_module_rule(self, org: str, rule_id: str) -> None:
        self._delete(f"/orgs/{_segment(org)}/module-rules/{_segment(rule_id)}")

    # -- deployments ----------------------------------------------------------------------------------

    def _deployment_path(self, org: str, deployment_id: str) -> str:
        return f"/orgs/{_segment(org)}/deployments/{_segment(deployment_id)}"

    def create_deployment(
        self,
        org: str,
        body: JsonObject,
        *,
        idempotency_key: str | None = None,
        on_retry: Callable[[ApiConnectionError], None] | None = None,
    ) -> JsonObject:
        """Create a deployment: the Deployment (201, also when ``idempotency_key`` named an existing one),
        or ``{runner_id, diff, tf}`` for a dry run (``is_dry_run``).

        With an ``idempotency_key`` a POST whose connection failed is sent again with the same key (up to
        :data:`CREATE_ATTEMPTS` tries): if the first one reached the server, the repeat answers the same
        deployment instead of creating a second. A dry run, which changes nothing, is repeated too. Without
        a key nothing else is repeated.
        """
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        retry = Retry(
            attempts=CREATE_ATTEMPTS if idempotency_key or body.get("is_dry_run") is True else 1,
            backoff=Backoff(first_seconds=CREATE_RETRY_DELAY_SECONDS),
            on=ApiConnectionError,
        )
        path = f"/orgs/{_segment(org)}/deployments"
        return retry.call(
            lambda: self._object("POST", path, body=body, headers=headers),
            on_retry=None if on_retry is None else lambda exc: on_retry(cast(ApiConnectionError, exc)),
        )

    def get_deployment(self, org: str, deployment_id: str) -> JsonObject:
        return self._object("GET", self._deployment_path(org, deployment_id))

    def list_deployments(
        self,
        org: str,
        *,
        project_id: str | None = None,
        env_id: str | None = None,
        modes: Sequence[str] = (),
        statuses: Sequence[str] = (),
        limit: int | None = None,
    ) -> list[JsonObject]:
        """Deployments, newest first (the newest ``limit``); several ``modes`` or ``statuses`` match any."""
        return self._list(
            f"/orgs/{_segment(org)}/deployments",
            {
                "project_id": project_id,
                "env_id": env_id,
                "by_mode[]": list(modes) or None,
                "by_status[]": list(statuses) or None,
            },
            limit,
        )

    def wait_for_deployment(
        self, org: str, deployment_id: str, *, timeout_seconds: int = DEFAULT_WAIT_SECONDS
    ) -> JsonObject | None:
        """The deployment once it is final, or None if it still executes after ``timeout_seconds``
        (a long poll: call again)."""
        try:
            return self._object(
                "GET",
                f"{self._deployment_path(org, deployment_id)}/actions/wait-for-complete",
                params={"timeout_in_seconds": str(timeout_seconds)},
                timeout=timeout_seconds + LONG_POLL_MARGIN_SECONDS,
            )
        except ApiError as exc:
            if exc.status == 408:
                return None
            raise

    def cancel_deployment(self, org: str, deployment_id: str) -> JsonObject:
        """Cancel an executing deployment: answered ``cancelled`` when it had not started, else still
        ``executing`` while its run is stopped (wait for it with :meth:`wait_for_deployment`); an
        ``ApiError`` 409 when it already ended."""
        return self._object("POST", f"{self._deployment_path(org, deployment_id)}/actions/cancel")

    def get_deployment_tf(self, org: str, deployment_id: str) -> str:
        """The compiled root module (main.tf) the deployment ran."""
        return self._send("GET", f"{self._deployment_path(org, deployment_id)}/tf").text

    def get_encrypted_outputs(self, org: str, deployment_id: str) -> str:
        """The deployment's outputs: base64 age ciphertext of a JSON object, for its outputs recipient."""
        raw = self._object("GET", f"{self._deployment_path(org, deployment_id)}/encrypted-outputs").get("raw")
        if not isinstance(raw, str):
            raise ApiError(200, "API-000", "the API answered encrypted outputs without 'raw'")
        return raw

    def get_deployment_logs(self, org: str, deployment_id: str, *, decrypt_key: str | None = None) -> str:
        """The runner's logs: base64 age ciphertext, or plain text when the server is given ``decrypt_key``
        (the identity travels to the server in the ``DecryptKey`` header)."""
        return self._send(
            "GET",
            f"{self._deployment_path(org, deployment_id)}/actions/get-logs",
            headers={"DecryptKey": decrypt_key} if decrypt_key else None,
        ).text

    def get_deployment_log_chunks(
        self, org: str, deployment_id: str, *, after: int = 0, limit: int | None = None
    ) -> JsonObject:
        """The live log's chunks after ``after``: ``{items: [LogChunk...], last_seq, complete, status,
        whole_log}`` (ciphertext only)."""
        params = {"after": str(after), "limit": None if limit is None else str(limit)}
        return self._object("GET", f"{self._deployment_path(org, deployment_id)}/logs", params=params)

    def follow_deployment_logs(
        self,
        org: str,
        deployment_id: str,
        *,
        after: int = 0,
        read_timeout_seconds: float = FOLLOW_READ_TIMEOUT_SECONDS,
    ) -> Iterator[sse.ServerSentEvent]:
        """The live log as server-sent events (``chunk``, ``phase``, ``log``, ``end``), from the chunk after
        ``after`` (sent as ``Last-Event-ID`` too). The stream ends after ``end``, or raises
        :class:`ApiConnectionError` when the connection drops or stays silent ``read_timeout_seconds``
        (the server sends a keep-alive every 15 s): reconnect with the last ``seq`` seen."""
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
        timeout = httpx.Timeout(
            self._http.timeout.connect or DEFAULT_TIMEOUT_SECONDS, read=read_timeout_seconds
        )
        path = f"{self._deployment_path(org, deployment_id)}/logs"
        try:
            with self._http.stream(
                "GET", path, params={"follow": "true", "after": str(after)}, headers=headers, timeout=timeout
            ) as response:
                if not response.is_success:
                    response.read()
                    raise _error_from(response)
                yield from sse.parse(response.iter_lines())
        except httpx.TimeoutException as exc:
            raise ApiConnectionError(
                f"the log stream of deployment {deployment_id} stayed silent {read_timeout_seconds:g} s"
            ) from exc
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise ApiConnectionError(
                f"the log stream of deployment {deployment_id} broke off: {reason}"
            ) from exc

    # -- usage ----------------------------------------------------------------------------------------

    def get_usage(self, org: str, *, start: str | None = None, end: str | None = None) -> JsonObject:
        """Runner minutes of the organization from ``start`` to ``end`` (RFC 3339 or dates; the server's
        defaults: the current calendar month, UTC)."""
        return self._object("GET", f"/orgs/{_segment(org)}/usage", params={"from": start, "to": end})

    def get_usage_csv(self, org: str, *, start: str | None = None, end: str | None = None) -> str:
        """The same as CSV: a header row and one row per project and environment (RFC 4180)."""
        return self._send(
            "GET",
            f"/orgs/{_segment(org)}/usage",
            params={"from": start, "to": end, "format": "csv"},
            headers={"Accept": "text/csv"},
        ).text
