"""The ``kubernetes-eks`` launcher against stand-ins, with the real clients: botocore for STS and EKS
(tests/support/aws_standin.py: STS verifies the web identity token against the test issuer's keys and
every signature against the credentials it issued), lightkube for the cluster (tests/support/kube_api.py,
over TLS with the CA that DescribeCluster answered), which authenticates the presigned ``k8s-aws-v1.``
token by sending it to STS with its cluster's name, as aws-iam-authenticator does.

Both stand-ins listen on 127.0.0.1, so the launcher allows loopback (``STAND_IN_EGRESS``).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from orchestrator.domain.runner_types import K8sEksRunnerConfiguration
from orchestrator.launchers import aws
from orchestrator.launchers.base import Launcher, LaunchError, RunState, RunStatus, launched
from orchestrator.launchers.egress import EgressPolicy
from orchestrator.launchers.eks import eks_launcher
from orchestrator.launchers.kubernetes_cloud import CloudKubernetesLauncher
from tests.support.aws_launcher import (
    CLUSTER,
    REGION,
    ROLE_ARN,
    EksWorld,
    clients,
    closed_port_url,
    eks_configuration,
    eks_world,
    make_spec,
    same_issuer,
    secrets_of,
    subject,
    target,
)
from tests.support.aws_standin import Role
from tests.support.kube_launcher import IMAGE, NAMESPACE, TOKEN, release
from tests.support.workload_identity import TestIssuer

STAND_IN_EGRESS = EgressPolicy(allow_plain_http=True, denied_networks=())
RUNNER = "eks"


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


@pytest.fixture
def issuer() -> TestIssuer:
    return TestIssuer(subject=subject(RUNNER))


@pytest.fixture
def world(tmp_path: Path, issuer: TestIssuer) -> Iterator[EksWorld]:
    with eks_world(tmp_path, issuer) as made:
        yield made


def launcher(
    world: EksWorld,
    issuer: TestIssuer,
    out_dir: Path,
    *,
    shared: aws.AwsClients | None = None,
    runner_id: str = RUNNER,
    **auth: Any,
) -> CloudKubernetesLauncher:
    configuration = eks_configuration(out_dir, **auth)
    parsed = K8sEksRunnerConfiguration.model_validate(configuration)
    return eks_launcher(
        target(runner_id, configuration),
        parsed.cluster,
        identity=issuer,
        clients=shared or clients(world.aws),
        egress=STAND_IN_EGRESS,
        image=IMAGE,
    )


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


async def launch_error(eks: Launcher, out_dir: Path) -> LaunchError:
    with pytest.raises(LaunchError) as caught:
        await eks.launch(make_spec(RUNNER, eks_configuration(out_dir)))
    return caught.value


def assert_no_secret(text: str, world: EksWorld, issuer: TestIssuer) -> None:
    for secret in secrets_of(world.aws, issuer, TOKEN):
        assert secret not in text


# --- launch -------------------------------------------------------------------------------------------


async def test_launch__creates_the_job_with_the_role_s_eks_token(
    world: EksWorld, issuer: TestIssuer, out_dir: Path
) -> None:
    """The role is assumed with the issuer's token (audience sts.amazonaws.com, the runner's subject, the
    default session name), the cluster found by DescribeCluster, and the Job created with a presigned
    GetCallerIdentity token that the cluster accepted through STS; the runner got its deployment token.
    The dry-run Secret, the Job and its token Secret pass Kubernetes' strict schemas."""
    eks = launcher(world, issuer, out_dir)

    handle = launched(await eks.launch(make_spec(RUNNER, eks_configuration(out_dir)))).handle
    await wait_until(lambda: (out_dir / "token").exists())

    assert handle == f"k8s:{NAMESPACE}:{make_spec(RUNNER, {}).deployment_id}"
    assert [audience for audience, _ in issuer.minted] == [aws.AUDIENCE]
    (session,) = world.aws.issued.values()
    assert (session.role.arn, session.subject, session.session_name) == (ROLE_ARN, "acme+eks", "acme-eks")
    assert [j["metadata"]["name"] for j in world.kube.objects("jobs", NAMESPACE)] == [handle.split(":")[2]]
    assert {r.caller for r in world.aws.reviews} == {session.assumed_arn}
    sent = [(s.kind, s.dry_run) for s in world.kube.sent]
    assert sent == [("Secret", True), ("Job", False), ("Secret", False)]
    world.kube.assert_sent_valid()
    assert all(r.accepted for r in world.aws.reviews)
    assert (out_dir / "token").read_text() == TOKEN
    aws_calls = [(c.service, c.action, c.status) for c in world.aws.calls]
    assert aws_calls[:2] == [("sts", "AssumeRoleWithWebIdentity", 200), ("eks", "DescribeCluster", 200)]
    assert {c for c in aws_calls[2:]} == {("sts", "GetCallerIdentity", 200)}


