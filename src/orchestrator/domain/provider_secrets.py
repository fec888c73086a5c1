"""Credentials in module providers' ``configuration``: recognised by their key, never answered in clear.

A provider configuration (``{"region": "eu-west-1", "secret_key": "..."}``) may hold credentials. A value
is *secret* when it is a literal (a string with no ``${...}`` reference, or a number) under a key that
names a credential (:func:`is_sensitive_key`: ``secret_key``, ``client_secret``, ``token``, ``password``,
``api_key``, ...), or anywhere inside the value of such a key. References (``${var.KEY}``,
``${context.KEY}``) are not credentials and stay visible; booleans and nulls too.

- The API answers every secret value as ``"SECRET"``, to every role (:func:`public_configuration`); the
  whole configuration is sealed at rest. Sending ``"SECRET"`` back on update keeps the stored value
  (:func:`keep_existing`), as for runner secrets.
- The compiler moves secret values out of ``main.tf`` (which viewers read) into a variables file of the
  bundle (:func:`extract_secrets`).

Stdlib only; functions never modify their arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final, Protocol

from orchestrator.domain.catalogue import ModuleProvider
from orchestrator.domain.runner_types import SECRET_PLACEHOLDER
from orchestrator.errors import InvalidInputError

__all__ = [
    "SECRET",
    "extract_secrets",
    "is_secret_value",
    "is_sensitive_key",
    "keep_existing",
    "open_configuration",
    "public_configuration",
    "seal_configuration",
    "sealing_context",
]

SECRET: Final = SECRET_PLACEHOLDER
#: Parts of a key name that make it name a credential (anywhere in the name).
_SENSITIVE_WORDS: Final = (
    "secret",
    "password",
    "passwd",
    "passphrase",
    "token",
    "credential",
    "private",
    "certificate",
    "apikey",
    "accesskey",
    "signature",
)
#: Words of a key name (split at ``_``, ``-``, ``.``) that make it name a credential.
_SENSITIVE_PARTS: Final = frozenset({"key", "keys", "pat", "pem", "pfx", "auth", "cert", "jwt", "sas"})
_REFERENCE: Final = re.compile(r"\$\{[^{}]+\}")
_BLOCK_INDEX: Final = re.compile(r"\[\d+\]$")
_NOT_IDENTIFIER: Final = re.compile(r"[^A-Za-z0-9_]+")


def sealing_context(org_id: str, provider_type: str, provider_id: str) -> str:
    """The SecretBox context of a provider's sealed configuration (binds the ciphertext to its row)."""
    return f"module-provider:{org_id}/{provider_type}.{provider_id}"


class Box(Protocol):
    """What seals at rest (``secretbox.SecretBox``)."""

    def seal(self, plaintext: bytes, *, context: str) -> str: ...

    def open(self, token: str, *, context: str) -> bytes: ...


def seal_configuration(
    box: Box, org_id: str, provider_type: str, provider_id: str, configuration: Mapping[str, Any]
) -> tuple[dict[str, Any], str]:
    """(the configuration as answered, the whole configuration sealed)."""
    sealed = box.seal(
        json.dumps(dict(configuration)).encode(), context=sealing_context(org_id, provider_type, provider_id)
    )
    return public_configuration(configuration), sealed


def open_configuration(box: Box, provider: ModuleProvider) -> dict[str, Any]:
    """The whole configuration of a provider (a row from before sealing holds it in clear)."""
    if provider.configuration_sealed is None:
        return dict(provider.configuration)
    context = sealing_context(provider.org_id, provider.provider_type, provider.id)
    opened: dict[str, Any] = json.loads(box.open(provider.configuration_sealed, context=context))
    return opened


def is_sensitive_key(name: str) -> bool:
    """Does the key name a credential (``secret_key``, ``client_secret``, ``token``, ``api_key``, ...)?"""
    lowered = _BLOCK_INDEX.sub("", name).lower()
    if any(word in lowered for word in _SENSITIVE_WORDS):
        return True
    return any(part in _SENSITIVE_PARTS for part in re.split(r"[_\-.]+", lowered))


