"""Helpers the resource commands share: the options of reading and writing commands, printing lists,
refusing empty updates."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from orchestrator.cli.octl import output
from orchestrator.cli.octl.session import UsageFailure, input_options, org_option, pass_session

F = TypeVar("F", bound=Callable[..., Any])


def reads_org(func: F) -> F:
    """A command that shows what the organization holds: ``-o`` (default table), ``--org``, and the session
    as its first argument."""
    return output.out_option("table")(org_option(pass_session(func)))  # type: ignore[return-value]


def writes_org(func: F) -> F:
    """A command that sends a body to the organization: ``--set``, ``--set-json``, ``--set-yaml`` (as
    ``body``), ``-o`` for the answer (default yaml), ``--org``, and the session as its first argument."""
    return input_options(output.out_option("yaml")(org_option(pass_session(func))))  # type: ignore[return-value]


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