async def test_eks_token__is_a_presigned_get_caller_identity_bound_to_the_cluster(
    world: EksWorld, issuer: TestIssuer, out_dir: Path
) -> None:
    """The token is ``k8s-aws-v1.`` + base64url (no padding) of an STS URL signed for ``x-k8s-aws-id``:
    another cluster presenting it to STS (with its own name) is refused, so it opens only this cluster."""
    access = (await launcher(world, issuer, out_dir).source.cluster_access()).access
    assert access.token is not None and access.token.startswith("k8s-aws-v1.")
    url = base64.urlsafe_b64decode(access.token.removeprefix("k8s-aws-v1.") + "==").decode()
    query = parse_qs(urlsplit(url).query)

    accepted_here = world.aws.token_review(CLUSTER)(access.token)
    accepted_elsewhere = world.aws.token_review("staging")(access.token)

    assert "=" not in access.token
    assert query["Action"] == ["GetCallerIdentity"]
    assert query["X-Amz-SignedHeaders"] == ["host;x-k8s-aws-id"]
    assert query["X-Amz-Expires"] == ["60"]
    assert f"/{REGION}/sts/aws4_request" in query["X-Amz-Credential"][0]
    assert access.server == world.kube.url and access.certificate_authority_data == world.kube.ca_data
    assert (accepted_here, accepted_elsewhere) == (True, False)
    assert world.aws.calls[-1].status == 403  # the signature does not cover the other cluster's name


async def test_launch__session_name_and_sts_region_from_the_configuration(
    world: EksWorld, issuer: TestIssuer, out_dir: Path
) -> None:
    source = launcher(world, issuer, out_dir, session_name="deployments", sts_region="us-east-1").source
    access = (await source.cluster_access()).access
    url = base64.urlsafe_b64decode(str(access.token).removeprefix("k8s-aws-v1.") + "==").decode()

    (session,) = world.aws.issued.values()
    assert session.session_name == "deployments"
    assert "/us-east-1/sts/aws4_request" in parse_qs(urlsplit(url).query)["X-Amz-Credential"][0]


async def test_credentials__cached_per_runner_until_shortly_before_they_expire(
    tmp_path: Path, out_dir: Path
) -> None:
    """Launch, status and cancel of one runner assume its role once; another runner of the same clients
    gets a session of its own; credentials closer to their expiry than the refresh margin are renewed."""
    issuer = TestIssuer(subject=subject("eks"))
    with eks_world(tmp_path, issuer, runner_ids=("eks", "eks-b")) as world:
        shared = clients(world.aws)
        # A launcher per call, as the server makes them: the access is not cached between them.
        a = launcher(world, issuer, out_dir, shared=shared)
        handle = launched(await a.launch(make_spec(RUNNER, eks_configuration(out_dir)))).handle
        await launcher(world, issuer, out_dir, shared=shared).status(handle)
        await launcher(world, issuer, out_dir, shared=shared).cancel(handle, grace_seconds=1)
        described_for_a = [c.action for c in world.aws.calls].count("DescribeCluster")
        assumed_for_a = len(world.aws.issued)
        b = launcher(world, same_issuer(issuer, subject("eks-b")), out_dir, shared=shared, runner_id="eks-b")
        await b.status(handle)
        renewing = clients(world.aws, refresh_margin_seconds=7200)
        for _ in range(2):
            await launcher(world, issuer, out_dir, shared=renewing).status(handle)

    assert (assumed_for_a, described_for_a) == (1, 3)
    subjects = [issued.subject for issued in world.aws.issued.values()]
    assert subjects == ["acme+eks", "acme+eks-b", "acme+eks", "acme+eks"]


