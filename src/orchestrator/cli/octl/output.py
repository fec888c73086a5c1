"""How ``octl`` prints objects (``-o json|yaml|table``) and messages.

Data goes to stdout, messages to stderr, so ``octl get runners -o json | jq`` sees only data.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click
import yaml
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

FORMATS = ("json", "yaml", "table")
#: Width of a table when stdout is not a terminal: wide enough that no cell is ever cut or wrapped.
PIPE_WIDTH = 10_000


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[dict[str, Any]], Any]


def field(header: str, path: str) -> Column:
    """A column showing the value at a dotted ``path`` of the object ("" when absent)."""

    def get(obj: dict[str, Any]) -> Any:
        value: Any = obj
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    return Column(header, get)


def _cell(value: Any) -> Text:
    if value is None:
        return Text("")
    if isinstance(value, bool):
        return Text(str(value).lower())
    if isinstance(value, dict | list):
        return Text(json.dumps(value, separators=(",", ":")))
    # Text, not str: a value such as "[bold]" must print as itself, not as rich markup.
    return Text(str(value))


class _Dumper(yaml.SafeDumper):
    """Safe YAML where a multi-line string (Terraform code, a module's source) is a literal block."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # PyYAML falls back to a quoted scalar by itself when a block cannot hold the value exactly.
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _represent_str)


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def to_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> None:
    """Rows under a header; piped, it is plain text (no rule, colour, width limit or trailing blanks)."""
    console = Console(file=sys.stdout, highlight=False, soft_wrap=False)
    piped = not console.is_terminal
    grid = Table(
        box=None if piped else box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        header_style="" if piped else "bold",
    )
    for column in columns:
        grid.add_column(column.header, no_wrap=True, overflow="ignore")
    for row in rows:
        grid.add_row(*(_cell(column.value(row)) for column in columns))
    if not piped:
        console.print(grid)
        return
    buffer = io.StringIO()
    Console(file=buffer, highlight=False, soft_wrap=False, width=PIPE_WIDTH, color_system=None).print(grid)
    click.echo("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()), nl=False)


def emit(data: dict[str, Any] | list[dict[str, Any]], fmt: str, columns: Sequence[Column]) -> None:
    """Print one object or a list in ``fmt``; a table shows ``columns``, one row per object."""
    if fmt == "json":
        click.echo(to_json(data), nl=False)
    elif fmt == "yaml":
        click.echo(to_yaml(data), nl=False)
    else:
        table(data if isinstance(data, list) else [data], columns)


def success(message: str) -> None:
    """A success message on stderr, green where stderr is a terminal."""
    click.secho(message, fg="green", err=True)


def warning(message: str) -> None:
    """``Warning: message`` on stderr, yellow where stderr is a terminal."""
    click.secho(f"Warning: {message}", fg="yellow", err=True)


def note(message: str) -> None:
    click.echo(message, err=True)


def out_option(default: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``-o/--out``: how to print the answer."""
    choices = FORMATS if default == "table" else FORMATS[:2]
    return click.option(
        "-o",
        "--out",
        "out",
        type=click.Choice(choices),
        default=default,
        show_default=True,
        help="Output format.",
    )
