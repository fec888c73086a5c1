"""A runner this orchestrator cannot launch, on a real ``orchestrator serve`` whose process cannot import
``lightkube`` and ``google.auth`` (the ``kubernetes`` extra, and google-auth of the ``cloud`` extra), as if
they were not installed (``tests/support/outages.UNIMPORTABLE_PRELUDE``): the server starts, creates and
updates such runners as any other, says on GET why it cannot launch them, and fails their deployments
with that very message. Runners of the kinds it can launch are unaffected.

One server for the module; each test works in an organization of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from orchestrator.domain.deployments import before_start_message
from tests.support.launchability import RUNNERS
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.outages import ServerProcess
from tests.support.stack import build_stack

pytestmark = pytest.mark.slow

UNIMPORTABLE = ("lightkube", "google.auth")
HINT = "and restart the orchestrator"
KUBERNETES = (
    "this orchestrator cannot launch kubernetes runners: lightkube is not installed: install the "
    f"'kubernetes' extra (pip install 'platform-orchestrator[kubernetes]') {HINT}"
)
GKE = (
    "this orchestrator cannot launch kubernetes-gke runners: lightkube and google-auth are not installed: "
    "install the 'kubernetes' and 'cloud' extras (pip install 'platform-orchestrator[kubernetes,cloud]') "
    + HINT
)


def runner(example: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((RUNNERS / example).read_text())
    return body


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("launchability")
    made = ServerProcess(
        f"sqlite+aiosqlite:///{directory / 'po.db'}", directory / "data", unimportable=UNIMPORTABLE
    )
    made.start()
    yield made
    made.stop()


@contextmanager
def platform_client(server: ServerProcess, org: str) -> Iterator[httpx.Client]:
    """A platform admin's client, with organization ``org`` made."""
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}, timeout=30
    ) as client:
        assert 201 == client.post("/orgs", json={"id": org}).status_code
        yield client


def test_kubernetes_runner__created_and_updated_as_any_other__get_says_why(server: ServerProcess) -> None:
    body = runner("seed001-kubernetes.yaml")
    patch = {"description": "moved", "runner_configuration": {"job": {"namespace": "runners-2"}}}
    with platform_client(server, "created") as client:
        created = client.post("/orgs/created/runners", json={"id": "cluster", **body})
        updated = client.patch("/orgs/created/runners/cluster", json=patch)
        got = client.get("/orgs/created/runners/cluster")
        listed = client.get("/orgs/created/runners")

    assert 201 == created.status_code, created.text
    assert 200 == updated.status_code, updated.text
    # Create and update answer as they do on a server with every extra: no status, no warning.
    for answer in (created.json(), updated.json()):
        assert "status" not in answer
        assert ("orchestrator", []) == (answer["launched_by"], answer["warnings"])
    assert "SECRET" == created.json()["runner_configuration"]["cluster"]["auth"]["client_key_data"]
    assert ("moved", "runners-2") == (
        updated.json()["description"],
        updated.json()["runner_configuration"]["job"]["namespace"],
    )
    assert {"launchable": False, "message": KUBERNETES} == got.json()["status"]
    read = {key: value for key, value in got.json().items() if key != "status"}
    assert {**read, "warnings": []} == updated.json()
    assert ["cluster"] == [item["id"] for item in listed.json()["items"]]


def test_each_kind__launchable_unless_it_needs_what_is_missing(server: ServerProcess) -> None:
    """GKE needs both missing libraries and names both extras; ECS, local and agent runners need
    neither."""
    examples = {
        "gke": "seed000-gke.yaml",
        "ecs": "serverless-ecs.yaml",
        "here": "vm-local.yaml",
        "agent": "seed000-agent.yaml",
    }
    with platform_client(server, "kinds") as client:
        for runner_id, example in examples.items():
            body = runner(example)
            if runner_id == "here":
                # A process run: runtime docker is launchable only where a Docker daemon answers.
                body["runner_configuration"]["job"] = {"runtime": "process"}
            created = client.post("/orgs/kinds/runners", json={"id": runner_id, **body})
            assert 201 == created.status_code, created.text
        statuses = {
            runner_id: client.get(f"/orgs/kinds/runners/{runner_id}").json()["status"]
            for runner_id in examples
        }

    assert {
        "gke": {"launchable": False, "message": GKE},
        "ecs": {"launchable": True},
        "here": {"launchable": True},
        "agent": {"last_seen_at": None},
    } == statuses


def test_deployment_on_it__fails_with_the_message_get_shows(server: ServerProcess, tmp_path: Path) -> None:
    stack = build_stack(server.url, tmp_path, org="deploys", runner=runner("seed001-kubernetes.yaml"))
    try:
        shown = stack.client.get("/orgs/deploys/runners/local").json()["status"]
        finished = stack.deploy()
    finally:
        stack.client.close()

    assert {"launchable": False, "message": KUBERNETES} == shown
    assert "failed" == finished["status"]
    # GET's message, and that no runner was started (issue 22).
    assert before_start_message(f"runner 'local': {KUBERNETES}", "queued") == finished["status_message"]
    assert {"error": "RUNNER_UNAVAILABLE", "message": finished["status_message"]} == finished["error"]
    assert finished.get("launched_at") is None  # nothing was started
    # Failed with a message, no traceback: the server logged none.
    assert "Traceback" not in server.log.read_text()
