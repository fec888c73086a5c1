"""Terraform values as plain Python: cty values to JSON-like data, and the attrs classes pyvider wants.

pyvider hands configuration and state over as attrs instances whose fields may hold cty values (nested
objects always do). Every resource here works on plain dicts instead: `native` turns whatever pyvider
gave into ``dict``/``list``/``str``/``int``/``bool``/``None``, and `attrs_class` makes the one-field-per-
attribute class pyvider converts to and from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from pyvider.cty import CtyValue
from pyvider.cty.conversion import cty_to_native

JsonDict = dict[str, Any]


def native(value: Any) -> Any:
    """``value`` as plain JSON-like data; unknown values stay cty values (they are only in plans)."""
    if isinstance(value, CtyValue):
        if value.is_unknown:
            return value
        if value.is_null:
            return None
        if value.is_wholly_known():
            return native(cty_to_native(value))
        return native(value.value)
    if attrs.has(type(value)):
        return {field.name: native(getattr(value, field.name)) for field in attrs.fields(type(value))}
    if isinstance(value, Mapping):
        return {str(key): native(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [native(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def attrs_class(name: str, fields: Iterable[str]) -> type:
    """A frozen attrs class with one optional field per attribute name."""
    return attrs.make_class(name, {field: attrs.field(default=None) for field in fields}, frozen=True)


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
