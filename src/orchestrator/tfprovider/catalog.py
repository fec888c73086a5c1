"""Projects, environment types and environments: resources and data sources."""

from __future__ import annotations

import asyncio
import time

from orchestrator.tfprovider.resource import SourceSpec, Spec
from orchestrator.tfprovider.schema import a_bool, a_str
from orchestrator.tfprovider.session import ApiProblem, Session
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


# -- environment types ------------------------------------------------------------------------------


async def _create_env_type(session: Session, config: JsonDict) -> JsonDict:
    body = {"id": config["id"], "display_name": config.get("display_name")}
    return await session.call(
        f"create environment type {config['id']!r}", session.client.create_env_type, session.org, body
    )


async def _read_env_type(session: Session, keys: JsonDict) -> JsonDict | None:
    return await session.find(
        f"read environment type {keys['id']!r}", session.client.get_env_type, session.org, keys["id"]
    )


async def _update_env_type(session: Session, config: JsonDict, prior: JsonDict) -> JsonDict:
    patch = {"display_name": config.get("display_name") or prior.get("display_name") or config["id"]}
    return await session.call(
        f"update environment type {config['id']!r}",
        session.client.update_env_type,
        session.org,
        config["id"],
        patch,
    )


async def _delete_env_type(session: Session, state: JsonDict) -> None:
    await session.call(
        f"delete environment type {state['id']!r}", session.client.delete_env_type, session.org, state["id"]
    )


def _env_type_state(found: JsonDict, prior: JsonDict) -> JsonDict:
    return {"id": found["id"], "uuid": found.get("uuid"), "display_name": found.get("display_name")}


ENVIRONMENT_TYPE = Spec(
    name="environment_type",
    description="An environment type (development, production...): environments are of one type.",
    attributes={
        "id": a_str(required=True, requires_replace=True, description="The environment type id."),
        "display_name": a_str(optional=True, computed=True, description="Defaults to the id."),
        "uuid": a_str(computed=True),
    },
    create=_create_env_type,
    read=_read_env_type,
    update=_update_env_type,
    delete=_delete_env_type,
    to_state=_env_type_state,
)

ENVIRONMENT_TYPE_SOURCE = SourceSpec(
    name="environment_type",
    attributes={
        "id": a_str(required=True),
        "display_name": a_str(computed=True),
        "uuid": a_str(computed=True),
    },
    read=_read_env_type,
    to_state=_env_type_state,
)


# -- environments -----------------------------------------------------------------------------------

#: How long deleting an environment waits for its destroy deployment, and how often it looks.
ENV_DELETE_TIMEOUT_SECONDS = 3600.0
ENV_DELETE_POLL_SECONDS = 1.0


def _env_name(values: JsonDict) -> str:
    return f"{values['project_id']}/{values['id']}"


async def _create_env(session: Session, config: JsonDict) -> JsonDict:
    body = {
        "id": config["id"],
        "env_type_id": config["env_type_id"],
        "display_name": config.get("display_name"),
    }
    return await session.call(
        f"create environment {_env_name(config)!r}",
        session.client.create_env,
        session.org,
        config["project_id"],
        body,
    )


async def _read_env(session: Session, keys: JsonDict) -> JsonDict | None:
    return await session.find(
        f"read environment {_env_name(keys)!r}",
        session.client.get_env,
        session.org,
        keys["project_id"],
        keys["id"],
    )


async def _update_env(session: Session, config: JsonDict, prior: JsonDict) -> JsonDict:
    patch = {"display_name": config.get("display_name") or prior.get("display_name") or config["id"]}
    return await session.call(
        f"update environment {_env_name(config)!r}",
        session.client.update_env,
        session.org,
        config["project_id"],
        config["id"],
        patch,
    )


