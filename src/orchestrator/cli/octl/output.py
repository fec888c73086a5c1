"""How ``octl`` prints objects (``-o table|wide|json|yaml``, the same choices on every command) and messages.

Data goes to stdout, messages to stderr, so ``octl get runners -o json | jq`` sees only data.

A table on a terminal fits its width without cutting what a user copies: the object's id, any column of
UUIDs and the status words are never wrapped or shortened (the table grows wider than the terminal
rather); the other columns wrap. ``-o wide`` adds the columns marked ``wide``. Piped, a table is plain
text with nothing cut or wrapped.
"""

from __future__ import annotations

import io
import json
import os
import re
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

#: The ``-o`` choices of every command that prints objects (``table`` first: the default of reading ones).
FORMATS = ("table", "wide", "json", "yaml")
#: Width of a table when stdout is not a terminal: wide enough that no cell is ever cut or wrapped.
PIPE_WIDTH = 10_000
#: Headers of the columns that are never wrapped or shortened, whatever their values.
WHOLE_HEADERS = ("Id", "Status")
#: The narrowest a wrapping column gets before the table grows wider than the terminal instead.
MIN_WRAPPED_WIDTH = 6
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[dict[str, Any]], Any]
    #: Shown only with ``-o wide``.
    wide: bool = False


def field(header: str, path: str, *, wide: bool = False) -> Column:
    """A column showing the value at a dotted ``path`` of the object ("" when absent)."""

    def get(obj: dict[str, Any]) -> Any:
        value: Any = obj
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    return Column(header, get, wide)


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


def _kept_whole(header: str, cells: Sequence[Text]) -> bool:
    """Whether a column is never wrapped nor shortened: ids, status words, and any column of UUIDs."""
    if header in WHOLE_HEADERS:
        return True
    values = [cell.plain for cell in cells if cell.plain]
    return bool(values) and all(_UUID.match(value) for value in values)


def table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    *,
    wide: bool = False,
    console: Console | None = None,
) -> None:
    """Rows under a header; piped, it is plain text (no rule, colour, width limit or trailing blanks).

    ``wide``: with the columns marked wide. ``console``: where to print (a test's, of a given width).
    """
    console = console or Console(file=sys.stdout, highlight=False, soft_wrap=False)
    piped = not console.is_terminal
    shown = [column for column in columns if wide or not column.wide]
    cells = [[_cell(column.value(row)) for column in shown] for row in rows]
    grid = Table(
        box=None if piped else box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        header_style="" if piped else "bold",
    )
    needed = 2 * max(0, len(shown) - 1)
    for index, column in enumerate(shown):
        column_cells = [row[index] for row in cells]
        if piped:
            grid.add_column(column.header, no_wrap=True, overflow="ignore")
        elif _kept_whole(column.header, column_cells):
            width = max([len(column.header), *(cell.cell_len for cell in column_cells)])
            grid.add_column(column.header, no_wrap=True, min_width=width, overflow="ignore")
            needed += width
        else:
            grid.add_column(column.header, overflow="fold")
            needed += MIN_WRAPPED_WIDTH
    for row_cells in cells:
        grid.add_row(*row_cells)
    if not piped:
        width = console.width
        # Too narrow even with the other columns wrapped: wider than the terminal, never an id cut.
        console.width = max(width, needed)
        try:
            console.print(grid)
        finally:
            console.width = width
        return
    buffer = io.StringIO()
    Console(file=buffer, highlight=False, soft_wrap=False, width=PIPE_WIDTH, color_system=None).print(grid)
    click.echo("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()), nl=False)


#: The table of an object that has no columns of its own (outputs, a dry run's answer): key and value.
KEY_VALUE = (Column("Key", lambda row: row.get("key")), Column("Value", lambda row: row.get("value")))


def emit(data: dict[str, Any] | list[dict[str, Any]], fmt: str, columns: Sequence[Column]) -> None:
    """Print one object or a list in ``fmt``; a table shows ``columns``, one row per object (an object
    without columns: one row per key)."""
    if fmt == "json":
        click.echo(to_json(data), nl=False)
    elif fmt == "yaml":
        click.echo(to_yaml(data), nl=False)
    elif not columns and isinstance(data, dict):
        table([{"key": key, "value": value} for key, value in data.items()], KEY_VALUE, wide=fmt == "wide")
    else:
        table(data if isinstance(data, list) else [data], columns, wide=fmt == "wide")


def colour_wanted() -> bool:
    """False when ``NO_COLOR`` is set to anything (no-color.org); click adds colours only on a terminal."""
    return not os.environ.get("NO_COLOR")


def success(message: str) -> None:
    """A success message on stderr, green where stderr is a terminal and NO_COLOR is not set."""
    _coloured(message, "green")


def warning(message: str) -> None:
    """``Warning: message`` on stderr, yellow where stderr is a terminal and NO_COLOR is not set."""
    _coloured(f"Warning: {message}", "yellow")


def _coloured(message: str, colour: str) -> None:
    # click drops the colour where stderr is no terminal; NO_COLOR drops it everywhere.
    if colour_wanted():
        click.secho(message, fg=colour, err=True)
    else:
        click.echo(message, err=True)


def note(message: str) -> None:
    click.echo(message, err=True)


def out_option(default: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``-o/--out``: how to print the answer (the same choices everywhere; ``default`` differs)."""
    return click.option(
        "-o",
        "--out",
        "out",
        type=click.Choice(FORMATS),
        default=default,
        show_default=True,
        help="Output format.",
    )
