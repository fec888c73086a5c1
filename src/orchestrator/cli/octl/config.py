"""The ``octl`` config file: ``{api_url, default_org_id, token, ca_file}`` in YAML, written with mode 0600.

Where it is: ``$OCTL_CONFIG`` if set, else ``$XDG_CONFIG_HOME/octl/config.yaml``, else
``~/.config/octl/config.yaml``. Values in it come last: a flag wins over its environment variable,
which wins over the file.

Profiles: the top-level keys are the profile ``default`` (the file upstream's CLI writes); others live
under ``profiles: {NAME: {api_url, default_org_id, token}}``, and ``current_profile`` names the one in
use (``octl config use NAME``; ``--profile``/``OCTL_PROFILE`` for one command)::

    api_url: http://127.0.0.1:8080
    current_profile: prod
    profiles:
      prod: {api_url: https://po.example.com, default_org_id: acme, token: po_...}
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
KEYS = ("api_url", "default_org_id", "token", "ca_file")
#: The profile of the top-level keys.
DEFAULT_PROFILE = "default"
CURRENT_KEY = "current_profile"
PROFILES_KEY = "profiles"


class ConfigFileError(Exception):
    """The config file cannot be read or written."""


@dataclass
class Config:
    """The values of one profile, and the rest of the file (kept as it is on save)."""

    api_url: str | None = None
    default_org_id: str | None = None
    token: str | None = None
    #: A PEM file of the CA (or the certificate itself) the API's certificate is verified with.
    ca_file: str | None = None
    #: Keys this version does not know (e.g. upstream's ``disable_version_check``), kept on save.
    other: dict[str, Any] = field(default_factory=dict)
    #: The profile these values are of.
    profile: str = DEFAULT_PROFILE
    #: The named profiles (not ``default``) as in the file, and the one the file says is in use.
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    current_profile: str | None = None
    #: The ``default`` profile's values when another profile is loaded (kept on save).
    defaults: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The values of this profile (what ``config show`` prints)."""
        known = {k: getattr(self, k) for k in KEYS if getattr(self, k) is not None}
        return {**known, **(self.other if self.profile == DEFAULT_PROFILE else {})}

    def document(self) -> dict[str, Any]:
        """The whole file with this profile's values in their place."""
        known = {k: getattr(self, k) for k in KEYS if getattr(self, k) is not None}
        profiles = dict(self.profiles)
        top: dict[str, Any] = {}
        if self.profile == DEFAULT_PROFILE:
            top.update(known)
        else:
            top.update(self.defaults)
            profiles[self.profile] = known
        top.update(self.other)
        if self.current_profile and self.current_profile != DEFAULT_PROFILE:
            top[CURRENT_KEY] = self.current_profile
        if profiles:
            top[PROFILES_KEY] = profiles
        return top

    def names(self) -> list[str]:
        return [DEFAULT_PROFILE, *sorted(self.profiles)]


def path_from(environ: Mapping[str, str]) -> Path:
    """The config file path the environment selects."""
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "octl" / "config.yaml"


def load(path: Path, profile: str | None = None) -> Config:
    """The values of ``profile`` (default: the file's ``current_profile``) in ``path``; a missing file or
    profile is an empty config."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config(profile=profile or DEFAULT_PROFILE)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"cannot read the config file {path}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"the config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return Config(profile=profile or DEFAULT_PROFILE)
    if not isinstance(data, dict):
        raise ConfigFileError(f"the config file {path} must be a mapping of settings")
    profiles = data.get(PROFILES_KEY) or {}
    current = data.get(CURRENT_KEY)
    if not isinstance(profiles, dict) or not all(isinstance(v, dict | None) for v in profiles.values()):
        raise ConfigFileError(f"the config file {path}: {PROFILES_KEY} must map names to settings")
    if current is not None and not isinstance(current, str):
        raise ConfigFileError(f"the config file {path}: {CURRENT_KEY} must be a string")
    selected = profile or current or DEFAULT_PROFILE
    source = data if selected == DEFAULT_PROFILE else (profiles.get(selected) or {})
    values: dict[str, str | None] = {}
    for key in KEYS:
        value = source.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigFileError(f"the config file {path}: {key} must be a string")
        values[key] = value or None
    return Config(
        **values,
        other={k: v for k, v in data.items() if k not in (*KEYS, CURRENT_KEY, PROFILES_KEY)},
        profile=selected,
        profiles={str(k): dict(v or {}) for k, v in profiles.items()},
        current_profile=current,
        defaults={k: data[k] for k in KEYS if data.get(k) is not None},
    )


def save(path: Path, config: Config) -> None:
    """Write ``config`` to ``path`` atomically, readable by the owner only (it may hold a token)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # mkstemp creates the file with mode 0600, so the token is never readable by others, not even briefly.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".yaml")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                yaml.safe_dump(config.document(), out, sort_keys=False, default_flow_style=False)
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
