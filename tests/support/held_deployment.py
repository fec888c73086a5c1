"""A deployment no runner takes (its environment's runner is an agent that never polls), with what a test
needs to play its runner: its id, its environment's UUID and its deployment token (made from the server's
key file, as the server makes it). Shared by the live-log tests that upload chunks themselves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator import deployment_tokens
from orchestrator.protocol import agent_auth
from orchestrator.secretbox import KEY_FILE_NAME, decode_key
from tests.support.stack import Stack, build_stack, demo_manifest, runner_body


def agent_stack(server_url: str, tmp_path: Path) -> Stack:
    """``build_stack`` whose runner is an agent (which no test starts: its deployments wait)."""
    agent_runner = runner_body(tmp_path / "terraformrc")
    agent_runner["runner_configuration"]["connection"] = {
        "type": "agent",
        "key": agent_auth.generate_key_pair()[1],
    }
    return build_stack(server_url, tmp_path, runner=agent_runner)


@dataclass(frozen=True)
class HeldDeployment:
    deployment_id: str
    env_uuid: str
    token: str


def create_held_deployment(stack: Stack, data_dir: Path, logs_recipient: str) -> HeldDeployment:
    """Deploy the demo manifest to ``shop/dev`` with ``logs_recipient``; the server's key is read from
    ``data_dir``."""
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={
            "project_id": "shop",
            "env_id": "dev",
            "manifest": demo_manifest(),
            "encrypted_logs_recipient": logs_recipient,
        },
    )
    assert 201 == created.status_code, created.text
    deployment_id = created.json()["id"]
    env_uuid = stack.client.get(f"/orgs/{stack.org}/projects/shop/envs/dev").json()["uuid"]
    key = decode_key((data_dir / KEY_FILE_NAME).read_text())
    token = deployment_tokens.deployment_token(deployment_tokens.token_key(key), stack.org, deployment_id)
    return HeldDeployment(deployment_id, env_uuid, token)
