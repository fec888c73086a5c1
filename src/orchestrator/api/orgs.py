"""Organizations and their API tokens."""

from __future__ import annotations

import secrets
import uuid
from datetime import UTC, datetime

from fastapi import APIRouter, Body, Depends, Response

from orchestrator.api import schemas
from orchestrator.api.context import MANAGE, READ, Principal, hash_token, principal
from orchestrator.api.paging import PageRequest, page_out, page_request
from orchestrator.domain.roles import Permission, Role, allows
from orchestrator.errors import ForbiddenError, InvalidInputError, NotFoundError, found
from orchestrator.store import managed_runners as managed_store
from orchestrator.store import orgs as org_store
from orchestrator.web import openapi
from orchestrator.web.services import Services, services, transaction

router = APIRouter(tags=["Organization"])

TOKEN_PREFIX = "po_"


@router.post("/orgs", status_code=201, response_model=schemas.OrganizationOut)
@openapi.may_answer(403)
async def create_org(
    body: schemas.OrganizationCreateBody | None = Body(default=None),
    caller: Principal = Depends(principal),
    svc: Services = Depends(services),
) -> schemas.OrganizationOut:
    if caller.role is not Role.PLATFORM_ADMIN:
        raise ForbiddenError("only a platform admin may create organizations")
    body = body or schemas.OrganizationCreateBody()
    if body.id and body.id_prefix:
        raise InvalidInputError("id_prefix: cannot be combined with id")
    org_id = body.id or f"{body.id_prefix or 'org-'}{secrets.token_hex(4)}"
    async with transaction(svc) as conn:
        org = await org_store.create_org(conn, org_id=org_id, created_by=caller.token_id)
        if svc.settings.managed_runners_enabled:
            # Every organization sees the managed pool as its runner "managed".
            await managed_store.ensure_pool_rows(conn, now=datetime.now(UTC), org_id=org_id)
    return schemas.OrganizationOut.of(org)


@router.get("/orgs", response_model=schemas.PageOf[schemas.OrganizationOut])
async def list_orgs(
    caller: Principal = Depends(principal),
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[schemas.OrganizationOut]:
    async with svc.reader.connect() as conn:
        result = await org_store.list_orgs(conn, only=caller.org_id, after=page.after, limit=page.limit)
    return page_out(result, schemas.OrganizationOut.of)


@router.get("/whoami", response_model=schemas.WhoAmIOut, tags=["Token"])
async def whoami(caller: Principal = Depends(principal)) -> schemas.WhoAmIOut:
    """Ours: the caller's token, its organization (null for a platform-wide token) and role, and what the
    role may do there. The web console reads it to show only the controls the token may use (the API
    refuses the others all the same)."""
    return schemas.WhoAmIOut(
        token_id=caller.token_id,
        org_id=caller.org_id,
        role=str(caller.role),
        permissions=[str(p) for p in Permission if allows(caller.role, p)],
    )


@router.get("/orgs/{org_id}", response_model=schemas.OrganizationOut)
async def get_org(
    org_id: str, _: Principal = READ, svc: Services = Depends(services)
) -> schemas.OrganizationOut:
    async with svc.reader.connect() as conn:
        org = await org_store.get_org(conn, org_id)
    return schemas.OrganizationOut.of(found(org, f"organization '{org_id}' not found"))


@router.post("/orgs/{org_id}/tokens", status_code=201, response_model=schemas.TokenCreated, tags=["Token"])
async def create_token(
    org_id: str, body: schemas.TokenCreateBody, _: Principal = MANAGE, svc: Services = Depends(services)
) -> schemas.TokenCreated:
    if body.expires_at is not None and (
        body.expires_at.tzinfo is None or body.expires_at <= datetime.now(UTC)
    ):
        raise InvalidInputError("expires_at: must be a future time with a time zone")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    async with transaction(svc) as conn:
        token = await org_store.create_token(
            conn,
            org_id=org_id,
            role=body.role,
            description=body.description,
            token_hash=hash_token(svc.api_token_key, secret),
            prefix=secret[: len(TOKEN_PREFIX) + 6],
            expires_at=body.expires_at,
        )
    return schemas.TokenCreated(**schemas.TokenOut.of(token).model_dump(), token=secret)


@router.get("/orgs/{org_id}/tokens", response_model=schemas.PageOf[schemas.TokenOut], tags=["Token"])
async def list_tokens(
    org_id: str,
    _: Principal = MANAGE,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[schemas.TokenOut]:
    async with svc.reader.connect() as conn:
        result = await org_store.list_tokens(conn, org_id, after=page.after, limit=page.limit)
    return page_out(result, schemas.TokenOut.of)


@router.delete("/orgs/{org_id}/tokens/{token_id}", status_code=204, tags=["Token"])
@openapi.never_answers(409)
async def revoke_token(
    org_id: str, token_id: uuid.UUID, _: Principal = MANAGE, svc: Services = Depends(services)
) -> Response:
    async with transaction(svc) as conn:
        if not await org_store.delete_token(conn, org_id, token_id):
            raise NotFoundError(f"token '{token_id}' not found")
    return Response(status_code=204)
