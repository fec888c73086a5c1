"""What Terraform 1.15 (the embedded engine) does when its ``http`` state backend is down or answers 5xx,
with the retry settings the runner gives it (``runner.state.http_retry_environment``).

Terraform's http backend sends every request through go-retryablehttp: GET and POST of the state, LOCK
and UNLOCK are all retried on a refused connection and on 5xx answers, but by default only twice (1 s,
then 2 s later). These tests hold the backend down (connections refused, through a proxy whose port is
closed) or failing (503 to each method's first requests) for longer than that; with the runner's
settings the apply goes on once the backend is back, and its state and unlock arrive.

The backend here is a minimal Terraform http backend in the test (state and lock in memory), a stand-in
for the orchestrator's (``gateway.state``), which the acceptance tests kill for real: what is checked is
Terraform's client side.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runner import engine, state
from tests.support.outages import Proxy, wait_for

pytestmark = pytest.mark.slow

#: Longer than Terraform's default retries (1 s + 2 s), well within the runner's.
OUTAGE_SECONDS = 6.0
#: Each method's first requests answered 503: more than Terraform's default 2 retries.
FAILURES_PER_METHOD = 3


class Backend:
    """Terraform's http backend protocol, in memory; ``fail_first`` answers 503 to each method's first
    requests."""

    def __init__(self, *, fail_first: int = 0) -> None:
        self.data: bytes | None = None
        self.lock: bytes | None = None
        self.fail_first = fail_first
        self.failed: dict[str, int] = {}
        self.requests: list[str] = []
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                method = self.command
                backend.requests.append(method)
                if backend.failed.get(method, 0) < backend.fail_first:
                    backend.failed[method] = backend.failed.get(method, 0) + 1
                    self._answer(503)
                    return
                if method == "GET":
                    self._answer(204) if backend.data is None else self._answer(200, backend.data)
                elif method == "POST":
                    backend.data = body
                    self._answer(200)
                elif method == "LOCK":
                    if backend.lock is not None:
                        self._answer(423, backend.lock)
                    else:
                        backend.lock = body
                        self._answer(200)
                elif method == "UNLOCK":
                    backend.lock = None
                    self._answer(200)

            do_GET = do_POST = do_LOCK = do_UNLOCK = _handle  # noqa: N815 - http.server's naming

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def backend() -> Iterator[Backend]:
    made = Backend()
    yield made
    made.close()


@pytest.fixture
def proxy(backend: Backend) -> Iterator[Proxy]:
    made = Proxy(backend.port)
    made.up()
    yield made
    made.down()


def _workdir(tmp_path: Path, url: str) -> Path:
    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "main.tf").write_text(
        f"""
terraform {{
  backend "http" {{
    address        = "{url}/state"
    lock_address   = "{url}/state/lock"
    unlock_address = "{url}/state/lock"
    lock_method    = "LOCK"
    unlock_method  = "UNLOCK"
  }}
}}

resource "terraform_data" "slow" {{
  input = "slow"
  provisioner "local-exec" {{
    command = "touch {tmp_path}/applying; sleep 2"
  }}
}}
"""
    )
    return workdir


def _terraform(workdir: Path, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    config = tmp_path / "terraformrc"
    config.touch()
    chosen = engine.select_engine(engine.IacBackend.EMBEDDED)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "CHECKPOINT_DISABLE": "1",
        "TF_CLI_CONFIG_FILE": str(config),
        **state.http_retry_environment(60),
    }
    return subprocess.Popen(
        [*chosen.command, f"-chdir={workdir}", *args, "-no-color", "-input=false"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> str:
    out, _ = process.communicate(timeout=120)
    assert 0 == process.returncode, out
    return out


def _outage(proxy: Proxy) -> None:
    proxy.down()
    time.sleep(OUTAGE_SECONDS)
    proxy.up()


def test_http_retry_environment__retries_last_the_given_time() -> None:
    env = state.http_retry_environment(600)
    retries, low, high = (int(env[f"TF_HTTP_RETRY_{name}"]) for name in ("MAX", "WAIT_MIN", "WAIT_MAX"))
    waits = [min(low * 2**n, high) for n in range(retries)]

    assert 600 <= sum(waits) < 600 + high


def test_state_retries__backend_down_at_init_and_lock(backend: Backend, proxy: Proxy, tmp_path: Path) -> None:
    """Connections refused while `init` reads the state, and while `apply` locks and reads it."""
    workdir = _workdir(tmp_path, proxy.url)
    down = threading.Thread(target=_outage, args=(proxy,))
    down.start()
    _finish(_terraform(workdir, tmp_path, "init"))
    _finish(_terraform(workdir, tmp_path, "apply", "-auto-approve"))
    down.join()

    assert backend.data is not None
    assert ["slow"] == [r["name"] for r in json.loads(backend.data)["resources"]]
    assert backend.lock is None


def test_state_retries__backend_down_at_the_state_write_and_unlock(
    backend: Backend, proxy: Proxy, tmp_path: Path
) -> None:
    """Connections refused from the middle of the apply on: the final state write and the unlock."""
    workdir = _workdir(tmp_path, proxy.url)
    _finish(_terraform(workdir, tmp_path, "init"))
    applying = _terraform(workdir, tmp_path, "apply", "-auto-approve")
    wait_for(lambda: (tmp_path / "applying").exists(), 60, "the apply to start")
    _outage(proxy)
    _finish(applying)

    assert backend.data is not None
    assert ["slow"] == [r["name"] for r in json.loads(backend.data)["resources"]]
    assert backend.lock is None
    assert not (workdir / state.ERRORED_STATE).exists()


def test_state_retries__5xx_to_every_method(proxy: Proxy, backend: Backend, tmp_path: Path) -> None:
    """503 to the first requests of GET, POST, LOCK and UNLOCK each: all four are retried."""
    workdir = _workdir(tmp_path, proxy.url)
    _finish(_terraform(workdir, tmp_path, "init"))
    backend.fail_first = FAILURES_PER_METHOD
    _finish(_terraform(workdir, tmp_path, "apply", "-auto-approve"))

    assert {method: FAILURES_PER_METHOD for method in ("GET", "POST", "LOCK", "UNLOCK")} == backend.failed
    assert backend.data is not None
    assert backend.lock is None
