"""State kept in S3 (moto) whose endpoint becomes unreachable at the state write: Terraform leaves
errored.tfstate, and the runner never discards it. When S3 is back in time the runner pushes it
(`terraform state push`, after releasing the lock its own apply could not release); when S3 stays away
the orchestrator keeps it sealed with the deployment, and an admin downloads it.

The runner reaches moto through a TCP proxy whose port the test closes (connections refused, as with a
dead endpoint); the orchestrator and its dispatcher run in this process, up all along.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.support.demo_modules import marker_module
from tests.support.emulators import MOTO_CREDENTIALS, Emulator, emulator_or_skip, start_moto
from tests.support.outages import Proxy, resource_ids, wait_for
from tests.support.stack import Stack, build_stack, demo_manifest, runner_body

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    server = emulator_or_skip(start_moto, tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture
def s3(moto: Emulator) -> Iterator[Any]:
    client = boto3.client(
        "s3",
        endpoint_url=moto.url,
        region_name=MOTO_CREDENTIALS["AWS_REGION"],
        aws_access_key_id=MOTO_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=MOTO_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    yield client
    client.close()


@pytest.fixture
def proxy(moto: Emulator) -> Iterator[Proxy]:
    made = Proxy(moto.port)
    made.up()
    yield made
    made.down()


class S3Scenario:
    def __init__(self, server_url: str, tmp_path: Path, s3: Any, proxy: Proxy, **environment: str) -> None:
        self.s3 = s3
        self.bucket = f"tfstate-{tmp_path.name[-20:].lower().replace('_', '-')}"
        s3.create_bucket(Bucket=self.bucket)
        self.markers = tmp_path / "markers"
        self.markers.mkdir()
        self.runs = tmp_path / "runs"
        tf_config = tmp_path / "terraformrc"
        tf_config.touch()
        runner = runner_body(
            tf_config,
            state={"type": "s3", "bucket": self.bucket},
            AWS_REGION=MOTO_CREDENTIALS["AWS_REGION"],
            AWS_ENDPOINT_URL_S3=proxy.url,
            AWS_ENDPOINT_URL_STS=proxy.url,
            # One SDK retry: Terraform gives up on the unreachable endpoint within seconds.
            TF_CLI_ARGS_init="-backend-config=use_path_style=true -backend-config=use_lockfile=true "
            "-backend-config=max_retries=1",
            **environment,
        )
        job = runner["runner_configuration"]["job"]
        job["work_dir"] = str(self.runs)
        job["secrets"] = {
            "AWS_ACCESS_KEY_ID": MOTO_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": MOTO_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        }
        self.stack: Stack = build_stack(server_url, tmp_path, runner=runner)
        self.env_uuid = str(
            self.stack.client.get(f"/orgs/{self.stack.org}/projects/shop/envs/dev").json()["uuid"]
        )
        code = marker_module(self.markers, count=1, sleep_seconds=2)
        patched = self.stack.client.patch(
            f"/orgs/{self.stack.org}/modules/demo-app", json={"module_source_code": code}
        )
        assert 200 == patched.status_code, patched.text

    def start(self, *, plan_only: bool = False) -> str:
        created = self.stack.client.post(
            f"/orgs/{self.stack.org}/deployments",
            json={
                "project_id": "shop",
                "env_id": "dev",
                "mode": "deploy",
                "manifest": demo_manifest(),
                "plan_only": plan_only,
            },
        )
        assert 201 == created.status_code, created.text
        deployment_id: str = created.json()["id"]
        return deployment_id

    def keys(self) -> list[str]:
        listed = self.s3.list_objects_v2(Bucket=self.bucket)
        return sorted(item["Key"] for item in listed.get("Contents", []))

    def state(self) -> dict[str, Any]:
        body = self.s3.get_object(Bucket=self.bucket, Key=f"{self.env_uuid}.tfstate")["Body"].read()
        state: dict[str, Any] = json.loads(body)
        return state

    def created_ids(self) -> set[str]:
        return {path.name.removeprefix("created-") for path in self.markers.glob("created-*")}


def _unreachable_at_the_state_write(scenario: S3Scenario, proxy: Proxy) -> tuple[str, Path]:
    deployment_id = scenario.start()
    wait_for(lambda: list(scenario.markers.glob("started-*")), 60, "the apply to start")
    proxy.down()
    errored = scenario.runs / deployment_id / "work" / "code" / "errored.tfstate"
    wait_for(errored.exists, 120, "Terraform to give up and write errored.tfstate")
    return deployment_id, errored


def test_s3__errored_state_is_pushed_once_the_backend_is_back(
    server_url: str, tmp_path: Path, s3: Any, proxy: Proxy
) -> None:
    scenario = S3Scenario(server_url, tmp_path, s3, proxy)
    deployment_id, errored = _unreachable_at_the_state_write(scenario, proxy)

    proxy.up()
    finished = scenario.stack.wait(deployment_id, timeout=180)

    assert "failed" == finished["status"]
    assert (
        "the runner pushed it to the state backend with `terraform state push`"
        in (finished["status_message"])
    )
    assert not errored.exists()
    assert [f"{scenario.env_uuid}.tfstate"] == scenario.keys()  # the lock object is gone
    assert scenario.created_ids() == set(resource_ids(scenario.state()).values())
    planned = scenario.stack.wait(scenario.start(plan_only=True))
    assert "succeeded" == planned["status"], planned["status_message"]
    assert 0 == planned["metrics"]["num_tf_resources_added"]
    scenario.stack.client.close()


def test_s3__errored_state_is_kept_by_the_orchestrator_when_the_backend_stays_away(
    server_url: str, tmp_path: Path, s3: Any, proxy: Proxy
) -> None:
    scenario = S3Scenario(server_url, tmp_path, s3, proxy, RUNNER_STATE_RECOVERY_SECONDS="3")
    deployment_id, errored = _unreachable_at_the_state_write(scenario, proxy)

    finished = scenario.stack.wait(deployment_id, timeout=180)

    assert "failed" == finished["status"]
    message = finished["status_message"]
    assert "Terraform could not save its state and the runner could not push it" in message
    assert f"GET /orgs/acme/deployments/{deployment_id}/errored-state" in message
    kept = scenario.stack.client.get(f"/orgs/acme/deployments/{deployment_id}/errored-state")
    assert 200 == kept.status_code, kept.text
    assert scenario.created_ids() == set(resource_ids(kept.json()).values())
    assert 1 == len(scenario.created_ids())
    assert not errored.exists()
    scenario.stack.client.close()
