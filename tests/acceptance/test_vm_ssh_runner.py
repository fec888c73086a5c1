"""Deployments through a ``vm`` runner over SSH: a real server connects to a real OpenSSH server on
loopback (tests/support/sshd.py) as this test's user, and starts this checkout's ``po-runner`` there
(``.venv/bin`` on ``job.environment.PATH``), which runs the embedded Terraform engine and reports back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from orchestrator.settings import ServerSettings
from tests.support.demo_modules import make_slow
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.outages import ServerProcess
from tests.support.sshd import SshServer, new_key_pair, running_sshd, vm_runner_body
from tests.support.stack import build_stack, demo_manifest

#: The database plays no part here: each test runs on one of them (tests/conftest.py).
pytestmark = pytest.mark.spread

SECRET = "vm-ssh-job-secret-2718281828"


@pytest.fixture
def settings(settings: ServerSettings) -> ServerSettings:
    """The SSH server listens on 127.0.0.1, which the server refuses by default: allowed here."""
    return settings.model_copy(update={"runner_denied_networks": ""})


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SshServer]:
    with running_sshd(tmp_path / "sshd") as server:
        yield server


def vm_ssh_runner(sshd: SshServer, tmp_path: Path, **connection: Any) -> dict[str, Any]:
    return vm_runner_body(sshd, tmp_path, secrets={"MY_SECRET": SECRET}, **connection)


@pytest.mark.slow
def test_deploy__through_a_vm_runner_over_ssh(server_url: str, sshd: SshServer, tmp_path: Path) -> None:
    """The deployment succeeds; its run ran on the host in the job's work_dir, and ended with exit code 0
    leaving no code there."""
    stack = build_stack(server_url, tmp_path, runner=vm_ssh_runner(sshd, tmp_path))

    deployment = stack.deploy()

    outputs = stack.outputs(deployment) if deployment["status"] == "succeeded" else {}
    stack.client.close()
    # The runner reports before its process ends: the run records its exit code a moment later.
    exit_code = tmp_path / "vm-runs" / deployment["id"] / "exit_code"
    deadline = time.monotonic() + 60
    while not exit_code.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert deployment["status"] == "succeeded", deployment["status_message"]
    assert outputs["shop"]["bucket"] == "bucket-shop"
    assert "0\n" == exit_code.read_text()
    assert not (exit_code.parent / "work").exists()


@pytest.mark.slow
def test_restart__the_orchestrator_adopts_the_run_again(
    database_url: str, sshd: SshServer, tmp_path: Path
) -> None:
    """The orchestrator is killed while the run goes on on the machine; once started again it checks the
    same run (not a second one) and the deployment succeeds."""
    server = ServerProcess(database_url, tmp_path / "data", PO_RUNNER_DENIED_NETWORKS="")
    server.start()
    try:
        stack = build_stack(server.url, tmp_path, runner=vm_ssh_runner(sshd, tmp_path))
        make_slow(stack, seconds=6)
        created = stack.client.post(
            f"/orgs/{stack.org}/deployments",
            json={"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": demo_manifest()},
        )
        assert 201 == created.status_code, created.text
        deployment_id = created.json()["id"]
        pid_file = tmp_path / "vm-runs" / deployment_id / "runner.pid"
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        launched = pid_file.read_text()

        server.kill()
        server.start()
        finished = stack.wait(deployment_id)
        stack.client.close()
    finally:
        server.stop()

    assert "succeeded" == finished["status"], finished["status_message"]
    assert launched == pid_file.read_text()


def test_host_key_mismatch__fails_the_deployment_saying_why_without_secrets(
    server_url: str, sshd: SshServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A host whose key is not the runner's ``host_public_key`` is never used: the deployment fails with
    a message naming the cause, and neither that message, nor the API's answers, nor the server's logs
    hold the private key or the job's secret."""
    runner = vm_ssh_runner(sshd, tmp_path, host_public_key=new_key_pair().public_key)
    stack = build_stack(server_url, tmp_path, runner=runner)
    caplog.set_level(logging.DEBUG)

    with capture_logs() as logs:
        deployment = stack.deploy()
    base = f"/orgs/{stack.org}"
    answers = [
        stack.client.get(f"{base}/deployments/{deployment['id']}").text,
        stack.client.get(f"{base}/deployments", params={"env_id": "dev", "project_id": "shop"}).text,
        stack.client.get(f"{base}/runners/local").text,
        stack.client.get(f"{base}/runners").text,
    ]
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}) as admin:
        answers.append(admin.get(f"{base}/runners/local").text)
    stack.client.close()

    message = deployment["status_message"]
    assert deployment["status"] == "failed"
    assert message.startswith(
        f"the runner could not be launched: the SSH host key of 127.0.0.1:{sshd.port} does not match "
        "the runner's connection.host_public_key"
    )
    assert not (tmp_path / "vm-runs").exists()
    key_lines = [line for line in sshd.private_key.splitlines() if "PRIVATE KEY" not in line]
    texts = {"status message": message, "logs": repr(logs) + caplog.text, "answers": "\n".join(answers)}
    for where, text in texts.items():
        assert SECRET not in text, where
        for line in key_lines:
            assert line not in text, where
