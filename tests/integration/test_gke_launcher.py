"""The ``kubernetes-gke`` launcher (launchers/gke.py) with google-auth's real external account credentials
against the Google stand-in (tests/support/gcp_standin.py: STS, IAM, the GKE API, over TLS) and the
stand-in Kubernetes API (tests/support/kube_api.py), which accepts only the service account access tokens
the Google stand-in issued. The orchestrator's OIDC tokens come from ``TestIssuer``; the STS stand-in
verifies them as Google does. Every failure must name its cause and hold no token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.launchers.base import LaunchError, RunState, launched
from orchestrator.launchers.gke import gke_launcher
from orchestrator.launchers.kubernetes_cloud import AccessCache, CloudKubernetesLauncher
from tests.support.cloud_launchers import (
    STAND_IN_EGRESS,
    closed_port,
    cloud_spec,
    eventually,
    holds,
    leaked,
    rendered_job,
)
from tests.support.gcp_standin import AUDIENCE, SERVICE_ACCOUNT, GcpStandIn
from tests.support.https_standin import trust
from tests.support.kube_api import CertificateAuthority, KubeApiServer
from tests.support.kube_launcher import IMAGE, NAMESPACE, kube_api, release
from tests.support.workload_identity import TestIssuer

PROJECT, LOCATION, CLUSTER = "my-gcp-project", "europe-west3", "my-cluster"


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


@pytest.fixture
def issuer() -> TestIssuer:
    return TestIssuer(subject="acme+k8s")  # the org and runner of kube_launcher.make_spec


@pytest.fixture
def ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CertificateAuthority:
    authority = CertificateAuthority("cloud-stand-ins")
    trust(authority, tmp_path / "cloud-ca.pem", monkeypatch)
    return authority


@pytest.fixture
def gcp(issuer: TestIssuer, ca: CertificateAuthority, tmp_path: Path) -> Iterator[GcpStandIn]:
    standin = GcpStandIn(issuer)
    standin.allow_impersonation(SERVICE_ACCOUNT, issuer.subject)
    with standin.serving(ca, tmp_path / "gcp"):
        yield standin


@pytest.fixture
def api(tmp_path: Path, gcp: GcpStandIn) -> Iterator[KubeApiServer]:
    with kube_api(tmp_path, auth="token", token_review=gcp.token_review) as server:
        gcp.add_cluster(
            PROJECT,
            LOCATION,
            CLUSTER,
            endpoint=server.url.removeprefix("https://"),
            ca_data=server.ca_data,
            readers={SERVICE_ACCOUNT},
        )
        yield server


def configuration(**cluster: Any) -> dict[str, Any]:
    return {
        "type": "kubernetes-gke",
        "cluster": {
            "name": CLUSTER,
            "project_id": PROJECT,
            "location": LOCATION,
            "auth": {"gcp_audience": AUDIENCE, "gcp_service_account": SERVICE_ACCOUNT},
            **cluster,
        },
    }


def launcher(
    gcp: GcpStandIn, issuer: TestIssuer, config: dict[str, Any], **options: Any
) -> CloudKubernetesLauncher:
    # The Job itself is rendered from the spec's configuration (cloud_spec), which holds the whole job.
    config = {"job": {"namespace": NAMESPACE, "service_account": "runner"}, **config}
    made = gke_launcher(
        config, issuer, egress=STAND_IN_EGRESS, endpoints=gcp.endpoints(), image=IMAGE, **options
    )
    assert made is not None
    return made


def secrets_of(gcp: GcpStandIn, issuer: TestIssuer) -> list[str]:
    return [token for _, token in issuer.minted] + list(gcp.federated) + list(gcp.access_tokens)


async def launch_error(
    launcher: CloudKubernetesLauncher, out_dir: Path, config: dict[str, Any]
) -> LaunchError:
    with pytest.raises(LaunchError) as caught:
        await launcher.launch(cloud_spec(out_dir, config))
    return caught.value


# --- launch, status, cancel ---------------------------------------------------------------------------


async def test_launch__exchanges_the_token_and_creates_the_kubernetes_job(
    gcp: GcpStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    """STS, then IAM, then the GKE API, each once; the Job holds what the kubernetes launcher renders and
    the cluster authenticated the service account's access token."""
    spec = cloud_spec(out_dir, configuration())

    handle = launched(await launcher(gcp, issuer, configuration()).launch(spec)).handle

    assert handle == f"k8s:{NAMESPACE}:{spec.deployment_id}"
    assert gcp.calls == [("sts", 200), ("iam", 200), ("gke", 200)]
    assert [audience for audience, _ in issuer.minted] == [AUDIENCE]
    (minted,) = [token for _, token in issuer.minted]
    assert gcp.presented[0] == minted  # the subject token STS verified
    (job,) = api.objects("jobs", NAMESPACE)
    assert holds(job, rendered_job(spec)) == []
    bearer_calls = [c for c in api.calls if c.method == "POST"]
    # The dry-run create of the token Secret (may the Role create Secrets?), the Job, its token Secret,
    # each valid by Kubernetes' strict schemas.
    assert [c.status for c in bearer_calls] == [201, 201, 201]
    assert [(s.kind, s.dry_run) for s in api.sent] == [("Secret", True), ("Job", False), ("Secret", False)]
    api.assert_sent_valid()
    (access_token,) = gcp.access_tokens
    assert gcp.access_tokens[access_token].principal == SERVICE_ACCOUNT
    assert gcp.presented[-1] == access_token  # the GKE API's bearer; the cluster's too (token_review)


