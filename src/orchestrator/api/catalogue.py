"""The module catalogue: resource types, module providers, modules (with versions), module rules, and the
resource types available in an environment. Field names and shapes follow upstream's control-plane spec.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.api import schemas
from orchestrator.api.context import MANAGE, READ, Principal
from orchestrator.api.paging import PageRequest, page_out, page_request
from orchestrator.domain import catalogue, provider_secrets
from orchestrator.domain.catalogue import ModuleContent, ModuleParam, ResourceRequest
from orchestrator.domain.module_rules import AvailableResourceType, Placement
from orchestrator.errors import InvalidInputError, NotFoundError
from orchestrator.secretbox import SecretBox
from orchestrator.store import module_providers as provider_store
from orchestrator.store import module_rules as rule_store
from orchestrator.store import modules as module_store
from orchestrator.store import projects as project_store
from orchestrator.store import resource_types as type_store
from orchestrator.web import openapi
from orchestrator.web.services import Services, services, transaction

router = APIRouter()

# --- request and response bodies ---

_NAME = r"^[a-z][a-z0-9_-]+$"
_KIND = r"^[A-Za-z0-9][A-Za-z0-9-]{0,61}[A-Za-z0-9]$"

TypeId = Annotated[str, StringConstraints(pattern=schemas.ID_PATTERN, min_length=2, max_length=63)]
ModuleId = Annotated[str, StringConstraints(pattern=schemas.ID_PATTERN, min_length=2, max_length=100)]
Description = Annotated[str, StringConstraints(max_length=200)]
ResourceClass = Annotated[str, StringConstraints(pattern=_KIND)]
ResourceId = Annotated[
    str,
    StringConstraints(
        pattern=r"^[a-z0-9]+(?:-+[a-z0-9]+)*(?:\.[a-z0-9]+(?:-+[a-z0-9]+)*)*$", min_length=1, max_length=63
    ),
]
ProviderName = Annotated[str, StringConstraints(pattern=_NAME, max_length=100)]
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
#: ``provider_type.id`` of a module provider.
ProviderRef = Annotated[
    str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]+\.[a-z][a-z0-9_-]+$", max_length=201)
]
ProviderLocalName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z_-][a-zA-Z0-9_-]+$", max_length=100)]
_WHITESPACE = re.compile(r"[\s\x00-\x1f\x7f]")


def _source(value: str) -> str:
    if _WHITESPACE.search(value):
        raise ValueError("must not contain whitespace or control characters")
    return value


ModuleSource = Annotated[str, StringConstraints(min_length=2, max_length=200), AfterValidator(_source)]


class ResourceTypeCreateBody(schemas.Body):
    id: TypeId
    description: Description | None = None
    output_schema: dict[str, Any]
    is_developer_accessible: bool = True


class ResourceTypeUpdateBody(schemas.Body):
    description: Description | None = None
    output_schema: dict[str, Any] | None = None
    is_developer_accessible: bool | None = None


class ResourceTypeOut(BaseModel):
    id: str
    description: str | None = schemas.optional()
    output_schema: dict[str, Any]
    created_at: datetime
    built_in: bool
    is_developer_accessible: bool

    @classmethod
    def of(cls, t: catalogue.ResourceType) -> ResourceTypeOut:
        return cls(
            id=t.id,
            description=t.description,
            output_schema=t.output_schema,
            created_at=t.created_at,
            built_in=t.built_in,
            is_developer_accessible=t.is_developer_accessible,
        )


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


class ModuleProviderSummaryOut(BaseModel):
    org_id: str
    provider_type: str
    id: str
    description: str | None = schemas.optional()
    source: str
    created_at: datetime

    @classmethod
    def of(cls, p: catalogue.ModuleProvider) -> ModuleProviderSummaryOut:
        return cls(
            org_id=p.org_id,
            provider_type=p.provider_type,
            id=p.id,
            description=p.description,
            source=p.source,
            created_at=p.created_at,
        )


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


class ModuleParamItem(schemas.Body):
    type: Literal["string", "number", "bool", "list", "map", "any"]
    is_optional: bool = False
    description: Annotated[str, StringConstraints(max_length=1000)] | None = None


class DependencyIn(schemas.Body):
    type: Annotated[str, StringConstraints(pattern=_KIND)]
    resource_class: ResourceClass | None = Field(default=None, alias="class")
    resource_id: ResourceId | None = Field(default=None, alias="id")
    params: Annotated[dict[str, Any], Field(max_length=20)] = Field(default_factory=dict)

    def request(self) -> ResourceRequest:
        return ResourceRequest(
            type=self.type,
            resource_class=self.resource_class,
            resource_id=self.resource_id,
            params=self.params,
        )


class CoProvisionIn(DependencyIn):
    is_dependent_on_current: bool = False
    copy_dependents_from_current: bool = False

    def request(self) -> ResourceRequest:
        return ResourceRequest(
            type=self.type,
            resource_class=self.resource_class,
            resource_id=self.resource_id,
            params=self.params,
            is_dependent_on_current=self.is_dependent_on_current,
            copy_dependents_from_current=self.copy_dependents_from_current,
        )


ModuleParams = dict[str, ModuleParamItem]
ModuleInputs = Annotated[dict[str, Any], Field(max_length=20)]
ProviderMapping = Annotated[dict[ProviderLocalName, ProviderRef], Field(max_length=20)]
Dependencies = Annotated[dict[str, DependencyIn], Field(max_length=20)]
CoProvisioned = Annotated[list[CoProvisionIn], Field(max_length=20)]


class ModuleCreateBody(schemas.Body):
    id: ModuleId
    description: Description | None = None
    resource_type: TypeId
    module_source: ModuleSource
    module_source_code: str | None = None
    module_params: ModuleParams = Field(default_factory=dict)
    module_inputs: ModuleInputs = Field(default_factory=dict)
    provider_mapping: ProviderMapping = Field(default_factory=dict)
    dependencies: Dependencies = Field(default_factory=dict)
    coprovisioned: CoProvisioned = Field(default_factory=list)

    def content(self) -> ModuleContent:
        return ModuleContent(
            description=self.description,
            module_source=self.module_source,
            module_source_code=self.module_source_code,
            module_params=_params(self.module_params),
            module_inputs=self.module_inputs,
            provider_mapping=self.provider_mapping,
            dependencies={alias: d.request() for alias, d in self.dependencies.items()},
            coprovisioned=tuple(c.request() for c in self.coprovisioned),
        )


class ModuleUpdateBody(schemas.Body):
    """Fields left out keep their value. A new ``module_source`` replaces the inline code too."""

    description: Description | None = None
    module_source: ModuleSource | None = None
    module_source_code: str | None = None
    module_params: ModuleParams | None = None
    module_inputs: ModuleInputs | None = None
    provider_mapping: ProviderMapping | None = None
    dependencies: Dependencies | None = None
    coprovisioned: CoProvisioned | None = None

    def apply(self, current: ModuleContent) -> ModuleContent:
        source, code = current.module_source, current.module_source_code
        if self.module_source is not None:
            # Switching between a remote source and inline code takes both fields together (upstream).
            source, code = self.module_source, self.module_source_code
        elif self.module_source_code is not None:
            if current.module_source != catalogue.INLINE_SOURCE:
                raise InvalidInputError(
                    f"module_source_code: cannot be set without module_source '{catalogue.INLINE_SOURCE}'"
                )
            code = self.module_source_code
        return ModuleContent(
            description=self.description if self.description is not None else current.description,
            module_source=source,
            module_source_code=code,
            module_params=_params(self.module_params)
            if self.module_params is not None
            else current.module_params,
            module_inputs=self.module_inputs if self.module_inputs is not None else current.module_inputs,
            provider_mapping=(
                self.provider_mapping if self.provider_mapping is not None else current.provider_mapping
            ),
            dependencies=(
                {alias: d.request() for alias, d in self.dependencies.items()}
                if self.dependencies is not None
                else current.dependencies
            ),
            coprovisioned=(
                tuple(c.request() for c in self.coprovisioned)
                if self.coprovisioned is not None
                else current.coprovisioned
            ),
        )


def _params(items: ModuleParams) -> dict[str, ModuleParam]:
    return {
        name: ModuleParam(type=p.type, is_optional=p.is_optional, description=p.description)
        for name, p in items.items()
    }


class ModuleParamOut(BaseModel):
    type: str
    is_optional: bool
    description: str | None = schemas.optional()


class ResourceRequestOut(BaseModel):
    # FastAPI re-validates what it serialized by alias, so the alias must work both ways.
    model_config = ConfigDict(populate_by_name=True)

    type: str
    resource_class: str | None = schemas.optional(alias="class")
    resource_id: str | None = schemas.optional(alias="id")
    params: dict[str, Any] = Field(default_factory=dict)


class CoProvisionOut(ResourceRequestOut):
    is_dependent_on_current: bool = False
    copy_dependents_from_current: bool = False


def _params_out(params: dict[str, ModuleParam]) -> dict[str, ModuleParamOut]:
    return {
        name: ModuleParamOut(type=p.type, is_optional=p.is_optional, description=p.description)
        for name, p in params.items()
    }


class ModuleVersionSummaryOut(BaseModel):
    version_id: uuid.UUID
    resource_type: str
    module_source: str
    provider_mapping: dict[str, str]
    description: str | None = schemas.optional()
    created_at: datetime

    @classmethod
    def of(cls, v: catalogue.ModuleVersion) -> ModuleVersionSummaryOut:
        return cls(
            version_id=v.id,
            resource_type=v.resource_type,
            module_source=v.content.module_source,
            provider_mapping=v.content.provider_mapping,
            description=v.content.description,
            created_at=v.created_at,
        )


class _ModuleCore(BaseModel):
    module_params: dict[str, ModuleParamOut]
    module_inputs: dict[str, Any]
    module_source_code: str | None = schemas.optional()
    dependencies: dict[str, ResourceRequestOut]
    coprovisioned: list[CoProvisionOut]

    @staticmethod
    def fields_of(c: ModuleContent) -> dict[str, Any]:
        return {
            "module_params": _params_out(c.module_params),
            "module_inputs": c.module_inputs,
            "module_source_code": c.module_source_code,
            "dependencies": {
                alias: ResourceRequestOut(
                    type=d.type, resource_class=d.resource_class, resource_id=d.resource_id, params=d.params
                )
                for alias, d in c.dependencies.items()
            },
            "coprovisioned": [
                CoProvisionOut(
                    type=r.type,
                    resource_class=r.resource_class,
                    resource_id=r.resource_id,
                    params=r.params,
                    is_dependent_on_current=r.is_dependent_on_current,
                    copy_dependents_from_current=r.copy_dependents_from_current,
                )
                for r in c.coprovisioned
            ],
        }


class ModuleVersionOut(ModuleVersionSummaryOut, _ModuleCore):
    @classmethod
    def of(cls, v: catalogue.ModuleVersion) -> ModuleVersionOut:
        return cls(**dict(ModuleVersionSummaryOut.of(v)), **_ModuleCore.fields_of(v.content))


class ModuleSummaryOut(BaseModel):
    org_id: str
    id: str
    version_id: uuid.UUID
    resource_type: str
    module_source: str
    provider_mapping: dict[str, str]
    description: str | None = schemas.optional()
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, m: catalogue.Module) -> ModuleSummaryOut:
        return cls(
            org_id=m.org_id,
            id=m.id,
            version_id=m.version_id,
            resource_type=m.resource_type,
            module_source=m.content.module_source,
            provider_mapping=m.content.provider_mapping,
            description=m.content.description,
            created_at=m.created_at,
            updated_at=m.updated_at,
        )


class ModuleOut(ModuleSummaryOut, _ModuleCore):
    @classmethod
    def of(cls, m: catalogue.Module) -> ModuleOut:
        return cls(**dict(ModuleSummaryOut.of(m)), **_ModuleCore.fields_of(m.content))


class ModuleRuleCreateBody(schemas.Body):
    module_id: ModuleId
    resource_class: ResourceClass | None = None
    resource_id: ResourceId | None = None
    project_id: schemas.Identifier | None = None
    env_type_id: schemas.Identifier | None = None
    env_id: schemas.Identifier | None = None


class ModuleRuleOut(BaseModel):
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

    @classmethod
    def of(cls, r: catalogue.ModuleRule) -> ModuleRuleOut:
        return cls(
            org_id=r.org_id,
            id=r.id,
            module_id=r.module_id,
            created_at=r.created_at,
            resource_type=r.resource_type,
            resource_class=r.resource_class,
            resource_id=r.resource_id,
            project_id=r.project_id,
            env_type_id=r.env_type_id,
            env_id=r.env_id,
        )


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
                    module_params=_params_out(o.module.content.module_params),
                )
                for o in a.options
            ],
        )


# --- resource types ---


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
        found = await type_store.get_resource_type(conn, org_id, type_id)
    if found is None:
        raise NotFoundError(f"resource type '{type_id}' not found")
    return ResourceTypeOut.of(found)


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
        updated = await type_store.update_resource_type(conn, org_id, type_id, **changes)
    if updated is None:
        raise NotFoundError(f"resource type '{type_id}' not found")
    return ResourceTypeOut.of(updated)


@router.delete("/orgs/{org_id}/resource-types/{type_id}", status_code=204, tags=["ResourceType"])
async def delete_resource_type(
    org_id: str, type_id: str, _: Principal = MANAGE, svc: Services = Depends(services)
) -> Response:
    async with transaction(svc) as conn:
        if not await type_store.delete_resource_type(conn, org_id, type_id):
            raise NotFoundError(f"resource type '{type_id}' not found")
    return Response(status_code=204)


# --- module providers ---


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
            org_id=org_id,
            provider_type=body.provider_type,
            provider_id=body.id,
            description=body.description,
            source=body.source,
            version_constraint=body.version_constraint,
            configuration=public,
            configuration_sealed=sealed,
        )
    return ModuleProviderOut.of(created)


_PROVIDER = "/orgs/{org_id}/module-providers/{provider_type}/{provider_id}"


async def seal_clear_provider_configurations(conn: AsyncConnection, box: SecretBox) -> int:
    """Seal the configurations stored in clear before sealing existed (run at start-up: a migration has no
    server key); how many."""
    sealed = 0
    for provider in await provider_store.unsealed(conn):
        public, whole = provider_secrets.seal_configuration(
            box, provider.org_id, provider.provider_type, provider.id, provider.configuration
        )
        sealed += await provider_store.seal(conn, provider, configuration=public, sealed=whole)
    return sealed


@router.get(_PROVIDER, response_model=ModuleProviderOut, tags=["Providers"])
async def get_provider(
    org_id: str, provider_type: str, provider_id: str, _: Principal = READ, svc: Services = Depends(services)
) -> ModuleProviderOut:
    async with svc.reader.connect() as conn:
        found = await provider_store.get_provider(conn, org_id, provider_type, provider_id)
    if found is None:
        raise NotFoundError(f"module provider '{provider_type}.{provider_id}' not found")
    return ModuleProviderOut.of(found)


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
        if not await provider_store.delete_provider(conn, org_id, provider_type, provider_id):
            raise NotFoundError(f"module provider '{provider_type}.{provider_id}' not found")
    return Response(status_code=204)


# --- modules and their versions ---


@router.get("/orgs/{org_id}/modules", response_model=schemas.PageOf[ModuleSummaryOut], tags=["Modules"])
async def list_modules(
    org_id: str,
    by_resource_type: Annotated[str | None, Query(alias="byResourceType")] = None,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[ModuleSummaryOut]:
    async with svc.reader.connect() as conn:
        result = await module_store.list_modules(
            conn, org_id, resource_type=by_resource_type or None, after=page.after, limit=page.limit
        )
    return page_out(result, ModuleSummaryOut.of)


@router.post("/orgs/{org_id}/modules", status_code=201, response_model=ModuleOut, tags=["Modules"])
async def create_module(
    org_id: str, body: ModuleCreateBody, _: Principal = MANAGE, svc: Services = Depends(services)
) -> ModuleOut:
    content = body.content()
    catalogue.check_content(content)
    async with transaction(svc) as conn:
        created = await module_store.create_module(
            conn, org_id=org_id, module_id=body.id, resource_type=body.resource_type, content=content
        )
    return ModuleOut.of(created)


@router.get("/orgs/{org_id}/modules/{module_id}", response_model=ModuleOut, tags=["Modules"])
async def get_module(
    org_id: str, module_id: str, _: Principal = READ, svc: Services = Depends(services)
) -> ModuleOut:
    async with svc.reader.connect() as conn:
        found = await module_store.get_module(conn, org_id, module_id)
    if found is None:
        raise NotFoundError(f"module '{module_id}' not found")
    return ModuleOut.of(found)


@router.patch("/orgs/{org_id}/modules/{module_id}", response_model=ModuleOut, tags=["Modules"])
async def update_module(
    org_id: str,
    module_id: str,
    body: ModuleUpdateBody,
    _: Principal = MANAGE,
    svc: Services = Depends(services),
) -> ModuleOut:
    async with transaction(svc) as conn:
        current = await module_store.get_module(conn, org_id, module_id, for_update=True)
        if current is None:
            raise NotFoundError(f"module '{module_id}' not found")
        content = body.apply(current.content)
        catalogue.check_content(content)
        updated = await module_store.update_module(conn, org_id, module_id, content)
    assert updated is not None
    return ModuleOut.of(updated)


@router.delete("/orgs/{org_id}/modules/{module_id}", status_code=204, tags=["Modules"])
async def delete_module(
    org_id: str, module_id: str, _: Principal = MANAGE, svc: Services = Depends(services)
) -> Response:
    async with transaction(svc) as conn:
        if not await module_store.delete_module(conn, org_id, module_id):
            raise NotFoundError(f"module '{module_id}' not found")
    return Response(status_code=204)


@router.get(
    "/orgs/{org_id}/modules/{module_id}/versions",
    response_model=schemas.PageOf[ModuleVersionSummaryOut],
    tags=["Modules"],
)
async def list_module_versions(
    org_id: str,
    module_id: str,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[ModuleVersionSummaryOut]:
    async with svc.reader.connect() as conn:
        if await module_store.get_module(conn, org_id, module_id) is None:
            raise NotFoundError(f"module '{module_id}' not found")
        result = await module_store.list_versions(conn, org_id, module_id, after=page.after, limit=page.limit)
    return page_out(result, ModuleVersionSummaryOut.of)


@router.get(
    "/orgs/{org_id}/modules/{module_id}/versions/{version_id}",
    response_model=ModuleVersionOut,
    tags=["Modules"],
)
async def get_module_version(
    org_id: str, module_id: str, version_id: uuid.UUID, _: Principal = READ, svc: Services = Depends(services)
) -> ModuleVersionOut:
    async with svc.reader.connect() as conn:
        found = await module_store.get_version(conn, org_id, module_id, version_id)
    if found is None:
        raise NotFoundError(f"version '{version_id}' of module '{module_id}' not found")
    return ModuleVersionOut.of(found)


# --- module rules ---


@router.post("/orgs/{org_id}/module-rules", status_code=201, response_model=ModuleRuleOut, tags=["Rules"])
async def create_module_rule(
    org_id: str, body: ModuleRuleCreateBody, _: Principal = MANAGE, svc: Services = Depends(services)
) -> ModuleRuleOut:
    async with transaction(svc) as conn:
        rule = await rule_store.create_rule(
            conn,
            org_id=org_id,
            module_id=body.module_id,
            resource_class=body.resource_class or catalogue.DEFAULT_RESOURCE_CLASS,
            resource_id=body.resource_id,
            project_id=body.project_id,
            env_type_id=body.env_type_id,
            env_id=body.env_id,
        )
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
    if rule is None:
        raise NotFoundError(f"module rule '{rule_id}' not found")
    return ModuleRuleOut.of(rule)


@router.delete("/orgs/{org_id}/module-rules/{rule_id}", status_code=204, tags=["Rules"])
@openapi.never_answers(409)
async def delete_module_rule(
    org_id: str, rule_id: uuid.UUID, _: Principal = MANAGE, svc: Services = Depends(services)
) -> Response:
    async with transaction(svc) as conn:
        if not await rule_store.delete_rule(conn, org_id, rule_id):
            raise NotFoundError(f"module rule '{rule_id}' not found")
    return Response(status_code=204)


# --- what an environment offers ---


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
        result = await rule_store.available_resource_types(
            conn,
            org_id,
            Placement(project_id=project_id, env_type_id=env.env_type_id, env_id=env_id),
            type_id=type_id or None,
            include_non_developer_accessible=include_non_developer_accessible,
            after=page.after,
            limit=page.limit,
        )
    return page_out(result, AvailableResourceTypeOut.of)