def is_secret_value(value: Any) -> bool:
    """A literal a credential could be: a string without any ``${...}`` reference, or a number."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, str):
        return value != SECRET and not _REFERENCE.search(value)
    return isinstance(value, int | float)


def _walk(value: Any, sensitive: bool, leaf: Any) -> Any:
    """``value`` with ``leaf(path_value)`` applied to each secret leaf (those under a sensitive key)."""
    if isinstance(value, Mapping):
        return {k: _walk(v, sensitive or is_sensitive_key(str(k)), leaf) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(item, sensitive, leaf) for item in value]
    if sensitive and is_secret_value(value):
        return leaf(value)
    return value


def public_configuration(configuration: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration as answered: ``"SECRET"`` for every secret value."""
    masked: dict[str, Any] = _walk(dict(configuration), False, lambda _value: SECRET)
    return masked


def _paths(value: Any, path: str) -> dict[str, Any]:
    """Every leaf of ``value`` by its dotted path (list items as ``[N]``)."""
    if isinstance(value, Mapping):
        found: dict[str, Any] = {}
        for key, child in value.items():
            found |= _paths(child, f"{path}.{key}" if path else str(key))
        return found
    if isinstance(value, list):
        found = {}
        for index, child in enumerate(value):
            found |= _paths(child, f"{path}[{index}]")
        return found
    return {path: value}


def keep_existing(
    new: Mapping[str, Any], stored: Mapping[str, Any] | None, *, prefix: str = "configuration"
) -> dict[str, Any]:
    """``new`` with each ``"SECRET"`` replaced by the stored value at its path; an InvalidInputError naming
    the field for a ``"SECRET"`` with no stored value there (on create nothing is stored)."""
    known = _paths(stored or {}, "")

    def resolve(value: Any, path: str) -> Any:
        if isinstance(value, Mapping):
            return {k: resolve(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(item, f"{path}[{index}]") for index, item in enumerate(value)]
        if value != SECRET:
            return value
        if path not in known or known[path] == SECRET:
            field = f"{prefix}.{path}"
            message = f"the placeholder '{SECRET}' keeps a stored value, but none is stored"
            raise InvalidInputError(
                f"{field}: {message}", details={"errors": [{"field": field, "message": message}]}
            )
        return known[path]

    resolved: dict[str, Any] = resolve(dict(new), "")
    return resolved


def extract_secrets(
    provider_type: str, provider_id: str, configuration: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the configuration with each secret value replaced by ``${var.NAME}``, the values by NAME).

    Names are ``po_<type>_<id>_<path>`` in identifier characters, unique within the configuration.
    """
    values: dict[str, Any] = {}
    base = _NOT_IDENTIFIER.sub("_", f"po_{provider_type}_{provider_id}")

    def move(value: Any, path: str, sensitive: bool) -> Any:
        if isinstance(value, Mapping):
            return {
                k: move(v, f"{path}_{k}", sensitive or is_sensitive_key(str(k))) for k, v in value.items()
            }
        if isinstance(value, list):
            return [move(item, f"{path}_{index}", sensitive) for index, item in enumerate(value)]
        if not (sensitive and is_secret_value(value)):
            return value
        name = re.sub("_+", "_", _NOT_IDENTIFIER.sub("_", f"{base}{path}")).strip("_")
        unique, counter = name, 1
        while unique in values:
            counter += 1
            unique = f"{name}_{counter}"
        # The value goes to a variables file, which Terraform does not interpolate: undo the manifest
        # escape of a literal "${" as the compiler would.
        values[unique] = value.replace("$\\{", "${") if isinstance(value, str) else value
        return f"${{var.{unique}}}"

    moved: dict[str, Any] = move(dict(configuration), "", False)
    return moved, values
