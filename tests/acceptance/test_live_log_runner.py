"""The runner's live log through the real server: the whole server (API, gateway, dispatcher) on 127.0.0.1, a
local runner process (``po-runner standard``), the embedded engine, on each database.

The chunks the server stored, read back through ``GET .../logs``, decrypt with the deployment's logs identity
into the run's lines in order: Terraform's lines of init, plan and apply, then the report; the same lines the
whole log (``get-logs``) begins with. The plan's lines are there while the apply still runs (its resource
waits for the test), and the deployment's phases are the ones its chunks named.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.protocol import age
from orchestrator.protocol.log_stream import ChunkPlaintext, Phase, decrypt_chunk
from tests.support.stack import EXAMPLES, Stack, build_stack, demo_manifest, runner_body

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(server_url: str, tmp_path: Path) -> Iterator[Stack]:
    # The runner of the tree under test when the tests run from a source tree (PYTHONPATH).
    body = runner_body(tmp_path / "terraformrc")
    if "PYTHONPATH" in os.environ:
        body["runner_configuration"]["job"]["environment"]["PYTHONPATH"] = os.environ["PYTHONPATH"]
    made = build_stack(server_url, tmp_path, runner=body)
    yield made
    made.client.close()


def gate_the_apply(stack: Stack, release: Path) -> None:
    """The demo module's bucket waits (in its provisioner, during the apply) until ``release`` exists."""
    module = yaml.safe_load((EXAMPLES / "module.yaml").read_text())
    wait = f"i=0; while [ ! -f {release} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done"
    code = module["module_source_code"].replace(
        'input = "bucket-${var.name}"',
        f'input = "bucket-${{var.name}}"\n  provisioner "local-exec" {{\n    command = "{wait}"\n  }}',
    )
    patched = stack.client.patch(f"/orgs/{stack.org}/modules/demo-app", json={"module_source_code": code})
    assert 200 == patched.status_code, patched.text


def page(stack: Stack, deployment_id: str, **params: Any) -> dict[str, Any]:
    answer = stack.client.get(f"/orgs/{stack.org}/deployments/{deployment_id}/logs", params=params)
    assert 200 == answer.status_code, answer.text
    body: dict[str, Any] = answer.json()
    return body


def decrypted(items: list[dict[str, Any]], identity: str, deployment_id: str) -> list[ChunkPlaintext]:
    return [
        decrypt_chunk(item["ciphertext"], identity, deployment_id=deployment_id, seq=item["seq"])
        for item in items
    ]


def terraform_messages(chunks: list[ChunkPlaintext]) -> list[dict[str, Any]]:
    lines = "".join(chunk.text for chunk in chunks).splitlines()
    return [json.loads(line) for line in lines if '"@module":"terraform.ui"' in line]


def test_the_runner_streams_terraform_lines_in_order_while_the_apply_runs(
    stack: Stack, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    gate_the_apply(stack, release)
    identity, recipient = age.generate_identity()
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={
            "project_id": "shop",
            "env_id": "dev",
            "mode": "deploy",
            "manifest": demo_manifest(),
            "encrypted_outputs_recipient": recipient,
            "encrypted_logs_recipient": recipient,
        },
    )
    assert created.status_code in (200, 201), created.text
    deployment_id = created.json()["id"]

    # The apply waits for the test: the plan's lines and the apply's start are on the server meanwhile.
    deadline = time.monotonic() + 90
    while True:
        during = page(stack, deployment_id, limit=1000)
        if any(item["phase"] == "apply" for item in during["items"]):
            break
        assert "executing" == during["status"], during
        assert time.monotonic() < deadline, f"no apply chunk came: {during}"
        time.sleep(0.1)
    running = stack.client.get(f"/orgs/{stack.org}/deployments/{deployment_id}").json()
    release.touch()
    finished = stack.wait(deployment_id)

    assert "succeeded" == finished["status"], finished["status_message"]
    assert (False, "executing", "apply") == (during["complete"], running["status"], running["phase"])
    early = terraform_messages(decrypted(during["items"], identity, deployment_id))
    assert {"planned_change", "change_summary"} <= {message["type"] for message in early}

    whole = page(stack, deployment_id, limit=1000)
    items = whole["items"]
    assert list(range(1, len(items) + 1)) == [item["seq"] for item in items]
    assert (len(items), True, True) == (whole["last_seq"], whole["complete"], whole["whole_log"])
    assert during["items"] == items[: len(during["items"])], "a stored chunk never changes"
    chunks = decrypted(items, identity, deployment_id)
    assert [item["phase"] for item in items] == [chunk.phase.value for chunk in chunks]
    assert [Phase.INIT, Phase.PLAN, Phase.APPLY, Phase.REPORTING] == list(
        dict.fromkeys(c.phase for c in chunks)
    )

    # The chunks hold the log's lines in order: what the whole log, put at the end, begins with.
    streamed = "".join(chunk.text for chunk in chunks).splitlines()
    whole_log = stack.client.get(
        f"/orgs/{stack.org}/deployments/{deployment_id}/actions/get-logs", headers={"DecryptKey": identity}
    ).text.splitlines()
    assert streamed == whole_log[: len(streamed)]
    kinds = [message["type"] for message in terraform_messages(chunks)]
    order = ["version", "planned_change", "change_summary", "apply_start", "apply_complete"]
    assert order == [kind for kind in dict.fromkeys(kinds) if kind in order]
    operations = [
        m["changes"]["operation"] for m in terraform_messages(chunks) if m["type"] == "change_summary"
    ]
    assert ["plan", "apply"] == operations

    phases = [entry["phase"] for entry in finished["phases"]]
    assert ["queued", "launching", "init", "plan", "apply", "reporting"] == phases
