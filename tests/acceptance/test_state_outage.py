"""Terraform state survives an outage of the orchestrator during a deployment (issue 7, finding 1), and a
killed runner leaves nothing running (finding 7).

A real ``orchestrator serve`` process is killed (``kill -9``) or stopped (SIGTERM) while a real runner's
Terraform (the embedded engine) applies a module whose resources take a few seconds each (a local-exec
provisioner that sleeps and then writes a marker file named after the resource's id, removed again by a
destroy-time provisioner). After the outage the checks are the same each time: the deployment ended, the
environment's stored state holds every resource Terraform created (the markers), a redeploy plans no
resource to add, and no state lock is left.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.demo_modules import marker_module
from tests.support.outages import ServerProcess, StoredState, resource_ids, run_processes, wait_for
from tests.support.stack import Stack, build_stack, demo_manifest, runner_body

pytestmark = pytest.mark.slow

#: Longer than Terraform's own default retries of the http backend (2 retries, 1 s and 2 s apart).
LONG_OUTAGE_SECONDS = 35.0


class Scenario:
    """One organization on a server process, its environment shop/dev and its marker directory."""

    def __init__(self, server: ServerProcess, tmp_path: Path, **job_environment: str) -> None:
        self.server = server
        self.markers = tmp_path / "markers"
        self.markers.mkdir()
        self.runs = tmp_path / "runs"
        tf_config = tmp_path / "terraformrc"
        tf_config.touch()
        runner = runner_body(tf_config, None, **job_environment)
        runner["runner_configuration"]["job"]["work_dir"] = str(self.runs)
        self.stack: Stack = build_stack(server.url, tmp_path, runner=runner)
        self.env_uuid = str(
            self.stack.client.get(f"/orgs/{self.stack.org}/projects/shop/envs/dev").json()["uuid"]
        )

    def use_module(self, *, count: int, sleep_seconds: float) -> None:
        code = marker_module(self.markers, count=count, sleep_seconds=sleep_seconds)
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

    def started_markers(self) -> list[Path]:
        return sorted(self.markers.glob("started-*"))

    def created_ids(self) -> set[str]:
        return {path.name.removeprefix("created-") for path in self.markers.glob("created-*")}

    def stored(self) -> StoredState:
        return StoredState(self.server.database_url, self.server.key())

    def wait(self, deployment_id: str, timeout: float = 240) -> dict[str, Any]:
        return self.stack.wait(deployment_id, timeout=timeout)

    def assert_consistent(self) -> None:
        """The stored state holds exactly the resources Terraform created, a redeploy plans nothing to add,
        and no lock is held."""
        state = self.stored().latest(self.env_uuid)
        assert state is not None, "no state stored"
        assert self.created_ids() == set(resource_ids(state).values()), state
        planned = self.wait(self.start(plan_only=True))
        assert "succeeded" == planned["status"], planned["status_message"]
        assert 0 == planned["metrics"]["num_tf_resources_added"], planned["metrics"]
        assert self.stored().lock(self.env_uuid) is None


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    made = ServerProcess(database_url, tmp_path / "data")
    made.start()
    yield made
    made.stop()


@pytest.fixture
def scenario(server: ServerProcess, tmp_path: Path) -> Iterator[Scenario]:
    made = Scenario(server, tmp_path)
    yield made
    made.stack.client.close()


def _outage(server: ServerProcess, how: signal.Signals, seconds: float) -> None:
    if how is signal.SIGKILL:
        server.kill()
    else:
        server.terminate()
    time.sleep(seconds)
    server.start()


# kill -9 on SQLite, SIGTERM on PostgreSQL (tests/conftest.py); tests/faults kills and stops on both.
@pytest.mark.diagonal("how")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_outage__server_down_while_terraform_holds_the_lock_and_writes_state_loses_nothing(
    scenario: Scenario, how: signal.Signals
) -> None:
    """The issue's scenario: the apply runs (the state lock held), the server goes down, the apply ends
    and Terraform writes its state and unlocks while the server is still down, longer than Terraform's
    default retries; the server comes back."""
    scenario.use_module(count=2, sleep_seconds=4)
    deployment_id = scenario.start()
    wait_for(lambda: len(scenario.started_markers()) == 2, 60, "the apply to start")

    _outage(scenario.server, how, LONG_OUTAGE_SECONDS)
    finished = scenario.wait(deployment_id)

    assert "succeeded" == finished["status"], finished["status_message"]
    assert 2 == len(scenario.created_ids())
    scenario.assert_consistent()


def test_outage__state_terraform_gave_up_on_is_recovered_through_the_gateway(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Terraform's retries run out (here: none at all, TF_HTTP_RETRY_MAX=0 in the job environment) while
    the server is down at the state write: it leaves errored.tfstate, which the runner hands to the
    gateway once the server is back; it becomes the environment's state and the deployment says so."""
    scenario = Scenario(server, tmp_path, TF_HTTP_RETRY_MAX="0")
    scenario.use_module(count=2, sleep_seconds=3)
    deployment_id = scenario.start()
    wait_for(lambda: len(scenario.started_markers()) == 2, 60, "the apply to start")

    server.kill()
    wait_for(lambda: len(scenario.created_ids()) == 2, 60, "the resources to be created")
    time.sleep(3)  # Terraform fails its state write and unlock meanwhile, and leaves errored.tfstate
    server.start()
    finished = scenario.wait(deployment_id)

    assert "failed" == finished["status"]
    assert (
        "Terraform could not save its state; the runner recovered it: it is the environment's state"
        in (finished["status_message"])
    )
    assert not list(scenario.runs.glob("*/work/code/errored.tfstate"))
    scenario.assert_consistent()
    scenario.stack.client.close()


