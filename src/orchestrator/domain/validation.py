"""Turning pydantic validation errors into one-line messages that name the offending field.

Every request body is validated with pydantic; :func:`format_validation_error` turns the resulting
:class:`pydantic.ValidationError` into

* a one-line message naming the first offending field as a dotted path with list indices, e.g.
  ``runner_configuration.job.pod_template.spec.containers[0].name: field required``, and
* the list of all errors as ``{"field": ..., "message": ...}`` for the ``details`` of a 400 answer.

Pydantic puts segments into an error's ``loc`` that are not field names: the tag of a discriminated union
(``kubernetes-gke``) and the names of schema wrappers (``function-after[...]``). Schema wrappers are
recognised by their shape; discriminated unions are declared once with :func:`register_discriminated_union`,
which also lets the formatter say ``unknown runner type 'foo', must be one of [...]`` instead of pydantic's
generic text.

Validators that find a problem deeper inside their value than their own field raise :func:`nested_error`,
which pydantic merges into the surrounding error with the full location.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pydantic
from pydantic_core import InitErrorDetails, PydanticCustomError

from orchestrator.errors import InvalidInputError

Loc = tuple[str | int, ...]

__all__ = [
    "ELLIPSIS",
    "ELLIPSIS_MESSAGE",
    "Loc",
    "format_validation_error",
    "go_list",
    "invalid_input",
    "nested_error",
    "register_discriminated_union",
    "render_loc",
]


@dataclass(frozen=True)
class _Union:
    noun: str
    tags: frozenset[str]
    fields: frozenset[str]


_UNIONS: list[_Union] = []

#: What the documentation's examples write for what they leave out, and what a user who pasted one is told.
ELLIPSIS: Final = "..."
ELLIPSIS_MESSAGE: Final = (
    "is '...', which the documentation's examples write for what they leave out: "
    "replace it with the real value"
)

#: pydantic's names for schema wrappers in a loc: ``function-after[check(), str]``, ``list[str]``, ``[key]``.
_SCHEMA_SEGMENT: Final = re.compile(r"^[a-z][a-z0-9-]*\[.*\]$|^\[key\]$", re.DOTALL)
_PLAIN_KEY: Final = re.compile(r"^[A-Za-z0-9_\-/]+$")
_QUOTED: Final = re.compile(r"'([^']*)'")


def register_discriminated_union(noun: str, tags: Iterable[str], *, fields: Iterable[str]) -> None:
    """Declare a discriminated union so that errors inside it are reported without the tag segment.

    ``noun`` names what the discriminator selects ("runner type"); ``tags`` are its values; ``fields`` are the
    names of the fields whose value is that union (the tag segment follows them in a loc).
    """
    union = _Union(noun, frozenset(tags), frozenset(fields))
    if union not in _UNIONS:
        _UNIONS.append(union)


def go_list(values: Iterable[str]) -> str:
    """Format values the way Go's ``%v`` prints a ``[]string``, sorted: ``[a b c]``."""
    return "[" + " ".join(sorted(values)) + "]"


def nested_error(problems: Sequence[tuple[Loc, str]], *, value: Any = None) -> pydantic.ValidationError:
    """A ValidationError for problems found inside a validated value, at locations relative to it.

    Raise it from a pydantic validator: pydantic prefixes each location with the validator's own location.
    """
    details = [
        InitErrorDetails(
            type=PydanticCustomError("value_error", "{message}", {"message": message}),
            loc=loc,
            input=value,
        )
        for loc, message in problems
    ]
    return pydantic.ValidationError.from_exception_data("value", details)


def _is_tag(loc: Loc, index: int) -> bool:
    segment = loc[index]
    if not isinstance(segment, str):
        return False
    if index == 0:
        # A union validated on its own (TypeAdapter) starts its loc with the tag.
        return len(loc) > 1 and any(segment in union.tags for union in _UNIONS)
    parent = loc[index - 1]
    return any(parent in union.fields and segment in union.tags for union in _UNIONS)


def _clean_loc(loc: Loc) -> Loc:
    kept: list[str | int] = []
    for index, segment in enumerate(loc):
        if isinstance(segment, str) and (_SCHEMA_SEGMENT.match(segment) or _is_tag(loc, index)):
            continue
        kept.append(segment)
    return tuple(kept)


def _render(loc: Loc) -> str:
    out = ""
    for segment in loc:
        if isinstance(segment, int):
            out += f"[{segment}]"
        elif _PLAIN_KEY.match(segment):
            out += f".{segment}" if out else segment
        else:
            quoted = '"' + segment.replace("\\", "\\\\").replace('"', '\\"') + '"'
            out += f"[{quoted}]"
    return out


