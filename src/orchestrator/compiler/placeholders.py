"""The ``${...}`` placeholders of manifests, module inputs and provider configurations (syntax only).

The grammar is upstream's (``platform-orchestrator-graph:internal/expressions/expressions.bnf``):

    context.KEY                                a value of the deployment context
    resources.ALIAS.outputs.KEY[.MORE...]      an output of a resource known by ALIAS in the scope
    shared.ALIAS.outputs.KEY[.MORE...]         an output of a shared resource of the manifest
    var.KEY                                    a Terraform variable (provider configurations only)
    self.outputs.KEY / select.…                parsed, but not supported by this compiler

where KEY and ALIAS are ``[A-Za-z0-9_-]+``. Any ``${...}`` without braces inside is a placeholder, and
one that does not parse is an error. A literal ``${`` is written ``$\\{`` (upstream's escape); a ``${``
with no closing brace is literal text as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, TypeAlias

_PLACEHOLDER: Final = re.compile(r"\$\{([^{}]+)\}")
_KEY: Final = r"[A-Za-z0-9_-]+"
_CONTEXT: Final = re.compile(rf"^context\.({_KEY})$")
_VAR: Final = re.compile(rf"^var\.({_KEY})$")
_RESOURCE: Final = re.compile(rf"^(resources|shared)\.({_KEY})\.outputs\.({_KEY}(?:\.{_KEY})*)$")
_UNSUPPORTED: Final = re.compile(r"^(self|select)\.")
#: How a manifest writes a literal ``${``.
ESCAPED_OPEN: Final = "$\\{"


class PlaceholderError(ValueError):
    """A ``${...}`` that is not a valid placeholder."""


@dataclass(frozen=True)
class ContextRef:
    key: str


@dataclass(frozen=True)
class VarRef:
    key: str


@dataclass(frozen=True)
class ResourceRef:
    alias: str
    #: ``shared.ALIAS`` rather than ``resources.ALIAS``.
    shared: bool
    #: The output key, then any attributes or indices inside it.
    output: tuple[str, ...]

    @property
    def text(self) -> str:
        return f"{'shared' if self.shared else 'resources'}.{self.alias}.outputs.{'.'.join(self.output)}"


@dataclass(frozen=True)
class UnsupportedRef:
    kind: str
    text: str


Placeholder: TypeAlias = ContextRef | VarRef | ResourceRef | UnsupportedRef


def parse(expression: str) -> Placeholder:
    """The placeholder of the text between ``${`` and ``}``."""
    if match := _CONTEXT.match(expression):
        return ContextRef(match[1])
    if match := _VAR.match(expression):
        return VarRef(match[1])
    if match := _RESOURCE.match(expression):
        return ResourceRef(alias=match[2], shared=match[1] == "shared", output=tuple(match[3].split(".")))
    if match := _UNSUPPORTED.match(expression):
        return UnsupportedRef(kind=match[1], text=expression)
    raise PlaceholderError(f"invalid placeholder '${{{expression}}}'")


def split(text: str) -> list[str | Placeholder]:
    """``text`` as literal parts (escapes undone) and placeholders, in order."""
    parts: list[str | Placeholder] = []
    position = 0
    for match in _PLACEHOLDER.finditer(text):
        if match.start() > position:
            parts.append(text[position : match.start()].replace(ESCAPED_OPEN, "${"))
        parts.append(parse(match[1]))
        position = match.end()
    if position < len(text):
        parts.append(text[position:].replace(ESCAPED_OPEN, "${"))
    return parts


def is_single_placeholder(value: object) -> bool:
    """A string that is one placeholder and nothing else (its type is only known at apply time)."""
    return isinstance(value, str) and bool(_PLACEHOLDER.fullmatch(value))
