"""A newcomer's path works from the docs alone: "Get started" (docs/get-started/) followed word for word, as
a user in two terminals would, on a fresh home and data directory: the install, the server, `octl`'s
configuration, then the first deployment with `octl` (octl.md) or with the Terraform provider
(terraform.md), each to its clean-up.

Each command is the page's own (tests/support/docs.py reads the blocks); what the test adds: a free port
instead of 8080 (suites may run at once), the `Id` a user would copy from `octl get deployments` in place
of `DEPLOYMENT`, and the checks of what the pages say is printed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.docs import DOCS, ROOT, Shell, blocks, commands, docs_example, substitute, wait_for
from tests.support.postgres import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.spread]

DOCS_URL = "http://127.0.0.1:8080"


@pytest.fixture
def temp_dir() -> Iterator[Path]:
    """TMPDIR of the newcomer's shell: not under tmp_path (0700), since as root the runs execute as other
    users, who must pass through to the server's runs directory in it."""
    made = Path(tempfile.mkdtemp(prefix="po-docs-test-"))
    made.chmod(0o711)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def newcomer(tmp_path: Path, temp_dir: Path) -> Iterator[Shell]:
    """A shell in the checkout with a home of its own and nothing of this test run's settings: no PO_*,
    OCTL_*, TF_* or XDG_* variable, no virtual environment. uv is where scripts/bootstrap finds it on this
    machine (with the real home), as it is for a user who bootstrapped before."""
    uv = subprocess.run(
        ["bash", str(ROOT / "scripts" / "bootstrap")], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    cache = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, check=True).stdout.strip()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PO_", "OCTL_", "TF_", "XDG_", "PYTEST", "UV_"))
        and key not in ("VIRTUAL_ENV", "PYTHONPATH", "HOME", "COLUMNS")
    }
    env.update(
        HOME=str(home),
        PATH=f"{Path(uv).parent}:{env['PATH']}",
        UV_CACHE_DIR=cache,
        NO_COLOR="1",
        CHECKPOINT_DISABLE="1",
        TMPDIR=str(temp_dir),
        # The port only: 8080 in the docs.
        PO_LISTEN=f"127.0.0.1:{free_port()}",
    )
    shell = Shell(cwd=ROOT, env=env, state=tmp_path, timeout=600)
    try:
        yield shell
    finally:
        shell.stop()


def start_server(shell: Shell, tmp_path: Path) -> str:
    """Steps 1 to 3 of docs/get-started/index.md; the server's URL."""
    shell.run(docs_example("get-started/install"))
    url = f"http://{shell.env['PO_LISTEN']}"
    log = tmp_path / "server.log"
    (serve,) = commands(docs_example("get-started/serve"))
    shell.start(serve, log=log)
    wait_for(f"{url}/healthz", log=log)
    shell.run(substitute(docs_example("get-started/configure"), {DOCS_URL: url}))
    assert "platform admin token" in log.read_text().lower()  # the first start printed one
    data_dir = Path(shell.env["HOME"]) / ".local" / "share" / "platform-orchestrator"
    assert (data_dir / "server.key").is_file(), "the server's data directory is the fresh default one"
    return url


def text_after(page: Path, name: str) -> str:
    """The first ``text`` block after example ``name`` on ``page`` (what the page says is printed)."""
    found = blocks(page)
    index = next(i for i, block in enumerate(found) if block.name == name)
    return next(block.text for block in found[index + 1 :] if block.language == "text")


def first_id(table: str) -> str:
    """The first row's `Id` of a table `octl get` printed (piped: plain, every value whole)."""
    header, first, *_ = [line for line in table.splitlines() if line.strip()]
    assert header.split()[0] == "Id", table
    return first.split()[0]


def test_get_started__the_octl_variant(newcomer: Shell, tmp_path: Path) -> None:
    start_server(newcomer, tmp_path)
    page = DOCS / "get-started" / "octl.md"
    assert docs_example("get-started/runner-yaml") == (ROOT / "examples/demo/runner.yaml").read_text()
    assert docs_example("get-started/manifest-yaml") == (ROOT / "examples/demo/manifest.yaml").read_text()

    newcomer.run(docs_example("get-started/octl-environment"))
    linked = newcomer.run(docs_example("get-started/octl-runner"))
    assert "local" in linked.stdout + linked.stderr
    newcomer.run(docs_example("get-started/octl-catalogue"))
    deployed = newcomer.run(docs_example("get-started/octl-deploy"))
    for line in text_after(page, "get-started/octl-deploy").splitlines():
        assert line in deployed.stdout.splitlines(), deployed.stdout

    listing, logs, code, again = commands(docs_example("get-started/octl-look"))
    deployment = first_id(newcomer.run(listing).stdout)
    assert "Apply complete!" in newcomer.run(substitute(logs, {"DEPLOYMENT": deployment})).stdout
    assert 'module "' in newcomer.run(substitute(code, {"DEPLOYMENT": deployment})).stdout
    newcomer.run(again)
    second = first_id(newcomer.run(listing).stdout)
    assert second != deployment
    assert (
        "Apply complete! Resources: 0 added, 0 changed, 0 destroyed."
        in newcomer.run(f"octl logs {second}").stdout
    )

    newcomer.run(docs_example("get-started/octl-delete"))
    gone = newcomer.run("octl get envs -o json")
    assert [] == json.loads(gone.stdout)


def test_get_started__the_terraform_variant(newcomer: Shell, tmp_path: Path) -> None:
    start_server(newcomer, tmp_path)

    newcomer.run(docs_example("get-started/tf-provider"))
    workdir = Path(newcomer.env["HOME"]) / "po-first-deployment"
    assert newcomer.run("pwd").stdout.strip() == str(workdir)
    (workdir / "main.tf").write_text(docs_example("get-started/tf-main"))  # "Put this into main.tf"
    applied = newcomer.run(docs_example("get-started/tf-apply"))
    assert applied.stdout.endswith("https://shop.example.test/bucket-shop"), applied.stdout[-2000:]
    assert 0 == newcomer.run("po-terraform plan -detailed-exitcode -no-color", check=False).returncode
    envs = json.loads(newcomer.run("octl get envs --org tf-demo -o json").stdout)
    assert [("shop", "dev", "local")] == [(e["project_id"], e["id"], e.get("runner_id")) for e in envs]

    newcomer.run(docs_example("get-started/tf-destroy"))
    assert [] == json.loads(newcomer.run("octl get envs --org tf-demo -o json").stdout)
    assert [] == json.loads(newcomer.run("octl get runners --org tf-demo -o json").stdout)
