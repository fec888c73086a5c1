"""Deployment bundles are sealed in the object store: the module providers' literal credentials they carry
(``po-provider-secrets.auto.tfvars.json``) are at rest only as ciphertext, as in the database; the runner
still gets the plain tar.gz through the gateway; bundles stored before sealing are still served."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI

from orchestrator import deployment_tokens
from orchestrator.protocol import results as protocol
from orchestrator.secretbox import SEALED_OBJECT_MAGIC
from orchestrator.store import deployments as deployment_store
from tests.support.deployments import insert_deployment
from tests.support.orgs import Org

CANARY = "canary-secret-value-7f3e"
DATA = Path(__file__).parent.parent / "data"


async def _ok(response: httpx.Response, status: int = 201) -> Any:
    assert status == response.status_code, response.text
    return response.json() if response.content else None


async def _catalogue_and_env(org: Org) -> dict[str, Any]:
    """A provider with literal credentials, a module mapping it, a rule, env shop/dev on a local runner."""
    base = f"/orgs/{org.id}"
    provider = {
        "provider_type": "aws",
        "id": "main",
        "source": "hashicorp/aws",
        "version_constraint": "~> 5.0",
        "configuration": {"region": "eu-west-1", "access_key": "AKIA-CANARY", "secret_key": CANARY},
    }
    await _ok(await org.admin.post(f"{base}/module-providers", json=provider))
    await _ok(
        await org.admin.post(
            f"{base}/resource-types", json={"id": "postgres", "output_schema": {"type": "object"}}
        )
    )
    module = {
        "id": "pg",
        "resource_type": "postgres",
        "module_source": "inline",
        "module_source_code": 'output "host" { value = "db" }',
        "provider_mapping": {"aws": "aws.main"},
    }
    await _ok(await org.admin.post(f"{base}/modules", json=module))
    await _ok(await org.admin.post(f"{base}/module-rules", json={"module_id": "pg"}))
    await _ok(await org.admin.post(f"{base}/env-types", json={"id": "development"}))
    await _ok(await org.admin.post(f"{base}/projects", json={"id": "shop"}))
    env = await _ok(
        await org.admin.post(f"{base}/projects/shop/envs", json={"id": "dev", "env_type_id": "development"})
    )
    runner = yaml.safe_load((DATA / "runners" / "vm-local.yaml").read_text())
    await _ok(await org.platform.post(f"{base}/runners", json={"id": "local", **runner}))
    await _ok(await org.admin.post(f"{base}/runner-rules", json={"runner_id": "local"}))
    return dict(env)


def _gateway(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test")


async def _bundle(app: FastAPI, org_id: str, runner_id: str, deployment_id: str) -> httpx.Response:
    token = deployment_tokens.deployment_token(app.state.services.token_key, org_id, deployment_id)
    async with _gateway(app) as client:
        return await client.get(
            protocol.bundle_path(org_id, runner_id, deployment_id),
            headers={protocol.DEPLOYMENT_TOKEN_HEADER: token},
        )


def _members(tar_gz: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(tar_gz), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


async def _deploy(org: Org) -> dict[str, Any]:
    body = {
        "project_id": "shop",
        "env_id": "dev",
        "mode": "deploy",
        "manifest": {"workloads": {"api": {"resources": {"db": {"type": "postgres"}}}}},
    }
    return dict(await _ok(await org.clients["deployer"].post(f"/orgs/{org.id}/deployments", json=body)))


@pytest.fixture
def settings(settings: Any) -> Any:
    return settings.model_copy(update={"allow_local_runners": True})


async def test_bundle__sealed_at_rest_and_plain_for_the_runner(app: FastAPI, org: Org) -> None:
    """The object holds no credential and is not a tar.gz; the gateway answers the tar.gz, whose variables
    file has the credential the runner needs."""
    await _catalogue_and_env(org)
    deployment = await _deploy(org)
    async with app.state.services.engine.connect() as conn:
        row = await deployment_store.get(conn, org.id, uuid.UUID(deployment["id"]))
    assert row is not None
    stored = await app.state.services.blobs.get(row.bundle_key)
    answered = await _bundle(app, org.id, "local", deployment["id"])

    assert stored is not None
    assert stored.startswith(SEALED_OBJECT_MAGIC)
    assert CANARY.encode() not in stored and b"AKIA-CANARY" not in stored
    assert row.bundle_key.endswith(".tar.gz.sealed")
    assert 200 == answered.status_code, answered.text
    files = _members(answered.content)
    secrets_file = json.loads(files["po-provider-secrets.auto.tfvars.json"])
    assert CANARY in json.dumps(secrets_file)
    assert b"main.tf" in b" ".join(name.encode() for name in files)


async def test_bundle__copied_under_another_deployment_does_not_open(app: FastAPI, org: Org) -> None:
    """The deployment is bound to its sealed bundle: an object copied over another deployment's key is
    refused (503, naming the bundle, not its content) rather than handed to that deployment's runner."""
    await _catalogue_and_env(org)
    first = await _deploy(org)
    env = await _ok(
        await org.admin.post(
            f"/orgs/{org.id}/projects/shop/envs", json={"id": "qa", "env_type_id": "development"}
        )
    )
    async with app.state.services.engine.connect() as conn:
        row = await deployment_store.get(conn, org.id, uuid.UUID(first["id"]))
    assert row is not None
    sealed = await app.state.services.blobs.get(row.bundle_key)
    assert sealed is not None
    other = await insert_deployment(app, org.id, env, status="executing", runner_id="local")
    await app.state.services.blobs.put(f"bundles/{org.id}/{other}.tar.gz", sealed)

    answered = await _bundle(app, org.id, "local", other)

    assert 503 == answered.status_code, answered.text
    assert f"bundle:{org.id}/{other}" in answered.json()["message"]
    assert CANARY not in answered.text


async def test_bundle__stored_before_sealing_is_served_as_it_is(app: FastAPI, org: Org) -> None:
    """A plain bundle written by an earlier version (tests.support.deployments writes one) still reaches
    its runner."""
    env = await _catalogue_and_env(org)
    deployment_id = await insert_deployment(app, org.id, env, status="executing", runner_id="local")

    answered = await _bundle(app, org.id, "local", deployment_id)

    assert (200, b"bundle bytes") == (answered.status_code, answered.content)