async def _wait_until_gone(session: Session, state: JsonDict) -> None:
    """Poll the environment a destroy deployment is deleting until it is gone (or its deletion failed)."""
    name = _env_name(state)
    deadline = time.monotonic() + ENV_DELETE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        await asyncio.sleep(ENV_DELETE_POLL_SECONDS)
        env = await _read_env(session, state)
        if env is None:
            return
        if env.get("status") == "delete_failed":
            raise ApiProblem(
                f"delete environment {name!r}: the destroy deployment failed",
                str(env.get("status_message") or "no message"),
            )
    raise ApiProblem(
        f"delete environment {name!r}: timed out",
        f"its destroy deployment still runs after {ENV_DELETE_TIMEOUT_SECONDS:.0f} s; "
        "delete it again later, or set force_delete = true to leave its infrastructure behind",
    )


async def _delete_env(session: Session, state: JsonDict) -> None:
    name = _env_name(state)
    deleting = await session.call(
        f"delete environment {name!r}",
        session.client.delete_env,
        session.org,
        state["project_id"],
        state["id"],
        force=bool(state.get("force_delete")),
    )
    if deleting is not None:  # 202: a destroy deployment runs first
        await _wait_until_gone(session, state)
    if state.get("delete_rules"):
        rules = await session.call(
            f"list the module rules of environment {name!r}",
            lambda: session.client.list_module_rules(
                session.org, project_id=state["project_id"], env_id=state["id"]
            ),
        )
        for rule in rules:
            if rule.get("env_id") == state["id"]:
                await session.call(
                    f"delete module rule {rule['id']!r}",
                    session.client.delete_module_rule,
                    session.org,
                    rule["id"],
                )


def env_state(found: JsonDict, prior: JsonDict) -> JsonDict:
    return {
        "id": found["id"],
        "project_id": found["project_id"],
        "env_type_id": found.get("env_type_id"),
        "display_name": found.get("display_name"),
        "uuid": found.get("uuid"),
        "status": found.get("status"),
        "status_message": found.get("status_message"),
        "runner_id": found.get("runner_id"),
        "force_delete": prior.get("force_delete"),
        "delete_rules": prior.get("delete_rules"),
    }


def env_import_id(import_id: str) -> JsonDict:
    """``project_id/env_id``, as upstream's provider imports an environment."""
    project_id, slash, env_id = import_id.partition("/")
    if not slash or not project_id or not env_id or "/" in env_id:
        raise ValueError(f"the import id must be PROJECT_ID/ENV_ID, not {import_id!r}")
    return {"project_id": project_id, "id": env_id}


_ENV_COMPUTED = {
    "uuid": a_str(computed=True),
    "status": a_str(computed=True, description="active, deleting or delete_failed."),
    "status_message": a_str(computed=True),
    "runner_id": a_str(computed=True, description="The runner the environment's runner rules selected."),
}

ENVIRONMENT = Spec(
    name="environment",
    description="An environment of a project; deleting it runs a destroy deployment first.",
    attributes={
        "id": a_str(required=True, requires_replace=True, description="The environment id."),
        "project_id": a_str(required=True, requires_replace=True),
        "env_type_id": a_str(required=True, requires_replace=True),
        "display_name": a_str(optional=True, computed=True, description="Defaults to the id."),
        "force_delete": a_bool(
            optional=True, description="Delete without a destroy deployment (its infrastructure stays)."
        ),
        "delete_rules": a_bool(
            optional=True, description="Delete the module rules of this environment with it."
        ),
        **_ENV_COMPUTED,
    },
    create=_create_env,
    read=_read_env,
    update=_update_env,
    delete=_delete_env,
    to_state=env_state,
    import_id=env_import_id,
)

ENVIRONMENT_SOURCE = SourceSpec(
    name="environment",
    attributes={
        "id": a_str(required=True),
        "project_id": a_str(required=True),
        "env_type_id": a_str(computed=True),
        "display_name": a_str(computed=True),
        **_ENV_COMPUTED,
    },
    read=_read_env,
    to_state=env_state,
)

RESOURCES = (PROJECT, ENVIRONMENT_TYPE, ENVIRONMENT)
DATA_SOURCES = (PROJECT_SOURCE, ENVIRONMENT_TYPE_SOURCE, ENVIRONMENT_SOURCE)
