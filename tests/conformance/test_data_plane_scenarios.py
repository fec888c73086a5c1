"""Upstream's data-plane integration scenarios that apply to us, against our real server (uvicorn on
127.0.0.1, real runner processes), with upstream's expected status codes and messages.

Written from upstream's integration tests (stellwerk-labs/platform-orchestrator-dp,
``integration-tests/deployments_test.go``: ``Test_CreateDeployment_with_inline_source_module``,
``Test_CreateDeployment_with_idempotency``, ``TestCreateDeployment_fail_due_to_module_params``, and in
``TestDeployments`` the tofu, bundle-token, outputs and result scenarios), the upstream OpenAPI documents
and protocol notes. Where we deliberately answer otherwise, the assertion is ours and a comment says why.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import tarfile
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import time_machine
import yaml

from orchestrator import deployment_tokens
from orchestrator.protocol import age
from orchestrator.secretbox import load_or_create_key
from orchestrator.settings import ServerSettings
from orchestrator.store import db
from orchestrator.store import deployments as deployment_store
from tests.support.outages import wait_for
from tests.support.stack import Stack, build_stack, running_server

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent.parent / "data"
#: What upstream's scenarios deploy, most of them.
SAMPLE: dict[str, Any] = {"workloads": {"sample": {}}}
NO_RESOURCES = {
    key: 0
    for key in ("num_resources", "num_resources_added", "num_resources_changed", "num_resources_removed")
}


@pytest.fixture
def server_settings(settings: ServerSettings) -> ServerSettings:
    # Cleanup rounds come often (the outputs retention stays upstream's 5 minutes): the scenario of the
    # outputs removed after it needs no wait of minutes.
    return settings.model_copy(update={"status_check_interval_seconds": 0.5, "cleanup_interval_seconds": 0.2})


@pytest.fixture
def server_url(server_settings: ServerSettings) -> Iterator[str]:
    def make(port: int) -> ServerSettings:
        return server_settings.model_copy(
            update={"listen": f"127.0.0.1:{port}", "public_url": f"http://127.0.0.1:{port}"}
        )

    with running_server(make) as url:
        yield url


@pytest.fixture
def stack(server_url: str, tmp_path: Path) -> Iterator[Stack]:
    """Organization ``acme``: environment shop/dev on a local runner (real runs)."""
    made = build_stack(server_url, tmp_path)
    yield made
    made.client.close()


@pytest.fixture
def agent_stack(server_url: str, tmp_path: Path) -> Iterator[Stack]:
    """Organization ``tokens``: environment shop/dev on seed 000's kubernetes-agent runner (its id is
    ``local``), which no agent polls: its deployments stay executing, and the test plays the runner."""
    runner = yaml.safe_load((DATA / "runners" / "seed000-agent.yaml").read_text())
    made = build_stack(server_url, tmp_path, org="tokens", runner=runner)
    yield made
    made.client.close()


def _create(stack: Stack, manifest: Any = SAMPLE, *, key: str | None = None, **body: Any) -> httpx.Response:
    payload = {"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": manifest, **body}
    if manifest is None:
        del payload["manifest"]
    headers = {"Idempotency-Key": key} if key else None
    return stack.client.post(f"/orgs/{stack.org}/deployments", json=payload, headers=headers)


def _catalogue(stack: Stack, resource_type: dict[str, Any], module: dict[str, Any]) -> None:
    for path, body in [
        ("/resource-types", resource_type),
        ("/modules", module),
        ("/module-rules", {"module_id": module["id"]}),
    ]:
        created = stack.client.post(f"/orgs/{stack.org}{path}", json=body)
        assert 201 == created.status_code, (path, created.text)


def _files(bundle: bytes) -> dict[str, str]:
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as archive:
        return {
            member.name: archive.extractfile(member).read().decode()  # type: ignore[union-attr]
            for member in archive.getmembers()
            if member.isfile()
        }


def _stored_outputs(settings: ServerSettings, org_id: str, deployment_id: str) -> str | None:
    """The deployment row's encrypted outputs, read from the server's database."""

    async def read() -> str | None:
        engine = db.create_engine(settings.resolved_database_url)
        try:
            async with engine.connect() as conn:
                found = await deployment_store.get(conn, org_id, uuid.UUID(deployment_id))
        finally:
            await engine.dispose()
        assert found is not None
        return found.outputs

    return asyncio.run(read())


def _block(main_tf: str, kind: str, name: str) -> str:
    start = main_tf.index(f'{kind} "{name}" {{\n')
    return main_tf[start : main_tf.index("\n}\n", start) + 3]


# -- Test_CreateDeployment_with_inline_source_module --------------------------------------------------------


def test_inline_module__outputs_decrypt_to_one_object_per_workload_named_after_it(stack: Stack) -> None:
    _catalogue(
        stack,
        {"id": "thing", "output_schema": {"type": "object", "properties": {}}},
        {
            "id": "thing-def",
            "resource_type": "thing",
            "module_inputs": {"number": 42},
            "module_source": "inline",
            "module_source_code": (
                'variable "number" {\n  type = number\n}\n\n'
                'output "answer" {\n  value = var.number * 7\n}\n\n'
                'output "platform_orchestrator_metadata" {\n  value = {\n    "Positive" = var.number >= 0\n'
                "  }\n}\n"
            ),
        },
    )
    identity, recipient = age.generate_identity()
    manifest = {
        "workloads": {
            "sample": {
                "resources": {"t": {"type": "thing"}},
                "outputs": {"ANSWER": "${resources.t.outputs.answer}"},
            }
        }
    }

    created = _create(stack, manifest, key="hello-world", encrypted_outputs_recipient=recipient)
    assert 201 == created.status_code, created.text
    done = stack.wait(created.json()["id"])
    raw = stack.client.get(f"/orgs/{stack.org}/deployments/{done['id']}/encrypted-outputs")

    assert "succeeded" == done["status"], done["status_message"]
    assert 200 == raw.status_code, raw.text
    assert {"sample": {"ANSWER": 294}} == json.loads(age.decrypt_b64(raw.json()["raw"], identity))


# -- TestDeployments, TestDeployment_rollback_flow: refusals at creation ---------------------------------


def test_create__contradictions_and_unknown_deployments_are_refused(stack: Stack) -> None:
    unknown = "0b6a3e4e-6f1c-4c57-9a53-5f3f8f0c2a11"

    not_found = stack.client.get(f"/orgs/{stack.org}/deployments/{unknown}")
    plan_only = _create(stack, mode="plan_only", plan_only=False)
    no_target = _create(stack, None, mode="rollback")
    missing_target = _create(stack, None, mode="rollback", rollback_to_deployment_id=unknown)

    assert (404, f"deployment '{unknown}' not found") == (not_found.status_code, not_found.json()["message"])
    assert (400, "plan_only cannot be false if mode is plan_only") == (
        plan_only.status_code,
        plan_only.json()["message"],
    )
    assert (400, "rollback_to_deployment_id must be set when mode is rollback") == (
        no_target.status_code,
        no_target.json()["message"],
    )
    # Upstream answers 409 "deployment '<id>' not found"; ours is a 400 naming the field, as every bad
    # input of ours is (README, "Faults, bad input and the server key"): the request is wrong, nothing
    # conflicts.
    assert 400 == missing_target.status_code, missing_target.text
    assert missing_target.json()["message"].startswith(
        f"rollback_to_deployment_id: no deployment '{unknown}' in environment 'shop/dev'"
    )
    assert [] == stack.client.get(f"/orgs/{stack.org}/deployments").json()["items"]


# -- Test_CreateDeployment_with_idempotency -----------------------------------------------------------------


def test_idempotency__same_key_and_manifest_same_deployment_another_manifest_409(stack: Stack) -> None:
    first = _create(stack, key="hello-world")
    other = _create(stack, {"workloads": {"bananas": {}}}, key="hello-world")
    again = _create(stack, key="hello-world")
    stack.wait(first.json()["id"])

    assert 201 == first.status_code, first.text
    assert 409 == other.status_code, other.text
    assert "incorrect manifest or mode for this idempotency key" == other.json()["message"]
    assert 201 == again.status_code, again.text
    assert first.json()["id"] == again.json()["id"]


# -- TestCreateDeployment_fail_due_to_module_params ---------------------------------------------------------


def test_module_params__a_required_param_left_unset_is_refused_at_creation(stack: Stack) -> None:
    _catalogue(
        stack,
        {"id": "thing", "output_schema": {"type": "object"}},
        {
            "id": "thing-default",
            "resource_type": "thing",
            "module_source": "inline",
            "module_params": {"animal": {"type": "string"}},
            "module_source_code": 'output "host" {\n  value = "localhost"\n}\n',
        },
    )
    version = stack.client.get(f"/orgs/{stack.org}/modules/thing-default").json()["version_id"]
    manifest = {
        "workloads": {"sample": {"resources": {"t": {"type": "thing", "params": {"fruit": "banana"}}}}}
    }

    refused = _create(stack, manifest)

    # Upstream's message, after the field it is about (every 400 of ours names its field first).
    assert 400 == refused.status_code, refused.text
    assert (
        "manifest.workloads.sample.resources.t.params.animal: "
        f"node 'type=thing,class=default,id=workloads.sample.t': uses module thing-default@{version} which "
        "requires string param 'animal' to be set"
    ) == refused.json()["message"]


# -- TestDeployments: the compiled code, the bundle and its token, outputs, results -------------------------


def test_deployment__the_compiled_code_has_the_metadata_output_and_one_output_per_workload(
    stack: Stack,
) -> None:
    created = _create(stack)
    assert 201 == created.status_code, created.text
    deployment = created.json()
    tf = stack.client.get(f"/orgs/{stack.org}/deployments/{deployment['id']}/tf")
    done = stack.wait(deployment["id"])

    assert ("executing", SAMPLE) == (deployment["status"], deployment["manifest"])
    assert "succeeded" == done["status"], done["status_message"]
    # Upstream pins main.tf byte for byte; ours differs deliberately in what is not wire-visible: a header
    # comment, our descriptions, no empty required_providers, and `sensitive` only on a workload output
    # that reads a sensitive value. The outputs are upstream's: the metadata output and one per workload,
    # named after it.
    metadata = _block(tf.text, "output", "platform_orchestrator_metadata")
    sample = _block(tf.text, "output", "sample")
    assert "  value       = {}\n" in metadata
    assert "  value       = {}\n" in sample
    assert 2 == tf.text.count('\noutput "')


def test_deployment__a_workload_named_like_the_metadata_output_is_refused_at_creation_and_dry_run(
    stack: Stack,
) -> None:
    """Upstream's workload names (no ``_``) cannot be ``platform_orchestrator_metadata``; nor ours. Ours
    start with a letter too: the name is a Terraform output name (upstream accepts ``9lives`` and its
    run fails)."""
    for name in ("platform_orchestrator_metadata", "9lives"):
        for dry_run in (False, True):
            refused = _create(stack, {"workloads": {name: {}}}, is_dry_run=dry_run)

            assert 400 == refused.status_code, refused.text
            assert refused.json()["message"].startswith(
                f"manifest.workloads.{name}: invalid workload name '{name}'"
            )
    assert [] == stack.client.get(f"/orgs/{stack.org}/deployments").json()["items"]


def test_bundle_tokens_outputs_and_results(agent_stack: Stack, server_settings: ServerSettings) -> None:
    stack = agent_stack
    identity, recipient = age.generate_identity()
    created = _create(stack, encrypted_outputs_recipient=recipient)
    assert 201 == created.status_code, created.text
    deployment_id = created.json()["id"]
    key = deployment_tokens.token_key(load_or_create_key(server_settings.data_dir))
    token = deployment_tokens.deployment_token(key, stack.org, deployment_id)
    # Upstream's test calls the data plane's legacy route GET /orgs/{org}/deployments/{id}/bundle (its
    # runners before v3); ours are the runner gateway's (notes §4), which upstream's v3 runners call.
    runner = f"/runner-gateway/v1/orgs/{stack.org}/runners/local/deployments/{deployment_id}"
    outputs_url = f"/orgs/{stack.org}/deployments/{deployment_id}/encrypted-outputs"
    # The runner's side: no API token, only the deployment token.
    gateway = httpx.Client(base_url=stack.client.base_url, timeout=60)

    # "cannot ask for any bundle without deployment token": 400 naming the header.
    without = gateway.get(f"{runner}/bundle")
    empty = gateway.get(f"{runner}/bundle", headers={"X-Deployment-Token": ""})
    # "... with a wrong deployment token"
    wrong = gateway.get(f"{runner}/bundle", headers={"X-Deployment-Token": "t0k3n"})
    # "can ask for any bundle with the proper deployment token"
    headers = {"X-Deployment-Token": token}
    bundle = gateway.get(f"{runner}/bundle", headers=headers)

    for answer in (without, empty):
        assert 400 == answer.status_code, answer.text
        assert answer.json()["message"].startswith("X-Deployment-Token: the header is required")
    assert (400, "the runner token is not valid") == (wrong.status_code, wrong.json()["message"])
    assert 200 == bundle.status_code, bundle.text
    files = _files(bundle.content)
    assert ["main.tf"] == list(files)
    assert 'output "platform_orchestrator_metadata" {' in files["main.tf"]
    assert 'output "sample" {' in files["main.tf"]

    # The runner's results, as it posts them (outputs: age ciphertext, base64).
    ciphertext = age.encrypt_b64(json.dumps({"sample": {}}).encode(), recipient)
    results = {"status": "success", "outputs": ciphertext, "tf_resource_counts": NO_RESOURCES}
    # Upstream's legacy results route answers 204; its gateway (and ours) 202.
    posted = gateway.post(f"{runner}/results", json=results, headers=headers)
    assert 202 == posted.status_code, posted.text
    done = stack.wait(deployment_id)
    # "can grab the outputs"
    grabbed = stack.client.get(outputs_url)
    # "cannot update the same deployment again": other results are refused.
    other = {**results, "tf_resource_counts": {**NO_RESOURCES, "num_resources": 12}}
    again = gateway.post(f"{runner}/results", json=other, headers=headers)
    gateway.close()

    assert "succeeded" == done["status"], done["status_message"]
    assert 200 == grabbed.status_code, grabbed.text
    assert base64.b64decode(grabbed.json()["raw"]).startswith(b"age-encryption.org/v1")
    assert {"sample": {}} == json.loads(age.decrypt_b64(grabbed.json()["raw"], identity))
    assert 409 == again.status_code, again.text

    # "the cleaner routine should remove the deployment outputs when they are staled", then "cannot grab
    # the outputs after removal". Upstream keeps them 5 minutes; so do we (PO_OUTPUTS_RETENTION_SECONDS).
    # Upstream's test reads the row; so do we.
    assert _stored_outputs(server_settings, stack.org, deployment_id) is not None
    later = datetime.now(UTC) + timedelta(seconds=server_settings.outputs_retention_seconds + 1)
    with time_machine.travel(later, tick=True):
        wait_for(
            lambda: _stored_outputs(server_settings, stack.org, deployment_id) is None,
            60,
            "the retention worker to delete the outputs",
        )
        gone = stack.client.get(outputs_url)
        row = stack.client.get(f"/orgs/{stack.org}/deployments/{deployment_id}").json()

    assert 404 == gone.status_code, gone.text
    assert "deployment outputs are no longer available" == gone.json()["message"]
    assert ("succeeded", False) == (row["status"], row["has_outputs"])
