"""The logs of a whole deployment, at debug level, hold no secret: `orchestrator serve` and `po-runner remote`
as real processes (JSON logs, `PO_LOG_LEVEL=debug`), a `vm` runner reached through the agent, with a job
secret, deployed with the runner at debug too. Every line of the server, the agent and the runner (its
uploaded log and what it wrote to stderr) is read: the server's and the agent's lines are JSON, the lines
of requests carry their request id, the deployment's lines its ids, and no line holds any of the secrets:
the runner's job secret, the deployment token (the runner's ``TOKEN``, also its state backend password),
the API tokens (the bootstrap token, the organization's token, a wrong one presented), the agent's private
key, the age identity of the outputs and logs, and the server's encryption key."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator import deployment_tokens
from orchestrator.protocol import agent_auth
from tests.support.agent_process import AgentProcess
from tests.support.log_lines import json_lines, secret_hits
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.outages import ServerProcess
from tests.support.stack import Stack, build_stack, runner_body

pytestmark = pytest.mark.slow

LOGGING = {"PO_LOG_LEVEL": "debug", "PO_LOG_FORMAT": "json"}
JOB_SECRET = "job-secret-" + secrets.token_hex(16)
WRONG_TOKEN = "wrong-token-" + secrets.token_hex(16)
SERVER_KEY = secrets.token_bytes(32)
REQUEST_ID = "trace-4bf92f3577b34da6"


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    made = ServerProcess(
        database_url,
        tmp_path / "data",
        PO_ENCRYPTION_KEY=base64.b64encode(SERVER_KEY).decode(),
        PO_AGENT_FETCH_WAIT_SECONDS="5",
        **LOGGING,
    )
    made.start()
    yield made
    made.stop()


@pytest.fixture
def stack(server: ServerProcess, tmp_path: Path, keys: tuple[str, str]) -> Iterator[Stack]:
    body = runner_body(tmp_path / "terraformrc")
    body["runner_configuration"]["connection"] = {"type": "agent", "key": keys[1]}
    body["runner_configuration"]["job"]["secrets"] = {"APP_SECRET": JOB_SECRET}
    made = build_stack(server.url, tmp_path, runner=body)
    yield made
    made.client.close()


@pytest.fixture
def keys() -> tuple[str, str]:
    return agent_auth.generate_key_pair()


def test_deployment_at_debug__no_log_line_holds_a_secret(
    server: ServerProcess, stack: Stack, tmp_path: Path, keys: tuple[str, str]
) -> None:
    agent = AgentProcess(server.url, keys[0], tmp_path)
    agent.env.update(LOGGING)
    agent.start()
    try:
        deployment = stack.deploy(runner_log_level="debug")
        deployment_id = deployment["id"]
        runner_log = stack.client.get(
            f"/orgs/{stack.org}/deployments/{deployment_id}/actions/get-logs",
            headers={"DecryptKey": deployment["_identity"]},
        )
        traced = stack.client.get(
            f"/orgs/{stack.org}/deployments/{deployment_id}", headers={"X-Request-ID": REQUEST_ID}
        )
        refused = httpx.get(
            f"{server.url}/orgs/{stack.org}/projects", headers={"Authorization": f"Bearer {WRONG_TOKEN}"}
        )
    finally:
        agent.stop()
        server.stop()
    token_key = deployment_tokens.token_key(SERVER_KEY)
    secret_values = {
        "job secret": JOB_SECRET,
        "deployment token": deployment_tokens.deployment_token(token_key, stack.org, deployment_id),
        "bootstrap token": BOOTSTRAP_TOKEN,
        "organization token": str(stack.client.headers["Authorization"]).removeprefix("Bearer "),
        "wrong token": WRONG_TOKEN,
        "agent private key": keys[0],
        "age identity": deployment["_identity"],
        "server key": base64.b64encode(SERVER_KEY).decode(),
    }
    logs = {
        "server": server.log.read_text(errors="replace"),
        "agent": agent.output(),
        "runner (uploaded)": runner_log.text,
        **{f"runner ({path.name})": path.read_text(errors="replace") for path in tmp_path.rglob("*.log")},
    }
    server_lines, server_other = json_lines(logs["server"])
    agent_lines, agent_other = json_lines(logs["agent"])
    runner_lines, _ = json_lines(runner_log.text)
    ids = {"org_id": stack.org, "deployment_id": deployment_id}

    assert "succeeded" == deployment["status"], deployment["status_message"]
    assert 200 == runner_log.status_code, runner_log.text
    # The check itself finds a secret where there is one.
    assert secret_hits({"planted": f'{{"event": "x", "key": "{JOB_SECRET}"}}'}, secret_values)
    assert [] == secret_hits(logs, secret_values)
    # Every line of the server and the agent is JSON, at debug level.
    assert ([], []) == (server_other, agent_other)
    assert {"debug", "info"} <= {line["level"] for line in server_lines}
    # Every line of a request carries its id; a presented one is kept, and returned.
    access = [line for line in server_lines if line.get("logger") == "uvicorn.access"]
    assert access
    assert [] == [line for line in access if not line.get("request_id")]
    assert (REQUEST_ID, True) == (
        traced.headers["X-Request-ID"],
        any(line.get("request_id") == REQUEST_ID for line in access),
    )
    assert (401, True) == (refused.status_code, bool(refused.headers.get("X-Request-ID")))
    # The deployment's lines carry its ids: the dispatcher's, the gateway's (its runner's requests), the
    # agent's and the runner's.
    about = [line for line in server_lines if line.get("deployment_id") == deployment_id]
    assert [] == [line for line in about if not ids.items() <= line.items()]
    # Those of the dispatcher, of the agent's events and of the runner's requests: its environment too.
    runner_requests = f"/runners/local/deployments/{deployment_id}/"
    whole = [
        line
        for line in about
        if line["event"] in ("agent command enqueued", "agent created the job")
        or runner_requests in line["event"]
    ]
    assert {"agent command enqueued", "agent created the job"} <= {line["event"] for line in whole}
    assert any(f"{runner_requests}results" in line["event"] for line in whole), [
        line["event"] for line in about
    ]
    environment = {"project_id": "shop", "env_id": "dev"}
    assert [] == [line for line in whole if not environment.items() <= line.items() or "env_uuid" not in line]
    assert any(ids.items() <= line.items() and line["event"] == "job launched" for line in agent_lines)
    events = [line for line in runner_lines if "event" in line and "level" in line]
    assert events
    assert [] == [line for line in events if not ids.items() <= line.items() or "env_uuid" not in line]
