"""The ECS part of the AWS stand-in (tests/support/aws_standin.py), with a "Fargate" that really runs the
tasks. It is NOT ECS; moto's ECS accepts ``RunTask`` but runs nothing, so this implements the handful of
actions the ``serverless-ecs`` launcher uses, with ECS's shapes, error codes and messages:

- ``RegisterTaskDefinition`` (new revision per call; Fargate's rules: ``awsvpc``, valid cpu/memory,
  ``executionRoleArn`` required with secrets), ``DescribeTaskDefinition`` (latest ACTIVE revision of a
  family, or ``family:revision``, or an ARN), ``DeregisterTaskDefinition``;
- ``RunTask`` (cluster, an ACTIVE definition supporting FARGATE, ``networkConfiguration`` required for
  ``awsvpc``, ``overrides`` only for the definition's containers, ``iam:PassRole`` on the execution and
  task roles, which ECS must be able to assume, ``ecs:TagResource`` for tags, ``clientToken``
  idempotency), ``ListTasks`` (``family``, ``startedBy``, ``desiredStatus``), ``DescribeTasks``
  (``include: ["TAGS"]``; unknown tasks as ``failures`` with reason ``MISSING``), ``StopTask``.

The Fargate (a thread) moves each task as ECS does: ``PROVISIONING`` → ``PENDING`` (the image is
"pulled": an image not in ``images`` stops the task with ``CannotPullContainerError``; the secrets are
resolved with the execution role: a secret it may not read, or one that does not exist, stops it with
``ResourceInitializationError``) → ``RUNNING``: the container's command runs as a local process, argv =
the image's entrypoint + ``command``, env = the image's + the definition's ``environment`` + the task's
``overrides`` + the secrets' values; the image's ``mount_env`` directories are the container's own
writable filesystem here, one local directory each → when the process ends, ``DEPROVISIONING`` →
``STOPPED`` with the container's exit code, ``stopCode`` ``EssentialContainerExited``. ``StopTask`` sends
SIGTERM to the process group, then SIGKILL after ``stop_timeout_seconds``; ``stop_as_ecs`` is ECS
stopping a task on its own (host retirement, Spot interruption) with a reason.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.support.kube_api import LocalImage

ACCOUNT = "123456789012"
FARGATE_SIZES = {
    "256": {"512", "1024", "2048"},
    "512": {"1024", "2048", "3072", "4096"},
    "1024": {str(m) for m in range(2048, 8193, 1024)},
    "2048": {str(m) for m in range(4096, 16385, 1024)},
    "4096": {str(m) for m in range(8192, 30721, 1024)},
}
_FAMILY = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_SECRETS_FAILED = (
    "ResourceInitializationError: unable to pull secrets or registry auth: execution resource retrieval "
    "failed: unable to retrieve secret from"
)
Authorize = Callable[[str, str], None]


class EcsError(Exception):
    """Answered as ``{"__type": code, "message": message}`` with HTTP 400 (ECS's client errors)."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class TaskDefinition:
    family: str
    revision: int
    region: str
    body: dict[str, Any]
    tags: list[dict[str, str]]
    status: str = "ACTIVE"
    registered_at: float = field(default_factory=time.time)
    account: str = ACCOUNT

    @property
    def arn(self) -> str:
        return f"arn:aws:ecs:{self.region}:{self.account}:task-definition/{self.family}:{self.revision}"

    def describe(self) -> dict[str, Any]:
        containers = [
            {"cpu": 0, "portMappings": [], "essential": True, "mountPoints": [], "volumesFrom": [], **c}
            for c in self.body["containerDefinitions"]
        ]
        return {
            **{k: v for k, v in self.body.items() if k != "containerDefinitions"},
            "containerDefinitions": containers,
            "taskDefinitionArn": self.arn,
            "family": self.family,
            "revision": self.revision,
            "status": self.status,
            "compatibilities": ["EC2", "FARGATE"],
            "registeredAt": self.registered_at,
            "registeredBy": f"arn:aws:sts::{self.account}:assumed-role/caller",
        }


@dataclass
class Task:
    arn: str
    cluster_arn: str
    region: str
    definition: TaskDefinition
    overrides: dict[str, Any]
    started_by: str | None
    tags: list[dict[str, str]]
    subnets: list[str]
    security_groups: list[str]
    assign_public_ip: str
    client_token: str | None
    created_at: float = field(default_factory=time.time)
    last_status: str = "PROVISIONING"
    desired_status: str = "RUNNING"
    started_at: float | None = None
    stopping_at: float | None = None
    stopped_at: float | None = None
    stop_code: str | None = None
    stopped_reason: str | None = None
    exit_code: int | None = None
    container_reason: str | None = None
    process: subprocess.Popen[bytes] | None = None
    kill_at: float | None = None
    #: The environment the container's process got (for tests: what the task saw).
    environment: dict[str, str] = field(default_factory=dict)
    work_dir: Path | None = None

    @property
    def container(self) -> dict[str, Any]:
        return dict(self.definition.body["containerDefinitions"][0])

    def describe(self, *, tags: bool) -> dict[str, Any]:
        task_id = self.arn.rsplit("/", 1)[-1]
        container: dict[str, Any] = {
            "containerArn": f"{self.arn.replace(':task/', ':container/')}/"
            f"{uuid.uuid5(uuid.NAMESPACE_URL, self.arn)}",
            "taskArn": self.arn,
            "name": self.container["name"],
            "image": self.container["image"],
            "lastStatus": {"PROVISIONING": "PENDING", "DEPROVISIONING": "STOPPED"}.get(
                self.last_status, self.last_status
            ),
            "networkInterfaces": [{"attachmentId": task_id, "privateIpv4Address": "10.0.0.10"}],
            "healthStatus": "UNKNOWN",
            "cpu": "0",
        }
        if self.exit_code is not None:
            container["exitCode"] = self.exit_code
        if self.container_reason:
            container["reason"] = self.container_reason
        described: dict[str, Any] = {
            "taskArn": self.arn,
            "clusterArn": self.cluster_arn,
            "taskDefinitionArn": self.definition.arn,
            "lastStatus": self.last_status,
            "desiredStatus": self.desired_status,
            "launchType": "FARGATE",
            "platformVersion": "1.4.0",
            "platformFamily": "Linux",
            "cpu": self.definition.body.get("cpu"),
            "memory": self.definition.body.get("memory"),
            "containers": [container],
            "overrides": self.overrides,
            "group": f"family:{self.definition.family}",
            "createdAt": self.created_at,
            "availabilityZone": f"{self.region}a",
            "connectivity": "CONNECTED",
            "attachments": [
                {
                    "id": task_id,
                    "type": "ElasticNetworkInterface",
                    "status": "ATTACHED" if self.last_status == "RUNNING" else "PRECREATED",
                    "details": [{"name": "subnetId", "value": self.subnets[0]}],
                }
            ],
            "enableExecuteCommand": False,
            "version": 1,
        }
        for key, value in (
            ("startedBy", self.started_by),
            ("startedAt", self.started_at),
            ("stoppingAt", self.stopping_at),
            ("stoppedAt", self.stopped_at),
            ("stopCode", self.stop_code),
            ("stoppedReason", self.stopped_reason),
        ):
            if value is not None:
                described[key] = value
        if tags:
            described["tags"] = self.tags
        return described


class EcsStandIn:
    """ECS's state (per region) and its Fargate; ``handle`` serves one authenticated request."""

    def __init__(
        self,
        work_dir: Path,
        *,
        images: Mapping[str, LocalImage],
        roles: Mapping[str, Any],
        account: str = ACCOUNT,
        secrets: Mapping[str, str] | None = None,
        stop_timeout_seconds: float = 30.0,
        tick_seconds: float = 0.05,
    ) -> None:
        self.work_dir = work_dir
        self.images = dict(images)
        #: IAM roles by ARN (the AWS stand-in's, shared): who ECS may assume, what they may read.
        self.roles = roles
        self.account = account
        #: Secrets Manager secret and SSM parameter ARNs to their values.
        self.secrets: dict[str, str] = dict(secrets or {})
        self.stop_timeout_seconds = stop_timeout_seconds
        self.tick_seconds = tick_seconds
        self.clusters: set[tuple[str, str]] = set()
        self.definitions: dict[tuple[str, str], list[TaskDefinition]] = {}
        self.tasks: dict[str, Task] = {}
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- set-up and test-side access -------------------------------------------------------------------

    def add_cluster(self, name: str, region: str) -> str:
        with self.lock:
            self.clusters.add((region, name))
        return self._cluster_arn(region, name)

    def task(self, arn: str) -> Task:
        with self.lock:
            return self.tasks[arn]

    def all_tasks(self) -> list[Task]:
        with self.lock:
            return list(self.tasks.values())

    def task_definitions(self, family: str, region: str) -> list[TaskDefinition]:
        with self.lock:
            return list(self.definitions.get((region, family), []))

    def stop_as_ecs(self, arn: str, reason: str, *, stop_code: str = "ServiceSchedulerInitiated") -> None:
        """ECS stops the task by itself (its host retired, a Spot interruption, ...)."""
        with self.lock:
            self._request_stop(self.tasks[arn], reason, stop_code)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            time.sleep(0.05)

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, daemon=True, name="ecs-stand-in-fargate")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self.lock:
            for task in self.tasks.values():
                if task.process is not None and task.process.poll() is None:
                    _signal_group(task.process, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        task.process.wait(5)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_seconds):
            with self.lock:
                for task in list(self.tasks.values()):
                    self._advance(task)

    # --- the Fargate ---------------------------------------------------------------------------------

    def _advance(self, task: Task) -> None:
        now = time.time()
        if task.last_status == "STOPPED":
            return
        if task.last_status == "DEPROVISIONING":
            task.last_status, task.stopped_at = "STOPPED", now
            return
        if task.desired_status == "STOPPED" and task.process is None:
            self._stopped(task, now)
            return
        if task.last_status == "PROVISIONING":
            task.last_status = "PENDING"
            return
        if task.last_status == "PENDING":
            self._start_container(task, now)
            return
        process = task.process
        if process is None:
            return
        code = process.poll()
        if code is None:
            if task.kill_at is not None and now >= task.kill_at:
                _signal_group(process, signal.SIGKILL)
            return
        task.exit_code = 128 - code if code < 0 else code
        if task.stop_code is None:
            task.stop_code, task.stopped_reason = (
                "EssentialContainerExited",
                "Essential container in task exited",
            )
        task.desired_status = "STOPPED"
        self._stopped(task, now)

    def _stopped(self, task: Task, now: float) -> None:
        task.stopping_at = task.stopping_at or now
        task.last_status = "DEPROVISIONING"

    def _start_container(self, task: Task, now: float) -> None:
        container = task.container
        image = self._image(container["image"])
        if image is None:
            self._fail_start(
                task,
                "CannotPullContainerError: pull image manifest has been retried 7 time(s): failed to "
                f"resolve ref {container['image']}: {container['image']}: not found",
                now,
            )
            return
        try:
            secret_values = self._resolve_secrets(task, container.get("secrets") or [])
        except EcsError as exc:
            self._fail_start(task, exc.message, now)
            return
        task_dir = self.work_dir / "tasks" / task.arn.rsplit("/", 1)[-1]
        task_dir.mkdir(parents=True, exist_ok=True)
        env = dict(image.env)
        for path in image.mount_env.values():
            local = task_dir / "fs" / path.strip("/").replace("/", "_")
            local.mkdir(parents=True, exist_ok=True)
        for mount_path, variable in image.mount_env.items():
            env[variable] = str(task_dir / "fs" / mount_path.strip("/").replace("/", "_"))
        env.update({e["name"]: e["value"] for e in container.get("environment") or []})
        for override in task.overrides.get("containerOverrides") or []:
            if override.get("name") == container["name"]:
                env.update({e["name"]: e["value"] for e in override.get("environment") or []})
        env.update(secret_values)
        command = next(
            (o["command"] for o in task.overrides.get("containerOverrides") or [] if o.get("command")),
            container.get("command") or [],
        )
        argv = [*(container.get("entryPoint") or image.argv), *command]
        log: IO[bytes]
        with open(task_dir / "main.log", "wb") as log:
            try:
                task.process = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=task_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                self._fail_start(
                    task, f"CannotStartContainerError: exec: {argv[0] if argv else ''}: {exc.strerror}", now
                )
                return
        task.environment, task.work_dir = env, task_dir
        task.last_status, task.started_at = "RUNNING", now

    def _fail_start(self, task: Task, reason: str, now: float) -> None:
        task.stop_code, task.stopped_reason = "TaskFailedToStart", reason
        task.desired_status = "STOPPED"
        self._stopped(task, now)

    def _resolve_secrets(self, task: Task, secrets: list[dict[str, str]]) -> dict[str, str]:
        """The secrets' values, read with the task's execution role (as the Fargate agent does)."""
        values: dict[str, str] = {}
        execution_arn = task.definition.body.get("executionRoleArn", "")
        role = self.roles.get(execution_arn)
        task_id = task.arn.rsplit("/", 1)[-1]
        for secret in secrets:
            arn = secret["valueFrom"]
            service, action = (
                ("asm", "secretsmanager:GetSecretValue")
                if ":secretsmanager:" in arn
                else ("ssm", "ssm:GetParameters")
            )
            if role is None or not role.allows(action):
                who = f"arn:aws:sts::{self.account}:assumed-role/{execution_arn.rsplit('/', 1)[-1]}/{task_id}"
                raise EcsError(
                    "ResourceInitializationError",
                    f"{_SECRETS_FAILED} {service}: AccessDeniedException: User: {who} is not authorized to "
                    f"perform: {action} on resource: {arn}",
                )
            if arn not in self.secrets:
                raise EcsError(
                    "ResourceInitializationError",
                    f"{_SECRETS_FAILED} {service}: ResourceNotFoundException: Secrets Manager can't find "
                    f"the specified secret. ({arn})",
                )
            values[secret["name"]] = self.secrets[arn]
        return values

    def _image(self, name: str) -> LocalImage | None:
        if name in self.images:
            return self.images[name]
        repository = name.split("@", 1)[0]
        if ":" in repository.rsplit("/", 1)[-1]:
            repository = repository.rsplit(":", 1)[0]
        return self.images.get(repository)

    def _request_stop(self, task: Task, reason: str, stop_code: str) -> None:
        if task.desired_status == "STOPPED":
            return
        task.desired_status, task.stop_code, task.stopped_reason = "STOPPED", stop_code, reason
        if task.process is not None and task.process.poll() is None:
            _signal_group(task.process, signal.SIGTERM)
            task.kill_at = time.time() + self.stop_timeout_seconds

    # --- requests ------------------------------------------------------------------------------------

    def handle(
        self, action: str, params: dict[str, Any], *, region: str, authorize: Authorize
    ) -> dict[str, Any]:
        """Serve one action; EcsError for ECS's errors (``authorize`` raises its own)."""
        handlers: dict[str, Callable[[dict[str, Any], str, Authorize], dict[str, Any]]] = {
            "RegisterTaskDefinition": self._register,
            "DescribeTaskDefinition": self._describe_definition,
            "DeregisterTaskDefinition": self._deregister,
            "RunTask": self._run_task,
            "ListTasks": self._list_tasks,
            "DescribeTasks": self._describe_tasks,
            "StopTask": self._stop_task,
        }
        handler = handlers.get(action)
        if handler is None:
            raise EcsError("UnknownOperationException", f"unknown operation {action}")
        with self.lock:
            return handler(params, region, authorize)

    def _cluster_arn(self, region: str, name: str) -> str:
        return f"arn:aws:ecs:{region}:{self.account}:cluster/{name}"

    def _cluster(self, params: Mapping[str, Any], region: str) -> tuple[str, str]:
        """(name, ARN) of the request's cluster (a name or an ARN; default ``default``)."""
        given = str(params.get("cluster") or "default")
        name = given.rsplit("/", 1)[-1] if given.startswith("arn:") else given
        if given.startswith("arn:") and given != self._cluster_arn(region, name):
            raise EcsError("ClusterNotFoundException", "Cluster not found.")
        if (region, name) not in self.clusters:
            raise EcsError("ClusterNotFoundException", "Cluster not found.")
        return name, self._cluster_arn(region, name)

    def _definition(self, reference: str, region: str) -> TaskDefinition | None:
        """``family`` (its latest ACTIVE revision), ``family:revision`` or an ARN."""
        name = reference.split("task-definition/", 1)[-1] if reference.startswith("arn:") else reference
        family, _, revision = name.partition(":")
        revisions = self.definitions.get((region, family), [])
        if revision:
            return next((d for d in revisions if str(d.revision) == revision), None)
        active = [d for d in revisions if d.status == "ACTIVE"]
        return active[-1] if active else None

    def _register(self, params: dict[str, Any], region: str, authorize: Authorize) -> dict[str, Any]:
        family = str(params.get("family", ""))
        resource = f"arn:aws:ecs:{region}:{self.account}:task-definition/{family}:*"
        authorize("ecs:RegisterTaskDefinition", resource)
        if params.get("tags"):
            authorize("ecs:TagResource", resource)
        if not _FAMILY.match(family):
            raise EcsError("ClientException", "Family contains invalid characters.")
        containers = params.get("containerDefinitions") or []
        if not containers or any(not c.get("name") or not c.get("image") for c in containers):
            raise EcsError("ClientException", "Container.image should not be null or empty.")
        if "FARGATE" in (params.get("requiresCompatibilities") or []):
            if params.get("networkMode") != "awsvpc":
                raise EcsError("ClientException", "Fargate only supports network mode 'awsvpc'.")
            cpu, memory = str(params.get("cpu", "")), str(params.get("memory", ""))
            if memory not in FARGATE_SIZES.get(cpu, set()):
                raise EcsError(
                    "ClientException",
                    f"No Fargate configuration exists for given values: {cpu} CPU, {memory} memory.",
                )
        if any(c.get("secrets") for c in containers) and not params.get("executionRoleArn"):
            raise EcsError(
                "ClientException",
                "When you are specifying container secrets, you must also specify a value for "
                "'executionRoleArn'.",
            )
        revisions = self.definitions.setdefault((region, family), [])
        body = {k: v for k, v in params.items() if k != "tags"}
        definition = TaskDefinition(
            family, len(revisions) + 1, region, body, list(params.get("tags") or []), account=self.account
        )
        revisions.append(definition)
        return {"taskDefinition": definition.describe(), "tags": definition.tags}

    def _describe_definition(
        self, params: dict[str, Any], region: str, authorize: Authorize
    ) -> dict[str, Any]:
        reference = str(params.get("taskDefinition", ""))
        authorize("ecs:DescribeTaskDefinition", "*")
        definition = self._definition(reference, region)
        if definition is None:
            raise EcsError("ClientException", "Unable to describe task definition.")
        answer: dict[str, Any] = {"taskDefinition": definition.describe()}
        if "TAGS" in (params.get("include") or []):
            answer["tags"] = definition.tags
        return answer

    def _deregister(self, params: dict[str, Any], region: str, authorize: Authorize) -> dict[str, Any]:
        authorize("ecs:DeregisterTaskDefinition", "*")
        reference = str(params.get("taskDefinition", ""))
        if ":" not in reference.split("task-definition/", 1)[-1]:
            raise EcsError("ClientException", "Revision is required.")
        definition = self._definition(reference, region)
        if definition is None:
            raise EcsError("ClientException", "The specified task definition does not exist.")
        definition.status = "INACTIVE"
        return {"taskDefinition": definition.describe()}

    def _run_task(self, params: dict[str, Any], region: str, authorize: Authorize) -> dict[str, Any]:
        name, cluster_arn = self._cluster(params, region)
        reference = str(params.get("taskDefinition", ""))
        definition = self._definition(reference, region)
        authorize("ecs:RunTask", definition.arn if definition else reference)
        if definition is None:
            raise EcsError("ClientException", "TaskDefinition not found.")
        if definition.status != "ACTIVE":
            raise EcsError("ClientException", "TaskDefinition is inactive")
        token = params.get("clientToken")
        if token:
            earlier = [t for t in self.tasks.values() if t.client_token == token and t.region == region]
            if earlier:
                return {"tasks": [t.describe(tags=True) for t in earlier], "failures": []}
        vpc = self._check_run(params, definition, authorize)
        tags = list(params.get("tags") or [])
        count = int(params.get("count") or 1)
        if not 1 <= count <= 10:
            raise EcsError("InvalidParameterException", "count must be between 1 and 10.")
        started = []
        for _ in range(count):
            arn = f"arn:aws:ecs:{region}:{self.account}:task/{name}/{uuid.uuid4().hex}"
            if tags:
                authorize("ecs:TagResource", arn)
            task = Task(
                arn=arn,
                cluster_arn=cluster_arn,
                region=region,
                definition=definition,
                overrides=dict(params.get("overrides") or {}),
                started_by=params.get("startedBy"),
                tags=tags,
                subnets=list(vpc["subnets"]),
                security_groups=list(vpc.get("securityGroups") or []),
                assign_public_ip=str(vpc.get("assignPublicIp") or "DISABLED"),
                client_token=token,
            )
            self.tasks[arn] = task
            started.append(task.describe(tags=True))
        return {"tasks": started, "failures": []}

    def _check_run(
        self, params: Mapping[str, Any], definition: TaskDefinition, authorize: Authorize
    ) -> dict[str, Any]:
        """RunTask's checks of the launch type, network, overrides and roles; the awsvpc configuration."""
        if params.get("launchType") == "FARGATE" and "FARGATE" not in (
            definition.body.get("requiresCompatibilities") or []
        ):
            raise EcsError(
                "InvalidParameterException", "Task definition does not support launch_type FARGATE."
            )
        vpc = (params.get("networkConfiguration") or {}).get("awsvpcConfiguration") or {}
        if definition.body.get("networkMode") == "awsvpc" and not vpc:
            raise EcsError(
                "InvalidParameterException",
                "Network Configuration must be provided when networkMode 'awsvpc' is specified.",
            )
        if not vpc.get("subnets"):
            raise EcsError("InvalidParameterException", "subnets can not be empty.")
        names = {c["name"] for c in definition.body["containerDefinitions"]}
        for override in (params.get("overrides") or {}).get("containerOverrides") or []:
            if override.get("name") not in names:
                raise EcsError(
                    "InvalidParameterException",
                    f"Override for container named {override.get('name')} is not a container in the "
                    "TaskDefinition.",
                )
        for key in ("executionRoleArn", "taskRoleArn"):
            role_arn = definition.body.get(key)
            if not role_arn:
                continue
            authorize("iam:PassRole", role_arn)
            role = self.roles.get(role_arn)
            if role is None or not role.ecs_tasks:
                raise EcsError(
                    "ClientException",
                    f"ECS was unable to assume the role '{role_arn}' that was provided for this task. Please "
                    "verify that the role being passed has the proper trust relationship and permissions and "
                    "that your IAM user has permissions to pass this role.",
                )
        return dict(vpc)

    def _list_tasks(self, params: dict[str, Any], region: str, authorize: Authorize) -> dict[str, Any]:
        _, cluster_arn = self._cluster(params, region)
        authorize("ecs:ListTasks", cluster_arn)
        desired = params.get("desiredStatus") or "RUNNING"
        found = [
            t.arn
            for t in self.tasks.values()
            if t.cluster_arn == cluster_arn
            and t.desired_status == desired
            and (params.get("startedBy") is None or t.started_by == params["startedBy"])
            and (params.get("family") is None or t.definition.family == params["family"])
        ]
        return {"taskArns": found[:100]}

    def _find(self, reference: str, cluster_arn: str) -> Task | None:
        task = self.tasks.get(reference)
        if task is None:
            task = next((t for t in self.tasks.values() if t.arn.endswith(f"/{reference}")), None)
        return task if task is not None and task.cluster_arn == cluster_arn else None

    def _describe_tasks(self, params: dict[str, Any], region: str, authorize: Authorize) -> dict[str, Any]:
        _, cluster_arn = self._cluster(params, region)
        tasks, failures = [], []
        for reference in params.get("tasks") or []:
            task = self._find(str(reference), cluster_arn)
            authorize("ecs:DescribeTasks", task.arn if task else str(reference))
            if task is None:
                failures.append({"arn": reference, "reason": "MISSING"})
            else:
                tasks.append(task.describe(tags="TAGS" in (params.get("include") or [])))
        return {"tasks": tasks, "failures": failures}

    def _stop_task(self, params: dict[str, Any], region: str, authorize: Authorize) -> dict[str, Any]:
        _, cluster_arn = self._cluster(params, region)
        task = self._find(str(params.get("task", "")), cluster_arn)
        authorize("ecs:StopTask", task.arn if task else str(params.get("task", "")))
        if task is None:
            raise EcsError("InvalidParameterException", "The referenced task was not found.")
        self._request_stop(task, str(params.get("reason") or "Task stopped by user"), "UserInitiated")
        return {"task": task.describe(tags=False)}


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the task's process group (its own session), by the process's own pid."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
