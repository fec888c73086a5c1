"""The live log's followers of a real ``orchestrator serve`` (issue 22), on both databases.

- A real deployment on the local launcher (``po-runner standard``, the embedded Terraform engine, an apply
  whose provisioner prints a marker and sleeps), followed from its creation: its plan reaches the follower
  while it executes, every chunk comes once and in order, then ``end``; its phases are the orchestrator's
  and the runner's; the marker is in the decrypted chunks and in no stored byte (database, object store).
- SIGTERM ends an open follow at once, cleanly (no ``end``: the follower reconnects), and the process exits
  without waiting out its shutdown grace; after the restart the follower resumes with ``Last-Event-ID`` and
  gets the next chunk only, once. That deployment runs on an agent runner whose agent never comes: it stays
  executing, and the test plays its runner (chunks encrypted to its logs recipient, sent with its token).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from orchestrator.protocol import age, log_stream
from orchestrator.protocol import results as protocol
from orchestrator.protocol.log_stream import Phase
from orchestrator.store import db
from tests.support.demo_modules import SLOW_MODULE
from tests.support.docs import docs_example
from tests.support.held_deployment import agent_stack, create_held_deployment
from tests.support.outages import ServerProcess
from tests.support.stack import build_stack, demo_manifest

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

    def wait_for(self, condition: Any) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: condition(self), WAIT_SECONDS * 4), self.events


def test_real_run__followed_from_plan_to_end_every_chunk_once_only_ciphertext_stored(
    database_url: str, tmp_path: Path
) -> None:
    server = ServerProcess(database_url, tmp_path / "data")
    server.start()
    stack = build_stack(server.url, tmp_path)
    marker = f"MARKER-{uuid.uuid4().hex}"
    # The shell joins the quoted halves: the marker is in the output only, never in the stored code.
    printed = f"echo '{marker[:4]}''{marker[4:]}'"
    code = SLOW_MODULE["module_source_code"].replace("sleep 4", f"{printed}; sleep 8")
    patched = stack.client.patch(f"/orgs/{stack.org}/modules/demo-app", json={"module_source_code": code})
    assert 200 == patched.status_code, patched.text
    identity, recipient = age.generate_identity()
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
        base = f"{server.url}/orgs/{stack.org}/deployments/{deployment_id}"
        follower = Follower(
            f"{base}/logs?follow=true", {"Authorization": stack.client.headers["Authorization"]}
        )
        follower.start()
        follower.wait_for(lambda f: any(d.get("phase") == "plan" for n, _, d in f.events if n == "chunk"))
        while_planning = stack.client.get(f"/orgs/{stack.org}/deployments/{deployment_id}").json()
        assert follower.done.wait(WAIT_SECONDS * 4)
        final = stack.wait(deployment_id)
        whole = stack.client.get(f"/orgs/{stack.org}/deployments/{deployment_id}/actions/get-logs").text
        token = stack.client.headers["Authorization"].removeprefix("Bearer ")
        assert "acme" == stack.org
        curl = (
            subprocess.run(  # docs/guides/live-logs.md's curl, on the ended deployment: all of it, then end
                ["bash", "-c", docs_example("guides/live-logs-curl")],
                env={**os.environ, "TOKEN": token, "SERVER": server.url, "ID": deployment_id},
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
    finally:
        stack.client.close()
        server.stop()

    assert 0 == curl.returncode, curl.stderr
    shown = [line.removeprefix("# ") for line in docs_example("guides/live-logs-curl").splitlines()[1:]]
    for line in shown:
        assert any(out.startswith(line.split("...")[0]) for out in curl.stdout.splitlines()), line

    assert follower.error is None, repr(follower.error)
    assert "executing" == while_planning["status"]
    assert "succeeded" == final["status"], final["status_message"]
    seqs = follower.chunks()
    assert list(range(1, len(seqs) + 1)) == seqs
    [end] = [data for name, _, data in follower.events if name == log_stream.SSE_END]
    assert (log_stream.SSE_END, "succeeded", len(seqs)) == (
        follower.events[-1][0],
        end["status"],
        end["last_seq"],
    )
    texts = [
        log_stream.decrypt_chunk(
            data["ciphertext"], identity, deployment_id=deployment_id, seq=int(data["seq"])
        )
        for name, _, data in follower.events
        if name == log_stream.SSE_CHUNK
    ]
    assert marker in "".join(chunk.text for chunk in texts)
    assert marker in age.decrypt_b64(whole, identity).decode()
    phases = [p["phase"] for p in final["phases"]]
    assert ["queued", "launching", "init", "plan", "apply"] == phases[:5]
    assert set(phases[5:]) <= {"reporting"}
    streamed = [p["phase"] for name, _, p in follower.events if name == log_stream.SSE_PHASE]
    assert phases == streamed
    stored = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    if database_url.startswith("sqlite"):
        database = Path(database_url.split("///", 1)[1])
        stored += list(database.parent.glob(database.name + "*"))
    for path in stored:
        assert marker.encode() not in path.read_bytes(), path
    assert [] == asyncio.run(_rows_holding(database_url, marker.encode()))
    # The search finds what is stored in clear: the deployment's id is.
    assert "deployments" in asyncio.run(_rows_holding(database_url, deployment_id.encode()))


async def _rows_holding(database_url: str, needle: bytes) -> list[str]:
    """The tables with a row holding ``needle`` in any column (text or bytes), on either database."""
    engine = db.create_engine(database_url)
    found = []
    try:
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda sync: sa.inspect(sync).get_table_names())
            for name in names:
                for row in (await conn.execute(sa.text(f"SELECT * FROM {name}"))).all():
                    values = [v if isinstance(v, bytes) else str(v).encode() for v in row]
                    if any(needle in value for value in values):
                        found.append(name)
    finally:
        await db.dispose(engine)
    return found


def test_sigterm__ends_followers_cleanly_and_they_resume_after_the_restart(
    database_url: str, tmp_path: Path
) -> None:
    server = ServerProcess(database_url, tmp_path / "data", PO_SHUTDOWN_GRACE_SECONDS=str(GRACE_SECONDS))
    server.start()
    identity, recipient = age.generate_identity()
    stack = agent_stack(server.url, tmp_path)
    try:
        held = create_held_deployment(stack, server.data_dir, recipient)
        deployment_id, env_uuid, token = held.deployment_id, held.env_uuid, held.token

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
