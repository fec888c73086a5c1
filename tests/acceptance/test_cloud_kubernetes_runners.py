"""Deployments through ``kubernetes-gke`` and ``kubernetes-aks`` runners, end to end: the real server mints
the runner's OIDC tokens with its own issuer; the cloud stand-ins (tests/support/gcp_standin.py,
azure_standin.py; over TLS) check them against the server's published discovery document and JWKS, as
Google STS and Azure AD do (``RelyingParty``), and issue the tokens the stand-in Kubernetes API
(tests/support/kube_api.py, not Kubernetes) accepts; its kubelet runs the runner image as
``python -m orchestrator.cli.runner standard``, which reports back through the gateway.

Each test first deploys with the cloud side not yet set up (no impersonation binding, no federated
credential): the deployment fails with the cloud's refusal and no token anywhere in the answers or the
server's logs; once set up, the next deployment succeeds (a refusal is not cached).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jwt
import pytest
from structlog.testing import capture_logs

from orchestrator.launchers.kubernetes_job import DEFAULT_RUNNER_IMAGE
from orchestrator.settings import ServerSettings
from tests.support.azure_standin import CLIENT, SUBSCRIPTION, TENANT, AzureStandIn
from tests.support.gcp_standin import AUDIENCE, SERVICE_ACCOUNT, GcpStandIn
from tests.support.https_standin import trust
from tests.support.kube_api import CertificateAuthority, KubeApiServer, runner_image
from tests.support.oidc_relying_party import RelyingParty
from tests.support.stack import Stack, build_stack, running_server

pytestmark = pytest.mark.slow

NAMESPACE = "platform-orchestrator-runner"
#: build_stack's organization and runner.
SUBJECT = "acme+local"


@pytest.fixture
def ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CertificateAuthority:
    authority = CertificateAuthority("cloud-stand-ins")
    trust(authority, tmp_path / "cloud-ca.pem", monkeypatch)
    return authority


@contextmanager
def serve(settings: ServerSettings, party: RelyingParty, **overrides: Any) -> Iterator[str]:
    """The server with the stand-ins' endpoints; the relying party trusts its issuer."""

    def make(port: int) -> ServerSettings:
        return settings.model_copy(
            update={
                "listen": f"127.0.0.1:{port}",
                "public_url": f"http://127.0.0.1:{port}",
                "status_check_interval_seconds": 0.5,
                # The stand-in cluster listens on 127.0.0.1, which the server refuses by default.
                "runner_denied_networks": "",
                **overrides,
            }
        )

    with running_server(make) as url:
        party.issuer = url
        yield url


def job(tf_config: Path) -> dict[str, Any]:
    engine_env = {"IAC_BACKEND": "embedded", "TF_CLI_CONFIG_FILE": str(tf_config), "CHECKPOINT_DISABLE": "1"}
    return {
        "namespace": NAMESPACE,
        "service_account": "platform-orchestrator-runner",
        "pod_template": {
            "spec": {
                "containers": [
                    {"name": "main", "env": [{"name": k, "value": v} for k, v in engine_env.items()]}
                ]
            }
        },
    }


def cluster(tmp_path: Path, token_review: Any) -> KubeApiServer:
    return KubeApiServer(
        tmp_path / "kube",
        auth="token",
        token_review=token_review,
        namespaces=("default", NAMESPACE),
        images={DEFAULT_RUNNER_IMAGE: runner_image()},
    )


def deploy_and_look(stack: Stack) -> tuple[dict[str, Any], str]:
    """A deployment, and everything a user or an operator sees of it: its answers, the runner's, the
    server's log lines."""
    with capture_logs() as logs:
        deployment = stack.deploy()
    seen = [
        str(deployment),
        stack.client.get(f"/orgs/{stack.org}/deployments/{deployment['id']}").text,
        stack.client.get(f"/orgs/{stack.org}/runners/local").text,
        str(logs),
    ]
    return deployment, "\n".join(seen)


def leaked(text: str, secrets: list[str]) -> list[str]:
    return [secret[:16] for secret in secrets if secret and secret[:16] in text]


