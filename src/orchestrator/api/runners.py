"""Runners: typed configuration of where deployments execute, and the state storage they use."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.api import schemas
from orchestrator.api.context import MANAGE, READ, Principal, principal
from orchestrator.api.paging import PageRequest, page_out, page_request
from orchestrator.domain import entities
from orchestrator.domain.managed import (
    MANAGED_RUNNER_ID,
    MANAGED_RUNNER_TYPE,
    READ_ONLY_MESSAGE,
    check_tags,
)
from orchestrator.domain.roles import Role
from orchestrator.domain.runner_requests import RunnerCreateBody, RunnerUpdateBody, apply_runner_patch
from orchestrator.domain.runner_secrets import split_secrets
from orchestrator.domain.runner_types import (
    K8sRunnerConfiguration,
    RunnerConfiguration,
    RunnerType,
    VmRunnerConfiguration,
    VmSshConnection,
    check_compatibility,
    compatibility_matrix,
    launched_by,
    runner_configuration_to_dict,
)
from orchestrator.errors import ForbiddenError, InvalidInputError, NotFoundError, SealedValueError
from orchestrator.launchers import availability
from orchestrator.launchers.egress import EgressDeniedError, EgressPolicy, is_ip_address
from orchestrator.secretbox import SecretBox
from orchestrator.settings import ServerSettings
from orchestrator.store import agent_commands as command_store
from orchestrator.store import managed_runners as managed_store
from orchestrator.store import runners as store
from orchestrator.web.services import Services, services, transaction

router = APIRouter(tags=["Runner"])


class TypeOnly(BaseModel):
    type: str


def _runner_fields(runner: entities.Runner) -> dict[str, Any]:
    """The fields the summary and the whole runner both answer as stored."""
    return {
        "org_id": runner.org_id,
        "id": runner.id,
        "description": runner.description,
        "created_at": runner.created_at,
        "updated_at": runner.updated_at,
    }


class RunnerSummaryOut(BaseModel):
    org_id: str
    id: str
    description: str | None = schemas.optional()
    created_at: datetime
    updated_at: datetime
    runner_configuration: TypeOnly
    state_storage_configuration: TypeOnly

    @classmethod
    def of(cls, runner: entities.Runner) -> RunnerSummaryOut:
        return cls(
            **_runner_fields(runner),
            runner_configuration=TypeOnly(type=runner.type),
            state_storage_configuration=TypeOnly(type=runner.state_type),
        )


class RunnerStatusOut(BaseModel):
    """The status of a runner an agent launches: when its agent was last seen."""

    #: When the runner's agent last asked the gateway for a command (written every
    #: PO_AGENT_PRESENCE_INTERVAL_SECONDS at most); null if it never has.
    last_seen_at: datetime | None = Field(
        description=(
            "When the runner's agent last asked the gateway for a command (written every "
            "PO_AGENT_PRESENCE_INTERVAL_SECONDS at most); null if it never has."
        )
    )


class RunnerLaunchabilityOut(BaseModel):
    """The status of a runner the orchestrator launches itself, on GET: whether this orchestrator can
    launch its deployments (ours: upstream's documents give runners no status)."""

    #: False: every deployment on the runner fails, with ``message``, until the server is changed.
    launchable: bool = Field(
        description=(
            "Whether this orchestrator can launch the runner's deployments. False when the server lacks "
            "the optional dependencies (extras) of the runner's launcher, or does not allow local runners "
            "(PO_ALLOW_LOCAL_RUNNERS) for a vm runner with a local connection: its deployments then fail "
            "with `message`."
        )
    )
    #: Why not, when ``launchable`` is false: the extra and libraries to install, or the setting.
    message: str | None = schemas.optional(
        description=(
            "Why not, when `launchable` is false: the extra of the server's package and the libraries to "
            "install (and how), or the setting to change. A deployment on the runner fails with it."
        )
    )


class RunnerManagedStatusOut(BaseModel):
    """The status of the managed pool (runner ``managed``, ours): its runners online now."""

    online: int = Field(
        description="How many managed runners were seen within the last PO_MANAGED_LEASE_SECONDS."
    )
    tags: list[str] = Field(description="The tags the managed runners online carry, together.")


class RunnerOut(BaseModel):
    org_id: str
    id: str
    description: str | None = schemas.optional()
    created_at: datetime
    updated_at: datetime
    #: Sensitive values are answered as "SECRET".
    runner_configuration: dict[str, Any]
    state_storage_configuration: dict[str, Any]
    #: "orchestrator" when the orchestrator launches runs itself, "agent" when an agent in the target does,
    #: "platform" for the managed pool (runner ``managed``).
    launched_by: str
    #: Read-only: an agent's runner's presence (always); whether the orchestrator can launch the others
    #: (GET only).
    status: RunnerStatusOut | RunnerLaunchabilityOut | RunnerManagedStatusOut | None = schemas.optional(
        description=(
            "Read-only. For a runner an agent launches (`launched_by: agent`): `last_seen_at`, on every "
            "answer. For the managed pool (`launched_by: platform`): `online` and `tags`. For the others, "
            "on GET only: `launchable` and, when false, `message` (see RunnerLaunchabilityOut); the "
            "answers to create and update leave it out."
        )
    )

    @classmethod
    def of(cls, runner: entities.Runner) -> RunnerOut:
        return cls(
            **_runner_fields(runner),
            runner_configuration=runner.configuration,
            state_storage_configuration=runner.state_configuration,
            launched_by=(
                "platform"
                if runner.type == MANAGED_RUNNER_TYPE
                else launched_by(runner.type, runner.configuration)
            ),
        )


class RunnerWrittenOut(RunnerOut):
    """The answer to a create or update: the runner, and what of the input was read leniently."""

    #: Each names a field whose value was read in another shape than it was given (an ``env`` mapping read
    #: as a list of one variable); the runner is stored in the shape read.
    warnings: list[str] = Field(default_factory=list)


class CompatibilityOut(BaseModel):
    #: Runner type to the state storage types it can use.
    matrix: dict[str, list[str]]


async def _answer(
    conn: AsyncConnection, runner: entities.Runner, *, settings: ServerSettings | None = None
) -> RunnerOut:
    """The runner as answered, with the status of its agent if an agent launches its runs; with the
    server's ``settings`` (GET), whether this orchestrator can launch the runs of any other, and why not
    (``launchers.availability``, which the dispatcher's launcher choice reads too)."""
    answer = RunnerOut.of(runner)
    if runner.type == MANAGED_RUNNER_TYPE and settings is not None:
        since = datetime.now(UTC) - timedelta(seconds=settings.managed_lease_seconds)
        online, tags = await managed_store.count_online(conn, since=since)
        answer.status = RunnerManagedStatusOut(online=online, tags=tags)
    elif answer.launched_by == "agent":
        last_seen = await command_store.last_seen(conn, runner.org_id, runner.id)
        answer.status = RunnerStatusOut(last_seen_at=last_seen)
    elif settings is not None:
        reason = availability.unlaunchable_reason(
            runner.type, runner.configuration, allow_local_runners=settings.allow_local_runners
        )
        if reason is None:
            reason = await asyncio.to_thread(
                availability.engine_reason, runner.type, runner.configuration, os.environ
            )
        answer.status = RunnerLaunchabilityOut(launchable=reason is None, message=reason)
    return answer


async def _written(conn: AsyncConnection, runner: entities.Runner, warnings: list[str]) -> RunnerWrittenOut:
    """The answer to a create or update: the runner as answered, and the warnings of its input."""
    return RunnerWrittenOut(**dict(await _answer(conn, runner)), warnings=warnings)


def _secret_context(org_id: str, runner_id: str) -> str:
    return f"runner:{org_id}/{runner_id}"


def _seal(box: SecretBox, org_id: str, runner_id: str, secrets: dict[str, str]) -> str | None:
    if not secrets:
        return None
    return box.seal(json.dumps(secrets).encode(), context=_secret_context(org_id, runner_id))


def _unseal(box: SecretBox, org_id: str, runner_id: str, sealed: str | None) -> dict[str, str]:
    if not sealed:
        return {}
    opened: dict[str, str] = json.loads(box.open(sealed, context=_secret_context(org_id, runner_id)))
    return opened


def _patched(
    box: SecretBox, runner: entities.Runner, patch: dict[str, Any], sealed: str | None
) -> tuple[RunnerConfiguration, list[str]]:
    """The runner's configuration with ``patch`` merged onto it, and its warnings. Stored secrets that do
    not open with the server key (sealed under another key) can be replaced by sending every secret value
    again."""
    try:
        stored = _unseal(box, runner.org_id, runner.id, sealed)
    except SealedValueError as exc:
        try:
            return apply_runner_patch(runner.type, runner.configuration, patch, stored_secrets={})
        except InvalidInputError as invalid:
            raise InvalidInputError(
                f"{invalid.message}; {exc.message}: send every secret value again", details=invalid.details
            ) from exc
    return apply_runner_patch(runner.type, runner.configuration, patch, stored_secrets=stored)


def _is_local(config: RunnerConfiguration) -> bool:
    return isinstance(config, VmRunnerConfiguration) and config.connection.type == "local"


def _check_allowed(settings: ServerSettings, config: RunnerConfiguration, caller: Principal) -> None:
    if not _is_local(config):
        return
    if not settings.allow_local_runners:
        raise InvalidInputError(
            "runner_configuration.connection.type: local runners are disabled on this server "
            "(start it with PO_ALLOW_LOCAL_RUNNERS=true)"
        )
    _check_platform_admin(caller)


def _check_platform_admin(caller: Principal) -> None:
    # A local runner runs deployments on the orchestrator's own host: whoever configures it decides what
    # runs there (job environment, work_dir), so it is the platform's decision, not an organization's.
    if caller.org_id is not None:
        raise ForbiddenError(
            "runner_configuration.connection.type: only a platform admin may create or change a runner "
            "with a local connection: its deployments run on the orchestrator's own host"
        )


def _check_egress(settings: ServerSettings, config: RunnerConfiguration) -> None:
    """A cluster URL or SSH host this server will not connect to (plain http, a denied IP address) is
    refused now; host names are checked again at every connection (``launchers.egress``)."""
    if isinstance(config, VmRunnerConfiguration) and isinstance(config.connection, VmSshConnection):
        _check_ssh_egress(settings.runner_egress, config.connection)
    if not isinstance(config, K8sRunnerConfiguration):
        return
    policy, data = settings.runner_egress, config.cluster.cluster_data
    for name, url, plain_http in (("server", data.server, None), ("proxy_url", data.proxy_url, True)):
        if url is None:
            continue
        try:
            policy.check_url(url, plain_http=plain_http)
        except EgressDeniedError as exc:
            field = f"runner_configuration.cluster.cluster_data.{name}"
            raise InvalidInputError(
                f"{field}: {exc.message}", details={"errors": [{"field": field, "message": exc.message}]}
            ) from exc


def _check_ssh_egress(policy: EgressPolicy, connection: VmSshConnection) -> None:
    host = connection.host.removeprefix("[").removesuffix("]")
    if not is_ip_address(host):
        return
    try:
        policy.check_address(host, host)
    except EgressDeniedError as exc:
        field = "runner_configuration.connection.host"
        raise InvalidInputError(
            f"{field}: {exc.message}", details={"errors": [{"field": field, "message": exc.message}]}
        ) from exc


def _check_not_managed(runner_id: str) -> None:
    """The managed pool is the platform's: no organization's token (admin or not) changes it."""
    if runner_id == MANAGED_RUNNER_ID:
        raise ForbiddenError(READ_ONLY_MESSAGE)


def _hidden_type(settings: ServerSettings) -> str | None:
    """The managed pool's rows are not shown while managed runners are off."""
    return None if settings.managed_runners_enabled else MANAGED_RUNNER_TYPE


def _storage_dict(storage: BaseModel) -> dict[str, Any]:
    return storage.model_dump(mode="json", exclude_none=True)


@router.get("/runner-compatibility", response_model=CompatibilityOut, tags=["Meta"])
async def get_compatibility() -> CompatibilityOut:
    """Which state storage types each runner type can use (public, no token needed)."""
    return CompatibilityOut(matrix=compatibility_matrix())


@router.post("/orgs/{org_id}/runners", status_code=201, response_model=RunnerWrittenOut)
async def create_runner(
    org_id: str, body: RunnerCreateBody, caller: Principal = MANAGE, svc: Services = Depends(services)
) -> RunnerWrittenOut:
    _check_not_managed(body.id)
    _check_allowed(svc.settings, body.runner_configuration, caller)
    public, secrets = split_secrets(runner_configuration_to_dict(body.runner_configuration))
    _check_egress(svc.settings, body.runner_configuration)
    async with transaction(svc) as conn:
        runner = await store.create_runner(
            conn,
            org_id=org_id,
            runner_id=body.id,
            description=body.description,
            runner_type=body.runner_configuration.type,
            configuration=public,
            config_secret=_seal(svc.box, org_id, body.id, secrets),
            state_type=body.state_storage_configuration.type,
            state_configuration=_storage_dict(body.state_storage_configuration),
        )
        return await _written(conn, runner, body.warnings)


@router.get("/orgs/{org_id}/runners", response_model=schemas.PageOf[RunnerSummaryOut])
async def list_runners(
    org_id: str,
    by_runner_type: Annotated[RunnerType | None, Query(alias="byRunnerType")] = None,
    include_managed: Annotated[
        bool,
        Query(
            description="Ours: also list the managed pool (runner `managed`, type `managed`, which "
            "upstream's RunnerType does not have: without this, upstream clients parse the list)."
        ),
    ] = False,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[RunnerSummaryOut]:
    """The organization's runners; the managed pool only with `include_managed=true` (GET of runner
    `managed` reads it always)."""
    hidden = _hidden_type(svc.settings) if include_managed else MANAGED_RUNNER_TYPE
    async with svc.reader.connect() as conn:
        result = await store.list_runners(
            conn,
            org_id,
            runner_type=by_runner_type,
            after=page.after,
            limit=page.limit,
            hidden_type=hidden,
        )
    return page_out(result, RunnerSummaryOut.of)


@router.get("/orgs/{org_id}/runners/{runner_id}", response_model=RunnerOut)
async def get_runner(
    org_id: str, runner_id: str, _: Principal = READ, svc: Services = Depends(services)
) -> RunnerOut:
    """The runner. Its `status` says, for a runner the orchestrator launches itself, whether this
    orchestrator can launch its deployments (`launchable`) and why not (`message`: an optional dependency
    of the server that is not installed, local runners not allowed); for a runner an agent launches, when
    the agent was last seen."""
    async with svc.reader.connect() as conn:
        runner = await store.get_runner(conn, org_id, runner_id)
        if runner is None or runner.type == _hidden_type(svc.settings):
            raise NotFoundError(f"runner '{runner_id}' not found")
        return await _answer(conn, runner, settings=svc.settings)


@router.patch("/orgs/{org_id}/runners/{runner_id}", response_model=RunnerWrittenOut)
async def update_runner(
    org_id: str,
    runner_id: str,
    body: RunnerUpdateBody,
    caller: Principal = MANAGE,
    svc: Services = Depends(services),
) -> RunnerWrittenOut:
    """``runner_configuration`` is merged onto the stored one as a JSON Merge Patch (RFC 7396): ``type``
    may be left out, ``null`` removes a key, lists replace; ``state_storage_configuration`` replaces the
    stored one."""
    _check_not_managed(runner_id)
    async with transaction(svc) as conn:
        runner = await store.get_runner(conn, org_id, runner_id)
        if runner is None:
            raise NotFoundError(f"runner '{runner_id}' not found")
        connection = runner.configuration.get("connection")
        if runner.type == "vm" and isinstance(connection, dict) and connection.get("type") == "local":
            # Any change of an existing local runner, even of its state storage or description.
            _check_platform_admin(caller)
        configuration, sealed = runner.configuration, await store.get_runner_secret(conn, org_id, runner_id)
        warnings: list[str] = []
        if body.runner_configuration is not None:
            merged, warnings = _patched(svc.box, runner, body.runner_configuration, sealed)
            _check_allowed(svc.settings, merged, caller)
            configuration, secrets = split_secrets(runner_configuration_to_dict(merged))
            sealed = _seal(svc.box, org_id, runner_id, secrets)
            _check_egress(svc.settings, merged)
        state_type, state_configuration = runner.state_type, runner.state_configuration
        if body.state_storage_configuration is not None:
            state_type = body.state_storage_configuration.type
            state_configuration = _storage_dict(body.state_storage_configuration)
        try:
            check_compatibility(runner.type, state_type)
        except InvalidInputError as exc:
            raise InvalidInputError(f"state_storage_configuration.type: {exc.message}") from exc
        updated = await store.update_runner(
            conn,
            org_id,
            runner_id,
            description=body.description if "description" in body.model_fields_set else runner.description,
            configuration=configuration,
            config_secret=sealed,
            state_type=state_type,
            state_configuration=state_configuration,
        )
        assert updated is not None
        return await _written(conn, updated, warnings)


@router.delete("/orgs/{org_id}/runners/{runner_id}", status_code=204)
async def delete_runner(
    org_id: str, runner_id: str, _: Principal = MANAGE, svc: Services = Depends(services)
) -> Response:
    _check_not_managed(runner_id)
    async with transaction(svc) as conn:
        if not await store.delete_runner(conn, org_id, runner_id):
            raise NotFoundError(f"runner '{runner_id}' not found")
    return Response(status_code=204)


# --- managed runner registration credentials (issue 26) ------------------------------------------------


class ManagedRegistrationBody(BaseModel):
    model_config = {"extra": "forbid"}

    tags: Annotated[list[Annotated[str, Field(max_length=63)]], Field(max_length=32)] = Field(
        default_factory=list,
        description="The tags a runner registering with this credential may serve (besides 'managed').",
    )
    description: Annotated[str, Field(max_length=200)] = ""


class ManagedRegistrationOut(BaseModel):
    id: str
    tags: list[str]
    description: str
    created_at: datetime
    #: Only in the answer to its creation: shown once, stored only as its SHA-256.
    secret: str | None = None


class ManagedRegistrationList(BaseModel):
    items: list[ManagedRegistrationOut]
    #: Always null: every credential is in one page (the shape of the API's other lists).
    next_page_token: str | None = None


def _registration_out(
    record: managed_store.Registration, secret: str | None = None
) -> ManagedRegistrationOut:
    return ManagedRegistrationOut(
        id=str(record.id),
        tags=record.tags,
        description=record.description,
        created_at=record.created_at,
        secret=secret,
    )


def _only_platform_admin(caller: Principal) -> None:
    if caller.role is not Role.PLATFORM_ADMIN:
        raise ForbiddenError(
            "only a platform admin may create, list or delete managed runner registration credentials: "
            "they decide which tags the platform's runners serve for every organization"
        )


@router.post(
    "/managed-runner-registrations",
    status_code=201,
    response_model=ManagedRegistrationOut,
    tags=["Managed runners"],
)
async def create_managed_registration(
    body: ManagedRegistrationBody, caller: Principal = Depends(principal), svc: Services = Depends(services)
) -> ManagedRegistrationOut:
    """A registration credential: a managed runner registering with its secret (as `managedSecret`) may
    serve at most `tags`. The secret is in this answer only (stored as its SHA-256)."""
    _only_platform_admin(caller)
    tags = check_tags(body.tags)
    secret = "pomr_" + secrets.token_urlsafe(32)
    async with transaction(svc) as conn:
        record = await managed_store.insert_registration(
            conn,
            secret_hash=hashlib.sha256(secret.encode()).hexdigest(),
            tags=tags,
            description=body.description,
            now=datetime.now(UTC),
        )
    return _registration_out(record, secret)


@router.get(
    "/managed-runner-registrations",
    response_model=ManagedRegistrationList,
    tags=["Managed runners"],
)
async def list_managed_registrations(
    caller: Principal = Depends(principal), svc: Services = Depends(services)
) -> ManagedRegistrationList:
    """The registration credentials (never their secrets: `secret` is null)."""
    _only_platform_admin(caller)
    async with svc.reader.connect() as conn:
        records = await managed_store.list_registrations(conn)
    return ManagedRegistrationList(items=[_registration_out(r) for r in records])


@router.delete("/managed-runner-registrations/{registration_id}", status_code=204, tags=["Managed runners"])
async def delete_managed_registration(
    registration_id: uuid.UUID, caller: Principal = Depends(principal), svc: Services = Depends(services)
) -> Response:
    """Delete a registration credential: no runner registers with it any more (runners registered with it
    keep their tokens until they register again)."""
    _only_platform_admin(caller)
    async with transaction(svc) as conn:
        deleted = await managed_store.delete_registration(conn, registration_id)
    if not deleted:
        raise NotFoundError(f"managed runner registration credential '{registration_id}' not found")
    return Response(status_code=204)
