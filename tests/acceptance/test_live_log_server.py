"""The live log's followers of a real ``orchestrator serve`` (issue 22), on both databases: SIGTERM ends an
open follow at once, cleanly (no ``end``: the follower reconnects), and the process exits without waiting
out its shutdown grace; after the restart the follower resumes with ``Last-Event-ID`` and gets the next
chunk only, once.

The deployment runs on an agent runner whose agent never comes: it stays executing, and the test plays its
runner (chunks encrypted to its logs recipient, sent with its token).
"""

from __future__ import annotations

import json
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import deployment_tokens
from orchestrator.protocol import age, agent_auth, log_stream
from orchestrator.protocol import results as protocol
from orchestrator.protocol.log_stream import Phase
from orchestrator.secretbox import KEY_FILE_NAME, decode_key
from tests.support.outages import ServerProcess
from tests.support.stack import build_stack, demo_manifest, runner_body

pytestmark = pytest.mark.slow

#: Far beyond what a stop takes; a follower the server did not end would hold it this long.
GRACE_SECONDS = 120
STOP_BOUND_SECONDS = 60
WAIT_SECONDS = 30


@dataclass
class Follower:
    """A follow of the deployment's logs in a thread: its events, and how its stream ended."""

    url: str
    headers: dict[str, str]
    events: list[tuple[str, str | None, dict[str, Any]]] = field(default_factory=list)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> Follower:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            with httpx.stream("GET", self.url, headers=self.headers, timeout=WAIT_SECONDS * 4) as response:
                assert 200 == response.status_code
                name, event_id = "", None
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        name = line.removeprefix("event: ")
                    elif line.startswith("id: "):
                        event_id = line.removeprefix("id: ")
                    elif line.startswith("data: "):
                        with self.arrived:
                            self.events.append((name, event_id, json.loads(line.removeprefix("data: "))))
                            self.arrived.notify_all()
                        name, event_id = "", None
        except BaseException as exc:  # reported to the test
            self.error = exc
        finally:
            self.done.set()

    def wait_for_chunks(self, count: int) -> list[int]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.chunks()) >= count, WAIT_SECONDS), self.events
        return self.chunks()

    def chunks(self) -> list[int]:
        return [int(data["seq"]) for name, _, data in self.events if name == log_stream.SSE_CHUNK]


def test_sigterm__ends_followers_cleanly_and_they_resume_after_the_restart(
    database_url: str, tmp_path: Path
) -> None:
    server = ServerProcess(database_url, tmp_path / "data", PO_SHUTDOWN_GRACE_SECONDS=str(GRACE_SECONDS))
    server.start()
    identity, recipient = age.generate_identity()
    agent_runner = runner_body(tmp_path / "terraformrc")
    agent_runner["runner_configuration"]["connection"] = {
        "type": "agent",
        "key": agent_auth.generate_key_pair()[1],
    }
    stack = build_stack(server.url, tmp_path, runner=agent_runner)
    try:
        created = stack.client.post(
            f"/orgs/{stack.org}/deployments",
            json={
                "project_id": "shop",
                "env_id": "dev",
                "manifest": demo_manifest(),
                "encrypted_logs_recipient": recipient,
            },
        )
        assert 201 == created.status_code, created.text
        deployment_id = created.json()["id"]
        env_uuid = stack.client.get(f"/orgs/{stack.org}/projects/shop/envs/dev").json()["uuid"]
        key = decode_key((server.data_dir / KEY_FILE_NAME).read_text())
        token = deployment_tokens.deployment_token(deployment_tokens.token_key(key), stack.org, deployment_id)

        def put(seq: int, text: str) -> None:
            answer = httpx.put(
                server.url + log_stream.chunk_path(stack.org, "local", env_uuid, deployment_id, seq),
                content=log_stream.encrypt_chunk(deployment_id, seq, Phase.PLAN, text, recipient),
                headers={protocol.DEPLOYMENT_TOKEN_HEADER: token, log_stream.PHASE_HEADER: "plan"},
            )
            assert 202 == answer.status_code, answer.text

        logs_url = f"{server.url}/orgs/{stack.org}/deployments/{deployment_id}/logs?follow=true"
        auth = {"Authorization": stack.client.headers["Authorization"]}
        first = Follower(logs_url, auth).start()
        put(1, "Plan: 1 to add\n")
        assert [1] == first.wait_for_chunks(1)
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        exit_code = server.process.wait(STOP_BOUND_SECONDS)
        assert first.done.wait(WAIT_SECONDS)
        server.start()
        again = Follower(logs_url, {**auth, "Last-Event-ID": "1"}).start()
        put(2, "terraform_data.app: Creating...\n")
        resumed = again.wait_for_chunks(1)
        stored = stack.client.get(f"/orgs/{stack.org}/deployments/{deployment_id}/logs").json()
    finally:
        stack.client.close()
        server.stop()

    assert 0 == exit_code, server.log.read_text()[-3000:]
    # Ended by the server as a complete answer, not cut: no error, and no `end` (the deployment goes on).
    assert first.error is None, repr(first.error)
    assert [] == [e for e in first.events if e[0] == log_stream.SSE_END]
    assert [2] == resumed
    assert [1, 2] == [item["seq"] for item in stored["items"]]
    texts = [
        log_stream.decrypt_chunk(
            item["ciphertext"], identity, deployment_id=deployment_id, seq=item["seq"]
        ).text
        for item in stored["items"]
    ]
    assert ["Plan: 1 to add\n", "terraform_data.app: Creating...\n"] == texts
