"""Terraform's value types (cty) and their wire forms: msgpack for values, JSON for types and state.

Only what the provider's schemas use: ``string``, ``number``, ``bool``, lists, maps, objects, and
``dynamic`` (whose values travel with their type: a literal's object or tuple type, as HCL types it).
Values are plain Python (``None`` is null, `UNKNOWN` a value known only after apply); a `Dynamic`
carries a dynamic attribute's value with the type Terraform gave it, so a plan hands it back unchanged.

msgpack follows cty's encoding (``cty/msgpack``): objects as maps of every attribute, unknown values as
extension 0 (12 when refined, read as plain unknown), a dynamic value as ``[type JSON, value]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgpack


class CtyError(ValueError):
    """A value or type that does not fit the schema."""


@dataclass(frozen=True)
class Primitive:
    name: str  # "string", "number" or "bool"

    def to_json(self) -> Any:
        return self.name


@dataclass(frozen=True)
class Collection:
    kind: str  # "list", "map" or "set"
    element: CtyType

    def to_json(self) -> Any:
        return [self.kind, self.element.to_json()]


@dataclass(frozen=True)
class Object:
    attributes: Mapping[str, CtyType]

    def to_json(self) -> Any:
        return ["object", {name: member.to_json() for name, member in self.attributes.items()}]


@dataclass(frozen=True)
class Tuple:
    elements: tuple[CtyType, ...]

    def to_json(self) -> Any:
        return ["tuple", [element.to_json() for element in self.elements]]


@dataclass(frozen=True)
class Dynamic:
    """The type of a ``dynamic`` attribute; as a value (`DynamicValue`) it is typed when known."""

    def to_json(self) -> Any:
        return "dynamic"


CtyType = Primitive | Collection | Object | Tuple | Dynamic

STRING: Final = Primitive("string")
NUMBER: Final = Primitive("number")
BOOL: Final = Primitive("bool")
DYNAMIC: Final = Dynamic()


def List(element: CtyType) -> Collection:  # noqa: N802 - reads as the type it builds
    return Collection("list", element)


def Map(element: CtyType) -> Collection:  # noqa: N802
    return Collection("map", element)


class _Unknown:
    """A value Terraform knows only after apply."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()


@dataclass(frozen=True)
class DynamicValue:
    """A dynamic attribute's value with the concrete type it came with."""

    type: CtyType
    value: Any


def is_unknown(value: Any) -> bool:
    return value is UNKNOWN


def parse_type(data: Any) -> CtyType:
    """A type from its JSON form (``"string"``, ``["list", "string"]``, ``["object", {...}]``, ...)."""
    if isinstance(data, str):
        if data in ("string", "number", "bool"):
            return Primitive(data)
        if data == "dynamic":
            return DYNAMIC
    elif isinstance(data, list) and len(data) >= 2:
        kind = data[0]
        if kind in ("list", "map", "set"):
            return Collection(kind, parse_type(data[1]))
        if kind == "object" and isinstance(data[1], dict):
            return Object({name: parse_type(member) for name, member in data[1].items()})
        if kind == "tuple" and isinstance(data[1], list):
            return Tuple(tuple(parse_type(element) for element in data[1]))
    raise CtyError(f"unsupported type {data!r}")


def type_bytes(cty_type: CtyType) -> bytes:
    return json.dumps(cty_type.to_json(), separators=(",", ":")).encode()