def test_outage__runner_killed_while_a_provisioner_runs_leaves_no_process(scenario: Scenario) -> None:
    """kill -9 of the runner while its Terraform runs a provisioner: the run's whole session is stopped
    (Terraform gets SIGTERM, saves its state and unlocks), and only then does the deployment fail."""
    scenario.use_module(count=1, sleep_seconds=30)
    deployment_id = scenario.start()
    wait_for(scenario.started_markers, 60, "the provisioner to start")
    run_dir = scenario.runs / deployment_id
    runner_pid = int((run_dir / "runner.pid").read_text().split(":")[2])

    os.kill(runner_pid, signal.SIGKILL)
    finished = scenario.wait(deployment_id)

    assert "failed" == finished["status"]
    assert "the runner exited" in finished["status_message"]
    assert [] == run_processes(run_dir)
    assert set() == scenario.created_ids(), "the provisioner's sleep ran to its end"
    assert scenario.stored().lock(scenario.env_uuid) is None
    # The interrupted resource is in the state (tainted): the next deploy replaces it.
    scenario.use_module(count=1, sleep_seconds=0)
    converged = scenario.wait(scenario.start())
    assert "succeeded" == converged["status"], converged["status_message"]
    scenario.assert_consistent()


def test_outage__state_left_by_a_runner_that_died_before_handing_it_over_is_recovered_from_its_run_dir(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Terraform left errored.tfstate (its retries ran out while the server was down), and the runner was
    killed while it still waited for the server to take it: the restarted server finds the file in the
    local run's directory, makes it the environment's state and says so; the directory is kept until then."""
    scenario = Scenario(server, tmp_path, TF_HTTP_RETRY_MAX="0")
    scenario.use_module(count=2, sleep_seconds=2)
    deployment_id = scenario.start()
    wait_for(lambda: len(scenario.started_markers()) == 2, 60, "the apply to start")
    run_dir = scenario.runs / deployment_id

    server.kill()
    errored = wait_for(lambda: list(run_dir.glob("work/code/errored.tfstate")), 60, "errored.tfstate")
    os.kill(int((run_dir / "runner.pid").read_text().split(":")[2]), signal.SIGKILL)
    wait_for(lambda: not run_processes(run_dir), 30, "the runner to die")
    assert errored[0].is_file()
    server.start()
    finished = scenario.wait(deployment_id)

    assert "failed" == finished["status"]
    assert f"Terraform could not save its state and left it in {errored[0]}" in finished["status_message"]
    assert (
        "the orchestrator recovered it: it is the environment's state version" in finished["status_message"]
    )
    assert not errored[0].exists()
    scenario.assert_consistent()
    scenario.stack.client.close()
