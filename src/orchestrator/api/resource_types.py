"""Resource types of an organization (``/orgs/{org_id}/resource-types``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Response

from orchestrator.api import schemas
from orchestrator.api.catalogue_fields import Description, TypeId
from orchestrator.api.context import MANAGE, READ, Principal
from orchestrator.api.paging import PageRequest, page_out, page_request
from orchestrator.dispatch import catalogue as catalogue_changes
from orchestrator.errors import NotFoundError, found
from orchestrator.store import resource_types as type_store
from orchestrator.web.services import Services, services, transaction

router = APIRouter()


class ResourceTypeCreateBody(schemas.Body):
    id: TypeId
    description: Description | None = None
    output_schema: dict[str, Any]
    is_developer_accessible: bool = True


class ResourceTypeUpdateBody(schemas.Body):
    description: Description | None = None
    output_schema: dict[str, Any] | None = None
    is_developer_accessible: bool | None = None


class ResourceTypeOut(schemas.EntityOut):
    id: str
    description: str | None = schemas.optional()
    output_schema: dict[str, Any]
    created_at: datetime
    built_in: bool
    is_developer_accessible: bool


@router.get(
    "/orgs/{org_id}/resource-types", response_model=schemas.PageOf[ResourceTypeOut], tags=["ResourceType"]
)
async def list_resource_types(
    org_id: str,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[ResourceTypeOut]:
    async with svc.reader.connect() as conn:
        result = await type_store.list_resource_types(conn, org_id, after=page.after, limit=page.limit)
    return page_out(result, ResourceTypeOut.of)


@router.post(
    "/orgs/{org_id}/resource-types", status_code=201, response_model=ResourceTypeOut, tags=["ResourceType"]
)
async def create_resource_type(
    org_id: str, body: ResourceTypeCreateBody, _: Principal = MANAGE, svc: Services = Depends(services)
) -> ResourceTypeOut:
    async with transaction(svc) as conn:
        created = await type_store.create_resource_type(
            conn,
            org_id=org_id,
            type_id=body.id,
            description=body.description,
            output_schema=body.output_schema,
            is_developer_accessible=body.is_developer_accessible,
        )
    return ResourceTypeOut.of(created)


@router.get("/orgs/{org_id}/resource-types/{type_id}", response_model=ResourceTypeOut, tags=["ResourceType"])
async def get_resource_type(
    org_id: str, type_id: str, _: Principal = READ, svc: Services = Depends(services)
) -> ResourceTypeOut:
    async with svc.reader.connect() as conn:
        resource_type = await type_store.get_resource_type(conn, org_id, type_id)
    return ResourceTypeOut.of(found(resource_type, f"resource type '{type_id}' not found"))


@router.patch(
    "/orgs/{org_id}/resource-types/{type_id}", response_model=ResourceTypeOut, tags=["ResourceType"]
)
async def update_resource_type(
    org_id: str,
    type_id: str,
    body: ResourceTypeUpdateBody,
    _: Principal = MANAGE,
    svc: Services = Depends(services),
) -> ResourceTypeOut:
    changes = body.model_dump(exclude_none=True)
    async with transaction(svc) as conn:
        updated = await catalogue_changes.update_resource_type(conn, org_id, type_id, **changes)
    return ResourceTypeOut.of(found(updated, f"resource type '{type_id}' not found"))


@router.delete("/orgs/{org_id}/resource-types/{type_id}", status_code=204, tags=["ResourceType"])
async def delete_resource_type(
    org_id: str, type_id: str, _: Principal = MANAGE, svc: Services = Depends(services)
) -> Response:
    async with transaction(svc) as conn:
        if not await catalogue_changes.delete_resource_type(conn, org_id, type_id):
            raise NotFoundError(f"resource type '{type_id}' not found")
    return Response(status_code=204)
