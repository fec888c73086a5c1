"""The ``serverless-ecs`` runner type: each deployment's runner is one ECS task on Fargate, started with
the runner's IAM role (``auth``; credentials from ``launchers.aws``).

- ``launch``: first looks for the deployment's task (``ListTasks`` by ``startedBy`` = the deployment id,
  running and stopped, then ``DescribeTasks`` for its ``PlatformOrchestratorDeploymentId`` tag): a task
  found is adopted, so launching twice starts one task. Otherwise the environment's task definition
  (family ``platform_orchestrator_env_<org>_<env uuid>``, upstream's) is looked up and registered again
  only when it differs from ``render_task_definition``; then ``RunTask`` on Fargate (awsvpc with the job's
  subnets, security groups and public-IP setting), tagged, ``startedBy`` and ``clientToken`` the
  deployment id. The handle is ``ecs:<task ARN>`` (region and cluster are in the ARN).
- The task definition holds what is the same for every deployment of the environment: container
  ``main``, the image (``job.image`` or the launcher's), command ``["standard"]``, the runner's variables
  that do not change per deployment plus ``job.environment``, ``job.secrets`` as Secrets Manager / SSM
  ARNs (ECS resolves them with the execution role), the execution and task roles, 0.5 vCPU and 1 GB.
  What changes per deployment (``DEPLOYMENT_ID``, ``MODE``, ``LOG_LEVEL``, the encryption recipients and
  ``TOKEN``) goes into the task's ``overrides``: task definition revisions are kept by ECS for good and
  readable with ``ecs:DescribeTaskDefinition``; the overrides live with the task (``DescribeTasks``).
- ``status``: ``DescribeTasks``. Until ``STOPPED`` the task is RUNNING; a stopped task is EXITED with
  container ``main``'s exit code, and ECS's ``stoppedReason`` (and the container's reason) as detail:
  for a task that never started (an image that cannot be pulled, secrets the execution role cannot
  read) that is the only word on why. Errors give UNKNOWN with the cause.
- ``cancel``: ``StopTask`` (ECS sends SIGTERM, then SIGKILL after the container's ``stopTimeout``, 30 s
  by default on Fargate); a task already gone is fine.

IAM the role needs: ``ecs:DescribeTaskDefinition``, ``ecs:RegisterTaskDefinition``, ``ecs:RunTask``,
``ecs:ListTasks``, ``ecs:DescribeTasks``, ``ecs:StopTask``, ``ecs:TagResource`` (tags on create), and
``iam:PassRole`` on the execution and task roles.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import pydantic

from orchestrator.domain.runner_types import ServerlessEcsRunnerConfiguration, ServerlessEcsRunnerJob
from orchestrator.launchers import aws, images
from orchestrator.launchers.base import LaunchError, LaunchTarget, RunState, RunStatus, WorkloadIdentity
from orchestrator.protocol.commands import JOB_CONTAINER, TOKEN_ENV
from orchestrator.protocol.launch import RunSpec

__all__ = [
    "CPU",
    "DEPLOYMENT_TAG",
    "MEMORY",
    "PER_DEPLOYMENT",
    "EcsLauncher",
    "parse_handle",
    "render_overrides",
    "render_run_task",
    "render_task_definition",
    "same_definition",
    "task_family",
    "task_status",
]

#: Upstream's ".5 vCPU" and "1 GB", in the units ECS answers with.
CPU: Final = "512"
MEMORY: Final = "1024"
COMMAND: Final = ("standard",)
#: The runner's variables that change with every deployment: the task's overrides, not the definition.
PER_DEPLOYMENT: Final = frozenset(
    {"DEPLOYMENT_ID", "MODE", "LOG_LEVEL", "ENCRYPTING_KEY", "ENCRYPTING_LOGS_KEY", TOKEN_ENV}
)
#: Upstream's tag keys (``DP:internal/runners/ecs_runner.go``), so IAM conditions written for it hold.
DEPLOYMENT_TAG: Final = "PlatformOrchestratorDeploymentId"
ORG_TAG: Final = "PlatformOrchestratorOrgId"
RUNNER_TAG: Final = "PlatformOrchestratorRunnerId"
MANAGED_BY_TAG: Final = "ManagedBy"
MANAGED_BY: Final = "platform-orchestrator"
STOP_REASON: Final = "stopped by the platform orchestrator"
#: ECS's stop reasons name the failing call and resource at their end: quoted up to this length.
MAX_STOP_REASON: Final = 1024
_FAMILY_CHARACTER: Final = re.compile(r"[^A-Za-z0-9_-]")
_TASK_ARN: Final = re.compile(
    r"^arn:aws[a-z-]*:ecs:(?P<region>[^:]+):[0-9]{12}:task/(?P<cluster>[^/]+)/[^/]+$"
)


def task_family(org_id: str, env_uuid: str) -> str:
    """Upstream's ``platform_orchestrator_env_<org>_<env uuid>`` (ECS allows letters, digits, ``_`` and
    ``-``, at most 255)."""
    return _FAMILY_CHARACTER.sub("_", f"platform_orchestrator_env_{org_id}_{env_uuid}")[:255]


def _pairs(values: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "value": values[name]} for name in sorted(values)]


def render_task_definition(spec: RunSpec, job: ServerlessEcsRunnerJob, image: str) -> dict[str, Any]:
    """The ``RegisterTaskDefinition`` parameters of the deployment's environment (no per-deployment value,
    no token)."""
    environment = {k: v for k, v in spec.runner_environment().items() if k not in PER_DEPLOYMENT}
    environment.update(job.environment)
    container: dict[str, Any] = {
        "name": JOB_CONTAINER,
        "image": job.image or image,
        "essential": True,
        "command": list(COMMAND),
        "environment": _pairs(environment),
    }
    if job.secrets:
        container["secrets"] = [{"name": k, "valueFrom": job.secrets[k]} for k in sorted(job.secrets)]
    definition: dict[str, Any] = {
        "family": task_family(spec.org_id, spec.env_uuid),
        "executionRoleArn": job.execution_role_arn,
        "networkMode": "awsvpc",
        "requiresCompatibilities": ["FARGATE"],
        "cpu": CPU,
        "memory": MEMORY,
        "containerDefinitions": [container],
        "tags": [
            {"key": MANAGED_BY_TAG, "value": MANAGED_BY},
            {"key": ORG_TAG, "value": spec.org_id},
            {"key": RUNNER_TAG, "value": spec.runner_id},
        ],
    }
    if job.task_role_arn:
        definition["taskRoleArn"] = job.task_role_arn
    return definition


def render_overrides(spec: RunSpec) -> dict[str, Any]:
    """The task's ``overrides``: the per-deployment variables of container ``main``, ``TOKEN`` included."""
    environment = {k: v for k, v in spec.runner_environment().items() if k in PER_DEPLOYMENT}
    return {"containerOverrides": [{"name": JOB_CONTAINER, "environment": _pairs(environment)}]}


