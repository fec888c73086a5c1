"""``octl``'s tables at 80 columns: one line a row, ids whole, times relative, free text shortened, the
rest left out; ``-o wide``: every column whole."""

from __future__ import annotations

import io
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from orchestrator.cli.octl import main, output
from orchestrator.cli.octl.commands.deployments import DEPLOYMENT_SUMMARY
from orchestrator.cli.octl.commands.envs import ENV
from orchestrator.cli.octl.commands.runners import RUNNER_SUMMARY

DEPLOYMENTS = [
    {
        "id": str(uuid.uuid4()),
        "project_id": "a-rather-long-project-name-for-the-shop",
        "env_id": "development-environment",
        "mode": "deploy",
        "status": status,
        "created_at": "2026-12-03T02:07:50.123456+00:00",
        "completed_at": "2026-12-03T02:09:01.654321+00:00",
        "runner_id": "my-kubernetes-runner",
        "status_message": "the deployment ran to its end",
    }
    for status in ("succeeded", "executing", "failed")
]


def _terminal(monkeypatch: pytest.MonkeyPatch) -> tuple[Console, io.StringIO]:
    """A terminal of COLUMNS=80, as rich reads it from the environment."""
    monkeypatch.setenv("COLUMNS", "80")
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, color_system=None, highlight=False), buffer


NOW = datetime(2026, 12, 3, 2, 30, tzinfo=UTC)


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_table__at_80_columns_one_line_a_row_ids_whole_and_relative_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    console, buffer = _terminal(monkeypatch)
    assert 80 == console.width

    output.table(DEPLOYMENTS, DEPLOYMENT_SUMMARY, console=console, now=NOW)

    lines = _rows(buffer.getvalue())
    assert 1 + len(DEPLOYMENTS) == len(lines), buffer.getvalue()
    assert all(len(line) <= 80 for line in lines), buffer.getvalue()
    assert ["Id", "Status", "Created"] == [h for h in lines[0].split() if h in ("Id", "Status", "Created")]
    for deployment, line in zip(DEPLOYMENTS, lines[1:], strict=True):
        assert line.startswith(deployment["id"] + " ")
        assert deployment["status"] in line.split()
        assert "22m ago" in line
    # Left out rather than wrapped or cut: -o wide shows them.
    assert "CompletedAt" not in buffer.getvalue()
    assert "…" not in buffer.getvalue()


def test_table__free_text_is_shortened_ids_never(monkeypatch: pytest.MonkeyPatch) -> None:
    console, buffer = _terminal(monkeypatch)
    runners = [
        {
            "id": "kubernetes-agent-production-eu",
            "description": "Runs the production deployments of the EU clusters through the agent",
            "runner_configuration": {"type": "kubernetes-agent"},
            "created_at": "2026-09-01T00:00:00+00:00",
        }
    ]

    output.table(runners, RUNNER_SUMMARY, console=console, now=NOW)

    lines = _rows(buffer.getvalue())
    assert 2 == len(lines) and all(len(line) <= 80 for line in lines), buffer.getvalue()
    assert lines[1].startswith("kubernetes-agent-production-eu  Runs the")
    assert "…" in lines[1]
    assert "kubernetes-agent" in lines[1].split()
    # Past 60 days a relative time says less than the date.
    assert "2026-09-01" in lines[1]


def test_table__wide_shows_every_column_whole_one_line_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    console, buffer = _terminal(monkeypatch)

    output.table(DEPLOYMENTS, DEPLOYMENT_SUMMARY, wide=True, console=console, now=NOW)

    text = buffer.getvalue()
    lines = _rows(text)
    assert 1 + len(DEPLOYMENTS) == len(lines)
    assert _printed(text) == _expected(DEPLOYMENTS, DEPLOYMENT_SUMMARY, wide=True)
    for deployment, line in zip(DEPLOYMENTS, lines[1:], strict=True):
        assert line.startswith(deployment["id"] + " ")
        assert deployment["created_at"] in line.split()
        assert deployment["status_message"] in line


def _printed(text: str) -> int:
    """The characters a table shows, without blanks."""
    return sum(1 for char in text if not char.isspace())


def _expected(rows: list[dict[str, str]], columns: tuple[output.Column, ...], *, wide: bool) -> int:
    shown = [column for column in columns if wide or not column.wide]
    cells = [column.header for column in shown] + [str(column.value(row)) for row in rows for column in shown]
    return sum(len(cell.replace(" ", "")) for cell in cells)


def test_table__ids_wider_than_the_terminal_grow_the_table_rather_than_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    console, buffer = _terminal(monkeypatch)
    envs = [
        {
            "project_id": "a-project-whose-id-is-as-long-as-ids-get-here-50ch",
            "id": "an-environment-with-an-id-that-is-long-as-well-50c",
            "status": "active",
        }
    ]

    output.table(envs, ENV, console=console, now=NOW)

    lines = _rows(buffer.getvalue())
    assert 2 == len(lines)
    assert lines[1].split()[:2] == [envs[0]["project_id"], envs[0]["id"]]


def test_emit__an_object_without_columns_is_a_key_value_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    output.emit({"my-app": {"host": "db"}, "count": 3}, "table", ())

    lines = capsys.readouterr().out.splitlines()
    assert ["Key", "Value"] == lines[0].split()
    assert ["my-app", '{"host":"db"}'] == lines[1].split()
    assert ["count", "3"] == lines[2].split()


@pytest.mark.parametrize("fmt", output.FORMATS)
def test_every_format_prints_a_list(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    output.emit(DEPLOYMENTS, fmt, DEPLOYMENT_SUMMARY)

    text = capsys.readouterr().out
    for deployment in DEPLOYMENTS:
        assert deployment["id"] in text
    assert ("RunnerId" in text) == (fmt == "wide")


def _set_org(tmp_path: Path, *, color: bool, **env: str | None) -> str:
    result = CliRunner().invoke(
        main,
        ["config", "set-org", "acme"],
        env={"OCTL_CONFIG": str(tmp_path / "config.yaml"), **env},
        color=color,
    )
    assert 0 == result.exit_code, result.output
    return result.stderr


def test_colours__only_on_a_terminal_and_never_with_no_color(tmp_path: Path) -> None:
    """CliRunner's color=True stands for a terminal, color=False for a pipe."""
    terminal = _set_org(tmp_path, color=True, NO_COLOR=None)
    piped = _set_org(tmp_path, color=False, NO_COLOR=None)
    no_color = _set_org(tmp_path, color=True, NO_COLOR="1")

    assert "\x1b[32m" in terminal
    assert "\x1b[" not in piped
    assert "\x1b[" not in no_color
    assert "Default organization set to acme" in no_color


def test_table__no_color_on_a_terminal_has_no_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=200)

    output.table(DEPLOYMENTS, DEPLOYMENT_SUMMARY, console=console)

    assert DEPLOYMENTS[0]["id"] in buffer.getvalue()
    assert not re.search(r"\x1b\[[0-9;]*3[0-9]m", buffer.getvalue())
