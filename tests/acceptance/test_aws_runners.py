"""Deployments through ``kubernetes-eks`` and ``serverless-ecs`` runners, end to end: a real server whose
OIDC issuer mints the runner's token, which the AWS stand-in's STS (tests/support/aws_standin.py, not
AWS) verifies against the server's published JWKS (an IAM OIDC provider for the server's URL, set up as a
user would, after the server is up) and exchanges for the role's credentials; the server's botocore
clients reach STS, EKS and ECS through ``PO_AWS_*_URL``.

- EKS: DescribeCluster answers the stand-in Kubernetes API (tests/support/kube_api.py) and its CA; the
  cluster authenticates the presigned ``k8s-aws-v1.`` token through STS; its kubelet runs the runner image
  as ``python -m orchestrator.cli.runner standard``.
- ECS: the stand-in's Fargate runs the task's container command (the runner image, ``standard``) with
  the task definition's environment, the task's overrides and the secret's value.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from orchestrator.launchers.kubernetes_job import DEFAULT_RUNNER_IMAGE
from orchestrator.settings import ServerSettings
from tests.support.aws_launcher import (
    CLUSTER,
    ECS_CLUSTER,
    EXECUTION_ROLE_ARN,
    REGION,
    ROLE_ARN,
    SECRET_ARN,
    SECRET_VALUE,
    roles,
)
from tests.support.aws_standin import AwsStandIn, OidcProvider
from tests.support.kube_api import KubeApiServer, runner_image
from tests.support.stack import Stack, build_stack

pytestmark = [pytest.mark.slow, pytest.mark.spread]

NAMESPACE = "platform-orchestrator-runner"
#: build_stack's runner is ``local`` of org ``acme``.
RUNNER = "local"


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[AwsStandIn]:
    images = {DEFAULT_RUNNER_IMAGE: runner_image()}
    with AwsStandIn(tmp_path / "aws", roles=roles(RUNNER), images=images) as made:
        made.ecs.add_cluster(ECS_CLUSTER, REGION)
        made.ecs.secrets[SECRET_ARN] = SECRET_VALUE
        yield made


@pytest.fixture
def settings(settings: ServerSettings, standin: AwsStandIn) -> ServerSettings:
    """The AWS endpoints are the stand-in's; the stand-in cluster listens on 127.0.0.1, allowed here."""
    return settings.model_copy(
        update={
            "aws_sts_url": standin.url,
            "aws_eks_url": standin.url,
            "aws_ecs_url": standin.url,
            "runner_denied_networks": "",
        }
    )


def trust_the_server(standin: AwsStandIn, server_url: str) -> None:
    """The IAM OIDC identity provider for the orchestrator's issuer URL, audience sts.amazonaws.com."""
    provider = OidcProvider.discovered(server_url)
    assert provider.issuer == server_url
    standin.providers[provider.issuer] = provider


def engine_env(tmp_path: Path) -> dict[str, str]:
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    return {"IAC_BACKEND": "embedded", "TF_CLI_CONFIG_FILE": str(tf_config), "CHECKPOINT_DISABLE": "1"}


def eks_runner(tmp_path: Path) -> dict[str, Any]:
    env = [{"name": k, "value": v} for k, v in engine_env(tmp_path).items()]
    return {
        "runner_configuration": {
            "type": "kubernetes-eks",
            "cluster": {"name": CLUSTER, "region": REGION, "auth": {"role_arn": ROLE_ARN}},
            "job": {
                "namespace": NAMESPACE,
                "service_account": "platform-orchestrator-runner",
                "pod_template": {"spec": {"containers": [{"name": "main", "env": env}]}},
            },
        },
        "state_storage_configuration": {"type": "orchestrator"},
    }


def ecs_runner(tmp_path: Path, **job: Any) -> dict[str, Any]:
    return {
        "runner_configuration": {
            "type": "serverless-ecs",
            "auth": {"role_arn": ROLE_ARN},
            "job": {
                "region": REGION,
                "cluster": ECS_CLUSTER,
                "subnets": ["subnet-0a1b2c3d"],
                "execution_role_arn": EXECUTION_ROLE_ARN,
                "environment": engine_env(tmp_path),
                "secrets": {"TF_VAR_unused_secret": SECRET_ARN},
                **job,
            },
        },
        "state_storage_configuration": {"type": "orchestrator"},
    }


def secrets_of(standin: AwsStandIn, *extra: str) -> list[str]:
    found = list(standin.presented_tokens)
    for issued in standin.issued.values():
        found += [issued.secret_access_key, issued.session_token]
    return [s for s in (*found, *extra) if s]


def answers(stack: Stack, deployment: dict[str, Any]) -> str:
    """What the API shows of the deployment and its runner."""
    texts = [
        stack.client.get(f"/orgs/{stack.org}/deployments/{deployment['id']}").text,
        stack.client.get(f"/orgs/{stack.org}/deployments", params={"env_id": "dev"}).text,
        stack.client.get(f"/orgs/{stack.org}/runners/{RUNNER}").text,
    ]
    return "\n".join(texts)


