"""The generated reference pages of the docs site (docs/reference/: the CLI, configuration, the Terraform
provider, the HTTP API) are what scripts/docs_reference.py makes of the code now: regenerated into a
temporary directory, each must equal the committed file. After a change to a click command, a setting, the
provider's schema or the API: `python scripts/docs_reference.py` (or `scripts/docs build`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
GENERATED = ["cli-octl.md", "cli-orchestrator.md", "cli-po-runner.md", "configuration.md"]
GENERATED += ["terraform-provider.md", "http-api.md", "openapi.json"]


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("reference")
    # Another home and working directory: the pages must not depend on the machine's paths.
    env = {**os.environ, "HOME": str(target), "COLUMNS": "57", "TMPDIR": str(target)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docs_reference.py"), str(target)],
        cwd=target,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert 0 == done.returncode, done.stderr
    return target


def test_generator__writes_each_page_and_nothing_else(regenerated: Path) -> None:
    assert sorted(GENERATED) == sorted(p.name for p in regenerated.iterdir())


@pytest.mark.parametrize("name", GENERATED)
def test_committed_page__equals_what_the_code_generates_now(regenerated: Path, name: str) -> None:
    committed = (REFERENCE / name).read_text(encoding="utf-8")
    assert (regenerated / name).read_text(encoding="utf-8") == committed, (
        f"docs/reference/{name} drifted from the code: run `python scripts/docs_reference.py`"
    )


def test_pages__name_every_command_setting_resource_and_operation(regenerated: Path) -> None:
    """Spot checks that the generator walks everything, not only the first level."""
    from orchestrator.cli.octl import main as octl
    from orchestrator.settings import ServerSettings

    octl_page = (regenerated / "cli-octl.md").read_text()
    for group in ("create", "get", "delete", "config", "terraform"):
        command = octl.commands[group]
        assert f"## `octl {group}`" in octl_page
        if hasattr(command, "commands"):
            for name in command.commands:
                assert f"## `octl {group} {name}`" in octl_page, f"octl {group} {name}"
    configuration = (regenerated / "configuration.md").read_text()
    for name in ServerSettings.model_fields:
        assert name.upper() in configuration, name
    assert "### `platform-orchestrator_vm_runner`" in (regenerated / "terraform-provider.md").read_text()
    api = (regenerated / "http-api.md").read_text()
    assert "### POST `/orgs/{org_id}/deployments`" in api
    assert "### Schema Error" in api
