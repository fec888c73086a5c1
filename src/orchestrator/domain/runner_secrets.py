"""Sensitive values of a runner configuration: kept apart from it, answered as the placeholder ``SECRET``.

A configuration is stored as its public form, with ``"SECRET"`` at each sensitive path that has a value,
plus a secrets dict keyed by dotted path (``cluster.auth.client_key_data``, ``job.secrets.DB_PASSWORD``).
Sending ``"SECRET"`` back on update means "keep the stored value"; :func:`keep_existing_secrets` resolves it
*before* the configuration is validated, so that validators (a PEM key, say) see the real value.

All functions take and return plain JSON dicts and never modify their arguments.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final

from orchestrator.domain.runner_types import SECRET_PLACEHOLDER, RunnerType
from orchestrator.errors import InvalidInputError

__all__ = [
    "SECRET",
    "SENSITIVE_PATHS",
    "keep_existing_secrets",
    "restore_secrets",
    "sensitive_paths",
    "split_secrets",
]

SECRET: Final = SECRET_PLACEHOLDER

#: Dotted paths of the sensitive values per runner type; ``*`` stands for every key of a mapping.
#: Agent keys are public keys and ECS ``job.secrets`` hold ARNs, so those types have none.
SENSITIVE_PATHS: Final[Mapping[RunnerType, tuple[str, ...]]] = MappingProxyType(
    {
        RunnerType.KUBERNETES: (
            "cluster.auth.client_certificate_data",
            "cluster.auth.client_key_data",
            "cluster.auth.service_account_token",
        ),
        RunnerType.KUBERNETES_AGENT: (),
        RunnerType.KUBERNETES_AKS: (),
        RunnerType.KUBERNETES_EKS: (),
        RunnerType.KUBERNETES_GKE: (),
        RunnerType.SERVERLESS_ECS: (),
        RunnerType.VM: (
            "connection.private_key",
            "job.secrets.*",
        ),
    }
)


def sensitive_paths(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The path patterns for the configuration's ``type``; ValueError for a missing or unknown type."""
    kind = config.get("type")
    if not isinstance(kind, str) or kind not in set(RunnerType):
        raise ValueError(f"not a runner configuration of a known type: {kind!r}")
    return SENSITIVE_PATHS[RunnerType(kind)]


def _locations(
    config: dict[str, Any], patterns: tuple[str, ...]
) -> Iterator[tuple[dict[str, Any], str, str]]:
    """(parent dict, key, dotted path) of every sensitive value present (not None) in ``config``."""
    for pattern in patterns:
        parents: list[tuple[dict[str, Any], tuple[str, ...]]] = [(config, ())]
        *steps, last = pattern.split(".")
        for step in steps:
            nxt: list[tuple[dict[str, Any], tuple[str, ...]]] = []
            for parent, path in parents:
                keys = list(parent) if step == "*" else [step]
                for key in keys:
                    child = parent.get(key)
                    if isinstance(child, dict):
                        nxt.append((child, (*path, key)))
            parents = nxt
        for parent, path in parents:
            keys = list(parent) if last == "*" else [last]
            for key in keys:
                if parent.get(key) is not None:
                    yield parent, key, ".".join((*path, key))


def split_secrets(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(public configuration with ``"SECRET"`` at each sensitive value, secrets keyed by dotted path)."""
    public = copy.deepcopy(dict(config))
    secrets: dict[str, str] = {}
    for parent, key, path in list(_locations(public, sensitive_paths(public))):
        value = parent[key]
        if not isinstance(value, str):
            raise ValueError(f"sensitive value at {path} is not a string")
        if value == SECRET:
            raise InvalidInputError(
                f"runner_configuration.{path}: the placeholder '{SECRET}' is not a value to store"
            )
        secrets[path] = value
        parent[key] = SECRET
    return public, secrets


def restore_secrets(public: Mapping[str, Any], secrets: Mapping[str, str]) -> dict[str, Any]:
    """The inverse of :func:`split_secrets`: every ``"SECRET"`` at a sensitive path gets its stored value."""
    full = copy.deepcopy(dict(public))
    for parent, key, path in list(_locations(full, sensitive_paths(full))):
        if parent[key] == SECRET:
            if path not in secrets:
                raise KeyError(f"no stored secret for {path}")
            parent[key] = secrets[path]
    return full


def keep_existing_secrets(
    new_config: Mapping[str, Any], old_secrets: Mapping[str, str], *, prefix: str = "runner_configuration"
) -> dict[str, Any]:
    """Replace ``"SECRET"`` at sensitive paths of an incoming configuration by the stored values.

    A placeholder with no stored value is an :class:`InvalidInputError` naming the field.
    """
    full = copy.deepcopy(dict(new_config))
    try:
        patterns = sensitive_paths(full)
    except ValueError:
        return full  # not a known type: validation refuses it, naming ``type``
    for parent, key, path in list(_locations(full, patterns)):
        if parent[key] != SECRET:
            continue
        stored = old_secrets.get(path)
        if stored is None or stored == SECRET:
            field = f"{prefix}.{path}" if prefix else path
            message = f"the placeholder '{SECRET}' keeps a stored value, but none is stored"
            raise InvalidInputError(
                f"{field}: {message}", details={"errors": [{"field": field, "message": message}]}
            )
        parent[key] = stored
    return full