async def test_status_and_cancel__reuse_the_cached_access(
    gcp: GcpStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    """A launcher per call, as the server makes them, sharing one cache: one exchange for launch, status
    checks and cancel; the run's exit code comes through."""
    cache = AccessCache()
    config = configuration()

    def fresh() -> CloudKubernetesLauncher:
        return launcher(gcp, issuer, config, cache=cache, cache_key="acme/k8s")

    handle = launched(await fresh().launch(cloud_spec(out_dir, config))).handle
    running = await fresh().status(handle)
    release(out_dir, 3)
    exited = await eventually(lambda: fresh().status(handle), lambda s: s.state is RunState.EXITED)
    await fresh().cancel(handle, grace_seconds=1)

    assert running.state is RunState.RUNNING
    assert (exited.state, exited.exit_code) == (RunState.EXITED, 3)
    assert api.objects("jobs", NAMESPACE) == []
    assert [step for step, _ in gcp.calls] == ["sts", "iam", "gke"]


async def test_access__exchanged_again_when_the_token_nears_expiry(
    issuer: TestIssuer, ca: CertificateAuthority, tmp_path: Path, out_dir: Path
) -> None:
    """Access tokens valid for less than the refresh margin are never reused."""
    gcp = GcpStandIn(issuer, token_lifetime_seconds=60)
    gcp.allow_impersonation(SERVICE_ACCOUNT, issuer.subject)
    with (
        gcp.serving(ca, tmp_path / "gcp"),
        kube_api(tmp_path, auth="token", token_review=gcp.token_review) as api,
    ):
        gcp.add_cluster(
            PROJECT, LOCATION, CLUSTER, endpoint=api.url[8:], ca_data=api.ca_data, readers={SERVICE_ACCOUNT}
        )
        k8s = launcher(gcp, issuer, configuration(), cache=AccessCache(margin_seconds=120))
        handle = launched(await k8s.launch(cloud_spec(out_dir, configuration()))).handle
        status = await k8s.status(handle)

    assert status.state is RunState.RUNNING
    assert [step for step, _ in gcp.calls] == ["sts", "iam", "gke"] * 2
    assert len(issuer.minted) == 2


async def test_status__a_revoked_token_is_exchanged_again(
    gcp: GcpStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    """The cluster answers 401 to a revoked access token: that check is UNKNOWN, the next one exchanges
    again and sees the run."""
    k8s = launcher(gcp, issuer, configuration())
    handle = launched(await k8s.launch(cloud_spec(out_dir, configuration()))).handle
    gcp.access_tokens.clear()

    refused = await k8s.status(handle)
    again = await k8s.status(handle)

    assert refused.state is RunState.UNKNOWN
    assert "401 Unauthorized" in (refused.detail or "")
    assert again.state is RunState.RUNNING
    assert [step for step, _ in gcp.calls] == ["sts", "iam", "gke"] * 2


async def test_launch__internal_ip_uses_the_private_endpoint(
    gcp: GcpStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    """``internal_ip``: the private endpoint; the public one (nothing listens there) is not called."""
    gcp.add_cluster(
        PROJECT,
        LOCATION,
        "private",
        endpoint=f"127.0.0.1:{closed_port()}",
        private_endpoint=api.url.removeprefix("https://"),
        ca_data=api.ca_data,
        readers={SERVICE_ACCOUNT},
    )
    config = configuration(name="private", internal_ip=True)

    await launcher(gcp, issuer, config).launch(cloud_spec(out_dir, config))

    assert len(api.objects("jobs", NAMESPACE)) == 1


# --- failures -----------------------------------------------------------------------------------------


async def test_launch__sts_refuses_a_token_of_another_audience(
    issuer: TestIssuer, ca: CertificateAuthority, tmp_path: Path, out_dir: Path
) -> None:
    """The provider allows another audience than the runner's: STS refuses, the message says so."""
    gcp = GcpStandIn(issuer, allowed_audiences=["https://some-other-audience.example"])
    gcp.allow_impersonation(SERVICE_ACCOUNT, issuer.subject)
    with gcp.serving(ca, tmp_path / "gcp"):
        error = await launch_error(launcher(gcp, issuer, configuration()), out_dir, configuration())

    assert error.message.startswith(f"Google STS refused the workload identity token (audience {AUDIENCE}): ")
    assert "invalid_grant" in error.message
    assert "does not match the expected audience" in error.message
    assert error.retryable is False
    assert gcp.calls == [("sts", 400)]
    assert leaked(error.message, secrets_of(gcp, issuer)) == []


async def test_launch__impersonation_refused(
    issuer: TestIssuer, ca: CertificateAuthority, tmp_path: Path, out_dir: Path
) -> None:
    """No workloadIdentityUser binding for the runner's principal: IAM answers 403."""
    gcp = GcpStandIn(issuer)
    with gcp.serving(ca, tmp_path / "gcp"):
        error = await launch_error(launcher(gcp, issuer, configuration()), out_dir, configuration())

    assert error.message.startswith(
        f"IAM refused to impersonate the service account {SERVICE_ACCOUNT}: 403 PERMISSION_DENIED: "
        "Permission 'iam.serviceAccounts.getAccessToken' denied"
    )
    assert "roles/iam.workloadIdentityUser" in error.message
    assert error.retryable is False
    assert gcp.calls == [("sts", 200), ("iam", 403)]
    assert leaked(error.message, secrets_of(gcp, issuer)) == []


async def test_launch__cluster_not_found(
    gcp: GcpStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    config = configuration(name="no-such-cluster")

    error = await launch_error(launcher(gcp, issuer, config), out_dir, config)

    path = f"projects/{PROJECT}/locations/{LOCATION}/clusters/no-such-cluster"
    assert error.message == f"GKE cluster {path} not found: 404 NOT_FOUND: Not found: {path}."
    assert error.retryable is False
    assert api.objects("jobs", NAMESPACE) == []
    assert leaked(error.message, secrets_of(gcp, issuer)) == []


async def test_launch__cluster_not_readable_by_the_service_account(
    gcp: GcpStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    gcp.clusters[f"projects/{PROJECT}/locations/{LOCATION}/clusters/{CLUSTER}"].readers.clear()

    error = await launch_error(launcher(gcp, issuer, configuration()), out_dir, configuration())

    assert "the GKE API refused to read cluster" in error.message
    assert '403 PERMISSION_DENIED: Required "container.clusters.get" permission(s)' in error.message
    assert error.retryable is False
    assert leaked(error.message, secrets_of(gcp, issuer)) == []


async def test_launch__unreachable_api_server(
    gcp: GcpStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    """The GKE API names an endpoint nothing listens on: retryable, naming the endpoint."""
    port = closed_port()
    gcp.add_cluster(
        PROJECT,
        LOCATION,
        "gone",
        endpoint=f"127.0.0.1:{port}",
        ca_data=api.ca_data,
        readers={SERVICE_ACCOUNT},
    )
    config = configuration(name="gone")

    error = await launch_error(launcher(gcp, issuer, config), out_dir, config)

    assert f"the Kubernetes API at https://127.0.0.1:{port} is unreachable" in error.message
    assert error.retryable is True
    assert leaked(error.message, secrets_of(gcp, issuer)) == []


async def test_launch__forbidden_namespace(
    gcp: GcpStandIn, issuer: TestIssuer, tmp_path: Path, out_dir: Path
) -> None:
    """RBAC denies creating Jobs in the runner's namespace: the cluster's 403 message, not retryable."""
    with kube_api(
        tmp_path, auth="token", token_review=gcp.token_review, forbidden={("create", "jobs")}
    ) as api:
        gcp.add_cluster(
            PROJECT, LOCATION, CLUSTER, endpoint=api.url[8:], ca_data=api.ca_data, readers={SERVICE_ACCOUNT}
        )
        error = await launch_error(launcher(gcp, issuer, configuration()), out_dir, configuration())

    assert error.message.startswith(f"the Kubernetes API refused to create Job {NAMESPACE}/")
    assert (
        f'cannot create resource "jobs" in API group "batch" in the namespace "{NAMESPACE}"' in error.message
    )
    assert error.retryable is False
    assert leaked(error.message, secrets_of(gcp, issuer)) == []


async def test_launch__unreachable_sts(issuer: TestIssuer, out_dir: Path) -> None:
    """Nothing listens where STS should be: retryable, naming Google's token services."""
    gcp = GcpStandIn(issuer)
    gcp.url = f"https://127.0.0.1:{closed_port()}"

    error = await launch_error(launcher(gcp, issuer, configuration()), out_dir, configuration())

    assert error.message.startswith("cannot reach Google's token services: ")
    assert error.retryable is True
    assert leaked(error.message, [token for _, token in issuer.minted]) == []


def test_gke_launcher__none_for_another_configuration(issuer: TestIssuer) -> None:
    assert gke_launcher({"type": "kubernetes-gke", "cluster": {}}, issuer, egress=None) is None
