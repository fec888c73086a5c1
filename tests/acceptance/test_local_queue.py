"""Local runs queue per host (PO_LOCAL_RUN_LIMIT): a deployment beyond the limit stays executing, its status
message saying it is queued, starts once a run slot is free, and its place survives a restart of the server
(the queue is the pending deployments in the database)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.demo_modules import make_slow
from tests.support.outages import ServerProcess
from tests.support.stack import Stack, build_stack, demo_manifest

pytestmark = pytest.mark.slow


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    made = ServerProcess(database_url, tmp_path / "data", PO_LOCAL_RUN_LIMIT="1")
    made.start()
    yield made
    made.stop()


def _create(stack: Stack, env: str) -> str:
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={"project_id": "shop", "env_id": env, "mode": "deploy", "manifest": demo_manifest(env)},
    )
    assert 201 == created.status_code, created.text
    deployment_id: str = created.json()["id"]
    return deployment_id


def _get(stack: Stack, deployment_id: str) -> dict[str, Any]:
    response = stack.client.get(f"/orgs/{stack.org}/deployments/{deployment_id}")
    assert 200 == response.status_code, response.text
    found: dict[str, Any] = response.json()
    return found


def _until(stack: Stack, deployment_id: str, what: str, check: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        found = _get(stack, deployment_id)
        if check(found):
            return found
        assert time.monotonic() < deadline, f"{what}: {found}"
        time.sleep(0.1)


def test_local_queue__a_run_beyond_the_limit_waits_queued_through_a_restart(
    server: ServerProcess, tmp_path: Path
) -> None:
    stack = build_stack(server.url, tmp_path)
    make_slow(stack, seconds=10)
    assert (
        201
        == stack.client.post(
            f"/orgs/{stack.org}/projects/shop/envs", json={"id": "qa", "env_type_id": "development"}
        ).status_code
    )
    first = _create(stack, "dev")
    _until(stack, first, "the first run was never launched", lambda d: d.get("launched_at") is not None)

    second = _create(stack, "qa")
    queued = _until(stack, second, "never said queued", lambda d: d["status_message"].startswith("Queued:"))
    assert queued["status"] == "executing" and queued.get("launched_at") is None, queued
    assert "1 local run slots" in queued["status_message"], queued["status_message"]

    # The queue is the database's: a restart keeps the second waiting while the first run goes on.
    server.kill()
    server.start()
    time.sleep(1)
    still = _get(stack, second)
    assert still.get("launched_at") is None and still["status_message"].startswith("Queued:"), still

    done_first = stack.wait(first)
    done_second = stack.wait(second)
    stack.client.close()

    assert "succeeded" == done_first["status"], done_first["status_message"]
    assert "succeeded" == done_second["status"], done_second["status_message"]
    # Launched only once the first had completed, with the usual message from then on.
    launched = datetime.fromisoformat(done_second["launched_at"])
    assert launched >= datetime.fromisoformat(done_first["completed_at"]), (done_first, done_second)
    assert not done_second["status_message"].startswith("Queued:"), done_second["status_message"]
