"""The ECS launcher's pure parts: the task definition, the overrides, the handle, a task's status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from orchestrator.domain.runner_types import ServerlessEcsRunnerConfiguration
from orchestrator.launchers import aws, base
from orchestrator.launchers.base import RunState
from orchestrator.launchers.ecs import (
    parse_handle,
    render_overrides,
    render_task_definition,
    same_definition,
    task_family,
    task_status,
)
from tests.support.aws_launcher import ecs_configuration, make_spec

ARN = "arn:aws:ecs:eu-west-1:123456789012:task/runners/0123456789abcdef0123456789abcdef"


def job(**changes: Any) -> Any:
    return ServerlessEcsRunnerConfiguration.model_validate(ecs_configuration(Path("/out"), **changes)).job


def test_render_task_definition__default_image_and_no_task_role() -> None:
    configuration = ecs_configuration(Path("/out"), image=None, task_role_arn=None, secrets={})
    definition = render_task_definition(
        make_spec("ecs", configuration), job(image=None, task_role_arn=None, secrets={}), "reg.example/r:9"
    )

    (container,) = definition["containerDefinitions"]
    assert container["image"] == "reg.example/r:9"
    assert "secrets" not in container and "taskRoleArn" not in definition


def test_render_overrides__only_what_changes_per_deployment() -> None:
    spec = make_spec("ecs", ecs_configuration(Path("/out")))

    (override,) = render_overrides(spec)["containerOverrides"]

    names = {e["name"] for e in override["environment"]}
    assert names == {"DEPLOYMENT_ID", "MODE", "LOG_LEVEL", "ENCRYPTING_KEY", "TOKEN"}
    assert names.isdisjoint(
        e["name"] for e in render_task_definition(spec, job(), "i")["containerDefinitions"][0]["environment"]
    )


def test_task_family__characters_ecs_refuses_are_replaced() -> None:
    assert task_family("acme.corp", "0b6c1a2e-3d4f") == "platform_orchestrator_env_acme_corp_0b6c1a2e-3d4f"
    assert len(task_family("o" * 300, "e")) == 255


def testsame_definition__ecs_defaults_and_order_do_not_count() -> None:
    wanted = render_task_definition(make_spec("ecs", ecs_configuration(Path("/out"))), job(), "i")
    container = wanted["containerDefinitions"][0]
    registered = {
        **wanted,
        "status": "ACTIVE",
        "containerDefinitions": [
            {
                **container,
                "environment": list(reversed(container["environment"])),
                "cpu": 0,
                "mountPoints": [],
            }
        ],
    }
    changed = {
        **registered,
        "containerDefinitions": [{**registered["containerDefinitions"][0], "image": "j"}],
    }

    assert same_definition(registered, wanted)
    assert not same_definition({**registered, "status": "INACTIVE"}, wanted)
    assert not same_definition(changed, wanted)


def test_parse_handle() -> None:
    assert parse_handle(f"ecs:{ARN}") == ("eu-west-1", "runners", ARN)
    with pytest.raises(ValueError):
        parse_handle("ecs:arn:aws:ecs:eu-west-1:123456789012:task/0123")  # the old ARN format


@pytest.mark.parametrize(
    ("task", "state", "exit_code", "detail"),
    [
        ({"lastStatus": "PROVISIONING"}, RunState.RUNNING, None, "the ECS task is PROVISIONING"),
        ({"lastStatus": "RUNNING", "startedAt": 1.0}, RunState.RUNNING, None, None),
        ({"lastStatus": "DEPROVISIONING", "startedAt": 1.0}, RunState.RUNNING, None, None),
        (
            {
                "lastStatus": "STOPPED",
                "stoppedReason": "Essential container in task exited",
                "containers": [{"name": "sidecar", "exitCode": 0}, {"name": "main", "exitCode": 2}],
            },
            RunState.EXITED,
            2,
            "ECS stopped the task: Essential container in task exited",
        ),
        (
            {
                "lastStatus": "STOPPED",
                "stoppedReason": "Task failed to start",
                "containers": [{"name": "main", "reason": "CannotPullContainerError: nope"}],
            },
            RunState.EXITED,
            None,
            "ECS stopped the task: Task failed to start; CannotPullContainerError: nope",
        ),
    ],
)
def test_task_status(
    task: dict[str, Any], state: RunState, exit_code: int | None, detail: str | None
) -> None:
    status = task_status(task)

    assert (status.state, status.exit_code, status.detail) == (state, exit_code, detail)


def test_answer_summary__a_body_that_is_not_an_aws_error_is_not_quoted() -> None:
    exc = ClientError(
        {
            "Error": {"Code": "502", "Message": "<html>secret</html>"},
            "ResponseMetadata": {"HTTPStatusCode": 502},
        },
        "RunTask",
    )

    assert aws.answer_summary(exc) == "502 Bad Gateway (not an AWS error answer; the answer is not shown)"
    assert aws.is_retryable(exc)


def test_scrubbed__secrets_replaced_and_shortened() -> None:
    text = aws.scrubbed("token abc123 in\nthe message " + "x" * 400, ["abc123"])

    assert "abc123" not in text and "***" in text and "\n" not in text
    assert len(text) == base.MAX_QUOTED
