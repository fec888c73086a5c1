"""Rolling an environment's Terraform state back through ``octl``, end to end.

Everything is real: the server under uvicorn with its dispatcher, a ``vm`` runner with a ``local``
connection (each deployment a ``po-runner standard`` process running the embedded Terraform engine), and
the state kept by the orchestrator (Terraform's ``http`` backend). The module makes as many
``terraform_data`` resources as its ``items`` parameter says: v1 of the manifest one, v2 two. After
``octl state rollback`` to v1's state version, deploying v2 again adds one resource: its plan read the
older state (without the rollback it would change nothing).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.settings import ServerSettings
from tests.support.docs import Shell, commands, docs_example
from tests.support.octl import ORG, OctlProcess, Ran, org_admin_token, serve
from tests.support.orgs import BOOTSTRAP_TOKEN

pytestmark = pytest.mark.slow

MODULE_CODE = """\
variable "items" {
  type = string
}

resource "terraform_data" "item" {
  count = tonumber(var.items)
  input = "item-${count.index}"
}

output "items" {
  value = join(",", terraform_data.item[*].output)
}
"""
CREATED = re.compile(r"Deployment ([0-9a-f-]{36}) created")


def _ok(result: Ran) -> Ran:
    assert 0 == result.exit_code, result.output
    return result


@dataclass
class Platform:
    octl: OctlProcess
    tmp_path: Path

    def manifest(self, items: int) -> Path:
        path = self.tmp_path / f"manifest-{items}.yaml"
        workload = {
            "resources": {"things": {"type": "things", "params": {"items": str(items)}}},
            "outputs": {"items": "${resources.things.outputs.items}"},
        }
        path.write_text(yaml.safe_dump({"workloads": {"app": workload}}))
        return path

    def deploy(self, items: int) -> tuple[str, Ran]:
        """Deploy the manifest of ``items`` resources; the deployment's id and octl's run."""
        result = _ok(self.octl("deploy", "shop", "dev", str(self.manifest(items)), "--yes"))
        found = CREATED.search(result.stderr)
        assert found is not None, result.stderr
        return found.group(1), result

    def versions(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = json.loads(
            _ok(self.octl("get", "state-versions", "shop", "dev", "-o", "json")).stdout
        )
        return listed


@pytest.fixture
def platform(settings: ServerSettings, tmp_path: Path) -> Iterator[Platform]:
    """Project ``shop``, environment ``dev``, a local vm runner keeping state in the orchestrator, and a
    module of ``items`` terraform_data resources: all made with octl."""
    tf_config = tmp_path / "terraform.rc"
    tf_config.write_text("")
    runner = {
        "runner_configuration": {
            "type": "vm",
            "connection": {"type": "local"},
            "job": {
                "environment": {
                    "IAC_BACKEND": "embedded",
                    "TF_CLI_CONFIG_FILE": str(tf_config),
                    "CHECKPOINT_DISABLE": "1",
                }
            },
        },
        "state_storage_configuration": {"type": "orchestrator"},
    }
    module = {
        "resource_type": "things",
        "module_source": "inline",
        "module_source_code": MODULE_CODE,
        "module_params": {"items": {"type": "string"}},
    }
    schema = {"output_schema": {"type": "object", "properties": {"items": {"type": "string"}}}}
    with serve(settings, status_check_interval_seconds=0.5) as base_url:
        octl = OctlProcess(
            base_url=base_url, token=org_admin_token(base_url), config_path=tmp_path / "octl.yaml"
        )
        # A runner with a local connection is the platform admin's to create.
        platform_octl = OctlProcess(
            base_url=base_url, token=BOOTSTRAP_TOKEN, config_path=tmp_path / "octl-platform.yaml"
        )
        _ok(platform_octl("create", "runner", "local", "--set-json", json.dumps(runner)))
        for args in (
            ("create", "env-type", "development"),
            ("create", "project", "shop"),
            ("create", "env", "shop", "dev", "--set", "env_type_id=development"),
            ("create", "runner-rule", "--set", "runner_id=local"),
            ("create", "resource-type", "things", "--set-json", json.dumps(schema)),
            ("create", "module", "things", "--set-json", json.dumps(module)),
            ("create", "module-rule", "--set", "module_id=things"),
        ):
            _ok(octl(*args))
        yield Platform(octl=octl, tmp_path=tmp_path)


def test_state_rollback__a_redeploy_plans_against_the_older_state(platform: Platform) -> None:
    octl = platform.octl
    v1, first = platform.deploy(1)
    v1_version = max(v["version"] for v in platform.versions() if v.get("deployment_id") == v1)
    v2, second = platform.deploy(2)
    before = platform.versions()

    rolled = _ok(octl("state", "rollback", "shop", "dev", str(v1_version), "--yes"))
    after = platform.versions()
    pulled = json.loads(_ok(octl("state", "pull", "shop", "dev")).stdout)
    again, redeploy = platform.deploy(2)
    final = platform.versions()

    assert "Resources: 1 added, 0 changed, 0 removed." in first.stderr
    assert "Resources: 1 added, 0 changed, 0 removed." in second.stderr
    current = before[0]
    assert (True, "terraform", v2, 2) == (
        current["current"],
        current["kind"],
        current["deployment_id"],
        current["resources"],
    )
    assert f"State of shop/dev rolled back to version {v1_version}: " in rolled.stderr
    rollback = after[0]
    assert {
        "version": current["version"] + 1,
        "current": True,
        "kind": "rollback",
        "rolled_back_from": v1_version,
        "serial": current["serial"] + 1,
        "lineage": current["lineage"],
        "resources": 1,
    }.items() <= rollback.items()
    assert "deployment_id" not in rollback
    # terraform_data keeps its dynamic input with its type.
    assert ["item-0"] == [
        i["attributes"]["input"]["value"] for r in pulled["resources"] for i in r["instances"]
    ]
    assert rollback["serial"] == pulled["serial"]
    # The redeploy of v2 planned against v1's state: it adds the second resource again.
    assert "Resources: 1 added, 0 changed, 0 removed." in redeploy.stderr, redeploy.stderr
    assert {"app": {"items": "item-0,item-1"}} == yaml.safe_load(redeploy.stdout)
    assert (again, 2, "terraform") == (final[0]["deployment_id"], final[0]["resources"], final[0]["kind"])
    assert final[0]["serial"] > rollback["serial"]


@pytest.mark.timeout(600)
def test_docs__the_state_versions_page_commands_run_as_printed(platform: Platform, tmp_path: Path) -> None:
    """docs/guides/state-versions.md's block in a shell, as the organization's admin, on shop/dev after
    two deployments: the listings, both pulls (the second to a file of mode 0600), the rollback to 1."""
    platform.deploy(1)
    platform.deploy(2)
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PO_API_URL": platform.octl.base_url,
        "PO_AUTH_TOKEN": platform.octl.token,
        "PO_ORG_ID": ORG,
        "OCTL_CONFIG": str(tmp_path / "octl.yaml"),
    }
    shell = Shell(cwd=work, env=env, state=tmp_path)
    listing, wide, pull, pull_one, rollback = commands(docs_example("guides/state-versions"))

    assert "Version" in shell.run(listing).stdout.splitlines()[0]
    assert "RolledBackFrom" in shell.run(wide).stdout.splitlines()[0]
    shell.run(pull)
    assert json.loads((work / "dev.tfstate").read_text())["serial"] == platform.versions()[0]["serial"]
    shell.run(pull_one)
    assert 0o600 == (work / "dev.tfstate").stat().st_mode & 0o777
    rolled = shell.run(rollback)
    assert "rolled back to version 1" in rolled.stderr
    assert (True, "rollback", 1) == (
        platform.versions()[0]["current"],
        platform.versions()[0]["kind"],
        platform.versions()[0]["rolled_back_from"],
    )
