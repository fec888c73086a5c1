"""The runner's side of an executing deployment's live log (``Live``: its token, chunks, whole log and
results through the gateway in process) and a follower of its server-sent events (``Follower``), shared
by the live-log tests."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI

from orchestrator import deployment_tokens
from orchestrator.protocol import age, log_stream
from orchestrator.protocol import results as protocol
from orchestrator.protocol.log_stream import Phase
from orchestrator.store.schema import deployments
from tests.support.orgs import Org

#: How long a test waits for an event it expects (never asserted as a time).
EVENT_WAIT_SECONDS = 20.0


class Live:
    """The runner's side of one executing deployment: its token, its chunks and its results."""

    def __init__(self, app: FastAPI, org: Org, env: dict[str, Any], deployment_id: str) -> None:
        self.app = app
        self.org = org
        self.env = env
        self.deployment_id = deployment_id
        self.identity, self.recipient = age.generate_identity()
        self.gateway = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test")

    def token(self, deployment_id: str | None = None) -> str:
        key = self.app.state.services.token_key
        return deployment_tokens.deployment_token(key, self.org.id, deployment_id or self.deployment_id)

    def path(self, seq: int, *, runner: str = "vm1", env_uuid: str | None = None) -> str:
        return log_stream.chunk_path(
            self.org.id, runner, env_uuid or self.env["uuid"], self.deployment_id, seq
        )

    def body(self, seq: int, text: str, phase: Phase = Phase.PLAN) -> str:
        return log_stream.encrypt_chunk(self.deployment_id, seq, phase, text, self.recipient)

    async def put(
        self,
        seq: int,
        text: str = "a line\n",
        phase: Phase | str = Phase.PLAN,
        *,
        body: str | bytes | None = None,
        headers: dict[str, str] | None = None,
        path: str | None = None,
    ) -> httpx.Response:
        sent = body if body is not None else self.body(seq, text, Phase(phase))
        return await self.gateway.put(
            path or self.path(seq),
            content=sent,
            headers={
                protocol.DEPLOYMENT_TOKEN_HEADER: self.token(),
                log_stream.PHASE_HEADER: str(phase),
                **(headers or {}),
            },
        )

    async def whole_log(self, text: str) -> str:
        """Put the whole log at the end (as every runner, upstream's too, does); its body."""
        body = age.encrypt_b64(text.encode(), self.recipient)
        path = protocol.logs_path(self.org.id, "vm1", self.env["uuid"], self.deployment_id)
        answer = await self.gateway.put(
            path, content=body, headers={protocol.DEPLOYMENT_TOKEN_HEADER: self.token()}
        )
        assert 202 == answer.status_code, answer.text
        return body

    async def results(self, status: str = "success") -> None:
        path = protocol.results_path(self.org.id, "vm1", self.deployment_id)
        answer = await self.gateway.post(
            path, json={"status": status}, headers={protocol.DEPLOYMENT_TOKEN_HEADER: self.token()}
        )
        assert 202 == answer.status_code, answer.text

    def logs_url(self, org_id: str | None = None) -> str:
        return f"/orgs/{org_id or self.org.id}/deployments/{self.deployment_id}/logs"

    async def page(self, role: str = "viewer", **params: Any) -> httpx.Response:
        return await self.org.clients[role].get(self.logs_url(), params=params)

    async def set_row(self, **values: Any) -> None:
        async with self.app.state.services.engine.begin() as conn:
            await conn.execute(
                deployments.update().where(deployments.c.id == uuid.UUID(self.deployment_id)).values(**values)
            )

    def decrypt(self, item: dict[str, Any]) -> log_stream.ChunkPlaintext:
        return log_stream.decrypt_chunk(
            item["ciphertext"], self.identity, deployment_id=self.deployment_id, seq=item["seq"]
        )


@dataclass
class Event:
    name: str
    data: dict[str, Any]
    id: str | None = None


@dataclass
class Follower:
    """One follower's stream: its events as they come."""

    response: httpx.Response
    events: list[Event] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    closed: bool = False
    #: Set at each new event and when the stream closes.
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self) -> None:
        name, data, event_id = "message", "", None
        async for line in self.response.aiter_lines():
            if line == "":
                if data:
                    self.events.append(Event(name, json.loads(data), event_id))
                    self.changed.set()
                name, data, event_id = "message", "", None
            elif line.startswith(":"):
                self.comments.append(line)
            else:
                key, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if key == "event":
                    name = value
                elif key == "data":
                    data += value
                elif key == "id":
                    event_id = value
        self.closed = True
        self.changed.set()

    async def until(self, condition: Any) -> None:
        """Wait until ``condition(self)`` holds (or fail after EVENT_WAIT_SECONDS)."""
        async with asyncio.timeout(EVENT_WAIT_SECONDS):
            while not condition(self):
                self.changed.clear()
                await self.changed.wait()

    def chunks(self) -> list[int]:
        return [int(e.data["seq"]) for e in self.events if e.name == log_stream.SSE_CHUNK]

    def named(self, name: str) -> list[Event]:
        return [e for e in self.events if e.name == name]
