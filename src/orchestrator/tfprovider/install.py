"""A filesystem mirror holding this provider, and the Terraform CLI configuration that uses it.

No registry is involved: the mirror's package is a small launcher script that runs this Python
environment's provider, at the address ``registry.terraform.io/stellwerk-labs/platform-orchestrator``,
so configurations written for upstream's provider (``source = "stellwerk-labs/platform-orchestrator"``)
work unchanged. Only the standard library is imported here: ``octl`` loads this without the provider's
dependencies.
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import platform
import re
import shlex
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HOSTNAME = "registry.terraform.io"
NAMESPACE = "stellwerk-labs"
TYPE = "platform-orchestrator"
SOURCE = f"{HOSTNAME}/{NAMESPACE}/{TYPE}"
EXECUTABLE = f"terraform-provider-{TYPE}"

_ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def provider_version() -> str:
    """This package's version, as the mirror's version directory (Terraform wants MAJOR.MINOR.PATCH)."""
    try:
        found = version("platform-orchestrator")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        found = "0.0.0"
    match = re.match(r"\d+\.\d+\.\d+", found)
    return match.group(0) if match else "0.0.0"


def target_platform() -> str:
    """Terraform's name of this machine's platform, e.g. ``linux_amd64``."""
    system = sys.platform if sys.platform != "win32" else "windows"
    machine = platform.machine().lower()
    return f"{system}_{_ARCHES.get(machine, machine)}"


@dataclass(frozen=True)
class Installed:
    mirror: Path
    executable: Path
    version: str

    def cli_configuration(self) -> str:
        """The ``provider_installation`` block that takes this provider from the mirror, others as usual."""
        mirror = str(self.mirror).replace("\\", "/")
        return (
            "provider_installation {\n"
            "  filesystem_mirror {\n"
            f'    path    = "{mirror}"\n'
            f'    include = ["{SOURCE}"]\n'
            "  }\n"
            "  direct {\n"
            f'    exclude = ["{SOURCE}"]\n'
            "  }\n"
            "}\n"
        )


def launcher_script(python: str) -> str:
    return (
        "#!/bin/sh\n"
        "# The platform-orchestrator Terraform provider, run from the Python environment that installed it.\n"
        f'exec {shlex.quote(python)} -m orchestrator.tfprovider.main "$@"\n'
    )


#: What the provider imports when Terraform starts it (each start is a new process).
PROVIDER_PACKAGES = (
    "grpc",
    "google.protobuf",
    "msgpack",
    "cryptography",
    "httpx",
    "httpcore",
    "h11",
    "yaml",
    "orchestrator",
)


def precompile(packages: tuple[str, ...] = PROVIDER_PACKAGES) -> None:
    """Write the bytecode of the provider's imports now, once: Terraform starts the provider several
    times per command, and with ``PYTHONDONTWRITEBYTECODE`` set (or a read-only environment) each start
    would compile them again (about three times the start-up's CPU). Unwritable places are left alone."""
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(location, quiet=2, workers=1)


def install(directory: Path, *, python: str | None = None) -> Installed:
    """Write the mirror under ``directory`` (created if missing); an existing package is replaced."""
    release = provider_version()
    package = directory.resolve() / HOSTNAME / NAMESPACE / TYPE / release / target_platform()
    package.mkdir(parents=True, exist_ok=True)
    executable = package / f"{EXECUTABLE}_v{release}"
    temporary = executable.with_name(executable.name + ".tmp")
    temporary.write_text(launcher_script(python or sys.executable), encoding="utf-8")
    temporary.chmod(0o755)
    os.replace(temporary, executable)
    precompile()
    return Installed(mirror=directory.resolve(), executable=executable, version=release)
