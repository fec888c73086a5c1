"""Helpers of the usage tests: an environment made through the API, the figures of a usage row."""

from __future__ import annotations

from typing import Any

from tests.support.orgs import Org


async def make_env(org: Org, project_id: str, env_id: str) -> dict[str, Any]:
    """Environment ``project_id/env_id`` of type development (the type and project made if missing)."""
    for path, body in [("/env-types", {"id": "development"}), ("/projects", {"id": project_id})]:
        response = await org.admin.post(f"/orgs/{org.id}{path}", json=body)
        assert response.status_code in (201, 409), response.text
    created = await org.admin.post(
        f"/orgs/{org.id}/projects/{project_id}/envs", json={"id": env_id, "env_type_id": "development"}
    )
    assert 201 == created.status_code, created.text
    env: dict[str, Any] = created.json()
    return env


def figures(item: dict[str, Any]) -> tuple[float, float, float, int]:
    """A usage row's (or total's) runner minutes, managed, self-hosted, and deployment count."""
    return (
        item["runnerMinutes"],
        item["runnerMinutesManaged"],
        item["runnerMinutesSelfHosted"],
        item["deployments"],
    )
