"""The manifest ``octl deploy`` sends: a YAML or JSON file, or standard input (``-``).

Its shape (``workloads``, ``shared``) is checked here only at the top level; the server validates the
rest and names the field that is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

import yaml

from orchestrator.cli.octl import inputs
from orchestrator.cli.octl.inputs import InputError

TOP_LEVEL_KEYS = ("workloads", "shared")


def read(source: str, stdin: TextIO) -> dict[str, Any]:
    """The manifest at ``source`` (a path, or ``-`` for standard input, which must not be a terminal)."""
    if source == "-":
        if stdin.isatty():
            raise InputError("MANIFEST: '-' reads standard input, but it is a terminal; pipe the manifest in")
        text, name = stdin.read(), "standard input"
    else:
        path = Path(source).expanduser()
        text, name = inputs.read_file("MANIFEST", path), str(path)
    return parse(text, name)


def parse(text: str, name: str) -> dict[str, Any]:
    """A manifest document (JSON is YAML too); ``name`` says where it came from in errors."""
    try:
        data = inputs.load_yaml(text)
    except yaml.YAMLError as exc:
        raise InputError(
            f"the manifest in {name} is not valid YAML or JSON: {inputs.yaml_error(exc)}"
        ) from exc
    if data is None or data == {}:
        raise InputError(
            f"the manifest in {name} is empty: deploying it would remove every resource of the environment. "
            "To remove them all on purpose, deploy a manifest of `workloads: {}` (octl asks first on a "
            "terminal), or delete the environment with `octl delete env PROJECT ENV`"
        )
    if not isinstance(data, dict):
        raise InputError(
            f"the manifest in {name} must be a mapping with workloads and shared, not {type(data).__name__}"
        )
    unknown = sorted(str(key) for key in data if key not in TOP_LEVEL_KEYS)
    if unknown:
        raise InputError(
            f"the manifest in {name} has unknown top-level keys: {', '.join(unknown)} "
            f"(expected {' and '.join(TOP_LEVEL_KEYS)})"
        )
    return {
        "workloads": data.get("workloads") or {},
        **({"shared": data["shared"]} if "shared" in data else {}),
    }