async def test_access__one_per_launcher_while_its_token_is_young(
    world: EksWorld, issuer: TestIssuer, out_dir: Path
) -> None:
    """One launcher's calls share an access (one DescribeCluster, one token), kept 14 minutes from the
    token's signing at most."""
    eks = launcher(world, issuer, out_dir)
    handle = launched(await eks.launch(make_spec(RUNNER, eks_configuration(out_dir)))).handle
    await eks.status(handle)
    await eks.cancel(handle, grace_seconds=1)
    before = time.time()
    fresh = await eks.source.cluster_access()
    after = time.time()

    assert [c.action for c in world.aws.calls].count("DescribeCluster") == 2
    assert len(eks.cache) == 1
    assert before + 14 * 60 <= fresh.expires_at <= after + 14 * 60


# --- status and cancel ----------------------------------------------------------------------------------


async def test_status__running_then_exited_with_the_exit_code(
    world: EksWorld, issuer: TestIssuer, out_dir: Path
) -> None:
    eks = launcher(world, issuer, out_dir)
    handle = launched(await eks.launch(make_spec(RUNNER, eks_configuration(out_dir)))).handle
    await wait_until(lambda: (out_dir / "started").exists())

    running = await eks.status(handle)
    release(out_dir, 3)
    exited = await eventually(lambda: eks.status(handle), lambda s: s.state is RunState.EXITED)

    assert running.state is RunState.RUNNING
    assert exited.exit_code == 3


async def test_cancel__deletes_the_job(world: EksWorld, issuer: TestIssuer, out_dir: Path) -> None:
    eks = launcher(world, issuer, out_dir)
    handle = launched(await eks.launch(make_spec(RUNNER, eks_configuration(out_dir)))).handle
    await wait_until(lambda: (out_dir / "started").exists())

    await eks.cancel(handle, grace_seconds=1)

    assert world.kube.objects("jobs", NAMESPACE) == []
    status = await eks.status(handle)
    assert status.state is RunState.EXITED and status.detail is not None and "is gone" in status.detail


# --- failures -----------------------------------------------------------------------------------------


async def test_launch__token_of_an_unknown_issuer_is_refused_by_sts(
    world: EksWorld, issuer: TestIssuer, out_dir: Path
) -> None:
    """An account without an OIDC provider for the orchestrator's issuer: STS refuses the token."""
    impostor = TestIssuer(subject=subject(RUNNER), issuer="https://elsewhere.test")

    error = await launch_error(launcher(world, impostor, out_dir), out_dir)

    assert error.retryable is False
    assert error.message == (
        f"STS refused the web identity token for role {ROLE_ARN}: InvalidIdentityToken: No OpenIDConnect "
        "provider found in your account for https://elsewhere.test"
    )
    assert_no_secret(error.message, world, impostor)


async def test_launch__token_signed_with_another_key_is_refused_by_sts(
    world: EksWorld, issuer: TestIssuer, out_dir: Path
) -> None:
    """Same issuer URL, another signing key: the signature does not verify against the provider's keys."""
    forger = TestIssuer(subject=subject(RUNNER), kid=issuer.kid)

    error = await launch_error(launcher(world, forger, out_dir), out_dir)

    assert error.retryable is False
    assert "STS refused the web identity token" in error.message
    assert (
        "InvalidIdentityToken: The web identity token that was passed could not be validated" in error.message
    )
    assert world.aws.issued == {}
    assert_no_secret(error.message, world, forger)


async def test_launch__role_that_does_not_trust_the_subject(
    world: EksWorld, issuer: TestIssuer, out_dir: Path
) -> None:
    other = same_issuer(issuer, subject("other-runner"))

    error = await launch_error(launcher(world, other, out_dir, runner_id="other-runner"), out_dir)

    assert error.retryable is False
    assert error.message.startswith(
        f"STS refused to let acme+other-runner assume role {ROLE_ARN}: AccessDenied: Not authorized to "
        "perform sts:AssumeRoleWithWebIdentity (the role's trust policy must allow"
    )
    assert_no_secret(error.message, world, other)


