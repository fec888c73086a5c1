"""Every command of ``octl``, ``orchestrator`` and ``po-runner`` (found by walking their click groups, so a
new one is covered) shows an ``Example`` section in its ``--help``."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from orchestrator.cli import runner, server
from orchestrator.cli.octl import main as octl


def _all(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name in sorted(group.commands):
        command = group.commands[name]
        if isinstance(command, click.Group):
            yield from _all(command, (*path, name))
        else:
            yield (*path, name)


CASES = [
    pytest.param(program, path, id=" ".join((name, *path)))
    for name, program in (("octl", octl), ("orchestrator", server.main), ("po-runner", runner.main))
    for path in _all(program)
]


@pytest.mark.parametrize(("program", "path"), CASES)
def test_every_help_has_an_example(program: click.Group, path: tuple[str, ...]) -> None:
    shown = CliRunner().invoke(program, [*path, "--help"], terminal_width=120)

    assert 0 == shown.exit_code, shown.output
    assert "Example:" in shown.output
    example = shown.output.split("Example:", 1)[1].splitlines()[1]
    assert example.strip(), shown.output


@pytest.mark.parametrize(
    ("program", "name"), [(octl, "octl"), (server.main, "orchestrator"), (runner.main, "po-runner")]
)
def test_version(program: click.Group, name: str) -> None:
    shown = CliRunner().invoke(program, ["--version"])

    assert 0 == shown.exit_code, shown.output
    assert shown.output.startswith(f"{name}, version ")


@pytest.mark.parametrize("program", [octl, server.main, runner.main])
def test_help_ends_with_the_exit_codes(program: click.Group) -> None:
    shown = CliRunner().invoke(program, ["--help"], terminal_width=200)

    assert "Exit codes: 0 " in shown.output


def test_docs__list_each_programs_exit_codes() -> None:
    """The table of docs/guides/cli.md ("Exit codes") says what each program's --help says."""
    from pathlib import Path

    from orchestrator.cli.octl.session import EXIT_CODES_HELP as OCTL_CODES

    readme = (Path(__file__).parents[2] / "docs" / "guides" / "cli.md").read_text()

    for name, codes in (
        ("octl", OCTL_CODES),
        ("orchestrator", server.EXIT_CODES_HELP),
        ("po-runner", runner.EXIT_CODES_HELP),
    ):
        assert f"| `{name}` | {codes}" in readme, name
