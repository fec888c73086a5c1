"""``octl``'s tables at 80 columns: ids and status words whole, other columns wrapped; ``-o wide``."""

from __future__ import annotations

import io
import re
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from orchestrator.cli.octl import main, output
from orchestrator.cli.octl.commands.deployments import DEPLOYMENT_SUMMARY
from orchestrator.cli.octl.commands.module_rules import MODULE_RULE

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


def test_table__at_80_columns_ids_and_statuses_stay_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    console, buffer = _terminal(monkeypatch)
    assert 80 == console.width

    output.table(DEPLOYMENTS, DEPLOYMENT_SUMMARY, console=console)

    lines = buffer.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), buffer.getvalue()
    for deployment in DEPLOYMENTS:
        row = next(line for line in lines if deployment["id"] in line)
        assert deployment["status"] in row.split()
    # The long project name wrapped over lines instead of being cut: every character is there.
    assert _printed(buffer.getvalue()) == _expected(DEPLOYMENTS, DEPLOYMENT_SUMMARY, wide=False)
    assert "CompletedAt" not in buffer.getvalue()


def _printed(text: str) -> int:
    """The characters a table shows, without blanks and its rule."""
    return sum(1 for char in text if not char.isspace() and char != "─")


def _expected(rows: list[dict[str, str]], columns: tuple[output.Column, ...], *, wide: bool) -> int:
    shown = [column for column in columns if wide or not column.wide]
    cells = [column.header for column in shown] + [str(column.value(row)) for row in rows for column in shown]
    return sum(len(cell.replace(" ", "")) for cell in cells)


def test_table__wide_adds_its_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    console, buffer = _terminal(monkeypatch)

    output.table(DEPLOYMENTS, DEPLOYMENT_SUMMARY, wide=True, console=console)

    text = buffer.getvalue()
    assert _printed(text) == _expected(DEPLOYMENTS, DEPLOYMENT_SUMMARY, wide=True)
    for deployment in DEPLOYMENTS:
        row = next(line for line in text.splitlines() if deployment["id"] in line)
        assert deployment["status"] in row.split()


def test_table__too_many_columns_grow_wider_rather_than_cut_an_id(monkeypatch: pytest.MonkeyPatch) -> None:
    console, buffer = _terminal(monkeypatch)
    rules = [
        {
            "id": str(uuid.uuid4()),
            "module_id": "postgres-on-aws-rds",
            "resource_type": "postgres",
            "resource_class": "default",
            "resource_id": "shared.main-db",
            "project_id": "shop",
            "env_type_id": "development",
            "env_id": "dev",
            "created_at": "2026-12-03T02:07:50.123456+00:00",
        }
        for _ in range(2)
    ]

    output.table(rules, MODULE_RULE, console=console)

    text = buffer.getvalue()
    for rule in rules:
        assert rule["id"] in text


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