async def test_launch__sts_unreachable_is_retryable(
    world: EksWorld, issuer: TestIssuer, out_dir: Path
) -> None:
    down = aws.AwsClients(
        aws.AwsEndpoints(sts=closed_port_url(), eks=world.aws.url), max_attempts=1, connect_timeout_seconds=2
    )

    error = await launch_error(launcher(world, issuer, out_dir, shared=down), out_dir)

    assert error.retryable is True
    assert error.message.startswith(f"cannot assume role {ROLE_ARN}: STS at http://127.0.0.1:")
    assert "is unreachable" in error.message
    assert_no_secret(error.message, world, issuer)


async def test_launch__cluster_not_found(world: EksWorld, issuer: TestIssuer, out_dir: Path) -> None:
    world.aws.eks_clusters.clear()

    error = await launch_error(launcher(world, issuer, out_dir), out_dir)

    assert error.retryable is False
    assert error.message == (
        f"cannot describe EKS cluster {CLUSTER} in {REGION}: EKS refused: ResourceNotFoundException: "
        f"No cluster found for name: {CLUSTER}."
    )
    assert_no_secret(error.message, world, issuer)


async def test_launch__role_without_describe_cluster(
    world: EksWorld, issuer: TestIssuer, out_dir: Path
) -> None:
    world.aws.add_role(Role("platform-orchestrator", frozenset({subject(RUNNER)}), allowed=frozenset()))

    error = await launch_error(launcher(world, issuer, out_dir), out_dir)

    assert error.retryable is False
    assert "EKS refused: AccessDeniedException: User: arn:aws:sts::" in error.message
    assert "is not authorized to perform: eks:DescribeCluster" in error.message
    assert_no_secret(error.message, world, issuer)


async def test_launch__role_without_an_access_entry_is_unauthorized(
    world: EksWorld, issuer: TestIssuer, out_dir: Path
) -> None:
    """The cluster does not map the role: 401, with the hint where to map it."""
    world.aws.eks_clusters[(REGION, CLUSTER)].access_entries.clear()

    error = await launch_error(launcher(world, issuer, out_dir), out_dir)

    assert error.retryable is False
    assert "401 Unauthorized" in error.message
    assert f"give {ROLE_ARN} an access entry on cluster {CLUSTER}" in error.message
    assert [r.accepted for r in world.aws.reviews] == [False]
    assert_no_secret(error.message, world, issuer)


async def test_launch__forbidden_namespace(tmp_path: Path, issuer: TestIssuer, out_dir: Path) -> None:
    with eks_world(tmp_path, issuer, forbidden={("create", "jobs")}) as world:
        error = await launch_error(launcher(world, issuer, out_dir), out_dir)

    assert error.retryable is False
    assert "403 Forbidden" in error.message
    assert (
        f'cannot create resource "jobs" in API group "batch" in the namespace "{NAMESPACE}"' in error.message
    )
    assert_no_secret(error.message, world, issuer)


async def test_launch__unreachable_api_server(world: EksWorld, issuer: TestIssuer, out_dir: Path) -> None:
    """DescribeCluster names an endpoint nothing listens on: retryable; status reads UNKNOWN."""
    world.aws.eks_clusters[(REGION, CLUSTER)].endpoint = closed_port_url("https")
    eks = launcher(world, issuer, out_dir)

    error = await launch_error(eks, out_dir)
    status = await eks.status(f"k8s:{NAMESPACE}:whatever")

    assert error.retryable is True
    assert "is unreachable" in error.message
    assert status.state is RunState.UNKNOWN
    assert_no_secret(error.message + str(status.detail), world, issuer)


async def test_status__sts_refusal_is_unknown(world: EksWorld, issuer: TestIssuer, out_dir: Path) -> None:
    """A status check whose role can no longer be assumed cannot tell: UNKNOWN with the cause."""
    world.aws.providers.clear()

    status = await launcher(world, issuer, out_dir).status(f"k8s:{NAMESPACE}:whatever")

    assert status.state is RunState.UNKNOWN
    assert status.detail is not None and "STS refused the web identity token" in status.detail
