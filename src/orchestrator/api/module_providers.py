"""Module providers: an organization's OpenTofu provider configurations (``/orgs/{org_id}/module-providers``),
their credentials sealed at rest and answered as "SECRET"."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from pydantic import Field, StringConstraints

from orchestrator.api import schemas
from orchestrator.api.catalogue_fields import NAME, Description
from orchestrator.api.context import MANAGE, READ, Principal
from orchestrator.api.paging import PageRequest, page_out, page_request
from orchestrator.dispatch import catalogue as catalogue_changes
from orchestrator.domain import catalogue, provider_secrets
from orchestrator.errors import NotFoundError, found
from orchestrator.store import module_providers as provider_store
from orchestrator.web.services import Services, services, transaction

router = APIRouter()

ProviderName = Annotated[str, StringConstraints(pattern=NAME, max_length=100)]
ProviderSource = Annotated[
    str, StringConstraints(pattern=r"^([a-z0-9.-]+/)?([a-z][a-z0-9_-]+)/([a-z][a-z0-9_-]+)$", max_length=100)
]
VersionConstraint = Annotated[
    str,
    StringConstraints(
        pattern=r"^((=|!=|>|>=|<|<=|~>) ([0-9.]+(-.+)?))(, (=|!=|>|>=|<|<=|~>) ([0-9.]+(-.+)?))*$",
        max_length=100,
    ),
]


class ModuleProviderCreateBody(schemas.Body):
    provider_type: ProviderName
    id: ProviderName
    description: Description | None = None
    source: ProviderSource
    version_constraint: VersionConstraint
    configuration: Annotated[dict[str, Any], Field(max_length=20)] = Field(default_factory=dict)


class ModuleProviderUpdateBody(schemas.Body):
    description: Description | None = None
    version_constraint: VersionConstraint | None = None
    configuration: Annotated[dict[str, Any], Field(max_length=20)] | None = None


class ModuleProviderSummaryOut(schemas.EntityOut):
    org_id: str
    provider_type: str
    id: str
    description: str | None = schemas.optional()
    source: str
    created_at: datetime


class ModuleProviderOut(ModuleProviderSummaryOut):
    version_constraint: str
    configuration: dict[str, Any]

    @classmethod
    def of(cls, p: catalogue.ModuleProvider) -> ModuleProviderOut:
        return cls(
            **ModuleProviderSummaryOut.of(p).model_dump(),
            version_constraint=p.version_constraint,
            # Masked again: a row from before sealing holds its configuration in clear.
            configuration=provider_secrets.public_configuration(p.configuration),
        )


@router.get(
    "/orgs/{org_id}/module-providers",
    response_model=schemas.PageOf[ModuleProviderSummaryOut],
    tags=["Providers"],
)
async def list_providers(
    org_id: str,
    by_provider_type: Annotated[str | None, Query(alias="byProviderType")] = None,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[ModuleProviderSummaryOut]:
    async with svc.reader.connect() as conn:
        result = await provider_store.list_providers(
            conn, org_id, provider_type=by_provider_type or None, after=page.after, limit=page.limit
        )
    return page_out(result, ModuleProviderSummaryOut.of)


@router.post(
    "/orgs/{org_id}/module-providers", status_code=201, response_model=ModuleProviderOut, tags=["Providers"]
)
async def create_provider(
    org_id: str, body: ModuleProviderCreateBody, _: Principal = MANAGE, svc: Services = Depends(services)
) -> ModuleProviderOut:
    configuration = provider_secrets.keep_existing(body.configuration, None)
    public, sealed = provider_secrets.seal_configuration(
        svc.box, org_id, body.provider_type, body.id, configuration
    )
    async with transaction(svc) as conn:
        created = await provider_store.create_provider(
            conn,
            **body.model_dump(include={"provider_type", "description", "source", "version_constraint"}),
            org_id=org_id,
            provider_id=body.id,
            configuration=public,
            configuration_sealed=sealed,
        )
    return ModuleProviderOut.of(created)


_PROVIDER = "/orgs/{org_id}/module-providers/{provider_type}/{provider_id}"


@router.get(_PROVIDER, response_model=ModuleProviderOut, tags=["Providers"])
async def get_provider(
    org_id: str, provider_type: str, provider_id: str, _: Principal = READ, svc: Services = Depends(services)
) -> ModuleProviderOut:
    async with svc.reader.connect() as conn:
        provider = await provider_store.get_provider(conn, org_id, provider_type, provider_id)
    return ModuleProviderOut.of(found(provider, f"module provider '{provider_type}.{provider_id}' not found"))


@router.patch(_PROVIDER, response_model=ModuleProviderOut, tags=["Providers"])
async def update_provider(
    org_id: str,
    provider_type: str,
    provider_id: str,
    body: ModuleProviderUpdateBody,
    _: Principal = MANAGE,
    svc: Services = Depends(services),
) -> ModuleProviderOut:
    async with transaction(svc) as conn:
        current = await provider_store.get_provider(conn, org_id, provider_type, provider_id)
        if current is None:
            raise NotFoundError(f"module provider '{provider_type}.{provider_id}' not found")
        changes = body.model_dump(exclude_none=True)
        if body.configuration is not None:
            # "SECRET" keeps the stored value at its place.
            stored = provider_secrets.open_configuration(svc.box, current)
            configuration = provider_secrets.keep_existing(body.configuration, stored)
            changes["configuration"], changes["configuration_sealed"] = provider_secrets.seal_configuration(
                svc.box, org_id, provider_type, provider_id, configuration
            )
        updated = await provider_store.update_provider(conn, org_id, provider_type, provider_id, **changes)
    assert updated is not None
    return ModuleProviderOut.of(updated)


@router.delete(_PROVIDER, status_code=204, tags=["Providers"])
async def delete_provider(
    org_id: str,
    provider_type: str,
    provider_id: str,
    _: Principal = MANAGE,
    svc: Services = Depends(services),
) -> Response:
    async with transaction(svc) as conn:
        if not await catalogue_changes.delete_provider(conn, org_id, provider_type, provider_id):
            raise NotFoundError(f"module provider '{provider_type}.{provider_id}' not found")
    return Response(status_code=204)
