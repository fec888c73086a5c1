"""``orchestrator serve``'s graceful shutdown on SIGTERM, as a real process: an agent's open long poll and
a managed runner's open claim are answered at once, a request in flight finishes, a request that does not
finish is cut after PO_SHUTDOWN_GRACE_SECONDS so the process exits within its bound, and the command lease
the server handed out (unanswered, its lease an hour long) is handed back: after the restart the next poll
gets the command again at once, as its next attempt."""

from __future__ import annotations

import signal
import threading
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

WAIT_SECONDS = 60
GRACE_SECONDS = 3
#: Far beyond the grace: the process must be gone by then.
STOP_BOUND_SECONDS = 30
MANAGED_SECRET = "a-managed-runner-secret-of-at-least-forty-eight-characters"


class SlowBody:
    """A request body sent in two parts: ``started`` is set once the first part went out, the second
    waits for ``go``."""

    def __init__(self, first: bytes, second: bytes) -> None:
        self.parts = (first, second)
        self.started = threading.Event()
        self.go = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        yield self.parts[0]
        self.started.set()
        self.go.wait(STOP_BOUND_SECONDS * 2)
        yield self.parts[1]


def test_sigterm__polls_answered_in_flight_finishes_bound_kept_lease_handed_back(
    database_url: str, tmp_path: Path
) -> None:
    server = ServerProcess(
        database_url,
        tmp_path / "data",
        PO_AGENT_FETCH_WAIT_SECONDS=str(WAIT_SECONDS),
        PO_AGENT_LEASE_SECONDS="3600",
        PO_SHUTDOWN_GRACE_SECONDS=str(GRACE_SECONDS),
        PO_AGENT_PRESENCE_INTERVAL_SECONDS="0",
        PO_AGENT_POLL_FALLBACK_SECONDS="0.2",
        MANAGED_RUNNER_SECRET=MANAGED_SECRET,
    )
    server.start()
    private_pem, public_pem = agent_auth.generate_key_pair()
    key = agent_auth.load_private_key(private_pem)
    agent_runner = runner_body(tmp_path / "terraformrc")
    agent_runner["runner_configuration"]["connection"] = {"type": "agent", "key": public_pem}
    # Runner "local" (the rule's) gets the deployment's command; runner "idle" never has one.
    stack = build_stack(server.url, tmp_path, runner=agent_runner)
    created = stack.client.post(f"/orgs/{stack.org}/runners", json={"id": "idle", **agent_runner})
    assert 201 == created.status_code, created.text
    deployment = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": demo_manifest()},
    )
    assert 201 == deployment.status_code, deployment.text

    def poll(runner: str) -> httpx.Response:
        token = agent_auth.sign(key, stack.org, runner)
        return httpx.post(
            server.url + protocol.next_command_path(stack.org, runner),
            headers={"Authorization": f"Bearer {token}"},
            timeout=WAIT_SECONDS + 30,
        )

    def create_project(project: str, body: SlowBody) -> httpx.Response:
        return stack.client.post(
            f"/orgs/{stack.org}/projects",
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=STOP_BOUND_SECONDS * 3,
        )

    registered = httpx.post(
        f"{server.url}/runner/register", json={"managedSecret": MANAGED_SECRET, "name": "runner-0"}
    )
    assert 200 <= registered.status_code < 300, registered.text

    def claim() -> httpx.Response:
        return httpx.post(
            f"{server.url}/runner/claim",
            json={"waitSeconds": 25},
            headers={"Authorization": f"Bearer {registered.json()['token']}"},
            timeout=STOP_BOUND_SECONDS * 3,
        )

    finishing = SlowBody(b'{"id": ', b'"finished"}')
    stalled = SlowBody(b'{"id": ', b'"stalled"}')
    try:
        delivered = poll("local")
        assert 200 == delivered.status_code, delivered.text
        with ThreadPoolExecutor(4) as pool:
            # No managed deployment is queued: the claim waits.
            claiming = pool.submit(claim)
            waiting = pool.submit(poll, "idle")
            in_flight = pool.submit(create_project, "finished", finishing)
            cut = pool.submit(create_project, "stalled", stalled)
            # The idle poll is in (the server noted its agent), both bodies are half sent.
            deadline = time.monotonic() + 30
            while (
                stack.client.get(f"/orgs/{stack.org}/runners/idle").json()["status"]["last_seen_at"] is None
            ):
                assert time.monotonic() < deadline, "the long poll never reached the server"
                time.sleep(0.1)
            assert finishing.started.wait(30) and stalled.started.wait(30)
            assert server.process is not None
            server.process.send_signal(signal.SIGTERM)
            # The idle poll is answered while the process is still stopping (its in-flight request holds it).
            answered = waiting.result(STOP_BOUND_SECONDS)
            claimed = claiming.result(STOP_BOUND_SECONDS)
            finishing.go.set()
            finished = in_flight.result(STOP_BOUND_SECONDS)
            exit_code = server.process.wait(STOP_BOUND_SECONDS)
            stalled.go.set()
            cut_answer = cut.result(STOP_BOUND_SECONDS)
        server.start()
        redelivered = poll("local")
        projects = {
            project: stack.client.get(f"/orgs/{stack.org}/projects/{project}").status_code
            for project in ("finished", "stalled")
        }
    finally:
        finishing.go.set()
        stalled.go.set()
        stack.client.close()
        server.stop()

    assert 204 == answered.status_code
    assert 204 == claimed.status_code, claimed.text
    assert 201 == finished.status_code, finished.text
    assert 0 == exit_code, server.log.read_text()[-3000:]
    # The request still sending its body after the grace was cut (uvicorn answers 500), nothing created.
    assert 500 == cut_answer.status_code
    assert {"finished": 200, "stalled": 404} == projects
    # Handed back at the stop: delivered again at once, though its lease had an hour to run.
    assert 200 == redelivered.status_code, redelivered.text
    first, again = delivered.json(), redelivered.json()
    assert first["command"]["command_id"] == again["command"]["command_id"]
    assert [1, 2] == [first["attempt"], again["attempt"]]
