"""Deployments (upstream data plane): create, list, get, wait, compiled code, encrypted outputs and logs;
and the Terraform state a deployment's engine could not save, when the orchestrator keeps it."""

from __future__ import annotations

import asyncio
import base64
import binascii
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

import pyrage
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import AfterValidator, BaseModel, Field, StringConstraints

from orchestrator.api import schemas
from orchestrator.api.context import DEPLOY, MANAGE, READ, Principal
from orchestrator.api.paging import PageRequest, page_out, page_request
from orchestrator.dispatch import cancel, creation, errored_states
from orchestrator.domain.deployments import Deployment, Mode, Status, is_final
from orchestrator.errors import GoneError, InvalidInputError, NotFoundError
from orchestrator.store import deployments as store
from orchestrator.store import phases as phase_store
from orchestrator.web.errors import error_body
from orchestrator.web.services import Services, services, transaction

router = APIRouter(tags=["Deployment"])

MAX_WAIT_SECONDS = 60
#: Waiters re-read the database this often, so a result applied by another replica is seen.
WAIT_POLL_SECONDS = 1.0


def _age_recipient(value: str) -> str:
    try:
        pyrage.x25519.Recipient.from_str(value)
    except Exception as exc:  # pyrage raises its own error types for a malformed key
        raise ValueError("does not look like an 'age' public key") from exc
    return value


AgeRecipient = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_age_recipient)]


class DeploymentCreateBody(schemas.Body):
    project_id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    env_id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    mode: Literal["deploy", "plan_only", "rollback"] = "deploy"
    plan_only: bool | None = None
    manifest: dict[str, Any] | None = None
    rollback_to_deployment_id: uuid.UUID | None = None
    encrypted_outputs_recipient: AgeRecipient | None = None
    encrypted_logs_recipient: AgeRecipient | None = None
    is_dry_run: bool = False
    runner_log_level: Literal["debug", "info", "warn", "error"] = "info"


class DeploymentMetrics(BaseModel):
    num_workloads: int = 0
    num_resource_nodes: int = 0
    num_tf_resources: int | None = schemas.optional()
    num_tf_resources_added: int | None = schemas.optional()
    num_tf_resources_removed: int | None = schemas.optional()
    num_tf_resources_changed: int | None = schemas.optional()


class PhaseOut(BaseModel):
    """A phase the deployment entered, and when."""

    phase: str = Field(
        description="queued, launching (recorded by the orchestrator), init, plan, apply or destroy, "
        "reporting (named by the runner's log chunks).",
        examples=["queued", "launching", "init", "plan", "apply", "destroy", "reporting"],
    )
    started_at: datetime

    @classmethod
    def of(cls, start: phase_store.PhaseStart) -> PhaseOut:
        return cls(phase=start.phase, started_at=start.started_at)


class DeploymentSummaryOut(BaseModel):
    org_id: str
    project_id: str
    env_id: str
    id: uuid.UUID
    created_at: datetime
    created_by: str
    completed_at: datetime | None = schemas.optional()
    mode: str
    plan_only: bool
    rollback_to_deployment_id: uuid.UUID | None = schemas.optional()
    status: str = Field(
        description="executing, then one final status: succeeded, failed, or cancelled (`actions/cancel`). "
        "A string, as upstream's: a client reads a status it does not know as final unless it is executing.",
        examples=["executing", "succeeded", "failed", "cancelled"],
    )
    status_message: str
    metrics: DeploymentMetrics
    runner_id: str
    #: When the runner was launched (absent until then).
    launched_at: datetime | None = schemas.optional()
    phase: str | None = schemas.optional(
        description="The deployment's latest phase (`phases[-1].phase`). Phases are not secret; its log is."
    )
    phases: list[PhaseOut] = Field(
        default_factory=list,
        description="The phases the deployment went through, oldest first (a deployment that failed before "
        "its runner started ends with queued or launching; a runner that streams no live log reports no "
        "phases of its own).",
    )

    @classmethod
    def fields_of(cls, d: Deployment, phases: list[phase_store.PhaseStart]) -> dict[str, Any]:
        return {
            "org_id": d.org_id,
            "project_id": d.project_id,
            "env_id": d.env_id,
            "id": d.id,
            "created_at": d.created_at,
            "created_by": d.created_by,
            "completed_at": d.completed_at,
            "mode": d.mode,
            "plan_only": d.plan_only,
            "rollback_to_deployment_id": d.rollback_to_deployment_id,
            "status": d.status,
            "status_message": d.status_message,
            "metrics": DeploymentMetrics(**d.metrics),
            "runner_id": d.runner_id,
            "launched_at": d.launched_at,
            "phase": phases[-1].phase if phases else None,
            "phases": [PhaseOut.of(start) for start in phases],
        }

    @classmethod
    def of(cls, d: Deployment, phases: list[phase_store.PhaseStart]) -> DeploymentSummaryOut:
        return cls(**cls.fields_of(d, phases))


