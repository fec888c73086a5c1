"""A crash of the orchestrator loses no deployment: after a restart it completes, or fails with a message."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.demo_modules import make_slow
from tests.support.outages import ServerProcess
from tests.support.stack import Stack, build_stack, demo_manifest

pytestmark = pytest.mark.slow


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    made = ServerProcess(database_url, tmp_path / "data")
    made.start()
    yield made
    made.stop()


def _start_slow_deploy(stack: Stack) -> str:
    make_slow(stack)
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": demo_manifest()},
    )
    assert 201 == created.status_code, created.text
    deployment_id: str = created.json()["id"]
    deadline = time.monotonic() + 30
    while (
        stack.client.get(f"/orgs/{stack.org}/deployments/{deployment_id}").json().get("launched_at") is None
    ):
        assert time.monotonic() < deadline, "the runner was never launched"
        time.sleep(0.1)
    return deployment_id


def _runner_pid(server: ServerProcess, deployment_id: str) -> int:
    # The local launcher's handle: local:<host>:<pid>:<start ticks>:<run dir>
    pid_file = server.runs_dir / deployment_id / "runner.pid"
    return int(pid_file.read_text().split(":")[2])


def test_restart__deployment_executing_during_a_crash_completes(
    server: ServerProcess, tmp_path: Path
) -> None:
    stack = build_stack(server.url, tmp_path)
    deployment_id = _start_slow_deploy(stack)

    server.kill()
    # The server is down (its port refuses) while the runner goes on; no wait: the run is still executing.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/healthz", timeout=5)
    server.start()
    finished = stack.wait(deployment_id)
    stack.client.close()

    assert "succeeded" == finished["status"], finished["status_message"]


def test_restart__runner_lost_with_the_server_fails_with_a_message(
    server: ServerProcess, tmp_path: Path
) -> None:
    stack = build_stack(server.url, tmp_path)
    deployment_id = _start_slow_deploy(stack)
    runner_pid = _runner_pid(server, deployment_id)

    server.kill()
    os.killpg(runner_pid, signal.SIGKILL)
    server.start()
    finished = stack.wait(deployment_id)
    stack.client.close()

    assert "failed" == finished["status"]
    assert "the runner exited without reporting results" in finished["status_message"]
