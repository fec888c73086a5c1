"""The ``kubernetes-aks`` launcher (launchers/aks.py) with azure-identity's real ``ClientAssertionCredential``
against the Azure stand-in (tests/support/azure_standin.py: Azure AD's token endpoint and ARM's managed
clusters, over TLS) and the stand-in Kubernetes API (tests/support/kube_api.py), which accepts only the
tokens the Azure stand-in issued for the AKS AAD server application. The orchestrator's OIDC tokens come
from ``TestIssuer``; the Azure AD stand-in checks them as a federated credential does. Every failure must
name its cause and hold no token or assertion."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.launchers.aks import TOKEN_EXCHANGE_AUDIENCE, aks_launcher
from orchestrator.launchers.base import LaunchError, RunState, launched
from orchestrator.launchers.cloud_endpoints import AKS_AAD_SERVER_APPLICATION
from orchestrator.launchers.kubernetes_cloud import AccessCache, CloudKubernetesLauncher
from tests.support.azure_standin import CLIENT, SUBSCRIPTION, TENANT, AzureStandIn
from tests.support.cloud_launchers import (
    STAND_IN_EGRESS,
    closed_port,
    cloud_spec,
    eventually,
    holds,
    leaked,
    rendered_job,
)
from tests.support.https_standin import trust
from tests.support.kube_api import CertificateAuthority, KubeApiServer
from tests.support.kube_launcher import IMAGE, NAMESPACE, kube_api, release
from tests.support.workload_identity import TestIssuer

GROUP, CLUSTER = "platform", "my-aks"


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
def azure(issuer: TestIssuer, ca: CertificateAuthority, tmp_path: Path) -> Iterator[AzureStandIn]:
    standin = AzureStandIn(issuer)
    standin.add_app(TENANT, CLIENT, federated={(issuer.issuer, issuer.subject)})
    with standin.serving(ca, tmp_path / "azure"):
        yield standin


@pytest.fixture
def api(tmp_path: Path, azure: AzureStandIn) -> Iterator[KubeApiServer]:
    with kube_api(tmp_path, auth="token", token_review=azure.token_review) as server:
        azure.add_cluster(
            SUBSCRIPTION, GROUP, CLUSTER, fqdn=server.url[8:], ca_data=server.ca_data, readers={CLIENT}
        )
        yield server


def configuration(*, auth: dict[str, str] | None = None, **cluster: Any) -> dict[str, Any]:
    return {
        "type": "kubernetes-aks",
        "cluster": {"name": CLUSTER, "resource_group": GROUP, "subscription_id": SUBSCRIPTION, **cluster},
        "auth": auth or {"tenant_id": TENANT, "client_id": CLIENT},
    }


def launcher(
    azure: AzureStandIn, issuer: TestIssuer, config: dict[str, Any], **options: Any
) -> CloudKubernetesLauncher:
    # The Job itself is rendered from the spec's configuration (cloud_spec), which holds the whole job.
    config = {"job": {"namespace": NAMESPACE, "service_account": "runner"}, **config}
    made = aks_launcher(
        config, issuer, egress=STAND_IN_EGRESS, endpoints=azure.endpoints(), image=IMAGE, **options
    )
    assert made is not None
    return made


def secrets_of(azure: AzureStandIn, issuer: TestIssuer) -> list[str]:
    return [token for _, token in issuer.minted] + list(azure.tokens)


async def launch_error(
    launcher: CloudKubernetesLauncher, out_dir: Path, config: dict[str, Any]
) -> LaunchError:
    with pytest.raises(LaunchError) as caught:
        await launcher.launch(cloud_spec(out_dir, config))
    return caught.value


# --- launch, status, cancel ---------------------------------------------------------------------------


async def test_launch__through_resource_manager(
    azure: AzureStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    """Without cluster_data: a token for AKS, one for ARM, the managed cluster and its user credentials;
    the Job holds what the kubernetes launcher renders, and the cluster authenticated the AKS token."""
    spec = cloud_spec(out_dir, configuration())

    handle = launched(await launcher(azure, issuer, configuration()).launch(spec)).handle

    assert handle == f"k8s:{NAMESPACE}:{spec.deployment_id}"
    assert azure.calls == [("aad", 200), ("aad", 200), ("arm-cluster", 200), ("arm-credentials", 200)]
    (minted,) = issuer.minted
    assert minted[0] == TOKEN_EXCHANGE_AUDIENCE
    assert azure.presented[:2] == [minted[1], minted[1]]  # the client assertion of both token requests
    (job,) = api.objects("jobs", NAMESPACE)
    assert holds(job, rendered_job(spec)) == []
    # The dry-run create of the token Secret (may the Role create Secrets?), the Job, its token Secret,
    # each valid by Kubernetes' strict schemas.
    assert [c.status for c in api.calls if c.method == "POST"] == [201, 201, 201]
    assert [(s.kind, s.dry_run) for s in api.sent] == [("Secret", True), ("Job", False), ("Secret", False)]
    api.assert_sent_valid()
    resources = sorted(grant.resource for grant in azure.tokens.values())
    assert resources == sorted([AKS_AAD_SERVER_APPLICATION, azure.url])


async def test_launch__with_cluster_data_asks_no_resource_manager(
    azure: AzureStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    config = configuration(cluster_data={"server": api.url, "certificate_authority_data": api.ca_data})

    await launcher(azure, issuer, config).launch(cloud_spec(out_dir, config))

    assert azure.calls == [("aad", 200)]
    assert len(api.objects("jobs", NAMESPACE)) == 1


async def test_status_and_cancel__reuse_the_cached_access(
    azure: AzureStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    """A launcher per call sharing one cache, as in the server: one exchange for launch, checks, cancel."""
    cache = AccessCache()
    config = configuration()

    def fresh() -> CloudKubernetesLauncher:
        return launcher(azure, issuer, config, cache=cache, cache_key="acme/k8s")

    handle = launched(await fresh().launch(cloud_spec(out_dir, config))).handle
    running = await fresh().status(handle)
    release(out_dir, 0)
    exited = await eventually(lambda: fresh().status(handle), lambda s: s.state is RunState.EXITED)
    await fresh().cancel(handle, grace_seconds=1)

    assert running.state is RunState.RUNNING
    assert (exited.state, exited.exit_code) == (RunState.EXITED, 0)
    assert api.objects("jobs", NAMESPACE) == []
    assert [step for step, _ in azure.calls] == ["aad", "aad", "arm-cluster", "arm-credentials"]


# --- failures -----------------------------------------------------------------------------------------


async def test_launch__no_federated_credential_for_the_subject(
    issuer: TestIssuer, ca: CertificateAuthority, tmp_path: Path, out_dir: Path
) -> None:
    """The app trusts another runner's subject: Azure AD refuses the assertion, the message says why."""
    azure = AzureStandIn(issuer)
    azure.add_app(TENANT, CLIENT, federated={(issuer.issuer, "acme+other-runner")})
    with azure.serving(ca, tmp_path / "azure"):
        error = await launch_error(launcher(azure, issuer, configuration()), out_dir, configuration())

    assert error.message.startswith(
        f"Azure AD refused the workload identity token as the client assertion of app {CLIENT} in tenant "
        f"{TENANT} (for {AKS_AAD_SERVER_APPLICATION}/.default): "
    )
    assert "AADSTS700213: No matching federated identity record found" in error.message
    assert "'acme+k8s'" in error.message
    assert error.retryable is False
    assert azure.calls == [("aad", 400)]
    assert leaked(error.message, secrets_of(azure, issuer)) == []


