"""A STAND-IN for the orchestrator's managed-runner routes (``/runner/register``, ``/runner/heartbeat``,
``/runner/claim``, ``/runner/deployments/{id}/finished``), exactly as /work/wt/MANAGED.md's wire contract
says and nothing more. The runner side was built before the server side; its end-to-end tests now run
against the real server (tests/acceptance/test_managed_runners_e2e.py). This stays for the loop tests that
need what the real server cannot be made to give on demand (tests/integration/test_managed_runner_loop.py
says which); keep it to the contract, not to any server's internals.

State lives in memory: records by name (a same-name registration replaces the record and its token), a
queue of deployments, each claim held by one record; every request is recorded (without its credentials)
for the tests to look at. ``outage`` makes every route answer that status; ``stop()``/``start()`` take the
whole server away and bring it back on the same port (connection refused in between).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.live_server import serve_in_thread

SECRET = "s" * 24 + secrets.token_hex(12)  # 48 characters, as the server requires
SECRET_REFUSED = "the managed runner secret is not valid"
TOKEN_REFUSED = "the managed runner token is not valid: register again"
NOT_ENABLED = "managed runners are not enabled on this server"


@dataclass
class Queued:
    id: str
    environment: dict[str, str]
    org_id: str = "org-a"
    project_id: str = "project-a"
    env_id: str = "env-a"
    required_tags: tuple[str, ...] = ()


@dataclass
class Record:
    name: str
    token: str
    tags: list[str]
    claim: str | None = None


@dataclass
class Call:
    """One request: its route, the runner's name (None when its credentials were refused), its body
    without the secret, and the status answered."""

    route: str
    name: str | None
    body: dict[str, Any]
    status: int


@dataclass
class ManagedStandin:
    secret: str = SECRET
    enabled: bool = True
    lease_seconds: int = 60
    heartbeat_seconds: int = 15
    #: The longest a claim waits here, whatever ``waitSeconds`` says (tests stay fast).
    max_wait_seconds: float = 0.2
    #: Every route answers this status while set (429, 503, ...).
    outage: int | None = None
    #: Deployments cancelled: a heartbeat carrying one answers ``cancel: true`` (as the orchestrator does).
    cancelled: dict[str, float] = field(default_factory=dict)
    records: dict[str, Record] = field(default_factory=dict)
    queue: list[Queued] = field(default_factory=list)
    finished: dict[str, int] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    registrations: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: contextlib.ExitStack | None = None
    port: int = 0
    url: str = ""

    # Test controls.

    def enqueue(self, deployment: Queued) -> None:
        with self._lock:
            self.queue.append(deployment)

    def revoke(self, name: str) -> None:
        """Remove the record of ``name`` (pruned): its token stops working."""
        with self._lock:
            self.records.pop(name, None)

    def drop_claim(self, name: str) -> None:
        """The lease of ``name``'s claim ran out: the claim is no longer its."""
        with self._lock:
            self.records[name].claim = None

    def routes_called(self) -> list[str]:
        with self._lock:
            return [call.route for call in self.calls]

    def start(self) -> str:
        stack = contextlib.ExitStack()
        self.url = stack.enter_context(serve_in_thread(self.app(), port=self.port))
        self.port = int(self.url.rsplit(":", 1)[1])
        self._server = stack
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    @contextlib.contextmanager
    def serving(self) -> Iterator[str]:
        try:
            yield self.start()
        finally:
            self.stop()

    # The app.

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/healthz", lambda _request: Response("ok"), methods=["GET"]),
                Route("/runner/register", self._register, methods=["POST"]),
                Route("/runner/heartbeat", self._heartbeat, methods=["POST"]),
                Route("/runner/claim", self._claim, methods=["POST"]),
                Route("/runner/deployments/{id}/finished", self._finished, methods=["POST"]),
            ]
        )

    def _answer(
        self, route: str, name: str | None, body: dict[str, Any], status: int, content: Any
    ) -> Response:
        with self._lock:
            self.calls.append(Call(route, name, body, status))
        if status == 204:
            return Response(status_code=204)
        if status >= 400:
            content = {"error": f"API-{status}", "message": content, "details": {}}
        return JSONResponse(content, status_code=status)

    def _refused(self, route: str, body: dict[str, Any]) -> Response | None:
        if self.outage is not None:
            return self._answer(route, None, body, self.outage, "the server is unavailable")
        if not self.enabled:
            return self._answer(route, None, body, 404, NOT_ENABLED)
        return None

    def _record(self, request: Request) -> Record | None:
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ")
        with self._lock:
            return next(
                (r for r in self.records.values() if header.startswith("Bearer ") and r.token == token), None
            )

    async def _register(self, request: Request) -> Response:
        body = await request.json()
        shown = {k: v for k, v in body.items() if k != "managedSecret"}
        refused = self._refused("register", shown)
        if refused is not None:
            return refused
        if body.get("managedSecret") != self.secret:
            return self._answer("register", None, shown, 401, SECRET_REFUSED)
        record = Record(name=body["name"], token=secrets.token_urlsafe(32), tags=["managed", *body["tags"]])
        with self._lock:
            self.records[record.name] = record  # replaced: the old token stops working, its claim is lost
            self.registrations += 1
        return self._answer(
            "register",
            record.name,
            shown,
            201,
            {
                "runnerId": secrets.token_hex(16),
                "name": record.name,
                "token": record.token,
                "pool": "managed",
                "tags": record.tags,
                "leaseSeconds": self.lease_seconds,
                "heartbeatSeconds": self.heartbeat_seconds,
            },
        )

    async def _heartbeat(self, request: Request) -> Response:
        body = await request.json()
        refused = self._refused("heartbeat", body)
        if refused is not None:
            return refused
        record = self._record(request)
        if record is None:
            return self._answer("heartbeat", None, body, 401, TOKEN_REFUSED)
        deployment = body.get("deploymentId")
        if deployment is not None and deployment != record.claim:
            return self._answer(
                "heartbeat", record.name, body, 409, f"deployment '{deployment}' is not this runner's claim"
            )
        timing: dict[str, Any] = {
            "leaseSeconds": self.lease_seconds,
            "heartbeatSeconds": self.heartbeat_seconds,
        }
        if deployment is not None and deployment in self.cancelled:
            timing.update(cancel=True, cancelGraceSeconds=self.cancelled[deployment])
        return self._answer("heartbeat", record.name, body, 200, timing)

    async def _claim(self, request: Request) -> Response:
        body = await request.json()
        refused = self._refused("claim", body)
        if refused is not None:
            return refused
        record = self._record(request)
        if record is None:
            return self._answer("claim", None, body, 401, TOKEN_REFUSED)
        if record.claim is not None:
            return self._answer(
                "claim", record.name, body, 409, f"this runner holds deployment '{record.claim}'"
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(float(body["waitSeconds"]), self.max_wait_seconds)
        while True:
            with self._lock:
                claimable = [q for q in self.queue if set(q.required_tags) <= set(record.tags)]
                if claimable:
                    queued = claimable[0]
                    self.queue.remove(queued)
                    record.claim = queued.id
                    break
            if loop.time() >= deadline:
                return self._answer("claim", record.name, body, 204, None)
            await asyncio.sleep(0.01)
        answer = {
            "deployment": {
                "id": queued.id,
                "orgId": queued.org_id,
                "projectId": queued.project_id,
                "envId": queued.env_id,
            },
            "leaseSeconds": self.lease_seconds,
            "environment": queued.environment,
        }
        return self._answer("claim", record.name, body, 200, answer)

    async def _finished(self, request: Request) -> Response:
        body = await request.json()
        route = "finished"
        refused = self._refused(route, body)
        if refused is not None:
            return refused
        record = self._record(request)
        if record is None:
            return self._answer(route, None, body, 401, TOKEN_REFUSED)
        deployment = request.path_params["id"]
        if record.claim != deployment:
            return self._answer(
                route, record.name, body, 409, f"deployment '{deployment}' is not this runner's claim"
            )
        with self._lock:
            record.claim = None
            self.finished[deployment] = int(body["exitCode"])
        return self._answer(route, record.name, body, 200, {})
