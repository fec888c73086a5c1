"""Request and response bodies of the control-plane API (upstream field names)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Generic, Self, TypeVar
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from orchestrator.domain import entities, validation
from orchestrator.domain.roles import ORG_ROLES

T = TypeVar("T")

ID_PATTERN = validation.ID_PATTERN
Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN, min_length=2, max_length=50)]

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def _display_name(value: str) -> str:
    if value != value.strip() or _CONTROL.search(value):
        raise ValueError("display_name contains invalid characters")
    return value


DisplayName = Annotated[str, StringConstraints(min_length=2, max_length=60), AfterValidator(_display_name)]


def _is_none(value: object) -> bool:
    return value is None


def _not_nullable(schema: dict[str, Any]) -> None:
    """The JSON schema of an :func:`optional` field: its type without the ``null`` branch, no default."""
    schema.pop("default", None)
    branches = schema.get("anyOf")
    if isinstance(branches, list):
        kept = [branch for branch in branches if branch != {"type": "null"}]
        if len(kept) == 1 and isinstance(kept[0], dict):
            del schema["anyOf"]
            schema.update(kept[0])
        else:
            schema["anyOf"] = kept


def optional(**kwargs: Any) -> Any:
    """An optional field of an answer: left out of the answer when it is None, never sent as ``null``
    (upstream's documents declare optional fields as plain, non-nullable types). Our OpenAPI shows it
    optional and not nullable. ``kwargs`` go to :func:`pydantic.Field` (``alias``, ``description``)."""
    return Field(default=None, exclude_if=_is_none, json_schema_extra=_not_nullable, **kwargs)


class EntityOut(BaseModel):
    """An answer that shows a domain entity (a dataclass of ``domain``): each of its fields is the entity's
    attribute of the same name, validated as the field declares. An answer that computes a field, or names
    it otherwise, keeps an ``of`` of its own."""

    @classmethod
    def of(cls, entity: Any) -> Self:
        return cls.model_validate(entity, from_attributes=True)


class Body(BaseModel):
    """Request bodies are decoded strictly: an unknown field is an error naming it."""

    model_config = ConfigDict(extra="forbid")


class PageOf(BaseModel, Generic[T]):
    items: list[T]
    next_page_token: str | None = optional()


class OrganizationCreateBody(Body):
    id: Identifier | None = None
    id_prefix: Annotated[str, StringConstraints(pattern=ID_PATTERN, max_length=15)] | None = None


class OrganizationOut(EntityOut):
    id: str
    uuid: UUID
    created_at: datetime
    created_by: str
    updated_at: datetime
    status: str
    plan: str = "self-hosted"


OrgRole = Annotated[str, AfterValidator(lambda v: _one_of(v, [str(r) for r in ORG_ROLES]))]


def _one_of(value: str, allowed: list[str]) -> str:
    if value not in allowed:
        raise ValueError(f"must be one of [{' '.join(allowed)}]")
    return value


class TokenCreateBody(Body):
    role: OrgRole
    description: Annotated[str, StringConstraints(max_length=200)] = ""
    expires_at: datetime | None = None


class TokenOut(EntityOut):
    id: UUID
    role: str
    description: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None


class TokenCreated(TokenOut):
    #: The secret, answered once at creation and never again.
    token: str


class WhoAmIOut(BaseModel):
    token_id: str
    #: None for a platform-wide token (a platform admin's): it reaches every organization.
    org_id: str | None = Field(description="The token's organization; null for a platform-wide token.")
    role: str = Field(examples=["platform-admin", "admin", "deployer", "viewer"])
    permissions: list[str] = Field(
        description="What the role may do in its organization (in every one for a platform admin): "
        "`read`; `deploy` (deployments, environments); `manage` (runners, rules, the catalogue, tokens, "
        "refresh_runner)."
    )


class EnvironmentTypeCreateBody(Body):
    id: Identifier
    display_name: Annotated[str, StringConstraints(max_length=60)] | None = None


class EnvironmentTypeUpdateBody(Body):
    display_name: Annotated[str, StringConstraints(max_length=60)]


class EnvironmentTypeOut(EntityOut):
    id: str
    uuid: UUID
    created_at: datetime
    display_name: str


class ProjectCreateBody(Body):
    id: Identifier
    display_name: DisplayName | None = None


class ProjectUpdateBody(Body):
    display_name: DisplayName


class ProjectOut(EntityOut):
    id: str
    uuid: UUID
    display_name: str
    created_at: datetime
    updated_at: datetime
    status: str


class EnvironmentCreateBody(Body):
    id: Identifier
    env_type_id: Identifier
    display_name: DisplayName | None = None


class EnvironmentUpdateBody(Body):
    display_name: DisplayName


class EnvironmentOut(EntityOut):
    id: str
    uuid: UUID
    project_id: str
    project_uuid: UUID
    env_type_id: str
    display_name: str
    created_at: datetime
    updated_at: datetime
    status: str
    status_message: str | None = optional()
    runner_id: str | None = optional()


class RefreshRunnerBody(Body):
    dry_run: bool = False


class RefreshRunnerResult(BaseModel):
    runner_id: str
    updated: bool


class RunnerRuleCreateBody(Body):
    runner_id: Annotated[str, Field(min_length=1)]
    project_id: str | None = None
    env_type_id: str | None = None
    #: Ours: only with runner_id ``managed``; the tags a managed runner must carry to run the deployments
    #: of the environments this rule links.
    required_tags: list[str] | None = Field(
        default=None,
        description=(
            "Ours (managed runners): only with `runner_id: managed`. Each tag matches "
            "`[a-z0-9][a-z0-9.-]{0,62}`; a managed runner claims a deployment of an environment linked "
            "through this rule only if it carries all of them."
        ),
    )


class RunnerRuleOut(BaseModel):
    org_id: str
    id: UUID
    runner_id: str
    project_id: str = ""
    env_type_id: str = ""
    created_at: datetime
    required_tags: list[str] | None = optional(
        description="Ours (managed runners): the tags a managed runner must carry; left out when none."
    )

    @classmethod
    def of(cls, rule: entities.RunnerRule) -> RunnerRuleOut:
        return cls(
            org_id=rule.org_id,
            id=rule.id,
            runner_id=rule.runner_id,
            project_id=rule.project_id or "",
            env_type_id=rule.env_type_id or "",
            created_at=rule.created_at,
            required_tags=rule.required_tags or None,
        )
