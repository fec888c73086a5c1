"""`orchestrator serve` stops promptly on SIGTERM and SIGINT while agents and clients hold long polls:
uvicorn's graceful shutdown waits for every open request, so the polls are told first and answer at once
(an agent's ``commands/next`` 204, ``wait-for-complete`` 408: call again)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from orchestrator.protocol import agent_auth
from orchestrator.protocol import commands as protocol
from tests.support.outages import ServerProcess
from tests.support.stack import build_stack, demo_manifest, runner_body

pytestmark = pytest.mark.slow

#: The longest wait of a poll: far beyond the bound the test allows for stopping.
WAIT_SECONDS = 60
STOP_BOUND_SECONDS = 20


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    made = ServerProcess(
        database_url,
        tmp_path / "data",
        PO_AGENT_FETCH_WAIT_SECONDS=str(WAIT_SECONDS),
        PO_AGENT_PRESENCE_INTERVAL_SECONDS="0",
        PO_AGENT_POLL_FALLBACK_SECONDS="0.2",
    )
    made.start()
    yield made
    made.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve__stops_at_once_answering_the_open_long_polls(
    server: ServerProcess, tmp_path: Path, signum: signal.Signals
) -> None:
    private_pem, public_pem = agent_auth.generate_key_pair()
    key = agent_auth.load_private_key(private_pem)
    agent_runner = runner_body(tmp_path / "terraformrc")
    agent_runner["runner_configuration"]["connection"] = {"type": "agent", "key": public_pem}
    # The deployment's runner is "local", whose command nobody fetches: the deployment stays executing.
    stack = build_stack(server.url, tmp_path, runner=agent_runner)
    created = stack.client.post(f"/orgs/{stack.org}/runners", json={"id": "polled", **agent_runner})
    assert 201 == created.status_code, created.text
    deployment = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": demo_manifest()},
    ).json()["id"]

    def wait_for_complete() -> httpx.Response:
        return stack.client.get(
            f"/orgs/{stack.org}/deployments/{deployment}/actions/wait-for-complete",
            params={"timeout_in_seconds": WAIT_SECONDS},
            timeout=WAIT_SECONDS + 30,
        )

    def poll() -> httpx.Response:
        token = agent_auth.sign(key, stack.org, "polled")
        return httpx.post(
            server.url + protocol.next_command_path(stack.org, "polled"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=WAIT_SECONDS + 30,
        )

    with ThreadPoolExecutor(3) as pool:
        waiting = pool.submit(wait_for_complete)
        polls = [pool.submit(poll), pool.submit(poll)]
        # The polls are in: the server noted the agent's presence.
        deadline = time.monotonic() + 30
        while stack.client.get(f"/orgs/{stack.org}/runners/polled").json()["status"]["last_seen_at"] is None:
            assert time.monotonic() < deadline, "the long polls never reached the server"
            time.sleep(0.1)
        assert server.process is not None
        server.process.send_signal(signum)
        exit_code = server.process.wait(STOP_BOUND_SECONDS)
        answers = [future.result(STOP_BOUND_SECONDS).status_code for future in polls]
        waited = waiting.result(STOP_BOUND_SECONDS)
    stack.client.close()

    assert 0 == exit_code
    assert [204, 204] == answers
    assert 408 == waited.status_code, waited.text
