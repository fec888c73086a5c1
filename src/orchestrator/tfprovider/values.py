"""Terraform values as plain Python: decoded values to JSON-like data, and JSON-string attributes.

`cty.from_msgpack` gives dicts, lists and scalars, with `cty.UNKNOWN` for a value known only after apply
and `cty.DynamicValue` for a dynamic attribute's typed value. Every resource here works on plain data:
`native` unwraps dynamic values (unknown ones stay `cty.UNKNOWN`: they are only in plans).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from orchestrator.tfprovider import cty

JsonDict = dict[str, Any]


def native(value: Any) -> Any:
    """``value`` as plain JSON-like data; unknown values stay `cty.UNKNOWN`."""
    if isinstance(value, cty.DynamicValue):
        return native(value.value)
    if isinstance(value, Mapping):
        return {str(key): native(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [native(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def has_unknown(value: Any) -> bool:
    """Whether any part of ``value`` is known only after apply."""
    if cty.is_unknown(value):
        return True
    if isinstance(value, cty.DynamicValue):
        return has_unknown(value.value)
    if isinstance(value, Mapping):
        return any(has_unknown(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(has_unknown(item) for item in value)
    return False


def json_text(prior: object, value: object) -> str | None:
    """A JSON attribute's text: the prior text when it means the same value, so a plan stays quiet."""
    if value is None:
        return None
    if isinstance(prior, str):
        try:
            if json.loads(prior) == value:
                return prior
        except ValueError:
            pass
    return json.dumps(value, sort_keys=True)


def parse_json(attribute: str, text: object) -> Any:
    """The value of a JSON-string attribute (``jsonencode(...)``), or a `ValueError` naming it."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"{attribute} must be a JSON string (use jsonencode(...))")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{attribute} is not valid JSON: {exc}") from exc


def drop_nulls(value: Any) -> Any:
    """``value`` without the ``null`` members Terraform gives every unset optional attribute."""
    if isinstance(value, dict):
        return {key: drop_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [drop_nulls(item) for item in value]
    return value
