"""The logs of whole deployments, at debug level, hold no secret. `orchestrator serve`, `po-runner remote`
(the agent) and `po-runner managed` run as real processes with JSON logs and `PO_LOG_LEVEL=debug`; one
deployment runs on a `vm` runner reached through the agent (with job secrets), one on the managed pool,
both with the runner at debug too. Every line of the server, the agent, the managed runner and the runners
(their uploaded logs, what they wrote to stderr and stdout) is read: the processes' lines are JSON, the
lines of requests carry their request id, a deployment's lines its ids, and no line holds any secret: the
runner's job secrets, the deployment tokens (a runner's ``TOKEN``, also its state backend password), the
API tokens (the bootstrap token, the organization's token, a wrong one presented), the agent's private key,
the managed runner secret, the age identities of outputs and logs, and the server's encryption key; nor
anything shaped like a token whose value the test cannot know (a managed runner's own token, the agent's
JWTs). The state storage is the orchestrator's (its credentials are the deployment token); a cloud state
storage's credential travels as a job secret, as ``AWS_SECRET_ACCESS_KEY`` does here.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import deployment_tokens
from orchestrator.protocol import agent_auth
from tests.support.agent_process import AgentProcess
from tests.support.log_lines import json_lines, secret_hits, token_shaped
from tests.support.managed import runs_work_dir
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.outages import ServerProcess
from tests.support.stack import Stack, build_stack, runner_body

pytestmark = pytest.mark.slow

LOGGING = {"PO_LOG_LEVEL": "debug", "PO_LOG_FORMAT": "json"}
JOB_SECRET = "job-secret-" + secrets.token_hex(16)
STATE_SECRET = "state-secret-" + secrets.token_hex(16)
MANAGED_SECRET = "managed-secret-" + secrets.token_hex(32)
WRONG_TOKEN = "po_wrong-token-" + secrets.token_hex(16)
SERVER_KEY = secrets.token_bytes(32)
REQUEST_ID = "trace-4bf92f3577b34da6"


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    made = ServerProcess(
        database_url,
        tmp_path / "data",
        PO_ENCRYPTION_KEY=base64.b64encode(SERVER_KEY).decode(),
        PO_AGENT_FETCH_WAIT_SECONDS="5",
        MANAGED_RUNNER_SECRET=MANAGED_SECRET,
        **LOGGING,
    )
    made.start()
    yield made
    made.stop()


@pytest.fixture
def keys() -> tuple[str, str]:
    return agent_auth.generate_key_pair()


@pytest.fixture
def stack(server: ServerProcess, tmp_path: Path, keys: tuple[str, str]) -> Iterator[Stack]:
    """Organization acme: environment dev on the vm runner ``local`` through the agent, with job secrets (an
    application's, and a state storage credential as runners carry them); environment prod on the managed
    pool."""
    body = runner_body(tmp_path / "terraformrc")
    body["runner_configuration"]["connection"] = {"type": "agent", "key": keys[1]}
    body["runner_configuration"]["job"]["secrets"] = {
        "APP_SECRET": JOB_SECRET,
        "AWS_SECRET_ACCESS_KEY": STATE_SECRET,
    }
    made = build_stack(server.url, tmp_path, runner=body)
    for path, payload in [
        ("/env-types", {"id": "production"}),
        ("/projects/shop/envs", {"id": "prod", "env_type_id": "production"}),
        ("/runner-rules", {"runner_id": "managed", "env_type_id": "production"}),
    ]:
        response = made.client.post(f"/orgs/{made.org}{path}", json=payload)
        assert 201 == response.status_code, (path, response.text)
    yield made
    made.client.close()


def _managed_runner(url: str, root: Path, work_dir: Path) -> subprocess.Popen[bytes]:
    """``po-runner managed``, its output (and its deployments' runners') in ``<root>/managed.log``."""
    with open(root / "managed.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli.runner", "managed"],
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(root),
                "RUNNER_URL": url,
                "RUNNER_MANAGED_SECRET": MANAGED_SECRET,
                "RUNNER_NAME": "pool-1",
                "RUNNER_WORK_DIR": str(work_dir),
                **LOGGING,
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _runner_log(stack: Stack, deployment: dict[str, Any]) -> str:
    answer = stack.client.get(
        f"/orgs/{stack.org}/deployments/{deployment['id']}/actions/get-logs",
        headers={"DecryptKey": deployment["_identity"]},
    )
    assert 200 == answer.status_code, answer.text
    return answer.text


def test_deployments_at_debug__no_log_line_holds_a_secret(
    server: ServerProcess, stack: Stack, tmp_path: Path, keys: tuple[str, str]
) -> None:
    agent = AgentProcess(server.url, keys[0], tmp_path)
    agent.env.update(LOGGING)
    agent.start()
    work_dir = runs_work_dir(tmp_path, "pool-1")
    managed = _managed_runner(server.url, tmp_path, work_dir)
    try:
        via_agent = stack.deploy(runner_log_level="debug")
        on_pool = stack.deploy(env_id="prod", runner_log_level="debug")
        runner_logs = {
            "agent's runner": _runner_log(stack, via_agent),
            "pool's runner": _runner_log(stack, on_pool),
        }
        traced = stack.client.get(
            f"/orgs/{stack.org}/deployments/{via_agent['id']}", headers={"X-Request-ID": REQUEST_ID}
        )
        refused = httpx.get(
            f"{server.url}/orgs/{stack.org}/projects", headers={"Authorization": f"Bearer {WRONG_TOKEN}"}
        )
    finally:
        agent.stop()
        managed.terminate()
        managed.wait(30)
        server.stop()
        if work_dir.parent != tmp_path:
            shutil.rmtree(work_dir.parent, ignore_errors=True)
    token_key = deployment_tokens.token_key(SERVER_KEY)
    secret_values = {
        "job secret": JOB_SECRET,
        "state storage credential": STATE_SECRET,
        "managed runner secret": MANAGED_SECRET,
        "bootstrap token": BOOTSTRAP_TOKEN,
        "organization token": str(stack.client.headers["Authorization"]).removeprefix("Bearer "),
        "wrong token": WRONG_TOKEN,
        "agent private key": keys[0],
        "server key": base64.b64encode(SERVER_KEY).decode(),
    }
    for deployment in (via_agent, on_pool):
        token = deployment_tokens.deployment_token(token_key, stack.org, deployment["id"])
        secret_values[f"deployment token of {deployment['env_id']}"] = token
        secret_values[f"age identity of {deployment['env_id']}"] = deployment["_identity"]
    process_logs = {
        "server": server.log.read_text(errors="replace"),
        "agent": agent.output(),
        "managed runner": (tmp_path / "managed.log").read_text(errors="replace"),
    }
    logs = {
        **process_logs,
        **runner_logs,
        **{f"runner ({path})": path.read_text(errors="replace") for path in tmp_path.rglob("stderr.log")},
    }
    lines = {name: json_lines(text) for name, text in process_logs.items()}
    server_lines = lines["server"][0]

    assert ("succeeded", "succeeded") == (via_agent["status"], on_pool["status"]), (via_agent, on_pool)
    # The check itself finds a secret where there is one.
    assert secret_hits({"planted": f'{{"event": "x", "key": "{JOB_SECRET}"}}'}, secret_values)
    assert [] == secret_hits(logs, secret_values)
    assert [] == [f"{name}: {found}" for name, text in logs.items() for found in token_shaped(text)]
    # Every line of the server, the agent and the managed runner is JSON, at debug level.
    assert {name: [] for name in lines} == {name: other for name, (_, other) in lines.items()}
    assert {"debug", "info"} <= {line["level"] for line in server_lines}
    # Every line of a request carries its id; a presented one is kept, and returned; an error answer has one.
    access = [line for line in server_lines if line.get("logger") == "uvicorn.access"]
    assert access
    assert [] == [line for line in access if not line.get("request_id")]
    assert (REQUEST_ID, True) == (
        traced.headers["X-Request-ID"],
        any(line.get("request_id") == REQUEST_ID for line in access),
    )
    assert (401, True) == (refused.status_code, bool(refused.headers.get("X-Request-ID")))
    for deployment, agent_side in ((via_agent, lines["agent"][0]), (on_pool, lines["managed runner"][0])):
        _carry_ids(stack.org, deployment, server_lines, agent_side, runner_logs)


def _carry_ids(
    org: str,
    deployment: dict[str, Any],
    server_lines: list[dict[str, Any]],
    launcher_lines: list[dict[str, Any]],
    runner_logs: dict[str, str],
) -> None:
    """A deployment's lines carry its ids: the server's (its environment too where the deployment is at
    hand: the dispatcher's, the agent's events, its runner's requests), those of what launched its runner
    (the agent, the managed runner), and the runner's own (which knows its environment's UUID)."""
    deployment_id = deployment["id"]
    ids = {"org_id": org, "deployment_id": deployment_id}
    about = [line for line in server_lines if line.get("deployment_id") == deployment_id]
    assert [] == [line for line in about if not ids.items() <= line.items()]
    runner_requests = f"/deployments/{deployment_id}/"
    whole = [
        line
        for line in about
        if line["event"] in ("agent command enqueued", "agent created the job")
        or runner_requests in line["event"]
    ]
    assert any(f"{runner_requests}results" in line["event"] for line in whole), [
        line["event"] for line in about
    ]
    environment = {"project_id": "shop", "env_id": deployment["env_id"]}
    assert [] == [line for line in whole if not environment.items() <= line.items() or "env_uuid" not in line]
    launched = [line for line in launcher_lines if line.get("deployment_id") == deployment_id]
    assert launched
    assert [] == [line for line in launched if line.get("org_id") != org]
    runner_lines, _ = json_lines(
        runner_logs["agent's runner" if deployment["env_id"] == "dev" else "pool's runner"]
    )
    events = [line for line in runner_lines if line.get("deployment_id") == deployment_id]
    assert events
    assert [] == [line for line in events if not ids.items() <= line.items() or "env_uuid" not in line]
