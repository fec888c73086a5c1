"""Variants of the demo module (examples/demo/module.yaml) for deployments that take a while or leave
traces on disk: ``make_slow`` patches a stack's module with a provisioner that sleeps, ``marker_module``
is a module whose resources leave markers once created."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.stack import EXAMPLES, Stack

SLOW_MODULE = yaml.safe_load((EXAMPLES / "module.yaml").read_text())
SLOW_MODULE["module_source_code"] = SLOW_MODULE["module_source_code"].replace(
    'input = "bucket-${var.name}"',
    'input = "bucket-${var.name}"\n  provisioner "local-exec" {\n    command = "sleep 4"\n  }',
)


def make_slow(stack: Stack, seconds: int = 4) -> None:
    """The demo module with a provisioner that sleeps: the deployment stays executing for a while."""
    code = SLOW_MODULE["module_source_code"].replace("sleep 4", f"sleep {seconds}")
    patched = stack.client.patch(f"/orgs/{stack.org}/modules/demo-app", json={"module_source_code": code})
    assert 200 == patched.status_code, patched.text


def marker_module(markers: Path, *, count: int, sleep_seconds: float) -> str:
    """Resources whose creation leaves a marker (``created-<id>``) once their provisioner finished."""
    create = (
        f"touch {markers}/started-${{self.id}}; sleep {sleep_seconds}; touch {markers}/created-${{self.id}}"
    )
    return f"""
variable "name" {{
  type = string
}}

resource "terraform_data" "item" {{
  count = {count}
  input = "${{var.name}}-${{count.index}}"
  provisioner "local-exec" {{
    command = "{create}"
  }}
  provisioner "local-exec" {{
    when    = destroy
    command = "rm -f {markers}/created-${{self.id}}"
  }}
}}

output "url" {{
  value = "https://${{var.name}}.example.test/${{length(terraform_data.item)}}"
}}

output "bucket" {{
  value = terraform_data.item[0].output
}}
"""