class DeploymentOut(DeploymentSummaryOut):
    manifest: dict[str, Any]
    #: The runner's error when the deployment failed.
    error: dict[str, Any] | None = schemas.optional()
    has_logs: bool = False
    #: GET .../encrypted-outputs answers them (kept, within PO_OUTPUTS_RETENTION_SECONDS).
    has_outputs: bool = False

    @classmethod
    def of(
        cls,
        d: Deployment,
        phases: list[phase_store.PhaseStart],
        *,
        outputs_retention: timedelta | None = None,
    ) -> DeploymentOut:
        """``outputs_retention``: outputs finished longer ago count as gone (default: as stored)."""
        missing = (
            None
            if outputs_retention is None
            else outputs_missing(d, now=datetime.now(UTC), retention=outputs_retention)
        )
        return cls(
            **cls.fields_of(d, phases),
            manifest=d.manifest,
            error=d.error,
            has_logs=d.logs_key is not None,
            has_outputs=d.outputs is not None and missing is None,
        )


class DryRunOut(BaseModel):
    runner_id: str
    diff: dict[str, Any]
    #: The compiled root module that would run.
    tf: str


class EncryptedOutputsOut(BaseModel):
    raw: str


def _mode(body: DeploymentCreateBody) -> tuple[Mode, bool]:
    if body.mode == "plan_only":
        if body.plan_only is False:
            # Upstream's words (pinned by its integration tests).
            raise InvalidInputError("plan_only cannot be false if mode is plan_only")
        return Mode.DEPLOY, True
    return Mode(body.mode), bool(body.plan_only)


@router.post(
    "/orgs/{org_id}/deployments",
    status_code=201,
    response_model=DeploymentOut,
    responses={
        200: {"model": DryRunOut, "description": "A dry run: what would run."},
        201: {
            "description": "The deployment created, or the one an earlier request with this "
            "Idempotency-Key created.",
        },
    },
)
async def create_deployment(
    org_id: str,
    body: DeploymentCreateBody,
    request: Request,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=255)] = None,
    caller: Principal = DEPLOY,
    svc: Services = Depends(services),
) -> Response:
    mode, plan_only = _mode(body)
    create_request = creation.Request(
        **body.model_dump(exclude={"mode", "plan_only"}),
        mode=mode,
        plan_only=plan_only,
        idempotency_key=idempotency_key or None,
        created_by=caller.token_id,
    )
    async with transaction(svc) as conn:
        outcome = await creation.create(conn, svc.creation, org_id, create_request, now=datetime.now(UTC))
    if isinstance(outcome, creation.DryRun):
        out = DryRunOut(runner_id=outcome.runner_id, diff=outcome.diff, tf=outcome.tf)
        return JSONResponse(out.model_dump(mode="json"), status_code=200)
    if outcome.new:
        svc.wake_dispatcher()
    # 201 for a repeat with the same Idempotency-Key too (the deployment it made), as upstream answers:
    # its clients read a 200 as a dry run's answer.
    return JSONResponse(
        (await _out(svc, outcome.deployment)).model_dump(mode="json"),
        status_code=201,
    )


@router.get("/orgs/{org_id}/deployments", response_model=schemas.PageOf[DeploymentSummaryOut])
async def list_deployments(
    org_id: str,
    project_id: str | None = None,
    env_id: str | None = None,
    by_mode: Annotated[list[str] | None, Query(alias="by_mode[]")] = None,
    by_status: Annotated[
        list[str] | None,
        Query(
            alias="by_status[]", description="Only these statuses: executing, succeeded, failed, cancelled."
        ),
    ] = None,
    _: Principal = READ,
    page: PageRequest = Depends(page_request),
    svc: Services = Depends(services),
) -> schemas.PageOf[DeploymentSummaryOut]:
    async with svc.reader.connect() as conn:
        result = await store.list_page(
            conn,
            org_id,
            project_id=project_id,
            env_id=env_id,
            modes=by_mode or [],
            statuses=by_status or [],
            after=page.after,
            limit=page.limit,
        )
        phases = await phase_store.of_many(conn, [d.id for d in result.items])
    return page_out(result, lambda d: DeploymentSummaryOut.of(d, phases.get(d.id, [])))


