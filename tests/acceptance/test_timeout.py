"""A deployment whose runner does not report within the deployment timeout fails, and its run is stopped."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.domain.deployments import TIMEOUT_MESSAGE
from orchestrator.settings import ServerSettings
from tests.support.demo_modules import make_slow
from tests.support.stack import build_stack, demo_manifest, running_server

pytestmark = pytest.mark.slow


@pytest.fixture
def short_timeout_server(settings: ServerSettings) -> Iterator[str]:
    def make(port: int) -> ServerSettings:
        return settings.model_copy(
            update={
                "listen": f"127.0.0.1:{port}",
                "public_url": f"http://127.0.0.1:{port}",
                "status_check_interval_seconds": 0.5,
                "deployment_timeout_seconds": 3.0,
            }
        )

    with running_server(make) as url:
        yield url


def test_timeout__fails_with_a_message_and_stops_the_runner(
    short_timeout_server: str, settings: ServerSettings, tmp_path: Path
) -> None:
    stack = build_stack(short_timeout_server, tmp_path)
    make_slow(stack, seconds=60)
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": demo_manifest()},
    ).json()
    finished = stack.wait(created["id"], timeout=60)
    # The local launcher's handle: local:<host>:<pid>:<start ticks>:<run dir>
    pid = int((settings.local_runs_dir / created["id"] / "runner.pid").read_text().split(":")[2])
    stack.client.close()

    assert "failed" == finished["status"]
    assert TIMEOUT_MESSAGE == finished["status_message"]
    assert "TIMEOUT" == finished["error"]["error"]
    assert _gone_within(pid, seconds=30), f"runner process {pid} still running"


def _gone_within(pid: int, *, seconds: float) -> bool:
    """Whether ``pid`` ends within ``seconds`` (the dispatcher stops it after failing the deployment)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False