def test_deploy__through_a_kubernetes_eks_runner(
    server_url: str, standin: AwsStandIn, tmp_path: Path
) -> None:
    """The deployment succeeds: the server's token was exchanged at STS, the cluster found and entered
    with the presigned token, the Job ran the runner to completion."""
    trust_the_server(standin, server_url)
    images = {DEFAULT_RUNNER_IMAGE: runner_image()}
    with KubeApiServer(
        tmp_path / "kube",
        auth="token",
        token_review=standin.token_review(CLUSTER),
        namespaces=("default", NAMESPACE),
        images=images,
    ) as kube:
        standin.add_eks_cluster(CLUSTER, REGION, endpoint=kube.url, ca_data=kube.ca_data, access=[ROLE_ARN])
        stack = build_stack(server_url, tmp_path, runner=eks_runner(tmp_path))

        with capture_logs() as logs:
            deployment = stack.deploy()
        outputs = stack.outputs(deployment) if deployment["status"] == "succeeded" else {}
        kube.wait_for(lambda: bool(kube.objects("jobs", NAMESPACE)[0]["status"].get("conditions")))
        jobs = kube.objects("jobs", NAMESPACE)
        (secret,) = kube.objects("secrets", NAMESPACE)
        shown = answers(stack, deployment)
        stack.client.close()

    assert deployment["status"] == "succeeded", deployment["status_message"]
    assert outputs["shop"]["bucket"] == "bucket-shop"
    assert [job["metadata"]["name"] for job in jobs] == [deployment["id"]]
    assert {c["type"] for c in jobs[0]["status"]["conditions"]} == {"SuccessCriteriaMet", "Complete"}
    assert {issued.subject for issued in standin.issued.values()} == {"acme+local"}
    assert standin.reviews and all(review.accepted for review in standin.reviews)
    deployment_token = base64.b64decode(secret["data"]["TOKEN"]).decode()
    for value in secrets_of(standin, deployment_token):
        assert value not in shown
        assert value not in str(logs)


def test_deploy__through_a_serverless_ecs_runner(
    server_url: str, standin: AwsStandIn, tmp_path: Path
) -> None:
    """The deployment succeeds: one Fargate task of the environment's task definition ran the runner,
    with the deployment token in the task's overrides only."""
    trust_the_server(standin, server_url)
    stack = build_stack(server_url, tmp_path, runner=ecs_runner(tmp_path))

    with capture_logs() as logs:
        deployment = stack.deploy()
    outputs = stack.outputs(deployment) if deployment["status"] == "succeeded" else {}
    shown = answers(stack, deployment)
    stack.client.close()

    assert deployment["status"] == "succeeded", deployment["status_message"]
    assert outputs["shop"]["bucket"] == "bucket-shop"
    (task,) = standin.ecs.all_tasks()
    standin.ecs.wait_for(lambda: task.last_status == "STOPPED")
    assert (task.exit_code, task.stop_code) == (0, "EssentialContainerExited")
    assert {t["key"]: t["value"] for t in task.tags}["PlatformOrchestratorDeploymentId"] == deployment["id"]
    assert task.environment["TF_VAR_unused_secret"] == SECRET_VALUE
    deployment_token = task.environment["TOKEN"]
    assert deployment_token not in str(task.definition.body)
    for value in secrets_of(standin, deployment_token, SECRET_VALUE):
        assert value not in shown
        assert value not in str(logs)


def test_deploy__ecs_task_stopped_by_ecs_fails_with_its_reason(
    server_url: str, standin: AwsStandIn, tmp_path: Path
) -> None:
    """A task ECS stops before it ran (its image cannot be pulled): the deployment fails with ECS's reason."""
    trust_the_server(standin, server_url)
    stack = build_stack(
        server_url, tmp_path, runner=ecs_runner(tmp_path, image="registry.example.com/gone:1")
    )

    with capture_logs() as logs:
        deployment = stack.deploy()
    shown = answers(stack, deployment)
    stack.client.close()

    assert deployment["status"] == "failed"
    assert deployment["status_message"].startswith(
        "the runner exited without reporting results: ECS stopped the task: CannotPullContainerError: "
    )
    assert "registry.example.com/gone:1: not found" in deployment["status_message"]
    (task,) = standin.ecs.all_tasks()
    (override,) = task.overrides["containerOverrides"]
    deployment_token = {e["name"]: e["value"] for e in override["environment"]}["TOKEN"]
    for value in secrets_of(standin, deployment_token):
        assert value not in shown
        assert value not in str(logs)


def test_deploy__eks_role_that_does_not_trust_the_runner_fails_with_sts_s_refusal(
    server_url: str, standin: AwsStandIn, tmp_path: Path
) -> None:
    trust_the_server(standin, server_url)
    standin.add_role(roles("another-runner")[0])
    stack = build_stack(server_url, tmp_path, runner=eks_runner(tmp_path))

    with capture_logs() as logs:
        deployment = stack.deploy()
    shown = answers(stack, deployment)
    stack.client.close()

    assert deployment["status"] == "failed"
    assert deployment["status_message"].startswith(
        f"the runner could not be launched: STS refused to let acme+local assume role {ROLE_ARN}: "
        "AccessDenied: Not authorized to perform sts:AssumeRoleWithWebIdentity"
    )
    assert standin.presented_tokens
    for value in secrets_of(standin):
        assert value not in shown
        assert value not in str(logs)
