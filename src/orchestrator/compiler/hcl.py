"""Writing HCL text: literals, templates, and bodies laid out the way ``terraform fmt`` lays them out.

The compiler builds a small tree (:class:`Block`, :class:`Attr`, :class:`Obj`, :class:`Tup`, with raw
expression text at the leaves) and :func:`render` turns it into text: two-space indentation, and the
``=`` of consecutive one-line attributes aligned, so that ``terraform fmt -check`` accepts the result.

Pitfalls:
- In a quoted template ``${`` and ``%{`` start an interpolation or a directive; literal text escapes
  them as ``$${`` and ``%%{`` (:func:`quote`).
- A literal ``$`` right before an interpolation would turn ``${`` into the escape ``$${``; such a
  ``$`` is written as the interpolation ``${"$"}`` instead (:func:`template`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

#: An HCL identifier (the ASCII subset Terraform names use).
IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_KEYWORDS: Final = frozenset({"true", "false", "null"})
_INDENT: Final = "  "


@dataclass(frozen=True)
class Raw:
    """Expression text written as is (``module.db.host``, ``"text"``, ``42``)."""

    text: str


@dataclass(frozen=True)
class Obj:
    """An object constructor; keys are written as identifiers when they are valid ones, else quoted.

    ``raw_keys`` writes keys as they are, for Terraform's ``providers = { aws.east = aws.main }``.
    """

    items: tuple[tuple[str, Expr], ...]
    raw_keys: bool = False


@dataclass(frozen=True)
class Tup:
    """A tuple constructor, one element per line."""

    items: tuple[Expr, ...]


Expr: TypeAlias = Raw | Obj | Tup


@dataclass(frozen=True)
class Attr:
    name: str
    value: Expr


@dataclass(frozen=True)
class Block:
    type: str
    labels: tuple[str, ...]
    body: tuple[Item, ...]


@dataclass(frozen=True)
class Lines:
    """Pre-rendered lines (a block rendered elsewhere), indented with the body they sit in."""

    text: str


class _Blank:
    def __repr__(self) -> str:
        return "BLANK"


#: An empty line between groups of a body (it also ends an alignment group).
BLANK: Final = _Blank()

Item: TypeAlias = Attr | Block | Lines | _Blank


def is_identifier(name: str) -> bool:
    return bool(IDENTIFIER.match(name))


def _escape(text: str) -> str:
    out: list[str] = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char == '"':
            out.append('\\"')
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif not char.isprintable() and char != " ":
            code = ord(char)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(char)
    return "".join(out).replace("${", "$${").replace("%{", "%%{")


def quote(text: str) -> str:
    """``text`` as a quoted HCL string whose value is exactly ``text``."""
    return f'"{_escape(text)}"'


def template(parts: Sequence[str | Raw]) -> Raw:
    """Literal text (``str``) and expressions (:class:`Raw`) joined into one string expression.

    A single expression stays bare (``module.db.port`` keeps its type); anything else becomes a quoted
    template, ``"postgres://${module.db.host}:5432"``.
    """
    merged: list[str | Raw] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        elif part != "":
            merged.append(part)
    if len(merged) == 1 and isinstance(merged[0], Raw):
        return merged[0]
    out: list[str] = []
    for index, part in enumerate(merged):
        if isinstance(part, Raw):
            out.append("${" + part.text + "}")
            continue
        followed_by_expression = index + 1 < len(merged)
        dollars = len(part) - len(part.rstrip("$")) if followed_by_expression else 0
        out.append(_escape(part[: len(part) - dollars]))
        if dollars:
            # "$" then "${" would read as the escape "$${": interpolate the dollars instead.
            out.append("${" + quote("$" * dollars) + "}")
    return Raw('"' + "".join(out) + '"')


def number(value: int | float) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a number HCL can write")
    # JSON's number syntax is a subset of HCL's.
    return json.dumps(value)


def object_key(key: str) -> str:
    return key if is_identifier(key) and key not in _KEYWORDS else quote(key)


def traversal(root: str, steps: Iterable[str]) -> str:
    """``module.db`` + ``["host", "0", "my key"]`` → ``module.db.host[0]["my key"]``."""
    out = root
    for step in steps:
        if step.isdigit():
            out += f"[{int(step)}]"
        elif is_identifier(step):
            out += f".{step}"
        else:
            out += f"[{quote(step)}]"
    return out


def _one_line(value: Expr) -> str | None:
    if isinstance(value, Raw):
        return value.text
    if not value.items:
        return "{}" if isinstance(value, Obj) else "[]"
    return None


def _expr_lines(value: Expr, depth: int) -> list[str]:
    """The lines of ``value``: the first continues the current line, the rest are fully indented."""
    single = _one_line(value)
    if single is not None:
        return [single]
    pad = _INDENT * depth
    if isinstance(value, Obj):
        key = (lambda k: k) if value.raw_keys else object_key
        inner = _body_lines(tuple(Attr(key(k), v) for k, v in value.items), depth + 1)
        return ["{", *inner, pad + "}"]
    lines = ["["]
    assert isinstance(value, Tup)
    for element in value.items:
        element_lines = _expr_lines(element, depth + 1)
        element_lines[0] = _INDENT * (depth + 1) + element_lines[0]
        element_lines[-1] += ","
        lines.extend(element_lines)
    lines.append(pad + "]")
    return lines


def _body_lines(items: Sequence[Item], depth: int) -> list[str]:
    pad = _INDENT * depth
    lines: list[str] = []
    group: list[tuple[str, str]] = []

    def flush() -> None:
        width = max((len(name) for name, _ in group), default=0)
        lines.extend(f"{pad}{name.ljust(width)} = {text}" for name, text in group)
        group.clear()

    for item in items:
        if isinstance(item, Attr):
            single = _one_line(item.value)
            if single is not None:
                group.append((item.name, single))
                continue
            flush()
            value_lines = _expr_lines(item.value, depth)
            lines.append(f"{pad}{item.name} = {value_lines[0]}")
            lines.extend(value_lines[1:])
            continue
        flush()
        if isinstance(item, Block):
            lines.extend(_block_lines(item, depth))
        elif isinstance(item, Lines):
            lines.extend(pad + line if line.strip() else "" for line in item.text.strip("\n").split("\n"))
        else:
            lines.append("")
    flush()
    return lines


def _block_lines(block: Block, depth: int) -> list[str]:
    pad = _INDENT * depth
    head = " ".join([block.type, *(quote(label) for label in block.labels)])
    if not block.body:
        return [f"{pad}{head} {{", f"{pad}}}"]
    return [f"{pad}{head} {{", *_body_lines(block.body, depth + 1), f"{pad}}}"]


def render(items: Sequence[Item]) -> str:
    """A whole file (or a body at the top level), ending with a newline."""
    return "\n".join(_body_lines(items, 0)) + "\n"
