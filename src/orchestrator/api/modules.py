"""Modules and their immutable versions (``/orgs/{org_id}/modules``)."""

from __future__ import annotations

import dataclasses
import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from orchestrator.api import schemas
from orchestrator.api.catalogue_fields import KIND, Description, ModuleId, ResourceClass, ResourceId, TypeId
from orchestrator.api.context import MANAGE, READ, Principal
from orchestrator.api.paging import PageRequest, page_out, page_request
from orchestrator.dispatch import catalogue as catalogue_changes
from orchestrator.dispatch import module_code
from orchestrator.domain import catalogue
from orchestrator.domain.catalogue import ModuleContent, ModuleParam, ResourceRequest
from orchestrator.errors import InvalidInputError, NotFoundError, found
from orchestrator.store import modules as module_store
from orchestrator.web.services import Services, services, transaction

router = APIRouter()

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


class ModuleParamItem(schemas.Body):
    type: Literal["string", "number", "bool", "list", "map", "any"]
    is_optional: bool = False
    description: Annotated[str, StringConstraints(max_length=1000)] | None = None


class DependencyIn(schemas.Body):
    type: Annotated[str, StringConstraints(pattern=KIND)]
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
        return dataclasses.replace(
            super().request(),
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


class ModuleParamOut(schemas.EntityOut):
    type: str
    is_optional: bool
    description: str | None = schemas.optional()


class ResourceRequestOut(schemas.EntityOut):
    # FastAPI re-validates what it serialized by alias, so the alias must work both ways.
    model_config = ConfigDict(populate_by_name=True)

    type: str
    resource_class: str | None = schemas.optional(alias="class")
    resource_id: str | None = schemas.optional(alias="id")
    params: dict[str, Any] = Field(default_factory=dict)


class CoProvisionOut(ResourceRequestOut):
    is_dependent_on_current: bool = False
    copy_dependents_from_current: bool = False


def params_out(params: dict[str, ModuleParam]) -> dict[str, ModuleParamOut]:
    return {name: ModuleParamOut.of(p) for name, p in params.items()}


class _VersionSummary(BaseModel):
    """What a module's and a version's summary show of the version."""

    version_id: uuid.UUID
    resource_type: str
    module_source: str
    provider_mapping: dict[str, str]
    description: str | None = schemas.optional()
    created_at: datetime

    @staticmethod
    def summary_fields(
        version_id: uuid.UUID, resource_type: str, c: ModuleContent, created_at: datetime
    ) -> dict[str, Any]:
        return {
            "version_id": version_id,
            "resource_type": resource_type,
            "module_source": c.module_source,
            "provider_mapping": c.provider_mapping,
            "description": c.description,
            "created_at": created_at,
        }


class ModuleVersionSummaryOut(_VersionSummary):
    @classmethod
    def of(cls, v: catalogue.ModuleVersion) -> ModuleVersionSummaryOut:
        return cls(**cls.summary_fields(v.id, v.resource_type, v.content, v.created_at))


class _ModuleCore(BaseModel):
    module_params: dict[str, ModuleParamOut]
    module_inputs: dict[str, Any]
    module_source_code: str | None = schemas.optional()
    dependencies: dict[str, ResourceRequestOut]
    coprovisioned: list[CoProvisionOut]

    @staticmethod
    def fields_of(c: ModuleContent) -> dict[str, Any]:
        return {
            "module_params": params_out(c.module_params),
            "module_inputs": c.module_inputs,
            "module_source_code": c.module_source_code,
            "dependencies": {alias: ResourceRequestOut.of(d) for alias, d in c.dependencies.items()},
            "coprovisioned": [CoProvisionOut.of(r) for r in c.coprovisioned],
        }


class ModuleVersionOut(ModuleVersionSummaryOut, _ModuleCore):
    @classmethod
    def of(cls, v: catalogue.ModuleVersion) -> ModuleVersionOut:
        return cls(**dict(ModuleVersionSummaryOut.of(v)), **_ModuleCore.fields_of(v.content))


class _ModuleKey(BaseModel):
    org_id: str
    id: str


# The key's fields come first (pydantic orders the later base's first), then the current version's summary.
class ModuleSummaryOut(_VersionSummary, _ModuleKey):
    updated_at: datetime

    @classmethod
    def of(cls, m: catalogue.Module) -> ModuleSummaryOut:
        version = cls.summary_fields(m.version_id, m.resource_type, m.content, m.created_at)
        return cls(org_id=m.org_id, id=m.id, updated_at=m.updated_at, **version)


class ModuleOut(ModuleSummaryOut, _ModuleCore):
    @classmethod
    def of(cls, m: catalogue.Module) -> ModuleOut:
        return cls(**dict(ModuleSummaryOut.of(m)), **_ModuleCore.fields_of(m.content))


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
    if body.module_source_code is not None:
        await module_code.check_syntax(body.module_source_code)
    async with transaction(svc) as conn:
        created = await catalogue_changes.create_module(
            conn, org_id=org_id, module_id=body.id, resource_type=body.resource_type, content=body.content()
        )
    return ModuleOut.of(created)


@router.get("/orgs/{org_id}/modules/{module_id}", response_model=ModuleOut, tags=["Modules"])
async def get_module(
    org_id: str, module_id: str, _: Principal = READ, svc: Services = Depends(services)
) -> ModuleOut:
    async with svc.reader.connect() as conn:
        module = await module_store.get_module(conn, org_id, module_id)
    return ModuleOut.of(found(module, f"module '{module_id}' not found"))


@router.patch("/orgs/{org_id}/modules/{module_id}", response_model=ModuleOut, tags=["Modules"])
async def update_module(
    org_id: str,
    module_id: str,
    body: ModuleUpdateBody,
    _: Principal = MANAGE,
    svc: Services = Depends(services),
) -> ModuleOut:
    if body.module_source_code is not None:
        await module_code.check_syntax(body.module_source_code)
    async with transaction(svc) as conn:
        updated = await catalogue_changes.update_module(conn, org_id, module_id, body.apply)
    return ModuleOut.of(updated)


@router.delete("/orgs/{org_id}/modules/{module_id}", status_code=204, tags=["Modules"])
async def delete_module(
    org_id: str, module_id: str, _: Principal = MANAGE, svc: Services = Depends(services)
) -> Response:
    async with transaction(svc) as conn:
        if not await catalogue_changes.delete_module(conn, org_id, module_id):
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
        version = await module_store.get_version(conn, org_id, module_id, version_id)
    return ModuleVersionOut.of(found(version, f"version '{version_id}' of module '{module_id}' not found"))
