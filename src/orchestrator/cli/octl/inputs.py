"""The request body of ``create`` and ``update``: ``--set-json`` or ``--set-yaml``, then ``--set`` on top.

Rules (upstream ``octl``):

- ``--set-json`` and ``--set-yaml`` take a raw document, ``-`` (standard input) or ``@file``; give at most
  one of them.
- ``--set k=v`` is repeatable and sets the top-level key ``k`` only. ``v`` is JSON-parsed when it starts with
  ``[`` or ``{`` or is ``true``, ``false``, ``null`` or all digits; otherwise it is the string as given.
- ``--set`` is applied last and wins over the document.
- The id comes from the positional argument; an ``id`` in the body must agree with it.

Pure code: no click, no network. Errors are :class:`InputError` with a message naming the flag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

_DIGITS = re.compile(r"[0-9]+")
_JSON_WORDS = ("true", "false", "null")


class InputError(ValueError):
    """The input flags do not give a valid request body."""


class _Loader(yaml.SafeLoader):
    """YAML 1.1 safe loading, minus timestamps: a date stays the string the API expects."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml(text: str) -> Any:
    """A YAML document, safely loaded, dates kept as strings; raises ``yaml.YAMLError``."""
    return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader: no arbitrary objects


def yaml_error(exc: yaml.YAMLError) -> str:
    """What is wrong with a YAML document, and where."""
    where = ""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        where = f" at line {mark.line + 1} column {mark.column + 1}"
    return f"{getattr(exc, 'problem', None) or 'not valid YAML'}{where}"


def _ellipsis_hint(text: str) -> str | None:
    """What to change in a document that does not parse because it holds the ``...`` line of an example
    (seed 000's ECS snippet: ``# See other required properties in the ECS runner docs`` then ``...``)."""
    lines = [number for number, line in enumerate(text.splitlines(), 1) if line.strip() == "..."]
    if not lines:
        return None
    where = f"line {lines[0]} is" if len(lines) == 1 else f"lines {', '.join(map(str, lines))} are"
    return (
        f"{where} '...', which the documentation's examples write for what they leave out: replace it with "
        "the fields it stands for, or delete it"
    )


def parse_set_value(key: str, raw: str) -> Any:
    """The value of one ``--set key=raw``."""
    if not (raw[:1] in ("[", "{") or raw in _JSON_WORDS or _DIGITS.fullmatch(raw)):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        if _DIGITS.fullmatch(raw):
            raise InputError(
                f"--set {key}: '{raw}' is all digits, so it is read as a number, but a number cannot have a "
                "leading zero; give the value with --set-json or --set-yaml instead"
            ) from exc
        raise InputError(f"--set {key}: invalid JSON: {exc.msg} at position {exc.pos}") from exc


def parse_sets(values: Sequence[str]) -> dict[str, Any]:
    """The top-level keys given by ``--set k=v`` flags; a later flag for the same key wins."""
    result: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep:
            raise InputError(f"--set '{item}': expected key=value")
        if not key or key != key.strip():
            raise InputError(f"--set '{item}': the key must be a non-empty name without spaces around it")
        result[key] = parse_set_value(key, raw)
    return result


def read_source(flag: str, value: str, stdin: TextIO) -> str:
    """The text a ``--set-json``/``--set-yaml`` value names: ``-`` is stdin, ``@path`` a file, else itself."""
    if value == "-":
        return stdin.read()
    if value.startswith("@"):
        return read_file(flag, file_path(flag, value))
    if looks_like_a_file_name(value):
        raise InputError(
            f"{flag}: '{value}' looks like a file name, and {flag} takes the document itself: to read the "
            f"file, write {flag}=@{value}"
        )
    return value


#: What a file name given without ``@`` ends with.
_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def looks_like_a_file_name(value: str) -> bool:
    """A one-line value that names an existing file or ends like a document's file name."""
    text = value.strip()
    if not text or "\n" in text or text[0] in "{[" or ":" in text.replace("\\", "/").split("/")[-1]:
        return False
    return text.lower().endswith(_FILE_SUFFIXES) or Path(text).expanduser().is_file()


def file_path(flag: str, value: str) -> Path:
    """The file an ``@FILE`` value of ``flag`` names (``~`` expanded)."""
    if not value[1:]:
        raise InputError(f"{flag}: '@' must be followed by a file name")
    return Path(value[1:]).expanduser()


def read_file(flag: str, path: Path, *, text: str = "UTF-8 text") -> str:
    """The UTF-8 text of the file ``flag`` names; an error naming ``flag`` if it cannot be read or is not
    ``text``."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{flag}: cannot read '{path}': {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{flag}: '{path}' is not {text}") from exc


def parse_document(flag: str, text: str) -> dict[str, Any]:
    """A JSON (``--set-json``) or YAML (``--set-yaml``) document that must be a mapping; empty is ``{}``."""
    if not text.strip():
        return {}
    data: Any
    if flag == "--set-json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"--set-json: invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from exc
    else:
        try:
            data = load_yaml(text)
        except yaml.YAMLError as exc:
            raise InputError(f"--set-yaml: invalid YAML: {_ellipsis_hint(text) or yaml_error(exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{flag}: the document must be a mapping of fields, not {type(data).__name__}")
    return data


def build_body(
    *,
    sets: Sequence[str] = (),
    set_json: str | None = None,
    set_yaml: str | None = None,
    stdin: TextIO,
) -> dict[str, Any]:
    """The request body the flags give: the document (if any), then each ``--set`` on top."""
    if set_json is not None and set_yaml is not None:
        raise InputError("--set-json and --set-yaml are mutually exclusive; give one of them")
    body: dict[str, Any] = {}
    if set_json is not None:
        body = parse_document("--set-json", read_source("--set-json", set_json, stdin))
    elif set_yaml is not None:
        body = parse_document("--set-yaml", read_source("--set-yaml", set_yaml, stdin))
    body.update(parse_sets(sets))
    return body


def with_id(body: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    """``body`` with ``key`` set to the positional ``value``; a different ``key`` in the body is refused."""
    given = body.get(key)
    if key in body and given != value:
        raise InputError(f"the input sets {key} '{given}', but the argument is '{value}'; they must agree")
    return {key: value, **{k: v for k, v in body.items() if k != key}}


def without_id(body: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    """``body`` without ``key`` (a PATCH body names no id); a different ``key`` in the body is refused."""
    with_id(body, key, value)
    return {k: v for k, v in body.items() if k != key}
