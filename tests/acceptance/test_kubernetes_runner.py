"""A deployment through a ``kubernetes`` runner, end to end: the real server launches the runner's Job on
the stand-in Kubernetes API (tests/support/kube_api.py, not Kubernetes), over TLS with the cluster CA and
a client certificate as in seed 001; the stand-in's kubelet runs the runner image as
``python -m orchestrator.cli.runner standard`` with the pod's environment, and the run reports back.

With ``kubernetes`` state storage, the runner's Terraform (the embedded engine, Terraform 1.15) keeps
the state in Secrets and locks it with a Lease through the stand-in's in-cluster endpoint, as the pod's
service account (granted upstream's Job Role only). Stand-in, said plainly: the kubelet cannot mount the
service account volume at ``/var/run/secrets/kubernetes.io/serviceaccount``, where client-go's
InClusterConfig reads it, so it writes the same token and CA to the pod's own directory with a kubeconfig
equal to what InClusterConfig builds (``KUBE_CONFIG_PATH``), and the runner's environment tells the
backend ``-backend-config=in_cluster_config=false`` to read that instead (``TF_CLI_ARGS_init``, as the
s3 tests pass their emulator settings). The compiled backend block stays upstream's
(``in_cluster_config = true``; tests/unit/test_compiler.py).
"""

from __future__ import annotations

import base64
import gzip
import json
import ssl
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import deployment_tokens
from orchestrator.launchers.kubernetes_job import DEFAULT_RUNNER_IMAGE
from orchestrator.secretbox import load_or_create_key
from orchestrator.settings import ServerSettings
from tests.support.kube_api import KubeApiServer, denied_except, runner_image
from tests.support.stack import Stack, build_stack

pytestmark = pytest.mark.slow

NAMESPACE = "platform-orchestrator-runner"
SERVICE_ACCOUNT = "platform-orchestrator-runner"
#: Seed 001's Role for the orchestrator: ``batch/jobs`` create and get, nothing else.
SEED_001_ROLE = denied_except(("create", "jobs"), ("get", "jobs"))
#: Upstream's Role for the Job's service account, for kubernetes state (upstream-notes §5, RBAC).
JOB_STATE_ROLE = {
    *(("create", "secrets"), ("get", "secrets"), ("list", "secrets"), ("update", "secrets")),
    *(("create", "leases"), ("get", "leases"), ("update", "leases")),
}
LOCK_ERROR = "Error acquiring the state lock"


@pytest.fixture
def settings(settings: ServerSettings) -> ServerSettings:
    """The stand-in API listens on 127.0.0.1, which the server refuses by default: allowed here."""
    return settings.model_copy(update={"runner_denied_networks": ""})


def kubernetes_runner(
    api: KubeApiServer, tf_config: Path, state: dict[str, Any] | None = None, **environment: str
) -> dict[str, Any]:
    engine_env = {
        "IAC_BACKEND": "embedded",
        "TF_CLI_CONFIG_FILE": str(tf_config),
        "CHECKPOINT_DISABLE": "1",
        **environment,
    }
    return {
        "runner_configuration": {
            "type": "kubernetes",
            "cluster": {
                "cluster_data": {"server": api.url, "certificate_authority_data": api.ca_data},
                "auth": {
                    "client_certificate_data": api.client_certificate_data,
                    "client_key_data": api.client_key_data,
                },
            },
            "job": {
                "namespace": NAMESPACE,
                "service_account": SERVICE_ACCOUNT,
                "pod_template": {
                    "spec": {
                        "containers": [
                            {"name": "main", "env": [{"name": k, "value": v} for k, v in engine_env.items()]}
                        ]
                    }
                },
            },
        },
        "state_storage_configuration": state or {"type": "orchestrator"},
    }


