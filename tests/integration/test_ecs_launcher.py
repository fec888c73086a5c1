"""The ``serverless-ecs`` launcher against the AWS stand-in (tests/support/aws_standin.py, ECS in
tests/support/ecs_standin.py) with the real client (botocore): STS verifies the web identity token and
every signature, ECS checks what ECS checks (cluster, Fargate's rules, iam:PassRole, the execution role's
access to the secrets), and its Fargate really runs the task's container command as a local process (the
stand-in runner image of tests/support/kube_launcher.py: it records its TOKEN and waits to be released).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.launchers import aws
from orchestrator.launchers.base import LaunchError, RunState, RunStatus
from orchestrator.launchers.ecs import DEPLOYMENT_TAG, EcsLauncher, task_family
from tests.support.aws_launcher import (
    ECS_CLUSTER,
    ENV_UUID,
    EXECUTION_ROLE_ARN,
    ORG,
    REGION,
    ROLE_ARN,
    SECRET_ARN,
    SECRET_VALUE,
    TASK_ROLE_ARN,
    clients,
    closed_port_url,
    ecs_configuration,
    ecs_world,
    make_spec,
    secrets_of,
    subject,
    target,
)
from tests.support.aws_standin import AwsStandIn, Role
from tests.support.ecs_standin import Task
from tests.support.kube_launcher import IMAGE, TOKEN, release
from tests.support.workload_identity import TestIssuer

RUNNER = "ecs"
FAMILY = task_family(ORG, ENV_UUID)


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


@pytest.fixture
def issuer() -> TestIssuer:
    return TestIssuer(subject=subject(RUNNER))


@pytest.fixture
def standin(tmp_path: Path, issuer: TestIssuer) -> Iterator[AwsStandIn]:
    with ecs_world(tmp_path, issuer) as made:
        yield made


def launcher(
    standin: AwsStandIn, issuer: TestIssuer, configuration: dict[str, Any], **options: Any
) -> EcsLauncher:
    shared = options.pop("shared", None) or clients(standin)
    return EcsLauncher(target(RUNNER, configuration), identity=issuer, clients=shared, **options)


async def eventually(
    check: Callable[[], Awaitable[RunStatus]], accept: Callable[[RunStatus], bool], within: float = 20
) -> RunStatus:
    deadline = time.monotonic() + within
    while True:
        status = await check()
        if accept(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"last status: {status}")
        await asyncio.sleep(0.05)


async def wait_until(predicate: Callable[[], bool], within: float = 20) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def only_task(standin: AwsStandIn) -> Task:
    (task,) = standin.ecs.all_tasks()
    return task


def assert_no_secret(text: str, standin: AwsStandIn, issuer: TestIssuer) -> None:
    for secret in secrets_of(standin, issuer, TOKEN, SECRET_VALUE):
        assert secret not in text


def env_of(items: list[dict[str, str]]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in items}


# --- launch -------------------------------------------------------------------------------------------


async def test_launch__registers_the_environment_s_task_definition(
    standin: AwsStandIn, issuer: TestIssuer, out_dir: Path
) -> None:
    """Family per environment (upstream's name), container ``main`` with the job's image and the command
    ``standard``, the runner's per-environment variables and ``job.environment``, the secrets as ARNs, both
    roles, Fargate 0.5 vCPU / 1 GB: and nothing of the deployment (no TOKEN, no deployment id)."""
    configuration = ecs_configuration(out_dir)

    await launcher(standin, issuer, configuration).launch(make_spec(RUNNER, configuration))

    (definition,) = standin.ecs.task_definitions(FAMILY, REGION)
    body = definition.body
    (container,) = body["containerDefinitions"]
    assert FAMILY == f"platform_orchestrator_env_{ORG}_{ENV_UUID}"
    assert (container["name"], container["image"], container["command"]) == ("main", IMAGE, ["standard"])
    assert env_of(container["environment"]) == {
        "ORG_ID": ORG,
        "RUNNER_ID": RUNNER,
        "DEPLOYMENT_ENV_UUID": ENV_UUID,
        "RUNNER_GATEWAY_URL": "http://127.0.0.1:9",
        "METADATA_KEY": "platform_orchestrator_metadata",
        "OUT_DIR": str(out_dir),
        "TF_IN_AUTOMATION": "1",
    }
    assert container["secrets"] == [{"name": "GIT_KEY", "valueFrom": SECRET_ARN}]
    assert (body["executionRoleArn"], body["taskRoleArn"]) == (EXECUTION_ROLE_ARN, TASK_ROLE_ARN)
    assert (body["cpu"], body["memory"], body["networkMode"]) == ("512", "1024", "awsvpc")
    assert body["requiresCompatibilities"] == ["FARGATE"]
    assert TOKEN not in str(body) and make_spec(RUNNER, {}).deployment_id not in str(body)


async def test_launch__runs_the_task_on_fargate_tagged_with_the_deployment(
    standin: AwsStandIn, issuer: TestIssuer, out_dir: Path
) -> None:
    """RunTask: Fargate, the job's subnets, security groups and public IP, tagged with the deployment id,
    the per-deployment variables (TOKEN too) in the task's overrides; the task's process got them, the
    job's environment and the secret's value (read with the execution role)."""
    configuration = ecs_configuration(out_dir)
    spec = make_spec(RUNNER, configuration)

    handle = await launcher(standin, issuer, configuration).launch(spec)
    await wait_until(lambda: (out_dir / "token").exists())

    task = only_task(standin)
    assert handle == f"ecs:{task.arn}"
    assert task.arn.startswith(f"arn:aws:ecs:{REGION}:123456789012:task/{ECS_CLUSTER}/")
    assert task.definition.family == FAMILY
    assert (task.subnets, task.security_groups, task.assign_public_ip) == (
        ["subnet-0a1b2c3d"],
        ["sg-0a1b2c3d"],
        "ENABLED",
    )
    tags = {t["key"]: t["value"] for t in task.tags}
    assert tags[DEPLOYMENT_TAG] == spec.deployment_id
    assert (tags["PlatformOrchestratorOrgId"], tags["PlatformOrchestratorRunnerId"]) == (ORG, RUNNER)
    assert task.started_by == spec.deployment_id and task.client_token == spec.deployment_id
    (override,) = task.overrides["containerOverrides"]
    assert override["name"] == "main"
    assert env_of(override["environment"]) == {
        "DEPLOYMENT_ID": spec.deployment_id,
        "MODE": "deploy",
        "LOG_LEVEL": "info",
        "ENCRYPTING_KEY": str(spec.encrypting_key),
        "TOKEN": TOKEN,
    }
    assert (out_dir / "token").read_text() == TOKEN
    assert task.environment["GIT_KEY"] == SECRET_VALUE
    assert task.environment["OUT_DIR"] == str(out_dir)
    assert task.environment["DEPLOYMENT_ENV_UUID"] == ENV_UUID
    (session,) = standin.issued.values()
    assert (session.role.arn, session.subject, session.session_name) == (ROLE_ARN, "acme+ecs", "acme-ecs")


async def test_launch__twice_starts_one_task(standin: AwsStandIn, issuer: TestIssuer, out_dir: Path) -> None:
    """A second launch of the deployment (the orchestrator restarted) finds its task by startedBy and
    tag, running or already stopped, and starts no other."""
    configuration = ecs_configuration(out_dir)
    spec = make_spec(RUNNER, configuration)
    ecs = launcher(standin, issuer, configuration)

    first = await ecs.launch(spec)
    second = await ecs.launch(spec)
    await wait_until(lambda: (out_dir / "started").exists())
    release(out_dir, 0)
    await eventually(lambda: ecs.status(first), lambda s: s.state is RunState.EXITED)
    third = await launcher(standin, issuer, configuration).launch(spec)

    assert first == second == third
    assert len(standin.ecs.all_tasks()) == 1
    assert [c.action for c in standin.calls if c.action == "RunTask"] == ["RunTask"]


async def test_launch__next_deployment_reuses_the_task_definition(
    standin: AwsStandIn, issuer: TestIssuer, out_dir: Path
) -> None:
    """The definition holds nothing of a deployment: the environment's next deployment runs the same
    revision; a changed configuration registers the next one."""
    configuration = ecs_configuration(out_dir)
    ecs = launcher(standin, issuer, configuration)
    await ecs.launch(make_spec(RUNNER, configuration, deployment="11111111-1111-4111-8111-111111111111"))
    await ecs.launch(make_spec(RUNNER, configuration, deployment="22222222-2222-4222-8222-222222222222"))
    changed = ecs_configuration(out_dir, environment={"OUT_DIR": str(out_dir), "TF_LOG": "debug"})
    await launcher(standin, issuer, changed).launch(
        make_spec(RUNNER, changed, deployment="33333333-3333-4333-8333-333333333333")
    )

    revisions = [t.definition.revision for t in standin.ecs.all_tasks()]
    assert revisions == [1, 1, 2]
    assert [d.revision for d in standin.ecs.task_definitions(FAMILY, REGION)] == [1, 2]


# --- status and cancel ----------------------------------------------------------------------------------


async def test_status__running_then_exited_with_the_exit_code(
    standin: AwsStandIn, issuer: TestIssuer, out_dir: Path
) -> None:
    configuration = ecs_configuration(out_dir)
    ecs = launcher(standin, issuer, configuration)
    handle = await ecs.launch(make_spec(RUNNER, configuration))
    await wait_until(lambda: (out_dir / "started").exists())

    running = await eventually(lambda: ecs.status(handle), lambda s: s.detail is None)
    release(out_dir, 4)
    exited = await eventually(lambda: ecs.status(handle), lambda s: s.state is RunState.EXITED)

    assert running.state is RunState.RUNNING
    assert exited.exit_code == 4
    assert exited.detail == "ECS stopped the task: Essential container in task exited"
    assert only_task(standin).stop_code == "EssentialContainerExited"


async def test_status__image_ecs_cannot_pull(standin: AwsStandIn, issuer: TestIssuer, out_dir: Path) -> None:
    """The task never starts: EXITED without an exit code, ECS's stop reason as the detail."""
    configuration = ecs_configuration(out_dir, image="registry.example.com/missing:1")
    ecs = launcher(standin, issuer, configuration)
    handle = await ecs.launch(make_spec(RUNNER, configuration))

    status = await eventually(lambda: ecs.status(handle), lambda s: s.state is RunState.EXITED)

    assert status.exit_code is None
    assert status.detail is not None
    assert status.detail.startswith("ECS stopped the task: CannotPullContainerError: ")
    assert "registry.example.com/missing:1: not found" in status.detail
    assert only_task(standin).stop_code == "TaskFailedToStart"


async def test_status__secret_the_execution_role_cannot_read(
    standin: AwsStandIn, issuer: TestIssuer, out_dir: Path
) -> None:
    standin.add_role(Role("runner-execution", allowed=frozenset(), ecs_tasks=True))
    configuration = ecs_configuration(out_dir)
    ecs = launcher(standin, issuer, configuration)
    handle = await ecs.launch(make_spec(RUNNER, configuration))

    status = await eventually(lambda: ecs.status(handle), lambda s: s.state is RunState.EXITED)

    assert status.exit_code is None
    assert status.detail is not None and "ResourceInitializationError" in status.detail
    assert f"secretsmanager:GetSecretValue on resource: {SECRET_ARN}" in status.detail
    assert not (out_dir / "started").exists()
    assert_no_secret(status.detail, standin, issuer)


async def test_status__task_stopped_by_ecs(standin: AwsStandIn, issuer: TestIssuer, out_dir: Path) -> None:
    """ECS stops a running task on its own (say, its host retired): the container gets SIGTERM and the
    status names ECS's reason."""
    configuration = ecs_configuration(out_dir)
    ecs = launcher(standin, issuer, configuration)
    handle = await ecs.launch(make_spec(RUNNER, configuration))
    await wait_until(lambda: (out_dir / "started").exists())

    standin.ecs.stop_as_ecs(handle.removeprefix("ecs:"), "Task stopped because the underlying host retired.")
    status = await eventually(lambda: ecs.status(handle), lambda s: s.state is RunState.EXITED)

    assert status.exit_code == 143
    assert status.detail == "ECS stopped the task: Task stopped because the underlying host retired."
    assert_no_secret(str(status), standin, issuer)


async def test_status__task_gone(standin: AwsStandIn, issuer: TestIssuer, out_dir: Path) -> None:
    ecs = launcher(standin, issuer, ecs_configuration(out_dir))
    arn = f"arn:aws:ecs:{REGION}:123456789012:task/{ECS_CLUSTER}/0123456789abcdef0123456789abcdef"

    status = await ecs.status(f"ecs:{arn}")

    assert status.state is RunState.EXITED
    assert status.detail == f"the ECS task {arn} is gone (MISSING)"


async def test_status__sts_refusal_is_unknown(standin: AwsStandIn, issuer: TestIssuer, out_dir: Path) -> None:
    configuration = ecs_configuration(out_dir)
    ecs = launcher(standin, issuer, configuration)
    handle = await ecs.launch(make_spec(RUNNER, configuration))
    standin.providers.clear()

    status = await launcher(standin, issuer, configuration).status(handle)

    assert status.state is RunState.UNKNOWN
    assert status.detail is not None and "STS refused the web identity token" in status.detail


async def test_cancel__stops_the_task(standin: AwsStandIn, issuer: TestIssuer, out_dir: Path) -> None:
    """StopTask: the container gets SIGTERM (exit 143), the task is STOPPED as the user's; cancelling a
    stopped or unknown task is fine."""
    configuration = ecs_configuration(out_dir)
    ecs = launcher(standin, issuer, configuration)
    handle = await ecs.launch(make_spec(RUNNER, configuration))
    await wait_until(lambda: (out_dir / "started").exists())

    await ecs.cancel(handle, grace_seconds=1)
    status = await eventually(lambda: ecs.status(handle), lambda s: s.state is RunState.EXITED)
    await ecs.cancel(handle, grace_seconds=1)
    await ecs.cancel(f"ecs:arn:aws:ecs:{REGION}:123456789012:task/{ECS_CLUSTER}/{'0' * 32}", grace_seconds=1)

    task = only_task(standin)
    assert (task.stop_code, task.stopped_reason) == ("UserInitiated", "stopped by the platform orchestrator")
    assert status.exit_code == 143


# --- failures -----------------------------------------------------------------------------------------


async def launch_error(ecs: EcsLauncher, configuration: dict[str, Any]) -> LaunchError:
    with pytest.raises(LaunchError) as caught:
        await ecs.launch(make_spec(RUNNER, configuration))
    return caught.value


async def test_launch__sts_refuses_the_token(standin: AwsStandIn, out_dir: Path) -> None:
    impostor = TestIssuer(subject=subject(RUNNER), issuer="https://elsewhere.test")
    configuration = ecs_configuration(out_dir)

    error = await launch_error(launcher(standin, impostor, configuration), configuration)

    assert error.retryable is False
    assert error.message.startswith(f"STS refused the web identity token for role {ROLE_ARN}: ")
    assert standin.ecs.all_tasks() == []
    assert_no_secret(error.message, standin, impostor)


async def test_launch__role_that_does_not_trust_the_subject(
    standin: AwsStandIn, issuer: TestIssuer, out_dir: Path
) -> None:
    standin.add_role(Role("platform-orchestrator", frozenset({"acme+someone-else"})))
    configuration = ecs_configuration(out_dir)

    error = await launch_error(launcher(standin, issuer, configuration), configuration)

    assert error.retryable is False
    assert error.message.startswith(f"STS refused to let acme+ecs assume role {ROLE_ARN}: AccessDenied")
    assert_no_secret(error.message, standin, issuer)


async def test_launch__cluster_not_found(standin: AwsStandIn, issuer: TestIssuer, out_dir: Path) -> None:
    configuration = ecs_configuration(out_dir, cluster="nowhere")

    error = await launch_error(launcher(standin, issuer, configuration), configuration)

    assert error.retryable is False
    assert error.message == (
        "cannot list the ECS tasks of cluster nowhere: ECS refused: ClusterNotFoundException: "
        "Cluster not found."
    )


async def test_launch__role_may_not_pass_the_execution_role(
    standin: AwsStandIn, issuer: TestIssuer, out_dir: Path
) -> None:
    allowed = frozenset({"ecs:*"})
    standin.add_role(Role("platform-orchestrator", frozenset({subject(RUNNER)}), allowed=allowed))
    configuration = ecs_configuration(out_dir)

    error = await launch_error(launcher(standin, issuer, configuration), configuration)

    assert error.retryable is False
    assert error.message.startswith(f"cannot run the ECS task in cluster {ECS_CLUSTER}: ECS refused: ")
    assert f"is not authorized to perform: iam:PassRole on resource: {EXECUTION_ROLE_ARN}" in error.message
    assert standin.ecs.all_tasks() == []
    assert_no_secret(error.message, standin, issuer)


async def test_launch__execution_role_ecs_cannot_assume(
    standin: AwsStandIn, issuer: TestIssuer, out_dir: Path
) -> None:
    standin.add_role(Role("runner-execution", allowed=frozenset({"secretsmanager:GetSecretValue"})))
    configuration = ecs_configuration(out_dir)

    error = await launch_error(launcher(standin, issuer, configuration), configuration)

    assert error.retryable is False
    assert f"ClientException: ECS was unable to assume the role '{EXECUTION_ROLE_ARN}'" in error.message


async def test_launch__ecs_unreachable_is_retryable(
    standin: AwsStandIn, issuer: TestIssuer, out_dir: Path
) -> None:
    down = aws.AwsClients(
        aws.AwsEndpoints(sts=standin.url, ecs=closed_port_url()), max_attempts=1, connect_timeout_seconds=2
    )
    configuration = ecs_configuration(out_dir)

    error = await launch_error(launcher(standin, issuer, configuration, shared=down), configuration)

    assert error.retryable is True
    assert "ECS at http://127.0.0.1:" in error.message and "is unreachable" in error.message
    assert_no_secret(error.message, standin, issuer)


async def test_launch__invalid_configuration_is_not_retryable(
    standin: AwsStandIn, issuer: TestIssuer, out_dir: Path
) -> None:
    configuration = ecs_configuration(out_dir, subnets=[])

    error = await launch_error(launcher(standin, issuer, configuration), configuration)

    assert error.retryable is False
    assert error.message.startswith(f"invalid configuration of runner '{RUNNER}': job.subnets")
