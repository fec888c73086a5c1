"""Runner rules: immutable links from (project, env type) matches to a runner."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from orchestrator.api import schemas
from orchestrator.api.context import MANAGE, READ, Principal
from orchestrator.api.paging import PageRequest, page_out, page_request
from orchestrator.domain.managed import MANAGED_RUNNER_ID, check_tags
from orchestrator.errors import InvalidInputError, NotFoundError, found
from orchestrator.store import runners as store
from orchestrator.web import openapi
from orchestrator.web.services import Services, services, transaction

router = APIRouter(tags=["RunnerRule"])


@router.post("/orgs/{org_id}/runner-rules", status_code=201, response_model=schemas.RunnerRuleOut)
async def create_rule(
    org_id: str, body: schemas.RunnerRuleCreateBody, _: Principal = MANAGE, svc: Services = Depends(services)
) -> schemas.RunnerRuleOut:
    required_tags = None
    if body.required_tags:
        if body.runner_id != MANAGED_RUNNER_ID:
            raise InvalidInputError(
                f"required_tags: only a rule for runner '{MANAGED_RUNNER_ID}' may require tags",
                details={"errors": [{"field": "required_tags", "message": "only with runner_id managed"}]},
            )
        required_tags = check_tags(body.required_tags, field="required_tags")
    async with transaction(svc) as conn:
        rule = await store.create_rule(
            conn,
            org_id=org_id,
            runner_id=body.runner_id,
            project_id=body.project_id or None,
            env_type_id=body.env_type_id or None,
            required_tags=required_tags,
        )
    return schemas.RunnerRuleOut.of(rule)


@router.get("/orgs/{org_id}/runner-rules", response_model=schemas.PageOf[schemas.RunnerRuleOut])
async def list_rules(
    org_id: str,
    by_runner_id: Annotated[str | None, Query(alias="byRunnerId")] = None,
    by_project_id: Annotated[str | None, Query(alias="byProjectId")] = None,
    by_env_type_id: Annotated[str | None, Query(alias="byEnvTypeId")] = None,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[schemas.RunnerRuleOut]:
    async with svc.reader.connect() as conn:
        result = await store.list_rules(
            conn,
            org_id,
            runner_id=by_runner_id or None,
            project_id=by_project_id or None,
            env_type_id=by_env_type_id or None,
            after=page.after,
            limit=page.limit,
        )
    return page_out(result, schemas.RunnerRuleOut.of)


@router.get("/orgs/{org_id}/runner-rules/{rule_id}", response_model=schemas.RunnerRuleOut)
async def get_rule(
    org_id: str, rule_id: uuid.UUID, _: Principal = READ, svc: Services = Depends(services)
) -> schemas.RunnerRuleOut:
    async with svc.reader.connect() as conn:
        rule = await store.get_rule(conn, org_id, rule_id)
    return schemas.RunnerRuleOut.of(found(rule, f"runner rule '{rule_id}' not found"))


@router.delete("/orgs/{org_id}/runner-rules/{rule_id}", status_code=204)
@openapi.never_answers(409)
async def delete_rule(
    org_id: str, rule_id: uuid.UUID, _: Principal = MANAGE, svc: Services = Depends(services)
) -> Response:
    async with transaction(svc) as conn:
        if not await store.delete_rule(conn, org_id, rule_id):
            raise NotFoundError(f"runner rule '{rule_id}' not found")
    return Response(status_code=204)
