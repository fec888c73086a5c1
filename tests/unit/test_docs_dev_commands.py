"""The test suite's own commands in the docs (docs/contributing/development.md, docs/operate/reliability.md):
they are CI's to run in full (.ci/run runs scripts/check, which runs scripts/test), so here each runs with
``--collect-only`` (the one-database line on one file of tests): the command works as printed and selects
the tests the page says; the one small enough
(`PO_TEST_WORKERS=0 scripts/test tests/unit/test_layering.py`) runs whole."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.docs import ROOT, commands, docs_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run(line: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PO_TEST_"))}
    # Collected in one process: xdist's workers would each import and collect the whole suite again (a
    # line that sets PO_TEST_WORKERS itself still does).
    env["PO_TEST_WORKERS"] = "0"
    return subprocess.run(
        ["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=800
    )


def collected(done: subprocess.CompletedProcess[str]) -> int:
    assert 0 == done.returncode, done.stdout[-3000:] + done.stderr[-3000:]
    last = [line for line in done.stdout.splitlines() if "collected" in line or "tests collected" in line]
    assert last, done.stdout[-2000:]
    return int(last[-1].split()[0].split("/")[0])


def test_development_page__its_commands(tmp_path: object) -> None:
    check, unit, sqlite_only, one_file = commands(docs_example("contributing/dev-commands"))
    assert check.split()[0] == "scripts/check" and "bash scripts/check" in (ROOT / ".ci" / "run").read_text()
    assert collected(run(f"{unit.split('#')[0].strip()} --collect-only")) > 100
    # One file of tests on both databases, to see the one-database setting work without collecting all.
    sqlite = run(f"{sqlite_only.split('#')[0].strip()} tests/integration/test_usage_api.py --collect-only -q")
    assert collected(sqlite) > 0
    assert "[sqlite" in sqlite.stdout and "[postgresql" not in sqlite.stdout
    whole = run(one_file.split("#")[0].strip())
    assert 0 == whole.returncode, whole.stdout[-3000:]
    assert " passed" in whole.stdout


def test_reliability_page__the_fault_suite_commands_select_the_fault_suite() -> None:
    for line in commands(docs_example("operate/fault-suite")):
        done = run(f"{line.split('#')[0].strip()} --collect-only -q")
        assert collected(done) > 0
        assert all(test.startswith("tests/faults/") for test in done.stdout.splitlines() if "::" in test), (
            done.stdout[-2000:]
        )
