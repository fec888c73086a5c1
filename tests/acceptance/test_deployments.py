"""The main job end to end: a real server, real runner processes, the embedded Terraform engine."""

from __future__ import annotations

import pytest

from orchestrator.protocol import age
from tests.acceptance.conftest import Stack, demo_manifest

pytestmark = pytest.mark.slow


def test_deploy__outputs_decrypt_only_with_the_right_key(stack: Stack) -> None:
    deployment = stack.deploy()
    other_identity, _ = age.generate_identity()

    assert "succeeded" == deployment["status"], deployment["status_message"]
    outputs = stack.outputs(deployment)
    assert {"url": "https://shop.example.test/bucket-shop", "bucket": "bucket-shop"} == outputs["workload_shop"]
    with pytest.raises(age.AgeDecryptError):
        stack.outputs(deployment, other_identity)
    assert 2 == deployment["metrics"]["num_tf_resources_added"]


def test_deploy__second_deploy_changes_nothing(stack: Stack) -> None:
    first = stack.deploy()
    second = stack.deploy()

    assert ("succeeded", "succeeded") == (first["status"], second["status"])
    metrics = second["metrics"]
    assert (0, 0, 0) == (
        metrics["num_tf_resources_added"],
        metrics["num_tf_resources_changed"],
        metrics["num_tf_resources_removed"],
    )


def test_logs__readable_only_with_the_right_key(stack: Stack) -> None:
    deployment = stack.deploy()
    url = f"/orgs/{stack.org}/deployments/{deployment['id']}/actions/get-logs"
    other_identity, _ = age.generate_identity()

    cipher = stack.client.get(url)
    plain = stack.client.get(url, headers={"DecryptKey": deployment["_identity"]})
    wrong = stack.client.get(url, headers={"DecryptKey": other_identity})

    assert 200 == cipher.status_code
    assert "terraform_data" not in cipher.text
    assert "terraform_data" in plain.text
    assert 400 == wrong.status_code
    assert "DecryptKey" in wrong.json()["message"]