def render_loc(loc: Loc) -> str:
    """A location as messages name it: ``runner_configuration.job.pod_template.spec.containers[0].env``."""
    return _render(loc)


def _union_for_tags(tags: Iterable[str]) -> _Union | None:
    wanted = frozenset(tags)
    for union in _UNIONS:
        if union.tags == wanted:
            return union
    return None


def _union_for_field(loc: Loc) -> _Union | None:
    if not loc:
        return None
    for union in _UNIONS:
        if loc[-1] in union.fields:
            return union
    return None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _lower_first(text: str) -> str:
    if len(text) > 1 and text[0].isupper() and not text[1].isupper():
        return text[0].lower() + text[1:]
    return text


#: Ids of orgs, projects, environments, runners, types and modules (``api.schemas.Identifier``).
ID_PATTERN: Final = r"^[a-z](?:-?[a-z0-9]+)+$"
#: The patterns a user meets often, said in words instead of as a regular expression.
PATTERN_WORDS: Final[dict[str, str]] = {
    ID_PATTERN: "must start with a lowercase letter and hold only lowercase letters, digits and single "
    "hyphens between them, e.g. 'my-project-2' (no capitals, underscores, spaces or leading, trailing or "
    "double hyphens)",
    r"^[A-Za-z_][A-Za-z0-9_]*$": "must be an environment variable name: letters, digits and underscores, "
    "not starting with a digit",
    r"^[a-z]{2}-[a-z]+-\d$": "must be a region name such as 'eu-west-1'",
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$": "must be a UUID "
    "such as '5f0c6a52-3a4e-4d8f-9d0e-2b7c1e4f8a90'",
}


def _describe(error: Any) -> tuple[Loc, str]:
    """The cleaned location and our message for one pydantic error dict."""
    kind: str = error["type"]
    loc: Loc = _clean_loc(tuple(error["loc"]))
    ctx: dict[str, Any] = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return loc, "unknown field"
    if kind != "missing" and error.get("input") == ELLIPSIS:
        return loc, ELLIPSIS_MESSAGE
    if kind == "missing":
        return loc, "field required"
    if kind == "string_pattern_mismatch" and str(ctx.get("pattern")) in PATTERN_WORDS:
        return loc, PATTERN_WORDS[str(ctx.get("pattern"))]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        discriminator = str(ctx.get("discriminator", "type")).strip("'\"")
        if kind == "union_tag_invalid":
            expected = _QUOTED.findall(str(ctx.get("expected_tags", "")))
            union = _union_for_tags(expected) or _union_for_field(loc)
            noun = union.noun if union else f"{discriminator} value"
            return (
                *loc,
                discriminator,
            ), f"unknown {noun} '{ctx.get('tag')}', must be one of {go_list(expected)}"
        union = _union_for_field(loc)
        suffix = f", must be one of {go_list(union.tags)}" if union else ""
        return (*loc, discriminator), f"field required{suffix}"
    message = str(error["msg"])
    for noise in ("Value error, ", "Assertion failed, "):
        if message.startswith(noise):
            message = message[len(noise) :]
    return loc, _lower_first(_one_line(message))


def format_validation_error(
    exc: pydantic.ValidationError, *, prefix: str = ""
) -> tuple[str, list[dict[str, str]]]:
    """One-line message naming the first offending field, and all errors as ``{"field", "message"}``.

    ``prefix`` is a dotted path prepended to every location, for a value validated on its own that sits at
    that path of the request body (``prefix="runner_configuration"``).
    """
    # The input is only compared with ELLIPSIS, never shown: it can hold keys and tokens.
    return describe_errors(exc.errors(include_url=False), prefix=prefix)


def describe_errors(errors: Iterable[Any], *, prefix: str = "") -> tuple[str, list[dict[str, str]]]:
    """:func:`format_validation_error` for a list of pydantic error dicts (as FastAPI collects them)."""
    head: Loc = tuple(part for part in prefix.split(".") if part)
    details: list[dict[str, str]] = []
    for error in errors:
        loc, message = _describe({**error, "loc": (*head, *error["loc"])})
        details.append({"field": _render(loc), "message": message})
    if not details:
        return "invalid input", details
    first = details[0]
    line = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
    if len(details) > 1:
        more = len(details) - 1
        line += f" (and {more} more error{'s' if more > 1 else ''})"
    return line, details


def invalid_input(exc: pydantic.ValidationError, *, prefix: str = "") -> InvalidInputError:
    """The :class:`InvalidInputError` for a validation error, with ``details={"errors": [...]}``."""
    message, errors = format_validation_error(exc, prefix=prefix)
    return InvalidInputError(message, details={"errors": errors})
