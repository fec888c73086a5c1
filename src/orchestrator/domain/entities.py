"""Control-plane entities as frozen value objects (stdlib only)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Organization:
    id: str
    uuid: uuid.UUID
    status: str
    created_by: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, kw_only=True)
class ApiToken:
    id: uuid.UUID
    #: None for a platform-wide token.
    org_id: str | None
    role: str
    description: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None


@dataclass(frozen=True, kw_only=True)
class EnvironmentType:
    org_id: str
    id: str
    uuid: uuid.UUID
    display_name: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, kw_only=True)
class Project:
    org_id: str
    id: str
    uuid: uuid.UUID
    display_name: str
    status: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, kw_only=True)
class Environment:
    org_id: str
    project_id: str
    project_uuid: uuid.UUID
    id: str
    uuid: uuid.UUID
    env_type_id: str
    display_name: str
    status: str
    status_message: str | None
    #: Sticky link to the runner that executes this environment's deployments; None until the first
    #: refresh_runner (explicit, or implied by the first deployment).
    runner_id: str | None
    created_at: datetime
    updated_at: datetime
    #: With runner ``managed``: the tags its managed runner must carry (the linking rule's); None: none.
    required_tags: list[str] | None = None


@dataclass(frozen=True, kw_only=True)
class Runner:
    org_id: str
    id: str
    description: str | None
    type: str
    #: The configuration with every sensitive value replaced by "SECRET" (safe to answer).
    configuration: dict[str, Any]
    state_type: str
    state_configuration: dict[str, Any]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, kw_only=True)
class RunnerRule:
    org_id: str
    id: uuid.UUID
    runner_id: str
    project_id: str | None
    env_type_id: str | None
    created_at: datetime
    #: Only with runner ``managed``: the tags its managed runner must carry; None: none.
    required_tags: list[str] | None = None
