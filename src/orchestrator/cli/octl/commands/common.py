"""Helpers the resource commands share: printing lists, refusing empty updates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.cli.octl import output
from orchestrator.cli.octl.session import UsageFailure


def emit_list(items: list[dict[str, Any]], out: str, columns: Sequence[output.Column], empty: str) -> None:
    """Print a list; an empty table is a note on stderr instead of a bare header."""
    if not items and out == "table":
        output.note(empty)
        return
    output.emit(items, out, columns)


def require_changes(body: dict[str, Any]) -> dict[str, Any]:
    if not body:
        raise UsageFailure("nothing to update: give --set, --set-json or --set-yaml")
    return body
