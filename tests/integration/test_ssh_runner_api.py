"""A ``vm`` runner over SSH as the server sees it: which launcher it gets, and SSH hosts the server's egress
policy refuses when the runner is created or updated (host names are checked when connecting:
tests/integration/test_ssh_launcher.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from orchestrator.identity.issuer import WorkloadIssuer
from orchestrator.launchers.base import LaunchTarget
from orchestrator.launchers.ssh import SshLauncher
from orchestrator.secretbox import SecretBox
from orchestrator.server import launcher_for, local_launcher
from orchestrator.settings import ServerSettings
from tests.support.orgs import Org
from tests.support.sshd import new_key_pair

KEYS = new_key_pair()


def ssh_runner(host: str) -> dict[str, Any]:
    return {
        "runner_configuration": {
            "type": "vm",
            "connection": {
                "type": "ssh",
                "host": host,
                "username": "deploy",
                "host_public_key": new_key_pair().public_key,
                "private_key": KEYS.private_key,
            },
        },
        "state_storage_configuration": {"type": "orchestrator"},
    }


def test_launcher_for__vm_over_ssh(tmp_path: Path) -> None:
    settings = ServerSettings(data_dir=tmp_path / "data", runner_denied_networks="10.0.0.0/8")
    configuration = ssh_runner("vm.example.com")["runner_configuration"]
    target = LaunchTarget(org_id="acme", runner_id="vm", runner_type="vm", configuration=configuration)

    issuer = WorkloadIssuer(create_async_engine("sqlite+aiosqlite://"), SecretBox(bytes(32)), settings)

    launcher = launcher_for(settings, local_launcher(settings), issuer, target)

    assert isinstance(launcher, SshLauncher)
    assert ("vm.example.com", 22, "deploy") == (
        launcher.connection.host,
        launcher.connection.port,
        launcher.connection.username,
    )
    assert launcher.egress == settings.runner_egress
    assert KEYS.private_key not in repr(launcher.connection)


@pytest.mark.parametrize(
    ("host", "network"),
    [("127.0.0.1", "127.0.0.0/8"), ("169.254.169.254", "169.254.0.0/16"), ("[::1]", "::1/128")],
)
async def test_create_and_update__a_denied_address_refused(org: Org, host: str, network: str) -> None:
    created = await org.admin.post(f"/orgs/{org.id}/runners", json={"id": "vm", **ssh_runner(host)})
    await org.admin.post(f"/orgs/{org.id}/runners", json={"id": "ok", **ssh_runner("vm.example.com")})
    updated = await org.admin.patch(
        f"/orgs/{org.id}/runners/ok", json={"runner_configuration": ssh_runner(host)["runner_configuration"]}
    )

    for response in (created, updated):
        assert 400 == response.status_code, response.text
        message = response.json()["message"]
        assert message.startswith("runner_configuration.connection.host: ")
        assert f"is in the network {network}, which runners may not target" in message


async def test_create__a_host_name_accepted_its_key_kept_secret(org: Org) -> None:
    created = await org.admin.post(
        f"/orgs/{org.id}/runners", json={"id": "vm", **ssh_runner("vm.example.com")}
    )
    read = await org.admin.get(f"/orgs/{org.id}/runners/vm")

    assert 201 == created.status_code, created.text
    assert "SECRET" == read.json()["runner_configuration"]["connection"]["private_key"]
    assert KEYS.private_key.splitlines()[1] not in created.text + read.text
