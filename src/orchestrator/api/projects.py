"""Environment types, projects, environments and the refresh_runner action."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import pyrage
from fastapi import APIRouter, Body, Depends, Query, Response
from fastapi.responses import JSONResponse

from orchestrator.api import schemas
from orchestrator.api.context import DEPLOY, MANAGE, READ, Principal
from orchestrator.api.paging import PageRequest, page_out, page_request
from orchestrator.dispatch import environments, links
from orchestrator.errors import InvalidInputError, NotFoundError, found
from orchestrator.store import projects as store
from orchestrator.web.services import Services, services, transaction

router = APIRouter()


@router.get(
    "/orgs/{org_id}/env-types",
    response_model=schemas.PageOf[schemas.EnvironmentTypeOut],
    tags=["EnvironmentType"],
)
async def list_env_types(
    org_id: str,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[schemas.EnvironmentTypeOut]:
    async with svc.reader.connect() as conn:
        result = await store.list_env_types(conn, org_id, after=page.after, limit=page.limit)
    return page_out(result, schemas.EnvironmentTypeOut.of)


@router.post(
    "/orgs/{org_id}/env-types",
    status_code=201,
    response_model=schemas.EnvironmentTypeOut,
    tags=["EnvironmentType"],
)
async def create_env_type(
    org_id: str,
    body: schemas.EnvironmentTypeCreateBody,
    _: Principal = MANAGE,
    svc: Services = Depends(services),
) -> schemas.EnvironmentTypeOut:
    async with transaction(svc) as conn:
        env_type = await store.create_env_type(conn, org_id, body.id, body.display_name or body.id)
    return schemas.EnvironmentTypeOut.of(env_type)


@router.get(
    "/orgs/{org_id}/env-types/{env_type_id}",
    response_model=schemas.EnvironmentTypeOut,
    tags=["EnvironmentType"],
)
async def get_env_type(
    org_id: str, env_type_id: str, _: Principal = READ, svc: Services = Depends(services)
) -> schemas.EnvironmentTypeOut:
    async with svc.reader.connect() as conn:
        env_type = await store.get_env_type(conn, org_id, env_type_id)
    return schemas.EnvironmentTypeOut.of(found(env_type, f"environment type '{env_type_id}' not found"))


@router.patch(
    "/orgs/{org_id}/env-types/{env_type_id}",
    response_model=schemas.EnvironmentTypeOut,
    tags=["EnvironmentType"],
)
async def update_env_type(
    org_id: str,
    env_type_id: str,
    body: schemas.EnvironmentTypeUpdateBody,
    _: Principal = MANAGE,
    svc: Services = Depends(services),
) -> schemas.EnvironmentTypeOut:
    async with transaction(svc) as conn:
        env_type = await store.update_env_type(conn, org_id, env_type_id, body.display_name)
    return schemas.EnvironmentTypeOut.of(found(env_type, f"environment type '{env_type_id}' not found"))


@router.delete("/orgs/{org_id}/env-types/{env_type_id}", status_code=204, tags=["EnvironmentType"])
async def delete_env_type(
    org_id: str, env_type_id: str, _: Principal = MANAGE, svc: Services = Depends(services)
) -> Response:
    async with transaction(svc) as conn:
        if not await store.delete_env_type(conn, org_id, env_type_id):
            raise NotFoundError(f"environment type '{env_type_id}' not found")
    return Response(status_code=204)


@router.get("/orgs/{org_id}/projects", response_model=schemas.PageOf[schemas.ProjectOut], tags=["Project"])
async def list_projects(
    org_id: str,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[schemas.ProjectOut]:
    async with svc.reader.connect() as conn:
        result = await store.list_projects(conn, org_id, after=page.after, limit=page.limit)
    return page_out(result, schemas.ProjectOut.of)


@router.post("/orgs/{org_id}/projects", status_code=201, response_model=schemas.ProjectOut, tags=["Project"])
async def create_project(
    org_id: str, body: schemas.ProjectCreateBody, _: Principal = MANAGE, svc: Services = Depends(services)
) -> schemas.ProjectOut:
    async with transaction(svc) as conn:
        project = await store.create_project(conn, org_id, body.id, body.display_name or body.id)
    return schemas.ProjectOut.of(project)


@router.get("/orgs/{org_id}/projects/{project_id}", response_model=schemas.ProjectOut, tags=["Project"])
async def get_project(
    org_id: str, project_id: str, _: Principal = READ, svc: Services = Depends(services)
) -> schemas.ProjectOut:
    async with svc.reader.connect() as conn:
        project = await store.get_project(conn, org_id, project_id)
    return schemas.ProjectOut.of(found(project, f"project '{project_id}' not found"))


@router.patch("/orgs/{org_id}/projects/{project_id}", response_model=schemas.ProjectOut, tags=["Project"])
async def update_project(
    org_id: str,
    project_id: str,
    body: schemas.ProjectUpdateBody,
    _: Principal = MANAGE,
    svc: Services = Depends(services),
) -> schemas.ProjectOut:
    async with transaction(svc) as conn:
        project = await store.update_project(conn, org_id, project_id, body.display_name)
    return schemas.ProjectOut.of(found(project, f"project '{project_id}' not found"))


@router.delete("/orgs/{org_id}/projects/{project_id}", status_code=204, tags=["Project"])
async def delete_project(
    org_id: str,
    project_id: str,
    delete_rules: Annotated[bool, Query(alias="deleteRules")] = False,
    _: Principal = MANAGE,
    svc: Services = Depends(services),
) -> Response:
    async with transaction(svc) as conn:
        if not await store.delete_project(conn, org_id, project_id, delete_rules=delete_rules):
            raise NotFoundError(f"project '{project_id}' not found")
    return Response(status_code=204)


@router.get(
    "/orgs/{org_id}/envs", response_model=schemas.PageOf[schemas.EnvironmentOut], tags=["Environment"]
)
async def list_org_envs(
    org_id: str,
    by_env_type_id: Annotated[list[str] | None, Query(alias="byEnvTypeId")] = None,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[schemas.EnvironmentOut]:
    async with svc.reader.connect() as conn:
        result = await store.list_envs(
            conn, org_id, project_id=None, env_type_ids=by_env_type_id, after=page.after, limit=page.limit
        )
    return page_out(result, schemas.EnvironmentOut.of)


@router.get(
    "/orgs/{org_id}/projects/{project_id}/envs",
    response_model=schemas.PageOf[schemas.EnvironmentOut],
    tags=["Environment"],
)
async def list_envs(
    org_id: str,
    project_id: str,
    by_env_type_id: Annotated[list[str] | None, Query(alias="byEnvTypeId")] = None,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[schemas.EnvironmentOut]:
    async with svc.reader.connect() as conn:
        if await store.get_project(conn, org_id, project_id) is None:
            raise NotFoundError(f"project '{project_id}' not found")
        result = await store.list_envs(
            conn,
            org_id,
            project_id=project_id,
            env_type_ids=by_env_type_id,
            after=page.after,
            limit=page.limit,
        )
    return page_out(result, schemas.EnvironmentOut.of)


@router.post(
    "/orgs/{org_id}/projects/{project_id}/envs",
    status_code=201,
    response_model=schemas.EnvironmentOut,
    tags=["Environment"],
)
async def create_env(
    org_id: str,
    project_id: str,
    body: schemas.EnvironmentCreateBody,
    _: Principal = DEPLOY,
    svc: Services = Depends(services),
) -> schemas.EnvironmentOut:
    async with transaction(svc) as conn:
        if await store.get_project(conn, org_id, project_id) is None:
            raise NotFoundError(f"project '{project_id}' not found")
        if await store.get_env_type(conn, org_id, body.env_type_id) is None:
            raise InvalidInputError(f"env_type_id: environment type '{body.env_type_id}' not found")
        env = await store.create_env(
            conn, org_id, project_id, body.id, body.env_type_id, body.display_name or body.id
        )
    return schemas.EnvironmentOut.of(env)


@router.get(
    "/orgs/{org_id}/projects/{project_id}/envs/{env_id}",
    response_model=schemas.EnvironmentOut,
    tags=["Environment"],
)
async def get_env(
    org_id: str, project_id: str, env_id: str, _: Principal = READ, svc: Services = Depends(services)
) -> schemas.EnvironmentOut:
    async with svc.reader.connect() as conn:
        env = await store.get_env(conn, org_id, project_id, env_id)
    return schemas.EnvironmentOut.of(
        found(env, f"environment '{env_id}' not found in project '{project_id}'")
    )


@router.patch(
    "/orgs/{org_id}/projects/{project_id}/envs/{env_id}",
    response_model=schemas.EnvironmentOut,
    tags=["Environment"],
)
async def update_env(
    org_id: str,
    project_id: str,
    env_id: str,
    body: schemas.EnvironmentUpdateBody,
    _: Principal = DEPLOY,
    svc: Services = Depends(services),
) -> schemas.EnvironmentOut:
    async with transaction(svc) as conn:
        if await store.get_env(conn, org_id, project_id, env_id) is None:
            raise NotFoundError(f"environment '{env_id}' not found in project '{project_id}'")
        env = await store.update_env(conn, org_id, project_id, env_id, display_name=body.display_name)
    assert env is not None
    return schemas.EnvironmentOut.of(env)


@router.delete(
    "/orgs/{org_id}/projects/{project_id}/envs/{env_id}",
    status_code=204,
    tags=["Environment"],
    responses={202: {"model": schemas.EnvironmentOut, "description": "A destroy deployment runs first."}},
)
async def delete_env(
    org_id: str,
    project_id: str,
    env_id: str,
    force: bool = False,
    encrypted_logs_recipient: Annotated[
        str | None,
        Query(
            max_length=200,
            description="An age public key the destroy deployment's runner encrypts its logs to, so that "
            "they are kept and can be read with the matching key (without it they are not kept).",
        ),
    ] = None,
    caller: Principal = DEPLOY,
    svc: Services = Depends(services),
) -> Response:
    """Delete an environment: a destroy deployment runs first (202), unless nothing was ever deployed or
    ``force`` is set (204; with force the infrastructure and its state are left behind)."""
    if encrypted_logs_recipient is not None:
        try:
            pyrage.x25519.Recipient.from_str(encrypted_logs_recipient)
        except Exception as exc:  # pyrage raises its own error types for a malformed key
            raise InvalidInputError(
                "encrypted_logs_recipient: does not look like an 'age' public key (age1...)"
            ) from exc
    async with transaction(svc) as conn:
        deleting = await environments.delete(
            conn,
            svc.creation,
            org_id,
            project_id,
            env_id,
            force=force,
            created_by=caller.token_id,
            now=datetime.now(UTC),
            logs_recipient=encrypted_logs_recipient,
        )
    if deleting is None:
        return Response(status_code=204)
    svc.wake_dispatcher()
    return JSONResponse(schemas.EnvironmentOut.of(deleting).model_dump(mode="json"), status_code=202)


@router.post(
    "/orgs/{org_id}/projects/{project_id}/envs/{env_id}/actions/refresh_runner",
    response_model=schemas.RefreshRunnerResult,
    tags=["Environment"],
)
async def refresh_runner(
    org_id: str,
    project_id: str,
    env_id: str,
    dry_run: Annotated[bool | None, Query(description="Only report the runner that would be linked.")] = None,
    body: schemas.RefreshRunnerBody | None = Body(default=None),
    _: Principal = MANAGE,
    svc: Services = Depends(services),
) -> schemas.RefreshRunnerResult:
    # The query parameter wins over the JSON body (seed 000 sends a body, upstream a query parameter).
    effective_dry_run = dry_run if dry_run is not None else bool(body and body.dry_run)
    async with transaction(svc) as conn:
        result = await links.refresh_runner(conn, org_id, project_id, env_id, dry_run=effective_dry_run)
    return schemas.RefreshRunnerResult(runner_id=result.runner_id, updated=result.updated)