def literal_type(value: Any) -> CtyType:
    """The type HCL gives a literal: objects and tuples (not maps and lists) all the way down."""
    if isinstance(value, DynamicValue):
        return value.type
    if isinstance(value, Mapping):
        return Object({str(key): literal_type(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return Tuple(tuple(literal_type(item) for item in value))
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int | float):
        return NUMBER
    if isinstance(value, str):
        return STRING
    return DYNAMIC


# -- msgpack ------------------------------------------------------------------------------------------

_UNKNOWN_EXT: Final = msgpack.ExtType(0, b"\x00")
_UNKNOWN_CODES: Final = (0, 12)  # plain, and refined (the refinements are dropped)


def _ext_hook(code: int, data: bytes) -> Any:
    if code in _UNKNOWN_CODES:
        return UNKNOWN
    raise CtyError(f"unexpected msgpack extension {code}")


def _number(value: Any) -> int | float:
    if isinstance(value, bool):
        raise CtyError("a number was expected, not a bool")
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):  # cty writes numbers beyond int64/float64 precision as text
        try:
            return int(value)
        except ValueError:
            try:
                return float(value)
            except ValueError:
                raise CtyError(f"{value!r} is not a number") from None
    raise CtyError(f"a number was expected, not {type(value).__name__}")


def _primitive(value: Any, cty_type: Primitive) -> Any:
    """A string, bool or number checked against its type (numbers as cty writes them: int when whole)."""
    if cty_type.name == "number":
        number = _number(value)
        return int(number) if isinstance(number, float) and number.is_integer() else number
    expected = str if cty_type.name == "string" else bool
    if not isinstance(value, expected):
        raise CtyError(f"a {cty_type.name} was expected, not {type(value).__name__}")
    return value


def _from_wire(raw: Any, cty_type: CtyType) -> Any:
    """A decoded msgpack tree, read as ``cty_type``."""
    if raw is None or raw is UNKNOWN:
        return raw
    if isinstance(cty_type, Dynamic):
        if not isinstance(raw, list | tuple) or len(raw) != 2:
            raise CtyError("a dynamic value must be [type, value]")
        type_json, inner = raw
        actual = parse_type(json.loads(type_json))
        return DynamicValue(actual, _from_wire(inner, actual))
    if isinstance(cty_type, Primitive):
        return _primitive(raw, cty_type)
    if isinstance(cty_type, Object):
        if not isinstance(raw, Mapping):
            raise CtyError("an object was expected")
        unexpected = sorted(set(raw) - set(cty_type.attributes))
        if unexpected:
            raise CtyError(f"unsupported attribute {unexpected[0]!r}")
        return {name: _from_wire(raw.get(name), member) for name, member in cty_type.attributes.items()}
    if isinstance(cty_type, Tuple):
        if not isinstance(raw, list | tuple) or len(raw) != len(cty_type.elements):
            raise CtyError(f"a tuple of {len(cty_type.elements)} elements was expected")
        return [_from_wire(item, element) for item, element in zip(raw, cty_type.elements, strict=True)]
    return _collection(raw, cty_type, _from_wire)


def _collection(value: Any, cty_type: Collection, convert: Callable[[Any, CtyType], Any]) -> Any:
    if cty_type.kind == "map":
        if not isinstance(value, Mapping):
            raise CtyError("a map was expected")
        return {str(key): convert(value[key], cty_type.element) for key in sorted(value)}
    if not isinstance(value, list | tuple):
        raise CtyError(f"a {cty_type.kind} was expected")
    return [convert(item, cty_type.element) for item in value]


def _to_wire(value: Any, cty_type: CtyType) -> Any:
    """``value`` as the msgpack tree cty reads as ``cty_type``."""
    if value is UNKNOWN:
        return _UNKNOWN_EXT
    if isinstance(cty_type, Dynamic):
        if value is None:
            return None
        actual = literal_type(value)
        inner = value.value if isinstance(value, DynamicValue) else value
        if inner is UNKNOWN:
            return _UNKNOWN_EXT
        return [type_bytes(actual), _to_wire(inner, actual)]
    if isinstance(value, DynamicValue):
        value = value.value
    if value is None:
        return None
    if isinstance(cty_type, Primitive):
        return _primitive(value, cty_type)
    if isinstance(cty_type, Object):
        if not isinstance(value, Mapping):
            raise CtyError(f"an object was expected, not {type(value).__name__}")
        return {
            name: _to_wire(value.get(name), cty_type.attributes[name]) for name in sorted(cty_type.attributes)
        }
    if isinstance(cty_type, Tuple):
        return [_to_wire(item, element) for item, element in zip(value, cty_type.elements, strict=True)]
    return _collection(value, cty_type, _to_wire)


def from_msgpack(data: bytes, cty_type: CtyType) -> Any:
    """A value of ``cty_type`` from cty's msgpack; empty bytes are null."""
    if not data:
        return None
    raw = msgpack.unpackb(data, raw=False, ext_hook=_ext_hook, strict_map_key=False)
    return _from_wire(raw, cty_type)


def to_msgpack(value: Any, cty_type: CtyType) -> bytes:
    packed: bytes = msgpack.packb(_to_wire(value, cty_type), use_bin_type=True)
    return packed


# -- JSON (state as Terraform stores it) ---------------------------------------------------------------


def from_json(data: Any, cty_type: CtyType) -> Any:
    """A value of ``cty_type`` from cty's JSON (decoded): a dynamic one is ``{"value": ..., "type": ...}``.
    Attributes an object type no longer has are dropped (state written by an older schema)."""
    if data is None:
        return None
    if isinstance(cty_type, Dynamic):
        if not isinstance(data, Mapping) or "type" not in data:
            raise CtyError("a dynamic value must be {value, type}")
        actual = parse_type(data["type"])
        return DynamicValue(actual, from_json(data.get("value"), actual))
    if isinstance(cty_type, Primitive):
        return _number(data) if cty_type.name == "number" else data
    if isinstance(cty_type, Object):
        if not isinstance(data, Mapping):
            raise CtyError("an object was expected")
        return {name: from_json(data.get(name), member) for name, member in cty_type.attributes.items()}
    if isinstance(cty_type, Tuple):
        return [from_json(item, element) for item, element in zip(data, cty_type.elements, strict=True)]
    return _collection(data, cty_type, from_json)
