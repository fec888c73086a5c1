"""A ``vm`` runner with a local connection and ``runtime: docker`` where no Docker daemon answers (issue 26):
its GET says it is not launchable, naming the engine's address, and a launch fails saying so instead of
"Run 'docker run --help' for more information". The engine is the stand-in CLI
(tests/support/container_engine.py) whose daemon is "down" while ``daemon-down`` exists beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from orchestrator.launchers.base import LaunchError
from orchestrator.launchers.local import LocalLauncher
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import RunnerMode
from tests.support.container_engine import install_engine
from tests.support.orgs import Org


def docker_job(engine_dir: Path, **environment: str) -> dict[str, Any]:
    return {
        "runtime": "docker",
        "image": "registry.example.com/runner:test",
        "environment": {"PATH": f"{engine_dir}:/usr/bin:/bin", **environment},
    }


async def test_get__a_docker_runner_without_a_daemon_is_not_launchable_naming_the_socket(
    org: Org, tmp_path: Path
) -> None:
    engine_dir = tmp_path / "engine"
    install_engine(engine_dir)
    (engine_dir / "daemon-down").touch()
    body = {
        "id": "boxed",
        "runner_configuration": {
            "type": "vm",
            "connection": {"type": "local"},
            "job": docker_job(engine_dir),
        },
        "state_storage_configuration": {"type": "orchestrator"},
    }
    created = await org.platform.post(f"/orgs/{org.id}/runners", json=body)
    assert 201 == created.status_code, created.text

    got = (await org.admin.get(f"/orgs/{org.id}/runners/boxed")).json()
    down = got["status"]
    (engine_dir / "daemon-down").unlink()
    up = (await org.admin.get(f"/orgs/{org.id}/runners/boxed")).json()["status"]

    assert down["launchable"] is False
    assert "no container engine answers at unix:///var/run/docker.sock" in down["message"]
    assert "Cannot connect to the Docker daemon" in down["message"]
    assert {"launchable": True} == up


async def test_launch__without_a_daemon_fails_naming_the_engine_address(tmp_path: Path) -> None:
    engine_dir = tmp_path / "engine"
    install_engine(engine_dir)
    (engine_dir / "daemon-down").touch()
    job = docker_job(engine_dir, DOCKER_HOST="unix:///run/elsewhere/docker.sock")
    spec = RunSpec(
        org_id="acme",
        runner_id="boxed",
        deployment_id="6f1c1d2e-0000-4000-8000-000000000026",
        env_uuid="6f1c1d2e-0000-4000-8000-0000000000e1",
        mode=RunnerMode.DEPLOY,
        token=SecretStr("deployment-token"),
        gateway_url="http://127.0.0.1:9",
        runner_configuration={"type": "vm", "connection": {"type": "local"}, "job": job},
    )
    launcher = LocalLauncher(tmp_path / "runs", environ={"PATH": "/usr/bin:/bin"})
    try:
        with pytest.raises(LaunchError) as failed:
            await launcher.launch(spec)
    finally:
        launcher.close()

    assert failed.value.retryable is False
    assert "no container engine answers at unix:///run/elsewhere/docker.sock" in failed.value.message
    assert "docker run --help" not in failed.value.message
    assert not (engine_dir / "runs.log").exists()  # no `docker run` was tried