def test_deploy__through_a_kubernetes_runner(server_url: str, tmp_path: Path) -> None:
    """The deployment succeeds; one Job named after it ran to completion with the token from its Secret."""
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    images = {DEFAULT_RUNNER_IMAGE: runner_image()}
    with KubeApiServer(tmp_path / "kube", namespaces=("default", NAMESPACE), images=images) as api:
        stack = build_stack(server_url, tmp_path, runner=kubernetes_runner(api, tf_config))

        deployment = stack.deploy()

        outputs = stack.outputs(deployment) if deployment["status"] == "succeeded" else {}
        # The runner reports before its process ends: the Job completes a moment later.
        api.wait_for(lambda: bool(api.objects("jobs", NAMESPACE)[0]["status"].get("conditions")))
        jobs = api.objects("jobs", NAMESPACE)
        pods = api.objects("pods", NAMESPACE)
        secrets = api.objects("secrets", NAMESPACE)
        stack.client.close()

    assert deployment["status"] == "succeeded", deployment["status_message"]
    assert outputs["shop"]["bucket"] == "bucket-shop"
    assert [job["metadata"]["name"] for job in jobs] == [deployment["id"]]
    assert {c["type"] for c in jobs[0]["status"]["conditions"]} == {"SuccessCriteriaMet", "Complete"}
    (pod,) = pods
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    (secret,) = secrets
    assert base64.b64decode(secret["data"]["TOKEN"])
    assert secret["metadata"]["ownerReferences"][0]["uid"] == jobs[0]["metadata"]["uid"]


def deployment_token(settings: ServerSettings, deployment_id: str) -> str:
    key = deployment_tokens.token_key(load_or_create_key(settings.data_dir))
    return deployment_tokens.deployment_token(key, "acme", deployment_id)


def test_deploy__seed_001_role_is_enough(server_url: str, settings: ServerSettings, tmp_path: Path) -> None:
    """Exactly seed 001's Role (jobs create, get): the deployment succeeds, TOKEN is a plain value in the
    Job's spec (upstream's way), and the status message says so and what to allow to keep it in a
    Secret; the token itself is in no status message or API answer."""
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    images = {DEFAULT_RUNNER_IMAGE: runner_image()}
    with KubeApiServer(
        tmp_path / "kube", namespaces=("default", NAMESPACE), images=images, forbidden=SEED_001_ROLE
    ) as api:
        stack = build_stack(server_url, tmp_path, runner=kubernetes_runner(api, tf_config))

        deployment = stack.deploy()

        jobs = api.objects("jobs", NAMESPACE)
        secrets = api.objects("secrets", NAMESPACE)
        answer = stack.client.get(f"/orgs/acme/deployments/{deployment['id']}")
        listed = stack.client.get("/orgs/acme/deployments")
        stack.client.close()

    message = deployment["status_message"]
    assert deployment["status"] == "succeeded", message
    assert message.startswith(
        "deployment succeeded (note: the runner's TOKEN is a plain value in the Job's spec"
    )
    assert f"may not create Secrets in namespace {NAMESPACE} (403 Forbidden:" in message
    assert f"allow the orchestrator create, get and update on secrets in namespace {NAMESPACE}" in message
    assert secrets == []
    (job,) = jobs
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    token = deployment_token(settings, deployment["id"])
    assert env["TOKEN"] == {"name": "TOKEN", "value": token}
    for text in (message, answer.text, listed.text):
        assert token not in text


def _state_stack(server_url: str, tmp_path: Path, api: KubeApiServer) -> Stack:
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    runner = kubernetes_runner(
        api,
        tf_config,
        {"type": "kubernetes", "namespace": NAMESPACE},
        TF_CLI_ARGS_init="-backend-config=in_cluster_config=false",
    )
    return build_stack(server_url, tmp_path, runner=runner)


def _state_api(tmp_path: Path) -> KubeApiServer:
    image = runner_image(in_cluster_kubeconfig_env="KUBE_CONFIG_PATH")
    return KubeApiServer(
        tmp_path / "kube",
        namespaces=("default", NAMESPACE),
        images={DEFAULT_RUNNER_IMAGE: image},
        service_accounts={f"{NAMESPACE}/{SERVICE_ACCOUNT}": JOB_STATE_ROLE},
    )


def env_uuid(stack: Stack) -> str:
    env = stack.client.get(f"/orgs/{stack.org}/projects/shop/envs/dev")
    assert 200 == env.status_code, env.text
    return str(env.json()["uuid"])


def state_of(secret: dict[str, Any]) -> dict[str, Any]:
    """The state in a Terraform kubernetes backend Secret: gzip, base64 in ``data.tfstate``."""
    state: dict[str, Any] = json.loads(gzip.decompress(base64.b64decode(secret["data"]["tfstate"])))
    return state


def assert_demo_state(state: dict[str, Any]) -> None:
    names = {r["name"] for r in state["resources"] if r["type"] == "terraform_data"}
    assert {"bucket", "app"} == names, state["resources"]
    assert state["serial"] >= 1


