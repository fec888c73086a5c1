"""How ``octl`` prints objects (``-o table|wide|json|yaml``, the same choices on every command) and messages.

Data goes to stdout, messages to stderr, so ``octl get runners -o json | jq`` sees only data.

A table on a terminal fits its width, one line a row: the columns a reader needs first (an object's
id, which is never cut nor left out; then each table's columns by rank), times as "3m ago", free text
(a description, a message) shortened with "…" where it would not fit; the columns that do not fit are
left out. Only when the ids alone are wider than the terminal is the table wider. ``-o wide`` shows every
column (those marked wide too) with every value whole and full timestamps, one line a row, however wide.
Piped, a table is plain text with every value whole (as upstream's printer: scripts cut columns out of
it), and ``-o json|yaml`` print the objects as the API answers them.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

#: The ``-o`` choices of every command that prints objects (``table`` first: the default of reading ones).
FORMATS = ("table", "wide", "json", "yaml")
#: Width of a table when stdout is not a terminal: wide enough that no cell is ever cut or wrapped.
PIPE_WIDTH = 10_000
#: The narrowest free text is shortened to on a terminal (fewer characters say too little).
MIN_SHORTENED_WIDTH = 12
#: Blanks between two columns of a terminal table.
GAP = 2
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d")


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[dict[str, Any]], Any]
    #: Shown only with ``-o wide``.
    wide: bool = False
    #: Free text a terminal table may shorten with "…" (never an id, a status or a time).
    shrink: bool = False
    #: Kept on a terminal however narrow it is (the object's id; a column headed Id is one anyway).
    key: bool = False
    #: Where the terminal is too narrow for every column, lower ranks are kept first, then the order.
    rank: int = 0


def field(
    header: str, path: str, *, wide: bool = False, shrink: bool = False, key: bool = False, rank: int = 0
) -> Column:
    """A column showing the value at a dotted ``path`` of the object ("" when absent)."""

    def get(obj: dict[str, Any]) -> Any:
        value: Any = obj
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    return Column(header, get, wide, shrink, key, rank)


def _cell(value: Any) -> Text:
    if value is None:
        return Text("")
    if isinstance(value, bool):
        return Text(str(value).lower())
    if isinstance(value, dict | list):
        return Text(json.dumps(value, separators=(",", ":")))
    # Text, not str: a value such as "[bold]" must print as itself, not as rich markup.
    return Text(str(value))


def parse_time(value: str) -> datetime | None:
    """An RFC 3339 timestamp as the API answers it, or None for anything else."""
    if not _TIMESTAMP.match(value):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def relative_time(value: datetime, now: datetime) -> str:
    """``12s ago``, ``3m ago``, ``5h ago``, ``9d ago``; the date itself past 60 days."""
    seconds = int((now - value).total_seconds())
    if seconds < 0:
        return "just now"
    for unit, size, limit in (
        ("s", 1, 60),
        ("m", 60, 3600),
        ("h", 3600, 2 * 86400),
        ("d", 86400, 60 * 86400),
    ):
        if seconds < limit:
            return f"{seconds // size}{unit} ago"
    return value.date().isoformat()


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


def _is_key(column: Column) -> bool:
    return column.key or column.header == "Id"


def table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    *,
    wide: bool = False,
    console: Console | None = None,
    now: datetime | None = None,
) -> None:
    """Rows under a header: fitted to a terminal (see the module's docstring); piped, plain text (no
    rule, colour, width limit or trailing blanks).

    ``wide``: with the columns marked wide. ``console``: where to print (a test's, of a given width).
    ``now``: the time relative times count from (a test's).
    """
    console = console or Console(file=sys.stdout, highlight=False, soft_wrap=False)
    shown = [column for column in columns if wide or not column.wide]
    cells = [[_cell(column.value(row)) for row in rows] for column in shown]
    if wide or not console.is_terminal:
        _print_whole(console, shown, cells)
    else:
        _print_fitted(console, shown, cells, now or datetime.now(UTC))


def _print_whole(console: Console, shown: Sequence[Column], cells: Sequence[Sequence[Text]]) -> None:
    """Every value whole, one line a row, however wide (piped: plain text without trailing blanks)."""
    terminal = console.is_terminal
    grid = Table(box=None, show_edge=False, pad_edge=False, header_style="bold" if terminal else "")
    for column in shown:
        grid.add_column(column.header, no_wrap=True, overflow="ignore")
    for row in zip(*cells, strict=True):
        grid.add_row(*row)
    if terminal:
        _print_at_least(console, grid, PIPE_WIDTH)
        return
    buffer = io.StringIO()
    Console(file=buffer, highlight=False, soft_wrap=False, width=PIPE_WIDTH, color_system=None).print(grid)
    click.echo("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()), nl=False)


def _print_fitted(
    console: Console, shown: Sequence[Column], cells: Sequence[Sequence[Text]], now: datetime
) -> None:
    """One line a row within the terminal's width: columns left out by rank, free text shortened."""
    headers = [column.header for column in shown]
    texts = [list(column_cells) for column_cells in cells]
    for index, column_cells in enumerate(texts):
        times = [parse_time(cell.plain) for cell in column_cells if cell.plain]
        if times and all(times):
            texts[index] = [
                Text(relative_time(t, now)) if (t := parse_time(cell.plain)) else cell
                for cell in column_cells
            ]
            if headers[index].endswith("At") and len(headers[index]) > 2:
                headers[index] = headers[index][:-2]
    natural = [
        max([len(header), *(cell.cell_len for cell in column_cells)])
        for header, column_cells in zip(headers, texts, strict=True)
    ]
    narrowest = [
        min(width, max(len(header), MIN_SHORTENED_WIDTH)) if column.shrink else width
        for column, header, width in zip(shown, headers, natural, strict=True)
    ]
    order = sorted(range(len(shown)), key=lambda i: (not _is_key(shown[i]), shown[i].rank, i))
    kept: set[int] = set()
    used = 0
    for index in order:
        needed = narrowest[index] + (GAP if kept else 0)
        if _is_key(shown[index]) or used + needed <= console.width:
            kept.add(index)
            used += needed
    widths = {index: narrowest[index] for index in kept}
    spare = console.width - used
    for index in sorted(kept):
        grow = min(spare, natural[index] - widths[index])
        if grow > 0:
            widths[index] += grow
            spare -= grow
    grid = Table(box=None, show_edge=False, pad_edge=False, padding=(0, GAP // 2), header_style="bold")
    for index in sorted(kept):
        grid.add_column(
            headers[index],
            no_wrap=True,
            width=widths[index],
            overflow="ellipsis" if shown[index].shrink else "ignore",
        )
    for row in zip(*(texts[index] for index in sorted(kept)), strict=True):
        grid.add_row(*row)
    _print_at_least(console, grid, sum(widths.values()) + GAP * max(0, len(kept) - 1))


def _print_at_least(console: Console, grid: Table, needed: int) -> None:
    """Print ``grid`` at the console's width, or wider where it needs more (never an id cut)."""
    width = console.width
    console.width = max(width, needed)
    try:
        console.print(grid)
    finally:
        console.width = width


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
