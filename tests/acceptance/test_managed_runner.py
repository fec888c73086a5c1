"""A managed runner end to end: a real ``orchestrator serve`` with MANAGED_RUNNER_SECRET, a small runner
(tests/support/managed.py) that registers, claims a deployment of the managed pool and runs the real
``po-runner standard`` with the claim's environment; the deployment succeeds and its outputs decrypt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.protocol import age
from tests.support.managed import MANAGED_SECRET, run_claimed
from tests.support.outages import ServerProcess
from tests.support.stack import Stack, build_stack, demo_manifest

pytestmark = pytest.mark.slow


@pytest.fixture
def managed_server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(database_url, tmp_path / "data", MANAGED_RUNNER_SECRET=MANAGED_SECRET)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def managed_stack(managed_server: ServerProcess, tmp_path: Path) -> Iterator[Stack]:
    """Organization acme (tests/support/stack.py) with environment shop/edge linked to the managed pool."""
    made = build_stack(managed_server.url, tmp_path)
    base = f"/orgs/{made.org}"
    for path, body in [
        ("/env-types", {"id": "edge"}),
        ("/projects/shop/envs", {"id": "edge", "env_type_id": "edge"}),
        ("/runner-rules", {"runner_id": "managed", "env_type_id": "edge", "required_tags": ["linux"]}),
    ]:
        response = made.client.post(base + path, json=body)
        assert 201 == response.status_code, (path, response.text)
    yield made
    made.client.close()


def test_managed_runner__runs_a_claimed_deployment_with_po_runner_standard(
    managed_server: ServerProcess, managed_stack: Stack, tmp_path: Path
) -> None:
    registered = httpx.post(
        f"{managed_server.url}/runner/register",
        json={"managedSecret": MANAGED_SECRET, "name": "managed-0", "tags": ["linux"]},
    )
    assert 201 == registered.status_code, registered.text
    identity, recipient = age.generate_identity()
    created = managed_stack.client.post(
        f"/orgs/{managed_stack.org}/deployments",
        json={
            "project_id": "shop",
            "env_id": "edge",
            "mode": "deploy",
            "manifest": demo_manifest(),
            "encrypted_outputs_recipient": recipient,
            "encrypted_logs_recipient": recipient,
        },
    )
    assert 201 == created.status_code, created.text

    run = run_claimed(
        managed_server.url,
        registered.json()["token"],
        tmp_path / "work",
        extra={"IAC_BACKEND": "embedded", "TF_CLI_CONFIG_FILE": str(managed_stack.tf_config)},
    )
    deployment = managed_stack.wait(created.json()["id"])

    assert 0 == run["exitCode"], run["stderr"]
    assert created.json()["id"] == run["deployment"]["id"]
    assert ("succeeded", "managed") == (deployment["status"], deployment["runner_id"]), deployment
    outputs = managed_stack.outputs(deployment, identity)
    assert {"url": "https://shop.example.test/bucket-shop", "bucket": "bucket-shop"} == outputs["shop"]
    logs = managed_stack.client.get(
        f"/orgs/{managed_stack.org}/deployments/{deployment['id']}/actions/get-logs",
        headers={"DecryptKey": identity},
    )
    assert "terraform_data" in logs.text