def render_run_task(spec: RunSpec, job: ServerlessEcsRunnerJob, task_definition_arn: str) -> dict[str, Any]:
    """The ``RunTask`` parameters of the deployment."""
    return {
        "cluster": job.cluster,
        "taskDefinition": task_definition_arn,
        "launchType": "FARGATE",
        "count": 1,
        "startedBy": spec.deployment_id[:128],
        "clientToken": spec.deployment_id[:64],
        "networkConfiguration": {
            "awsvpcConfiguration": {
                "subnets": list(job.subnets),
                "securityGroups": list(job.security_groups),
                "assignPublicIp": "ENABLED" if job.is_public_ip_enabled else "DISABLED",
            }
        },
        "overrides": render_overrides(spec),
        "tags": [
            {"key": MANAGED_BY_TAG, "value": MANAGED_BY},
            {"key": ORG_TAG, "value": spec.org_id},
            {"key": RUNNER_TAG, "value": spec.runner_id},
            {"key": DEPLOYMENT_TAG, "value": spec.deployment_id},
        ],
    }


def same_definition(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a registered revision is the one ``wanted`` would register (ECS adds defaults of its own:
    only the fields we set are compared; lists of variables and secrets in any order)."""
    if existing.get("status") != "ACTIVE":
        return False
    for key in ("executionRoleArn", "taskRoleArn", "networkMode", "cpu", "memory"):
        if existing.get(key) != wanted.get(key):
            return False
    if sorted(existing.get("requiresCompatibilities") or []) != sorted(wanted["requiresCompatibilities"]):
        return False
    containers = existing.get("containerDefinitions") or []
    if len(containers) != 1:
        return False
    have, want = containers[0], wanted["containerDefinitions"][0]

    def variables(container: Mapping[str, Any], key: str, field: str) -> list[tuple[str, str]]:
        return sorted((item["name"], item[field]) for item in container.get(key) or [])

    return (
        have.get("name") == want["name"]
        and have.get("image") == want["image"]
        and list(have.get("command") or []) == want["command"]
        and have.get("essential", True) is True
        and variables(have, "environment", "value") == variables(want, "environment", "value")
        and variables(have, "secrets", "valueFrom") == variables(want, "secrets", "valueFrom")
    )


def parse_handle(handle: str) -> tuple[str, str, str]:
    """``ecs:<task ARN>`` to (region, cluster, task ARN)."""
    kind, _, arn = handle.partition(":")
    match = _TASK_ARN.match(arn)
    if kind != "ecs" or match is None:
        raise ValueError(f"not an ECS run handle: {handle}")
    return match["region"], match["cluster"], arn


def _tag(task: Mapping[str, Any], key: str) -> str | None:
    return next((t.get("value") for t in task.get("tags") or [] if t.get("key") == key), None)


def _main(task: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = task.get("containers") or []
    return next(
        (c for c in containers if c.get("name") == JOB_CONTAINER), containers[0] if containers else {}
    )


def task_status(task: Mapping[str, Any]) -> RunStatus:
    """A described task as a run's status."""
    last = str(task.get("lastStatus") or "")
    if last != "STOPPED":
        if task.get("startedAt") is None:
            return RunStatus(state=RunState.RUNNING, detail=f"the ECS task is {last or 'starting'}")
        return RunStatus(state=RunState.RUNNING)
    main = _main(task)
    exit_code = main.get("exitCode")
    reasons = [str(task.get("stoppedReason") or "").strip(), str(main.get("reason") or "").strip()]
    detail = "; ".join(dict.fromkeys(r for r in reasons if r)) or None
    if detail is not None:
        detail = f"ECS stopped the task: {aws.scrubbed(detail, (), limit=MAX_STOP_REASON)}"
    return RunStatus(
        state=RunState.EXITED, exit_code=exit_code if isinstance(exit_code, int) else None, detail=detail
    )


class EcsLauncher:
    """Launcher of one ``serverless-ecs`` runner (its configuration, role and workload identity)."""

    def __init__(
        self,
        target: LaunchTarget,
        *,
        identity: WorkloadIdentity,
        clients: aws.AwsClients,
        image: str = images.DEFAULT_RUNNER_IMAGE,
    ) -> None:
        self.target = target
        self.identity = identity
        self.clients = clients
        self.image = image

    def _configuration(self, configuration: Mapping[str, Any]) -> ServerlessEcsRunnerConfiguration:
        try:
            return ServerlessEcsRunnerConfiguration.model_validate(configuration)
        except pydantic.ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            aws.fail(
                f"invalid configuration of runner '{self.target.runner_id}': {problems}",
                retryable=False,
                cause=exc,
            )

    async def _call(
        self, region: str, action: str, operation: str, *, secrets: tuple[str, ...] = (), **params: Any
    ) -> dict[str, Any]:
        config = self._configuration(self.target.configuration)
        credentials = await self.clients.role_credentials(
            self.target, config.auth, identity=self.identity, region=config.job.region
        )
        with aws.translated(
            action, service="ecs", url=self.clients.endpoints.ecs, secrets=(*credentials.secrets(), *secrets)
        ):
            return await self.clients.call("ecs", region, credentials, operation, **params)

    # --- Launcher -------------------------------------------------------------------------------------

    async def launch(self, spec: RunSpec) -> str:
        job = self._configuration(spec.runner_configuration).job
        token = spec.token.get_secret_value()
        found = await self._find(job, spec.deployment_id)
        if found is not None:
            return f"ecs:{found}"
        definition = await self._task_definition(spec, job)
        answer = await self._call(
            job.region,
            f"run the ECS task in cluster {job.cluster}",
            "run_task",
            secrets=(token,),
            **render_run_task(spec, job, definition),
        )
        tasks = answer.get("tasks") or []
        if not tasks:
            failures = "; ".join(
                aws.scrubbed(f"{f.get('arn', '')} {f.get('reason', '')} {f.get('detail', '')}", (token,))
                for f in answer.get("failures") or []
            )
            aws.fail(
                f"ECS started no task in cluster {job.cluster}: {failures or 'no reason given'}",
                retryable=True,
            )
        return f"ecs:{tasks[0]['taskArn']}"

    async def _find(self, job: ServerlessEcsRunnerJob, deployment_id: str) -> str | None:
        """The ARN of the deployment's task, running or stopped, if there is one."""
        for desired in ("RUNNING", "STOPPED"):
            listed = await self._call(
                job.region,
                f"list the ECS tasks of cluster {job.cluster}",
                "list_tasks",
                cluster=job.cluster,
                startedBy=deployment_id[:128],
                desiredStatus=desired,
            )
            arns = listed.get("taskArns") or []
            if not arns:
                continue
            described = await self._call(
                job.region,
                f"describe the ECS tasks of cluster {job.cluster}",
                "describe_tasks",
                cluster=job.cluster,
                tasks=arns[:100],
                include=["TAGS"],
            )
            for task in described.get("tasks") or []:
                if _tag(task, DEPLOYMENT_TAG) == deployment_id:
                    return str(task["taskArn"])
        return None

    async def _task_definition(self, spec: RunSpec, job: ServerlessEcsRunnerJob) -> str:
        """The ARN of the environment's current task definition, registered anew only when it changed."""
        wanted = render_task_definition(spec, job, self.image)
        family = wanted["family"]
        try:
            described = await self._call(
                job.region,
                f"describe ECS task definition {family}",
                "describe_task_definition",
                taskDefinition=family,
            )
        except LaunchError as error:
            # ECS answers ClientException for a family that has no active revision yet.
            if not _no_such_definition(error):
                raise
            described = {}
        existing = described.get("taskDefinition") or {}
        if existing and same_definition(existing, wanted):
            return str(existing["taskDefinitionArn"])
        registered = await self._call(
            job.region, f"register ECS task definition {family}", "register_task_definition", **wanted
        )
        return str(registered["taskDefinition"]["taskDefinitionArn"])

    async def status(self, handle: str) -> RunStatus:
        region, cluster, arn = parse_handle(handle)
        try:
            described = await self._call(
                region, f"describe ECS task {arn}", "describe_tasks", cluster=cluster, tasks=[arn]
            )
        except LaunchError as error:
            return RunStatus(state=RunState.UNKNOWN, detail=error.message)
        tasks = described.get("tasks") or []
        if not tasks:
            reason = next((f.get("reason") for f in described.get("failures") or []), None) or "MISSING"
            return RunStatus(
                state=RunState.EXITED, detail=f"the ECS task {arn} is gone ({aws.scrubbed(str(reason), ())})"
            )
        return task_status(tasks[0])

    async def cancel(self, handle: str, *, grace_seconds: float) -> None:
        """Stop the task; ECS gives the container its ``stopTimeout`` (not ``grace_seconds``)."""
        region, cluster, arn = parse_handle(handle)
        try:
            await self._call(
                region, f"stop ECS task {arn}", "stop_task", cluster=cluster, task=arn, reason=STOP_REASON
            )
        except LaunchError as error:
            if not _task_not_found(error):
                raise


def _client_error(error: LaunchError) -> tuple[str, str]:
    cause = error.__cause__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return "", ""
    details = response.get("Error", {})
    return str(details.get("Code") or ""), str(details.get("Message") or "")


def _no_such_definition(error: LaunchError) -> bool:
    code, message = _client_error(error)
    return code == "ClientException" and "unable to describe task definition" in message.lower()


def _task_not_found(error: LaunchError) -> bool:
    code, message = _client_error(error)
    return code == "InvalidParameterException" and "not found" in message.lower()