async def test_launch__unknown_app(
    azure: AzureStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    other = "99999999-8888-4777-8666-555555555555"
    config = configuration(auth={"tenant_id": TENANT, "client_id": other})

    error = await launch_error(launcher(azure, issuer, config), out_dir, config)

    assert f"AADSTS700016: Application with identifier '{other}' was not found" in error.message
    assert error.retryable is False
    assert leaked(error.message, secrets_of(azure, issuer)) == []


async def test_launch__cluster_not_found(
    azure: AzureStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    config = configuration(name="no-such-cluster")

    error = await launch_error(launcher(azure, issuer, config), out_dir, config)

    assert error.message.startswith(
        f"AKS cluster /subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/"
        "Microsoft.ContainerService/managedClusters/no-such-cluster not found: 404 ResourceNotFound: "
    )
    assert error.retryable is False
    assert api.objects("jobs", NAMESPACE) == []
    assert leaked(error.message, secrets_of(azure, issuer)) == []


async def test_launch__resource_manager_refuses(
    azure: AzureStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    azure.clusters[(SUBSCRIPTION, GROUP, CLUSTER)].readers.clear()

    error = await launch_error(launcher(azure, issuer, configuration()), out_dir, configuration())

    assert error.message.startswith("Azure Resource Manager refused to read AKS cluster ")
    assert "403 AuthorizationFailed: The client" in error.message
    assert "Azure Kubernetes Service Cluster User Role" in error.message
    assert error.retryable is False
    assert leaked(error.message, secrets_of(azure, issuer)) == []


async def test_launch__cluster_without_entra_id_integration(
    azure: AzureStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    azure.clusters[(SUBSCRIPTION, GROUP, CLUSTER)].aad = False

    error = await launch_error(launcher(azure, issuer, configuration()), out_dir, configuration())

    assert "has no Microsoft Entra ID integration (aadProfile)" in error.message
    assert error.retryable is False


async def test_launch__unreachable_api_server(
    azure: AzureStandIn, issuer: TestIssuer, api: KubeApiServer, out_dir: Path
) -> None:
    port = closed_port()
    config = configuration(
        cluster_data={"server": f"https://127.0.0.1:{port}", "certificate_authority_data": api.ca_data}
    )

    error = await launch_error(launcher(azure, issuer, config), out_dir, config)

    assert f"the Kubernetes API at https://127.0.0.1:{port} is unreachable" in error.message
    assert error.retryable is True
    assert leaked(error.message, secrets_of(azure, issuer)) == []


async def test_launch__forbidden_namespace(
    azure: AzureStandIn, issuer: TestIssuer, tmp_path: Path, out_dir: Path
) -> None:
    """RBAC denies creating Jobs in the runner's namespace: the cluster's 403 message, not retryable."""
    with kube_api(
        tmp_path, auth="token", token_review=azure.token_review, forbidden={("create", "jobs")}
    ) as api:
        azure.add_cluster(
            SUBSCRIPTION, GROUP, CLUSTER, fqdn=api.url[8:], ca_data=api.ca_data, readers={CLIENT}
        )
        error = await launch_error(launcher(azure, issuer, configuration()), out_dir, configuration())

    assert error.message.startswith(f"the Kubernetes API refused to create Job {NAMESPACE}/")
    assert f'cannot create resource "jobs" in API group "batch" in the namespace "{NAMESPACE}"' in (
        error.message
    )
    assert error.retryable is False
    assert leaked(error.message, secrets_of(azure, issuer)) == []


async def test_launch__unreachable_azure_ad(issuer: TestIssuer, out_dir: Path) -> None:
    azure = AzureStandIn(issuer)
    azure.url = f"https://127.0.0.1:{closed_port()}"

    error = await launch_error(launcher(azure, issuer, configuration()), out_dir, configuration())

    assert error.message.startswith(f"cannot reach Azure AD at {azure.url}: ")
    assert error.retryable is True
    assert leaked(error.message, [token for _, token in issuer.minted]) == []


def test_aks_launcher__none_for_another_configuration(issuer: TestIssuer) -> None:
    assert aks_launcher({"type": "kubernetes-aks", "cluster": {}}, issuer, egress=None) is None