async def _get(svc: Services, org_id: str, deployment_id: uuid.UUID) -> Deployment:
    async with svc.reader.connect() as conn:
        deployment = await store.get(conn, org_id, deployment_id)
    if deployment is None:
        raise NotFoundError(f"deployment '{deployment_id}' not found")
    return deployment


@router.get("/orgs/{org_id}/deployments/{deployment_id}", response_model=DeploymentOut)
async def get_deployment(
    org_id: str, deployment_id: uuid.UUID, _: Principal = READ, svc: Services = Depends(services)
) -> DeploymentOut:
    return await _out(svc, await _get(svc, org_id, deployment_id))


@router.get(
    "/orgs/{org_id}/deployments/{deployment_id}/actions/wait-for-complete",
    response_model=DeploymentOut,
    responses={408: {"description": "Still executing: call again."}},
)
async def wait_for_complete(
    org_id: str,
    deployment_id: uuid.UUID,
    timeout_in_seconds: Annotated[int, Query(ge=2, le=MAX_WAIT_SECONDS)] = 30,
    _: Principal = READ,
    svc: Services = Depends(services),
) -> Response:
    deadline = asyncio.get_running_loop().time() + timeout_in_seconds
    while True:
        deployment = await _get(svc, org_id, deployment_id)
        if is_final(deployment.status):
            return JSONResponse((await _out(svc, deployment)).model_dump(mode="json"))
        remaining = deadline - asyncio.get_running_loop().time()
        # A stopping server answers at once rather than hold its shutdown: the client calls again.
        if remaining <= 0 or svc.notifier.closed:
            return JSONResponse(
                error_body("API-408", f"deployment '{deployment_id}' is still executing"), status_code=408
            )
        await svc.notifier.wait(str(deployment_id), min(remaining, WAIT_POLL_SECONDS))


@router.post(
    "/orgs/{org_id}/deployments/{deployment_id}/actions/cancel",
    response_model=DeploymentOut,
    status_code=202,
    responses={
        200: {"description": "It had not started: it is `cancelled` now."},
        202: {
            "description": "Its run is being stopped (Terraform interrupted, its state saved); it ends "
            "`cancelled` (`succeeded` if the run finished first). Wait with `actions/wait-for-complete`."
        },
        409: {"description": "It already ended (succeeded, failed or cancelled)."},
    },
)
async def cancel_deployment(
    org_id: str, deployment_id: uuid.UUID, caller: Principal = DEPLOY, svc: Services = Depends(services)
) -> Response:
    async with transaction(svc) as conn:
        outcome = await cancel.cancel(conn, org_id, deployment_id, by=caller.token_id, now=datetime.now(UTC))
    if outcome.final:
        svc.notifier.notify(str(deployment_id))
    else:
        svc.wake_dispatcher()
    return JSONResponse(
        (await _out(svc, outcome.deployment)).model_dump(mode="json"),
        status_code=200 if outcome.final else 202,
    )


@router.get("/orgs/{org_id}/deployments/{deployment_id}/tf", response_class=PlainTextResponse)
async def get_tf(
    org_id: str, deployment_id: uuid.UUID, _: Principal = READ, svc: Services = Depends(services)
) -> PlainTextResponse:
    """The compiled root module (main.tf) the runner executes."""
    return PlainTextResponse((await _get(svc, org_id, deployment_id)).tf)


@router.get(
    "/orgs/{org_id}/deployments/{deployment_id}/encrypted-outputs", response_model=EncryptedOutputsOut
)
async def get_encrypted_outputs(
    org_id: str, deployment_id: uuid.UUID, _: Principal = READ, svc: Services = Depends(services)
) -> EncryptedOutputsOut:
    """The outputs, age ciphertext (base64): answered ``PO_OUTPUTS_RETENTION_SECONDS`` after the deployment
    finished, then 404 "deployment outputs are no longer available" (upstream's answer)."""
    deployment = await _get(svc, org_id, deployment_id)
    missing = outputs_missing(deployment, now=datetime.now(UTC), retention=_outputs_retention(svc))
    if missing is not None or deployment.outputs is None:
        raise NotFoundError(missing or f"deployment '{deployment_id}' has no outputs")
    return EncryptedOutputsOut(raw=deployment.outputs)


def _outputs_retention(svc: Services) -> timedelta:
    return timedelta(seconds=svc.settings.outputs_retention_seconds)


async def _out(svc: Services, deployment: Deployment) -> DeploymentOut:
    async with svc.reader.connect() as conn:
        phases = await phase_store.of(conn, deployment.id)
    return DeploymentOut.of(deployment, phases, outputs_retention=_outputs_retention(svc))