def test_deploy__through_a_kubernetes_gke_runner(
    settings: ServerSettings, ca: CertificateAuthority, tmp_path: Path
) -> None:
    party = RelyingParty()
    gcp = GcpStandIn(party)
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    with gcp.serving(ca, tmp_path / "gcp"), cluster(tmp_path, gcp.token_review) as api:
        gcp.add_cluster(
            "my-gcp-project",
            "europe-west3",
            "my-cluster",
            endpoint=api.url[8:],
            ca_data=api.ca_data,
            readers={SERVICE_ACCOUNT},
        )
        google = {
            "gcp_sts_url": f"{gcp.url}/v1/token",
            "gcp_iam_credentials_url": gcp.url,
            "gcp_container_api_url": gcp.url,
        }
        runner = {
            "runner_configuration": {
                "type": "kubernetes-gke",
                "cluster": {
                    "name": "my-cluster",
                    "project_id": "my-gcp-project",
                    "location": "europe-west3",
                    "auth": {"gcp_audience": AUDIENCE, "gcp_service_account": SERVICE_ACCOUNT},
                },
                "job": job(tf_config),
            },
            "state_storage_configuration": {"type": "orchestrator"},
        }
        with serve(settings, party, **google) as url:
            stack = build_stack(url, tmp_path, runner=runner)
            refused, refused_seen = deploy_and_look(stack)
            gcp.allow_impersonation(SERVICE_ACCOUNT, SUBJECT)
            deployment, seen = deploy_and_look(stack)
            outputs = stack.outputs(deployment) if deployment["status"] == "succeeded" else {}
            api.wait_for(lambda: bool(api.objects("jobs", NAMESPACE)[0]["status"].get("conditions")))
            jobs = api.objects("jobs", NAMESPACE)
            stack.client.close()

    assert refused["status"] == "failed"
    assert refused["status_message"].startswith(
        "the runner could not be launched: IAM refused to impersonate the service account "
        f"{SERVICE_ACCOUNT}: 403 PERMISSION_DENIED"
    )
    assert deployment["status"] == "succeeded", deployment["status_message"]
    assert outputs["shop"]["bucket"] == "bucket-shop"
    assert [j["metadata"]["name"] for j in jobs] == [deployment["id"]]
    subject_token = gcp.presented[0]
    claims = jwt.decode(subject_token, options={"verify_signature": False})
    assert (claims["iss"], claims["sub"], claims["aud"]) == (url, SUBJECT, AUDIENCE)
    assert [step for step, status in gcp.calls if status == 200] == ["sts", "sts", "iam", "gke"]
    secrets = gcp.presented + list(gcp.federated) + list(gcp.access_tokens)
    assert leaked(refused_seen + seen, secrets) == []


def test_deploy__through_a_kubernetes_aks_runner(
    settings: ServerSettings, ca: CertificateAuthority, tmp_path: Path
) -> None:
    party = RelyingParty()
    azure = AzureStandIn(party)
    azure.add_app(TENANT, CLIENT, federated=set())
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    with azure.serving(ca, tmp_path / "azure"), cluster(tmp_path, azure.token_review) as api:
        azure.add_cluster(
            SUBSCRIPTION, "platform", "my-aks", fqdn=api.url[8:], ca_data=api.ca_data, readers={CLIENT}
        )
        runner = {
            "runner_configuration": {
                "type": "kubernetes-aks",
                "cluster": {"name": "my-aks", "resource_group": "platform", "subscription_id": SUBSCRIPTION},
                "auth": {"tenant_id": TENANT, "client_id": CLIENT},
                "job": job(tf_config),
            },
            "state_storage_configuration": {"type": "orchestrator"},
        }
        azure_endpoints = {"azure_authority_host": azure.url, "azure_resource_manager_url": azure.url}
        with serve(settings, party, **azure_endpoints) as url:
            stack = build_stack(url, tmp_path, runner=runner)
            refused, refused_seen = deploy_and_look(stack)
            azure.add_app(TENANT, CLIENT, federated={(url, SUBJECT)})
            deployment, seen = deploy_and_look(stack)
            outputs = stack.outputs(deployment) if deployment["status"] == "succeeded" else {}
            api.wait_for(lambda: bool(api.objects("jobs", NAMESPACE)[0]["status"].get("conditions")))
            jobs = api.objects("jobs", NAMESPACE)
            stack.client.close()

    assert refused["status"] == "failed"
    assert refused["status_message"].startswith(
        f"the runner could not be launched: Azure AD refused the workload identity token as the client "
        f"assertion of app {CLIENT} in tenant {TENANT}"
    )
    no_match = "AADSTS700213: No matching federated identity record found for presented assertion subject"
    no_match += f" '{SUBJECT}'"
    assert no_match in refused["status_message"]
    assert deployment["status"] == "succeeded", deployment["status_message"]
    assert outputs["shop"]["bucket"] == "bucket-shop"
    assert [j["metadata"]["name"] for j in jobs] == [deployment["id"]]
    claims = jwt.decode(azure.presented[0], options={"verify_signature": False})
    assert (claims["iss"], claims["sub"], claims["aud"]) == (url, SUBJECT, "api://AzureADTokenExchange")
    assert [step for step, status in azure.calls if status == 200] == [
        "aad",
        "aad",
        "arm-cluster",
        "arm-credentials",
    ]
    secrets = azure.presented + list(azure.tokens)
    assert leaked(refused_seen + seen, secrets) == []
