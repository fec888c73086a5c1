"""Creating a deployment: environment and runner checks, idempotency, compilation, the bundle, the row.

Everything happens in the caller's transaction; the bundle object is written before the row commits (a
failed commit leaves an unreferenced object behind, never a deployment without its bundle).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator import compiler, metrics
from orchestrator.blobs import BlobStore
from orchestrator.dispatch import bundles, env_catalogue, gauges, links, live_logs
from orchestrator.domain import provider_secrets
from orchestrator.domain.deployments import (
    EXECUTING_MESSAGE,
    Deployment,
    DispatchState,
    Mode,
    Status,
)
from orchestrator.domain.entities import Environment, Runner
from orchestrator.domain.managed import MANAGED_RUNNER_ID
from orchestrator.domain.module_rules import Placement
from orchestrator.errors import ConflictError, InvalidInputError, NotFoundError
from orchestrator.protocol.log_stream import Phase
from orchestrator.secretbox import SecretBox
from orchestrator.store import deployments as store
from orchestrator.store import projects as project_store
from orchestrator.store import resource_types as resource_type_store
from orchestrator.store import runners as runner_store

IDEMPOTENCY_WINDOW = timedelta(hours=24)
#: The 409 to an Idempotency-Key repeated with another request.
IDEMPOTENCY_CONFLICT = "incorrect manifest or mode for this idempotency key"


@dataclass(frozen=True, kw_only=True)
class Request:
    """A validated create request (the API's body, plus who asks and how)."""

    project_id: str
    env_id: str
    mode: Mode
    plan_only: bool
    manifest: dict[str, Any] | None
    rollback_to_deployment_id: uuid.UUID | None
    encrypted_outputs_recipient: str | None
    encrypted_logs_recipient: str | None
    runner_log_level: str
    is_dry_run: bool
    idempotency_key: str | None
    created_by: str


@dataclass(frozen=True, kw_only=True)
class DryRun:
    runner_id: str
    diff: dict[str, Any]
    tf: str


@dataclass(frozen=True, kw_only=True)
class Created:
    deployment: Deployment
    #: False when an Idempotency-Key named an existing deployment (nothing new was created).
    new: bool


@dataclass(frozen=True, kw_only=True)
class Context:
    """What creation needs beyond the database."""

    blobs: BlobStore
    public_url: str
    timeout: timedelta
    #: Opens module providers' sealed configurations for the compiler, seals bundles.
    box: SecretBox


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def _request_digest(org_id: str, request: Request) -> str:
    fields = {
        "project_id": request.project_id,
        "env_id": request.env_id,
        "mode": request.mode,
        "plan_only": request.plan_only,
        "manifest": request.manifest,
        "rollback_to_deployment_id": str(request.rollback_to_deployment_id or ""),
    }
    return _digest(org_id, json.dumps(fields, sort_keys=True, default=str))


def _fresh(ctx: Context, now: datetime) -> dict[str, Any]:
    """The columns every new deployment starts with: executing, pending dispatch, no results yet."""
    return {
        "status": Status.EXECUTING,
        "status_message": EXECUTING_MESSAGE,
        "created_at": now,
        "updated_at": now,
        "completed_at": None,
        "outputs": None,
        "error": None,
        "logs_key": None,
        "logs_size": None,
        "dispatch_state": DispatchState.PENDING,
        "dispatch_owner": None,
        "dispatch_lease_until": None,
        "dispatch_attempts": 0,
        "handle": None,
        "launch_note": None,
        "launched_at": None,
        "next_check_at": None,
        "exited_at": None,
        "timeout_at": now + ctx.timeout,
    }


def _managed(runner_id: str, required_tags: list[str] | None) -> dict[str, Any]:
    """A deployment of the managed pool waits, queued, for a managed runner carrying its environment's
    required tags to claim it; the dispatcher never launches it."""
    if runner_id != MANAGED_RUNNER_ID:
        return {"required_tags": None}
    return {"dispatch_state": DispatchState.QUEUED, "required_tags": required_tags or None}


def state_url(public_url: str, org_id: str, env_uuid: uuid.UUID) -> str:
    return f"{public_url}/runner-gateway/v1/orgs/{org_id}/environments/{env_uuid}/state"


async def _linked_runner(
    conn: AsyncConnection, env: Environment, *, dry_run: bool
) -> tuple[Runner, Environment]:
    """The environment's runner, and the environment as linked (the first deployment links it; ``env`` is
    locked by the caller, so the link written is the one read back)."""
    if env.runner_id is None:
        # The first deployment links the environment (upstream: refresh_runner when runner_id is null).
        linked = await links.refresh_runner(
            conn, env.org_id, env.project_id, env.id, dry_run=dry_run, env=env
        )
        if not dry_run:
            env = dataclasses.replace(env, runner_id=linked.runner_id, required_tags=linked.required_tags)
        runner_id = linked.runner_id
    else:
        runner_id = env.runner_id
    runner = await runner_store.get_runner(conn, env.org_id, runner_id)
    if runner is None:
        raise ConflictError(f"no runner exists with id '{runner_id}'")
    return runner, env


async def _idempotent(
    conn: AsyncConnection, org_id: str, key_digest: str, request_digest: str, now: datetime
) -> Deployment | None:
    existing = await store.find_idempotent(conn, org_id, key_digest)
    if existing is None:
        return None
    if existing.created_at <= now - IDEMPOTENCY_WINDOW:
        await store.forget_idempotency_key(conn, existing.id)
        return None
    if existing.request_digest != request_digest:
        # Upstream's words (its integration tests pin them); the request compared is the environment,
        # mode, plan_only, manifest and rollback target.
        raise ConflictError(IDEMPOTENCY_CONFLICT)
    return existing


async def _manifest_and_reference(
    conn: AsyncConnection, org_id: str, env: Environment, request: Request
) -> dict[str, Any]:
    if request.mode is Mode.ROLLBACK:
        if request.rollback_to_deployment_id is None:
            raise InvalidInputError("rollback_to_deployment_id must be set when mode is rollback")
        target = await store.get(conn, org_id, request.rollback_to_deployment_id)
        if target is None or target.env_uuid != env.uuid:
            raise InvalidInputError(
                f"rollback_to_deployment_id: no deployment '{request.rollback_to_deployment_id}' "
                f"in environment '{env.project_id}/{env.id}'"
            )
        return target.manifest
    if request.manifest is None:
        raise InvalidInputError("manifest: field required")
    return request.manifest


async def create(
    conn: AsyncConnection, ctx: Context, org_id: str, request: Request, *, now: datetime
) -> Created | DryRun:
    env = await project_store.get_env(conn, org_id, request.project_id, request.env_id, for_update=True)
    if env is None:
        raise NotFoundError(f"environment '{request.env_id}' not found in project '{request.project_id}'")
    if env.status == "deleting":
        raise ConflictError(f"environment '{env.project_id}/{env.id}' is being deleted")
    request_digest = _request_digest(org_id, request)
    key_digest = _digest(org_id, request.idempotency_key) if request.idempotency_key else None
    if key_digest and not request.is_dry_run:
        existing = await _idempotent(conn, org_id, key_digest, request_digest, now)
        if existing is not None:
            return Created(deployment=existing, new=False)
    runner, env = await _linked_runner(conn, env, dry_run=request.is_dry_run)
    manifest_data = await _manifest_and_reference(conn, org_id, env, request)
    manifest = compiler.parse_manifest(manifest_data)
    catalogue = await env_catalogue.load_env_catalogue(
        conn,
        org_id,
        Placement(project_id=env.project_id, env_type_id=env.env_type_id, env_id=env.id),
    )
    # The compiler gets the providers' whole configurations (the stored ones answer "SECRET").
    catalogue = dataclasses.replace(
        catalogue,
        providers={
            key: dataclasses.replace(
                provider, configuration=provider_secrets.open_configuration(ctx.box, provider)
            )
            for key, provider in catalogue.providers.items()
        },
    )
    backend = compiler.render_backend(
        runner.state_type,
        runner.state_configuration,
        env_uuid=str(env.uuid),
        orchestrator_state_url=state_url(ctx.public_url, org_id, env.uuid),
    )
    resource_types = await resource_type_store.get_resource_types(
        conn, org_id, compiler.required_resource_types(manifest, catalogue)
    )
    compiled = compiler.compile_deployment(
        manifest,
        catalogue,
        resource_types=resource_types,
        env=compiler.EnvInfo(
            org_id=org_id,
            project_id=env.project_id,
            env_id=env.id,
            env_type_id=env.env_type_id,
            env_uuid=str(env.uuid),
        ),
        backend=backend,
    )
    if request.is_dry_run:
        previous = await store.last_in_env(conn, env.uuid, succeeded_state_change=True)
        return DryRun(
            runner_id=runner.id,
            diff=compiler.diff_graphs(previous.graph if previous else None, compiler.graph_of(compiled)),
            tf=compiled.main_tf,
        )
    deployment_id = uuid.uuid4()
    bundle_key = await bundles.put(ctx.blobs, ctx.box, org_id, deployment_id, compiler.build_bundle(compiled))
    deployment = await store.insert(
        conn,
        {
            "id": deployment_id,
            "org_id": org_id,
            "project_id": env.project_id,
            "env_id": env.id,
            "env_uuid": env.uuid,
            "runner_id": runner.id,
            "mode": request.mode,
            "plan_only": request.plan_only,
            "rollback_to_deployment_id": request.rollback_to_deployment_id,
            "manifest": manifest_data,
            "tf": compiled.main_tf,
            "graph": compiler.graph_of(compiled),
            "bundle_key": bundle_key,
            "encrypted_outputs_recipient": request.encrypted_outputs_recipient,
            "encrypted_logs_recipient": request.encrypted_logs_recipient,
            "runner_log_level": request.runner_log_level,
            "idempotency_key_digest": key_digest,
            "request_digest": request_digest,
            "created_by": request.created_by,
            "metrics": dict(compiled.metrics),
            **_fresh(ctx, now),
            **_managed(runner.id, env.required_tags),
        },
    )
    await live_logs.record_phase(conn, deployment, Phase.QUEUED, now=now)
    metrics.DEPLOYMENTS_CREATED.labels(runner.type).inc()
    return Created(deployment=deployment, new=True)


#: How many of an environment's newest deployments a destroy looks through for code it can run.
DESTROY_CODE_CANDIDATES = 20


async def create_destroy(
    conn: AsyncConnection,
    ctx: Context,
    env: Environment,
    *,
    created_by: str,
    now: datetime,
    logs_recipient: str | None = None,
) -> Deployment | None:
    """The destroy deployment that deleting an environment runs first; None when no deployment ever
    applied anything there (nothing to destroy). It runs with the code of the newest deployment that may
    have changed the infrastructure, succeeded or failed (a failed apply can leave resources in the state:
    they are destroyed, not orphaned), or of an older one when that code is no longer stored; Terraform
    destroys whatever the state holds. ``logs_recipient``: the age recipient its runner encrypts its logs
    to (none: the logs are not kept)."""
    candidates = await store.state_changing_in_env(conn, env.uuid, limit=DESTROY_CODE_CANDIDATES)
    if not candidates:
        return None
    if await store.executing_in_env(conn, env.uuid) is not None:
        raise ConflictError(f"a deployment is already executing in environment '{env.project_id}/{env.id}'")
    last, bundle = candidates[0], None
    for candidate in candidates:
        bundle = await bundles.get(ctx.blobs, ctx.box, candidate.org_id, candidate.id, candidate.bundle_key)
        if bundle is not None:
            last = candidate
            break
    if bundle is None:
        raise ConflictError(
            f"the code of deployment '{last.id}' (and of the deployments before it) is no longer stored, so "
            "no destroy can run; delete the environment with force=true, which leaves its resources and "
            "their Terraform state behind"
        )
    deployment_id = uuid.uuid4()
    bundle_key = await bundles.put(ctx.blobs, ctx.box, env.org_id, deployment_id, bundle)
    values = {
        column: getattr(last, column)
        for column in ("org_id", "project_id", "env_id", "env_uuid", "runner_id", "manifest", "tf", "graph")
    }
    deployment = await store.insert(
        conn,
        {
            **values,
            "id": deployment_id,
            "runner_id": env.runner_id or last.runner_id,
            "mode": Mode.DESTROY,
            "plan_only": False,
            "rollback_to_deployment_id": None,
            "bundle_key": bundle_key,
            "encrypted_outputs_recipient": None,
            "encrypted_logs_recipient": logs_recipient,
            "runner_log_level": "info",
            "idempotency_key_digest": None,
            "request_digest": _digest(env.org_id, "destroy", str(env.uuid), str(now)),
            "created_by": created_by,
            "metrics": dict(last.metrics),
            **_fresh(ctx, now),
            **_managed(
                env.runner_id or last.runner_id, env.required_tags if env.runner_id else last.required_tags
            ),
        },
    )
    await live_logs.record_phase(conn, deployment, Phase.QUEUED, now=now)
    metrics.DEPLOYMENTS_CREATED.labels(await gauges.runner_type(conn, deployment)).inc()
    return deployment
