"""Deployments as a resource, as upstream's provider has them: creating one deploys a manifest.

Every attribute requires replacement (a changed manifest is a new deployment), and deleting the resource
only forgets it: a deployment cannot be undone, deleting its environment destroys what it made. With
``wait_for`` (the default) the apply waits until the deployment is final and fails when it failed; its
outputs are encrypted to a key made for this one deployment, decrypted here and kept as the sensitive
``outputs`` JSON string (only the creating apply can read them). YAML and age are imported when a
deployment's manifest or outputs are read: a provider start for other resources does not load them.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.tfprovider.modules import compact_json
from orchestrator.tfprovider.resource import Spec
from orchestrator.tfprovider.schema import a_bool, a_str
from orchestrator.tfprovider.session import ApiProblem, Session
from orchestrator.tfprovider.values import JsonDict

MODES = ("deploy", "plan_only")
#: How long an apply waits for a deployment at most, and how long each long poll asks the API to wait.
WAIT_TIMEOUT_SECONDS = 6 * 3600.0
POLL_SECONDS = 30


def manifest_value(text: Any) -> JsonDict:
    """The manifest of a configuration: a YAML or JSON object (``jsonencode(...)`` or ``yamlencode(...)``)."""
    if not isinstance(text, str):
        raise ApiProblem("invalid manifest", "manifest must be a JSON or YAML string (use jsonencode(...))")
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ApiProblem("invalid manifest", f"manifest is neither JSON nor YAML: {exc}") from None
    if not isinstance(value, dict):
        raise ApiProblem("invalid manifest", "manifest must be an object with workloads and shared")
    return value


def _mode(config: JsonDict) -> str:
    mode = config.get("mode") or "deploy"
    if mode not in MODES:
        raise ApiProblem("invalid mode", f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    return str(mode)


def validate_deployment(config: JsonDict) -> list[str]:
    """Plan-time checks of a configuration: messages naming the attribute."""
    problems = []
    for check in (lambda: _mode(config), lambda: manifest_value(config.get("manifest"))):
        try:
            check()
        except ApiProblem as problem:
            problems.append(problem.detail)
    return problems


async def _wait(session: Session, deployment: JsonDict) -> JsonDict:
    deployment_id = str(deployment["id"])
    deadline = time.monotonic() + WAIT_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        final = await session.call(
            f"wait for deployment {deployment_id}",
            session.client.wait_for_deployment,
            session.org,
            deployment_id,
            timeout_seconds=POLL_SECONDS,
        )
        if final is not None:
            return final
    raise ApiProblem(
        f"wait for deployment {deployment_id}: timed out",
        f"it still executes after {WAIT_TIMEOUT_SECONDS:.0f} s",
    )


async def _outputs(session: Session, deployment_id: str, identity: str) -> str | None:
    try:
        raw = await session.call(
            f"read the outputs of deployment {deployment_id}",
            session.client.get_encrypted_outputs,
            session.org,
            deployment_id,
        )
    except ApiProblem as problem:
        if problem.status == 404:  # a plan-only deployment, or nothing was output
            return None
        raise
    import yaml

    from orchestrator.protocol import age

    try:
        outputs = yaml.safe_load(age.decrypt_b64(raw, identity))
    except (OrchestratorError, yaml.YAMLError) as exc:
        raise ApiProblem(f"read the outputs of deployment {deployment_id}", str(exc)) from None
    return compact_json(outputs)


async def _create_deployment(session: Session, config: JsonDict) -> JsonDict:
    from orchestrator.protocol import age

    name = f"{config['project_id']}/{config['env_id']}"
    identity, recipient = age.generate_identity()
    body = {
        "project_id": config["project_id"],
        "env_id": config["env_id"],
        "mode": _mode(config),
        "manifest": manifest_value(config.get("manifest")),
        "encrypted_outputs_recipient": recipient,
    }
    created: JsonDict = await session.call(
        f"deploy to environment {name!r}",
        session.client.create_deployment,
        session.org,
        body,
        idempotency_key=str(uuid.uuid4()),
    )
    if config.get("wait_for") is False:
        return created
    final = await _wait(session, created)
    if final.get("status") != "succeeded":
        raise ApiProblem(
            f"deployment {final['id']} to environment {name!r} {final.get('status')}",
            str(final.get("status_message") or "no message"),
        )
    return {**final, "outputs": await _outputs(session, str(final["id"]), identity)}


async def _read_deployment(session: Session, keys: JsonDict) -> JsonDict | None:
    return await session.find(
        f"read deployment {keys['id']}", session.client.get_deployment, session.org, keys["id"]
    )


async def _forget_deployment(session: Session, state: JsonDict) -> None:
    """Nothing to call: a deployment stays in the environment's history (upstream does the same)."""


def deployment_state(found: JsonDict, prior: JsonDict) -> JsonDict:
    manifest = prior.get("manifest")
    if manifest is None and isinstance(found.get("manifest"), dict):  # an import
        manifest = compact_json(found["manifest"])
    return {
        "id": str(found["id"]),
        "project_id": found.get("project_id"),
        "env_id": found.get("env_id"),
        "manifest": manifest,
        "mode": found.get("mode") if prior.get("mode") is None else prior["mode"],
        "wait_for": prior.get("wait_for"),
        "status": found.get("status"),
        "status_message": found.get("status_message"),
        "runner_id": found.get("runner_id"),
        "created_at": found.get("created_at"),
        "completed_at": found.get("completed_at"),
        # Only the creating apply can decrypt them: later reads keep what it found.
        "outputs": found["outputs"] if "outputs" in found else prior.get("outputs"),
    }


DEPLOYMENT = Spec(
    name="deployment",
    description="A deployment of a manifest to an environment; deleting the resource only forgets it.",
    attributes={
        "project_id": a_str(required=True, requires_replace=True),
        "env_id": a_str(required=True, requires_replace=True),
        "manifest": a_str(
            required=True, requires_replace=True, description="jsonencode(...) or yamlencode(...)."
        ),
        "mode": a_str(
            optional=True, computed=True, requires_replace=True, description="deploy (default) or plan_only."
        ),
        "wait_for": a_bool(
            optional=True, requires_replace=True, description="Wait until it is final (default true)."
        ),
        "id": a_str(computed=True, description="The deployment's id (a UUID)."),
        "status": a_str(computed=True, description="executing, succeeded, failed or cancelled."),
        "status_message": a_str(computed=True),
        "runner_id": a_str(computed=True),
        "created_at": a_str(computed=True),
        "completed_at": a_str(computed=True),
        "outputs": a_str(computed=True, sensitive=True, description="The deployment's outputs as JSON."),
    },
    create=_create_deployment,
    read=_read_deployment,
    delete=_forget_deployment,
    to_state=deployment_state,
    validate=validate_deployment,
)

RESOURCES = (DEPLOYMENT,)
