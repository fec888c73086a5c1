"""The main job end to end: a real server, real runner processes, the embedded Terraform engine."""

from __future__ import annotations

import pytest

from orchestrator.protocol import age
from tests.support.stack import Stack, demo_manifest

pytestmark = [pytest.mark.slow, pytest.mark.spread]


def test_deploy__outputs_decrypt_only_with_the_right_key(stack: Stack) -> None:
    deployment = stack.deploy()
    other_identity, _ = age.generate_identity()

    assert "succeeded" == deployment["status"], deployment["status_message"]
    outputs = stack.outputs(deployment)
    assert {"url": "https://shop.example.test/bucket-shop", "bucket": "bucket-shop"} == outputs["shop"]
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


def _state_versions(stack: Stack) -> int:
    deployments = stack.client.get(f"/orgs/{stack.org}/deployments").json()["items"]
    return sum(1 for d in deployments if d["status"] == "succeeded" and not d["plan_only"])


def test_plan_only__reports_planned_outputs_and_changes_nothing(stack: Stack) -> None:
    planned = stack.deploy(mode="plan_only")
    applied = stack.deploy()

    assert ("succeeded", True) == (planned["status"], planned["plan_only"])
    # terraform_data outputs are only known once applied: the plan says so.
    assert "(known after apply)" == stack.outputs(planned)["shop"]["url"]
    # Nothing was applied by the plan: the real deploy still adds both resources.
    assert 2 == applied["metrics"]["num_tf_resources_added"]


def test_rollback__returns_to_the_earlier_manifest(stack: Stack) -> None:
    first = stack.deploy(demo_manifest("shop"))
    second = stack.deploy(demo_manifest("outlet"))
    rolled = stack.deploy(mode="rollback", rollback_to_deployment_id=first["id"])

    assert "bucket-outlet" == stack.outputs(second)["shop"]["bucket"]
    assert "succeeded" == rolled["status"], rolled["status_message"]
    assert ("rollback", first["id"]) == (rolled["mode"], rolled["rollback_to_deployment_id"])
    assert "bucket-shop" == stack.outputs(rolled)["shop"]["bucket"]


def test_failing_module__clear_message_and_results_stored(stack: Stack) -> None:
    module = stack.client.get(f"/orgs/{stack.org}/modules/demo-app").json()
    broken = module["module_source_code"].replace(
        'input = "bucket-${var.name}"',
        'input = "bucket-${var.name}"\n  lifecycle {\n    precondition {\n'
        '      condition     = var.name != "shop"\n'
        '      error_message = "the name shop is reserved"\n    }\n  }',
    )
    patched = stack.client.patch(f"/orgs/{stack.org}/modules/demo-app", json={"module_source_code": broken})
    assert 200 == patched.status_code, patched.text

    failed = stack.deploy()
    logs = stack.client.get(
        f"/orgs/{stack.org}/deployments/{failed['id']}/actions/get-logs",
        headers={"DecryptKey": failed["_identity"]},
    )

    assert "failed" == failed["status"]
    assert "runner failed with code TF_DIAGNOSTIC_ERROR" in failed["status_message"]
    assert "the name shop is reserved" in failed["status_message"]
    assert "TF_DIAGNOSTIC_ERROR" == failed["error"]["error"]
    assert 200 == logs.status_code
    assert "the name shop is reserved" in logs.text


def test_one_executing_deployment_per_environment(stack: Stack) -> None:
    body = {"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": demo_manifest()}
    first = stack.client.post(f"/orgs/{stack.org}/deployments", json=body)
    second = stack.client.post(f"/orgs/{stack.org}/deployments", json=body)
    stack.wait(first.json()["id"])

    assert 201 == first.status_code
    assert 409 == second.status_code
    assert "already executing in environment 'shop/dev'" in second.json()["message"]


def test_idempotency_key__same_request_same_deployment_other_request_409(stack: Stack) -> None:
    body = {"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": demo_manifest()}
    headers = {"Idempotency-Key": "key-1"}
    first = stack.client.post(f"/orgs/{stack.org}/deployments", json=body, headers=headers)
    again = stack.client.post(f"/orgs/{stack.org}/deployments", json=body, headers=headers)
    other = stack.client.post(
        f"/orgs/{stack.org}/deployments", json={**body, "manifest": demo_manifest("x")}, headers=headers
    )
    stack.wait(first.json()["id"])

    assert (201, 201) == (first.status_code, again.status_code)
    assert first.json()["id"] == again.json()["id"]
    assert 409 == other.status_code
    assert "incorrect manifest or mode for this idempotency key" == other.json()["message"]


def test_dry_run__returns_runner_and_plan_of_work_without_executing(stack: Stack) -> None:
    response = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={
            "project_id": "shop",
            "env_id": "dev",
            "mode": "deploy",
            "manifest": demo_manifest(),
            "is_dry_run": True,
        },
    )
    listed = stack.client.get(f"/orgs/{stack.org}/deployments").json()["items"]

    assert 200 == response.status_code
    assert "local" == response.json()["runner_id"]
    assert 'module "' in response.json()["tf"]
    assert 'backend "http"' in response.json()["tf"]
    assert [] == listed


def test_delete_env__runs_destroy_then_removes_the_environment(stack: Stack) -> None:
    deployed = stack.deploy()
    deleted = stack.client.delete(f"/orgs/{stack.org}/projects/shop/envs/dev")
    destroy = next(
        d
        for d in stack.client.get(f"/orgs/{stack.org}/deployments").json()["items"]
        if d["mode"] == "destroy"
    )
    finished = stack.wait(destroy["id"])

    assert "succeeded" == deployed["status"]
    assert 202 == deleted.status_code
    assert "deleting" == deleted.json()["status"]
    assert "succeeded" == finished["status"], finished["status_message"]
    assert 2 == finished["metrics"]["num_tf_resources_removed"]
    assert 404 == stack.client.get(f"/orgs/{stack.org}/projects/shop/envs/dev").status_code


def test_delete_env__never_deployed_is_immediate(stack: Stack) -> None:
    response = stack.client.delete(f"/orgs/{stack.org}/projects/shop/envs/dev")

    assert 204 == response.status_code
    assert 404 == stack.client.get(f"/orgs/{stack.org}/projects/shop/envs/dev").status_code


def test_delete_env__after_a_failed_apply_destroys_what_it_created(stack: Stack) -> None:
    """The only deployment created the bucket, then failed on the app: the state holds both (the app
    tainted). Deleting the environment must destroy them, not orphan them."""
    module = stack.client.get(f"/orgs/{stack.org}/modules/demo-app").json()
    failing = module["module_source_code"].replace(
        'resource "terraform_data" "app" {',
        'resource "terraform_data" "app" {\n  provisioner "local-exec" {\n    command = "exit 3"\n  }',
    )
    patched = stack.client.patch(f"/orgs/{stack.org}/modules/demo-app", json={"module_source_code": failing})
    assert 200 == patched.status_code, patched.text
    failed = stack.deploy()

    deleted = stack.client.delete(f"/orgs/{stack.org}/projects/shop/envs/dev")
    destroy = next(
        d
        for d in stack.client.get(f"/orgs/{stack.org}/deployments").json()["items"]
        if d["mode"] == "destroy"
    )
    finished = stack.wait(destroy["id"])

    assert "failed" == failed["status"], failed["status_message"]
    assert 202 == deleted.status_code, deleted.text
    assert "succeeded" == finished["status"], finished["status_message"]
    assert 2 == finished["metrics"]["num_tf_resources_removed"]
    assert 404 == stack.client.get(f"/orgs/{stack.org}/projects/shop/envs/dev").status_code
