"""Projects (and, as they are added, the other catalogue objects): resources and data sources."""

from __future__ import annotations

from pyvider.schema import a_bool, a_str

from orchestrator.tfprovider.resource import SourceSpec, Spec
from orchestrator.tfprovider.session import Session
from orchestrator.tfprovider.values import JsonDict


async def _create_project(session: Session, config: JsonDict) -> JsonDict:
    body = {"id": config["id"], "display_name": config.get("display_name")}
    return await session.call(
        f"create project {config['id']!r}", session.client.create_project, session.org, body
    )


async def _read_project(session: Session, keys: JsonDict) -> JsonDict | None:
    return await session.find(
        f"read project {keys['id']!r}", session.client.get_project, session.org, keys["id"]
    )


async def _update_project(session: Session, config: JsonDict, prior: JsonDict) -> JsonDict:
    patch = {"display_name": config.get("display_name") or config["id"]}
    return await session.call(
        f"update project {config['id']!r}", session.client.update_project, session.org, config["id"], patch
    )


async def _delete_project(session: Session, state: JsonDict) -> None:
    await session.call(
        f"delete project {state['id']!r}",
        session.client.delete_project,
        session.org,
        state["id"],
        delete_rules=bool(state.get("delete_rules")),
    )


def _project_state(found: JsonDict, prior: JsonDict) -> JsonDict:
    return {
        "id": found["id"],
        "uuid": found.get("uuid"),
        "display_name": found.get("display_name"),
        "status": found.get("status"),
        "delete_rules": prior.get("delete_rules"),
    }


PROJECT = Spec(
    name="project",
    description="A project: a group of environments.",
    attributes={
        "id": a_str(required=True, requires_replace=True, description="The project id."),
        "display_name": a_str(optional=True, computed=True, description="Defaults to the id."),
        "uuid": a_str(computed=True),
        "status": a_str(computed=True),
        "delete_rules": a_bool(optional=True, description="Delete the project's rules with it."),
    },
    create=_create_project,
    read=_read_project,
    update=_update_project,
    delete=_delete_project,
    to_state=_project_state,
)

PROJECT_SOURCE = SourceSpec(
    name="project",
    attributes={
        "id": a_str(required=True),
        "display_name": a_str(computed=True),
        "uuid": a_str(computed=True),
        "status": a_str(computed=True),
    },
    read=_read_project,
    to_state=_project_state,
)

RESOURCES = (PROJECT,)
DATA_SOURCES = (PROJECT_SOURCE,)