#: Upstream's message (pinned by its integration tests) once the outputs' retention has passed.
OUTPUTS_GONE = "deployment outputs are no longer available"


def outputs_missing(deployment: Deployment, *, now: datetime, retention: timedelta) -> str | None:
    """Why the deployment's outputs cannot be answered (the 404 message), or None when they can."""
    where = f"deployment '{deployment.id}'"
    if not is_final(deployment.status):
        return f"{where} has no outputs yet: it is still executing"
    if deployment.mode == Mode.DESTROY:
        return f"{where} has no outputs: a destroy reports none"
    if deployment.encrypted_outputs_recipient is None:
        return f"{where} has no outputs: it was created without an encrypted_outputs_recipient"
    finished = deployment.completed_at or deployment.updated_at
    if deployment.outputs is None and deployment.status != Status.SUCCEEDED:
        return f"{where} has no outputs: it {deployment.status}"
    if now >= finished + retention:
        return OUTPUTS_GONE
    if deployment.outputs is None:
        return f"{where} has no outputs: its runner reported none"
    return None


def logs_removed(svc: Services, deployment_id: uuid.UUID, removed_at: datetime) -> GoneError:
    """410: the deployment's logs (whole log, live log chunks) and bundle were deleted by the retention
    worker."""
    days = f"{svc.settings.object_retention_days:g}"
    return GoneError(
        f"the logs of deployment '{deployment_id}' were removed on {removed_at.isoformat()} after the "
        f"retention period: deployment logs and bundles are kept {days} days after the deployment "
        "finished (PO_OBJECT_RETENTION_DAYS), and only while its environment exists"
    )


@router.get(
    "/orgs/{org_id}/deployments/{deployment_id}/actions/get-logs",
    response_class=PlainTextResponse,
    responses={410: {"description": "The logs were removed after the retention period."}},
)
async def get_logs(
    org_id: str,
    deployment_id: uuid.UUID,
    decrypt_key: Annotated[str | None, Header(alias="DecryptKey")] = None,
    _: Principal = READ,
    svc: Services = Depends(services),
) -> Response:
    """The runner's logs: age ciphertext (base64), or plain text when the ``DecryptKey`` header is given."""
    deployment = await _get(svc, org_id, deployment_id)
    data = await svc.blobs.get(deployment.logs_key) if deployment.logs_key else None
    if data is None:
        async with svc.reader.connect() as conn:
            removed_at = await store.objects_deleted_at(conn, org_id, deployment_id)
        if removed_at is not None:
            raise logs_removed(svc, deployment_id, removed_at)
        raise NotFoundError(f"deployment '{deployment_id}' has no logs")
    headers = {
        "Content-Disposition": f'attachment; filename="{deployment_id}.log"',
        "Cache-Control": "no-store",
    }
    if not decrypt_key:
        return PlainTextResponse(data.decode(), headers=headers)
    try:
        identity = pyrage.x25519.Identity.from_str(decrypt_key.strip())
    except Exception as exc:  # pyrage's own error types
        raise InvalidInputError("DecryptKey: not an age secret key (AGE-SECRET-KEY-...)") from exc
    try:
        plain = pyrage.decrypt(base64.b64decode(data), [identity])
    except (binascii.Error, pyrage.DecryptError) as exc:
        raise InvalidInputError("DecryptKey: the logs do not decrypt with this key") from exc
    return PlainTextResponse(plain.decode(errors="replace"), headers=headers)


@router.get(
    "/orgs/{org_id}/deployments/{deployment_id}/errored-state",
    responses={200: {"content": {"application/json": {}}, "description": "A Terraform state file."}},
)
async def get_errored_state(
    org_id: str, deployment_id: uuid.UUID, _: Principal = MANAGE, svc: Services = Depends(services)
) -> Response:
    """The Terraform state the deployment's engine could not save and the orchestrator keeps (its
    status message says so), as Terraform wrote it: push it with ``terraform state push``. Org admins
    only: a state holds every resource attribute, secrets included."""
    deployment = await _get(svc, org_id, deployment_id)
    data = await errored_states.kept(svc.blobs, svc.box, deployment)
    if data is None:
        raise NotFoundError(f"deployment '{deployment_id}' has no errored state kept")
    return Response(
        data,
        media_type="application/json",
        headers={
            "Content-Disposition": f'attachment; filename="{deployment_id}.errored.tfstate"',
            "Cache-Control": "no-store",
        },
    )