def test_kubernetes_state__in_a_secret_locked_with_a_lease(server_url: str, tmp_path: Path) -> None:
    """State storage ``kubernetes``: the deployment succeeds and its state is the Secret
    ``tfstate-default-<env uuid>`` (gzipped, labelled), written by the Job's service account through the
    in-cluster endpoint; the lock was the Lease ``lock-tfstate-default-<env uuid>``, created in
    protobuf as client-go sends it, and is free again."""
    with _state_api(tmp_path) as api:
        stack = _state_stack(server_url, tmp_path, api)
        env = env_uuid(stack)

        deployment = stack.deploy()

        secrets = {s["metadata"]["name"]: s for s in api.objects("secrets", NAMESPACE)}
        leases = {lease["metadata"]["name"]: lease for lease in api.objects("leases", NAMESPACE)}
        calls = list(api.calls)
        stack.client.close()

    assert deployment["status"] == "succeeded", deployment["status_message"]
    secret = secrets[f"tfstate-default-{env}"]
    assert secret["metadata"]["labels"] == {
        "tfstate": "true",
        "tfstateSecretSuffix": env,
        "tfstateWorkspace": "default",
        "app.kubernetes.io/managed-by": "terraform",
    }
    assert secret["metadata"]["annotations"] == {"encoding": "gzip"}
    assert_demo_state(state_of(secret))
    lease = leases[f"lock-tfstate-default-{env}"]
    assert "holderIdentity" not in lease["spec"]  # unlocked
    account = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
    state_calls = [c for c in calls if c.user == account]
    assert any("/secrets" in c.path for c in state_calls) and any("/leases" in c.path for c in state_calls)
    assert all(c.status < 400 or c.status == 404 for c in state_calls), state_calls
    lease_writes = [c for c in state_calls if "/leases" in c.path and c.method in ("POST", "PUT")]
    assert lease_writes and {c.content_type for c in lease_writes} == {"application/vnd.kubernetes.protobuf"}


def test_kubernetes_state__a_held_lease_refuses_the_deployment(server_url: str, tmp_path: Path) -> None:
    """Another client holds the Lease (as Terraform takes it: holderIdentity and the lock info): the
    deployment fails with the engine's lock error naming the holder, and the state Secret is untouched;
    released, the next deployment succeeds."""
    with _state_api(tmp_path) as api:
        stack = _state_stack(server_url, tmp_path, api)
        env = env_uuid(stack)
        first = stack.deploy()
        assert first["status"] == "succeeded", first["status_message"]
        name = f"lock-tfstate-default-{env}"
        (before,) = [
            s for s in api.objects("secrets", NAMESPACE) if s["metadata"]["name"].startswith("tfstate-")
        ]
        lock_id = str(uuid.uuid4())
        info = {
            "ID": lock_id,
            "Operation": "OperationTypeApply",
            "Info": "held by test_kubernetes_runner",
            "Who": "tester@acceptance",
            "Version": "1.15.5",
            "Created": "2026-01-01T00:00:00Z",
            "Path": "",
        }
        with _admin(api) as client:
            url = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{name}"
            lease = client.get(url).json()
            lease["spec"]["holderIdentity"] = lock_id
            lease["metadata"].setdefault("annotations", {})["app.terraform.io/lock-info"] = json.dumps(info)
            held = client.put(url, json=lease)
            assert 200 == held.status_code, held.text

            refused = stack.deploy()
            (after,) = [
                s for s in api.objects("secrets", NAMESPACE) if s["metadata"]["name"].startswith("tfstate-")
            ]

            released = client.get(url).json()
            del released["spec"]["holderIdentity"]
            del released["metadata"]["annotations"]["app.terraform.io/lock-info"]
            assert 200 == client.put(url, json=released).status_code
        again = stack.deploy()
        stack.client.close()

    assert refused["status"] == "failed", refused["status_message"]
    assert LOCK_ERROR in refused["status_message"]
    assert lock_id in refused["status_message"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["data"] == before["data"]
    assert again["status"] == "succeeded", again["status_message"]


def _admin(api: KubeApiServer) -> httpx.Client:
    """A client of the stand-in with the cluster's admin certificate (the test's own look)."""
    directory = api.work_dir / f"admin-{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    (directory / "tls.crt").write_bytes(api.client.cert_pem)
    (directory / "tls.key").write_bytes(api.client.key_pem)
    context = ssl.create_default_context(cadata=api.ca.pem.decode())
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    return httpx.Client(base_url=api.url, verify=context, timeout=30)
