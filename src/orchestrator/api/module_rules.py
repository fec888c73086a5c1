"""Module rules (``/orgs/{org_id}/module-rules``), and the resource types they make available in an
environment (``.../envs/{env_id}/available-resource-types``)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel

from orchestrator.api import schemas
from orchestrator.api.catalogue_fields import ModuleId, ResourceClass, ResourceId
from orchestrator.api.context import MANAGE, READ, Principal
from orchestrator.api.modules import ModuleParamOut, params_out
from orchestrator.api.paging import PageRequest, page_out, page_request
from orchestrator.dispatch import catalogue as catalogue_changes
from orchestrator.dispatch import env_catalogue
from orchestrator.domain import catalogue
from orchestrator.domain.module_rules import AvailableResourceType, Placement, RuleScope
from orchestrator.errors import InvalidInputError, NotFoundError, found
from orchestrator.store import module_rules as rule_store
from orchestrator.store import projects as project_store
from orchestrator.web import openapi
from orchestrator.web.services import Services, services, transaction

router = APIRouter()


class ModuleRuleCreateBody(schemas.Body):
    module_id: ModuleId
    resource_class: ResourceClass | None = None
    resource_id: ResourceId | None = None
    project_id: schemas.Identifier | None = None
    env_type_id: schemas.Identifier | None = None
    env_id: schemas.Identifier | None = None

    def scope(self) -> RuleScope:
        return RuleScope(
            resource_class=self.resource_class or catalogue.DEFAULT_RESOURCE_CLASS,
            resource_id=self.resource_id,
            project_id=self.project_id,
            env_type_id=self.env_type_id,
            env_id=self.env_id,
        )


class ModuleRuleOut(schemas.EntityOut):
    org_id: str
    id: uuid.UUID
    module_id: str
    created_at: datetime
    resource_type: str
    resource_class: str
    resource_id: str | None = schemas.optional()
    project_id: str | None = schemas.optional()
    env_type_id: str | None = schemas.optional()
    env_id: str | None = schemas.optional()


class AvailableResourceTypeOptionOut(BaseModel):
    resource_id: str | None = schemas.optional()
    resource_class: str
    rule_id: uuid.UUID
    module_id: str
    module_params: dict[str, ModuleParamOut]


class AvailableResourceTypeOut(BaseModel):
    id: str
    description: str | None = schemas.optional()
    output_schema: dict[str, Any]
    options: list[AvailableResourceTypeOptionOut]

    @classmethod
    def of(cls, a: AvailableResourceType) -> AvailableResourceTypeOut:
        return cls(
            id=a.resource_type.id,
            description=a.resource_type.description,
            output_schema=a.resource_type.output_schema,
            options=[
                AvailableResourceTypeOptionOut(
                    resource_id=o.rule.resource_id,
                    resource_class=o.rule.resource_class,
                    rule_id=o.rule.id,
                    module_id=o.module.id,
                    module_params=params_out(o.module.content.module_params),
                )
                for o in a.options
            ],
        )


@router.post("/orgs/{org_id}/module-rules", status_code=201, response_model=ModuleRuleOut, tags=["Rules"])
async def create_module_rule(
    org_id: str, body: ModuleRuleCreateBody, _: Principal = MANAGE, svc: Services = Depends(services)
) -> ModuleRuleOut:
    async with transaction(svc) as conn:
        rule = await catalogue_changes.create_rule(conn, org_id, body.module_id, body.scope())
    return ModuleRuleOut.of(rule)


@router.get("/orgs/{org_id}/module-rules", response_model=schemas.PageOf[ModuleRuleOut], tags=["Rules"])
async def list_module_rules(
    org_id: str,
    by_resource_type: Annotated[str | None, Query(alias="byResourceType")] = None,
    by_module_id: Annotated[str | None, Query(alias="byModuleId")] = None,
    by_project_id: Annotated[str | None, Query(alias="byProjectId")] = None,
    by_env_id: Annotated[str | None, Query(alias="byEnvId")] = None,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[ModuleRuleOut]:
    if by_env_id and not by_project_id:
        raise InvalidInputError("byEnvId: must be used together with byProjectId")
    async with svc.reader.connect() as conn:
        result = await rule_store.list_rules(
            conn,
            org_id,
            resource_type=by_resource_type or None,
            module_id=by_module_id or None,
            project_id=by_project_id or None,
            env_id=by_env_id or None,
            after=page.after,
            limit=page.limit,
        )
    return page_out(result, ModuleRuleOut.of)


@router.get("/orgs/{org_id}/module-rules/{rule_id}", response_model=ModuleRuleOut, tags=["Rules"])
async def get_module_rule(
    org_id: str, rule_id: uuid.UUID, _: Principal = READ, svc: Services = Depends(services)
) -> ModuleRuleOut:
    async with svc.reader.connect() as conn:
        rule = await rule_store.get_rule(conn, org_id, rule_id)
    return ModuleRuleOut.of(found(rule, f"module rule '{rule_id}' not found"))


@router.delete("/orgs/{org_id}/module-rules/{rule_id}", status_code=204, tags=["Rules"])
@openapi.never_answers(409)
async def delete_module_rule(
    org_id: str, rule_id: uuid.UUID, _: Principal = MANAGE, svc: Services = Depends(services)
) -> Response:
    async with transaction(svc) as conn:
        if not await rule_store.delete_rule(conn, org_id, rule_id):
            raise NotFoundError(f"module rule '{rule_id}' not found")
    return Response(status_code=204)


@router.get(
    "/orgs/{org_id}/projects/{project_id}/envs/{env_id}/available-resource-types",
    response_model=schemas.PageOf[AvailableResourceTypeOut],
    tags=["ResourceType"],
)
async def list_available_resource_types(
    org_id: str,
    project_id: str,
    env_id: str,
    type_id: Annotated[str | None, Query(description="Only this resource type.")] = None,
    include_non_developer_accessible: bool = False,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[AvailableResourceTypeOut]:
    async with svc.reader.connect() as conn:
        env = await project_store.get_env(conn, org_id, project_id, env_id)
        if env is None:
            raise NotFoundError(f"environment '{env_id}' not found in project '{project_id}'")
        result = await env_catalogue.available_resource_types(
            conn,
            org_id,
            Placement(project_id=project_id, env_type_id=env.env_type_id, env_id=env_id),
            type_id=type_id or None,
            include_non_developer_accessible=include_non_developer_accessible,
            after=page.after,
            limit=page.limit,
        )
    return page_out(result, AvailableResourceTypeOut.of)
