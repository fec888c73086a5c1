"""The AWS stand-in (tests/support/aws_standin.py) as the EKS and ECS launcher tests use it: an account
with the runner's role (trusting the test issuer's subject), the ECS execution and task roles, an EKS
cluster on a stand-in Kubernetes API that authenticates EKS tokens, and run specs for both types."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from orchestrator.launchers import aws
from orchestrator.launchers.base import LaunchTarget
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import RunnerMode
from tests.support.aws_standin import ACCOUNT, AwsStandIn, OidcProvider, Role
from tests.support.kube_api import KubeApiServer, LocalImage
from tests.support.kube_launcher import IMAGE, NAMESPACE, TOKEN, local_image
from tests.support.workload_identity import TestIssuer

ORG = "acme"
REGION = "eu-west-1"
CLUSTER = "prod"
ECS_CLUSTER = "runners"
DEPLOYMENT = "5f0c8d3e-1a2b-4c3d-8e9f-0a1b2c3d4e5f"
ENV_UUID = "0b6c1a2e-3d4f-4a5b-8c6d-7e8f9a0b1c2d"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/platform-orchestrator"
EXECUTION_ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/runner-execution"
TASK_ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/runner-task"
SECRET_ARN = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:runner/git-key-AbCdEf"
SECRET_VALUE = "git-ssh-key-value-0123456789"


def subject(runner_id: str) -> str:
    return f"{ORG}+{runner_id}"


def same_issuer(issuer: TestIssuer, subject: str) -> TestIssuer:
    """The same issuer (URL and signing key) minting for another subject (another runner)."""
    return TestIssuer(subject=subject, issuer=issuer.issuer, kid=issuer.kid, _key=issuer._key)


def roles(*runner_ids: str) -> list[Role]:
    """The orchestrator's role (trusting the runners' subjects), the execution role (may read the secret)
    and the task role."""
    return [
        Role("platform-orchestrator", frozenset(subject(r) for r in runner_ids)),
        Role("runner-execution", allowed=frozenset({"secretsmanager:GetSecretValue"}), ecs_tasks=True),
        Role("runner-task", allowed=frozenset(), ecs_tasks=True),
    ]


def clients(standin: AwsStandIn, **options: Any) -> aws.AwsClients:
    endpoints = aws.AwsEndpoints(sts=standin.url, eks=standin.url, ecs=standin.url)
    return aws.AwsClients(endpoints, **options)


def closed_port_url(scheme: str = "http") -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"{scheme}://127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class EksWorld:
    aws: AwsStandIn
    kube: KubeApiServer


@contextlib.contextmanager
def eks_world(
    tmp_path: Path,
    issuer: TestIssuer,
    *,
    runner_ids: tuple[str, ...] = ("eks",),
    images: Mapping[str, LocalImage] | None = None,
    **kube_options: Any,
) -> Iterator[EksWorld]:
    """An account whose EKS cluster ``prod`` (in ``eu-west-1``) is a stand-in Kubernetes API that accepts
    EKS tokens of sessions whose role has an access entry (the orchestrator's role has one)."""
    with AwsStandIn(
        tmp_path / "aws", providers=[OidcProvider.of(issuer)], roles=roles(*runner_ids)
    ) as standin:
        kube_options.setdefault("namespaces", ("default", NAMESPACE))
        with KubeApiServer(
            tmp_path / "kube",
            auth="token",
            token_review=standin.token_review(CLUSTER),
            images=images or {IMAGE: local_image()},
            **kube_options,
        ) as kube:
            standin.add_eks_cluster(
                CLUSTER, REGION, endpoint=kube.url, ca_data=kube.ca_data, access=[ROLE_ARN]
            )
            yield EksWorld(standin, kube)


def eks_configuration(out_dir: Path, **auth: Any) -> dict[str, Any]:
    return {
        "type": "kubernetes-eks",
        "cluster": {"name": CLUSTER, "region": REGION, "auth": {"role_arn": ROLE_ARN, **auth}},
        "job": {
            "namespace": NAMESPACE,
            "service_account": "runner",
            "pod_template": {
                "spec": {
                    "containers": [{"name": "main", "env": [{"name": "OUT_DIR", "value": str(out_dir)}]}]
                }
            },
        },
    }


def ecs_configuration(out_dir: Path, **job: Any) -> dict[str, Any]:
    return {
        "type": "serverless-ecs",
        "auth": {"role_arn": ROLE_ARN},
        "job": {
            "region": REGION,
            "cluster": ECS_CLUSTER,
            "subnets": ["subnet-0a1b2c3d"],
            "security_groups": ["sg-0a1b2c3d"],
            "is_public_ip_enabled": True,
            "execution_role_arn": EXECUTION_ROLE_ARN,
            "task_role_arn": TASK_ROLE_ARN,
            "image": IMAGE,
            "environment": {"OUT_DIR": str(out_dir), "TF_IN_AUTOMATION": "1"},
            "secrets": {"GIT_KEY": SECRET_ARN},
            **job,
        },
    }


@contextlib.contextmanager
def ecs_world(
    tmp_path: Path,
    issuer: TestIssuer,
    *,
    runner_ids: tuple[str, ...] = ("ecs",),
    images: Mapping[str, LocalImage] | None = None,
    stop_timeout_seconds: float = 5.0,
) -> Iterator[AwsStandIn]:
    """An account with ECS cluster ``runners`` in ``eu-west-1``, whose Fargate knows the stand-in runner
    image, and the secret ``SECRET_ARN``."""
    with AwsStandIn(
        tmp_path / "aws",
        providers=[OidcProvider.of(issuer)],
        roles=roles(*runner_ids),
        images=images or {IMAGE: local_image()},
    ) as standin:
        standin.ecs.add_cluster(ECS_CLUSTER, REGION)
        standin.ecs.secrets[SECRET_ARN] = SECRET_VALUE
        standin.ecs.stop_timeout_seconds = stop_timeout_seconds
        yield standin


def target(runner_id: str, configuration: dict[str, Any]) -> LaunchTarget:
    return LaunchTarget(
        org_id=ORG, runner_id=runner_id, runner_type=configuration["type"], configuration=configuration
    )


def make_spec(
    runner_id: str, configuration: dict[str, Any], *, deployment: str = DEPLOYMENT, token: str = TOKEN
) -> RunSpec:
    return RunSpec(
        org_id=ORG,
        runner_id=runner_id,
        deployment_id=deployment,
        env_uuid=ENV_UUID,
        mode=RunnerMode.DEPLOY,
        token=SecretStr(token),
        gateway_url="http://127.0.0.1:9",
        encrypting_key="age1qyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqs3290gq",
        runner_configuration=configuration,
    )


def secrets_of(standin: AwsStandIn, issuer: TestIssuer, *extra: str) -> list[str]:
    """Every secret of the exchanges so far: the web identity tokens, the issued secret keys and session
    tokens, and ``extra`` (the deployment token, a secret's value)."""
    found = [token for _, token in issuer.minted]
    for issued in standin.issued.values():
        found += [issued.secret_access_key, issued.session_token]
    return [*found, *extra]
