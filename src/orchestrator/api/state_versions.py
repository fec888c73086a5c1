"""An environment's Terraform state versions (state storage ``orchestrator``): list, describe, download
(admins only, audited in the log) and roll back."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

import structlog
from fastapi import APIRouter, Depends, Path, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from orchestrator.api import schemas
from orchestrator.api.context import MANAGE, READ, Principal
from orchestrator.api.paging import PageRequest, page_out, page_request
from orchestrator.dispatch import state_versions
from orchestrator.domain.state_versions import StateVersion
from orchestrator.web.services import Services, services, transaction

log = structlog.get_logger(__name__)

router = APIRouter(tags=["StateVersion"])

PATH = "/orgs/{org_id}/projects/{project_id}/envs/{env_id}/state-versions"

VersionNumber = Annotated[
    int, Path(ge=1, le=2**31 - 1, description="The version's number in its environment (1, 2, ...).")
]


class StateVersionOut(BaseModel):
    org_id: str
    project_id: str
    env_id: str
    version: int = Field(description="Numbered from 1 in its environment; the newest is the current state.")
    current: bool = Field(description="It is the environment's current state (the newest version).")
    kind: str = Field(
        description="terraform: written by a deployment's Terraform (through the state backend, or "
        "recovered from its errored.tfstate); rollback: an earlier version made current again.",
        examples=["terraform", "rollback"],
    )
    serial: int | None = schemas.optional(description="The state's serial.")
    lineage: str | None = schemas.optional(description="The state's lineage.")
    resources: int | None = schemas.optional(
        description="Managed resource instances in the state (data sources left out)."
    )
    deployment_id: uuid.UUID | None = schemas.optional(description="The deployment whose Terraform wrote it.")
    rolled_back_from: int | None = schemas.optional(
        description="A rollback: the version whose content it made current again."
    )
    created_by: str | None = schemas.optional(
        description="The token that created the deployment, or that asked for the rollback."
    )
    created_at: datetime
    size: int = Field(description="Bytes of the state document.")
    md5: str

    @classmethod
    def of(
        cls, version: StateVersion, *, project_id: str, env_id: str, current: int | None
    ) -> StateVersionOut:
        return cls(
            org_id=version.org_id,
            project_id=project_id,
            env_id=env_id,
            version=version.version,
            current=version.version == current,
            kind=version.kind,
            serial=version.serial,
            lineage=version.lineage,
            resources=version.resources,
            deployment_id=version.deployment_id,
            rolled_back_from=version.rolled_back_from,
            created_by=version.created_by,
            created_at=version.created_at,
            size=version.size,
            md5=version.md5,
        )


@router.get(PATH, response_model=schemas.PageOf[StateVersionOut])
async def list_state_versions(
    org_id: str,
    project_id: str,
    env_id: str,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[StateVersionOut]:
    """The environment's state versions, newest (the current state) first. 400 when its runner keeps the
    state in another storage than ``orchestrator``."""
    async with svc.reader.connect() as conn:
        env = await state_versions.environment(conn, org_id, project_id, env_id)
        result, current = await state_versions.list_page(
            conn, svc.box, env, after=page.after, limit=page.limit
        )
    return page_out(
        result, lambda v: StateVersionOut.of(v, project_id=project_id, env_id=env_id, current=current)
    )


@router.get(f"{PATH}/{{version}}", response_model=StateVersionOut)
async def get_state_version(
    org_id: str,
    project_id: str,
    env_id: str,
    version: VersionNumber,
    _: Principal = READ,
    svc: Services = Depends(services),
) -> StateVersionOut:
    async with svc.reader.connect() as conn:
        env = await state_versions.environment(conn, org_id, project_id, env_id)
        found, current = await state_versions.get(conn, svc.box, env, version)
    return StateVersionOut.of(found, project_id=project_id, env_id=env_id, current=current)


@router.get(
    f"{PATH}/{{version}}/download",
    responses={200: {"content": {"application/json": {}}, "description": "The Terraform state document."}},
)
async def download_state_version(
    org_id: str,
    project_id: str,
    env_id: str,
    version: VersionNumber,
    caller: Principal = MANAGE,
    svc: Services = Depends(services),
) -> Response:
    """The state document of a version, decrypted, as Terraform wrote it. Org admins and platform admins
    only (a state holds every resource attribute, secrets included); every download is logged
    (``state_version_downloaded``)."""
    async with svc.reader.connect() as conn:
        env = await state_versions.environment(conn, org_id, project_id, env_id)
        data = await state_versions.document(conn, svc.box, env, version)
    log.info(
        "state_version_downloaded",
        org_id=org_id,
        project_id=project_id,
        env_id=env_id,
        env_uuid=str(env.uuid),
        version=version,
        token_id=caller.token_id,
        platform_token=caller.org_id is None,
    )
    return Response(
        data,
        media_type="application/json",
        headers={
            "Content-Disposition": f'attachment; filename="{project_id}-{env_id}-{version}.tfstate"',
            "Cache-Control": "no-store",
        },
    )


@router.post(
    f"{PATH}/{{version}}/actions/rollback",
    status_code=201,
    response_model=StateVersionOut,
    responses={
        201: {"description": "The new current version: the content of `version`, with the next serial."},
        409: {
            "description": "A deployment of the environment is executing, or the state lock is held (the "
            "message names the holder); or the version is current already, or of another lineage."
        },
    },
)
async def rollback_state_version(
    org_id: str,
    project_id: str,
    env_id: str,
    version: VersionNumber,
    caller: Principal = MANAGE,
    svc: Services = Depends(services),
) -> JSONResponse:
    """Make an earlier version the environment's current state again. Written as a new version (kind
    ``rollback``) whose serial follows the current one, lineage kept, under the state lock; the next
    deployment plans against it. Org admins and platform admins only."""
    async with transaction(svc) as conn:
        written = await state_versions.rollback(
            conn,
            svc.box,
            org_id=org_id,
            project_id=project_id,
            env_id=env_id,
            version=version,
            by=caller.token_id,
            keep=svc.settings.state_versions_kept,
            now=datetime.now(UTC),
        )
    log.info(
        "state_version_rolled_back",
        org_id=org_id,
        project_id=project_id,
        env_id=env_id,
        env_uuid=str(written.env_uuid),
        rolled_back_from=version,
        version=written.version,
        token_id=caller.token_id,
    )
    out = StateVersionOut.of(written, project_id=project_id, env_id=env_id, current=written.version)
    return JSONResponse(out.model_dump(mode="json"), status_code=201)
