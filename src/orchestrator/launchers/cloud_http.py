"""What the ``requests``-based cloud sources (``gke``, ``aks``) share for their JSON API calls: a bearer
request whose failure to connect is a retryable :class:`LaunchError` naming the API, the JSON object of
a 200 answer, the ``error`` object of an error answer, and :func:`refused`, which statuses of an error
answer are final. What an error says is the caller's: each cloud words its errors its own way.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import requests

from orchestrator.launchers.base import fail, shortened, transient
from orchestrator.launchers.kubernetes_cloud import redacted

__all__ = ["bearer_request", "error_object", "json_object", "refused"]


def bearer_request(
    session: requests.Session,
    method: str,
    url: str,
    *,
    token: str,
    timeout: float,
    api: str,
    where: str,
    secrets: list[str],
    params: dict[str, str] | None = None,
) -> requests.Response:
    """``method url`` with ``token`` as bearer, asking for JSON; a :class:`LaunchError` "cannot reach
    ``api`` at ``where``" (retryable, ``secrets`` redacted) when no answer comes."""
    try:
        return session.request(
            method,
            url,
            params=params,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
        )
    except requests.RequestException as exc:
        fail(
            f"cannot reach {api} at {where}: {shortened(redacted(str(exc), secrets))}",
            retryable=True,
            cause=exc,
        )


def json_object(response: requests.Response, *, not_json: str, not_object: str) -> dict[str, Any]:
    """The JSON object a 200 answer holds; a retryable :class:`LaunchError` ``not_json`` or
    ``not_object`` when it holds something else."""
    try:
        body = response.json()
    except ValueError as exc:
        fail(not_json, retryable=True, cause=exc)
    if isinstance(body, dict):
        return body
    fail(not_object, retryable=True)


def error_object(body: str) -> dict[str, Any] | None:
    """The ``error`` object of a Google or Azure API error body (``{"error": {...}}``); None for any other
    body (it is not quoted)."""
    try:
        error = json.loads(body).get("error") if body else None
    except (ValueError, AttributeError):
        return None
    return error if isinstance(error, dict) else None


def refused(code: int, *, not_found: str, refusal: str, denied: str) -> NoReturn:
    """Raise the :class:`LaunchError` of an error answer of status ``code``: ``not_found`` for a 404
    (final); else ``refusal``, followed by ``denied`` (the permission it needs) for a 401 or a 403,
    retryable when :func:`transient`."""
    if code == 404:
        fail(not_found, retryable=False)
    fail(refusal + (denied if code in (401, 403) else ""), retryable=transient(code))
