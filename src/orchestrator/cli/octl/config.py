"""The ``octl`` config file: ``{api_url, default_org_id, token}`` in YAML, written with mode 0600.

Where it is: ``$OCTL_CONFIG`` if set, else ``$XDG_CONFIG_HOME/octl/config.yaml``, else
``~/.config/octl/config.yaml``. Values in it come last: a flag wins over its environment variable,
which wins over the file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CONFIG_ENV = "OCTL_CONFIG"
KEYS = ("api_url", "default_org_id", "token")


class ConfigFileError(Exception):
    """The config file cannot be read or written."""


@dataclass
class Config:
    api_url: str | None = None
    default_org_id: str | None = None
    token: str | None = None
    #: Keys this version does not know (e.g. upstream's ``disable_version_check``), kept on save.
    other: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        known = {k: getattr(self, k) for k in KEYS if getattr(self, k) is not None}
        return {**known, **self.other}


def path_from(environ: Mapping[str, str]) -> Path:
    """The config file path the environment selects."""
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "octl" / "config.yaml"


def load(path: Path) -> Config:
    """The config in ``path``; a missing file is an empty config."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"cannot read the config file {path}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"the config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return Config()
    if not isinstance(data, dict):
        raise ConfigFileError(f"the config file {path} must be a mapping of settings")
    values: dict[str, str | None] = {}
    for key in KEYS:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigFileError(f"the config file {path}: {key} must be a string")
        values[key] = value or None
    return Config(**values, other={k: v for k, v in data.items() if k not in KEYS})


def save(path: Path, config: Config) -> None:
    """Write ``config`` to ``path`` atomically, readable by the owner only (it may hold a token)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # mkstemp creates the file with mode 0600, so the token is never readable by others, not even briefly.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".yaml")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                yaml.safe_dump(config.as_dict(), out, sort_keys=False, default_flow_style=False)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ConfigFileError(f"cannot write the config file {path}: {exc}") from exc


def mask(token: str) -> str:
    """A token as ``config show`` prints it: enough to recognize it, not enough to use it."""
    if len(token) <= 12:
        return "****"
    return f"{token[:6]}****{token[-2:]}"
