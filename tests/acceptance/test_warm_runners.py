"""Warm runners (``PO_LOCAL_WARM_RUNNERS`` with ``PO_LOCAL_ZYGOTE=off``, ``launchers.warm``): after the
first local run, deployments are handed to runner processes started ahead; each serves one deployment
only, gets exactly the environment, directory and stderr file a cold runner gets, and an idle one exits
when its server stops or dies.

A real ``orchestrator serve``, real runner processes and the embedded engine; what a run sees is read by a
``local-exec`` provisioner of the deployed module: the runner process above it (its command line and pid)
and its environment.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.outages import ServerProcess, wait_for
from tests.support.stack import EXAMPLES, Stack, build_stack, demo_manifest

pytestmark = [pytest.mark.slow, pytest.mark.spread]

MODULE = yaml.safe_load((EXAMPLES / "module.yaml").read_text())


def _probe_module(found: Path) -> str:
    """The demo module and a resource replaced on every deploy whose provisioner finds the runner above
    it (the process running ``orchestrator.cli.runner``) and writes down its command line, pid and the
    environment the engine got."""
    script = f"""
p=$PPID
while [ "$p" -gt 1 ] && ! tr '\\0' ' ' < /proc/$p/cmdline | grep -q orchestrator.cli.runner; do
  p=$(cut -d ' ' -f 4 /proc/$p/stat)
done
tr '\\0' ' ' < /proc/$p/cmdline > {found}/cmdline.$p
env > {found}/env.$p
"""
    code: str = MODULE["module_source_code"]
    return code + (
        '\nresource "terraform_data" "probe" {\n  triggers_replace = timestamp()\n'
        '  provisioner "local-exec" {\n'
        f"    command = <<-EOT\n{script}\n    EOT\n  }}\n}}\n"
    )


class Warm:
    def __init__(self, database_url: str, tmp_path: Path) -> None:
        self.found = tmp_path / "found"
        self.found.mkdir()
        # Warm runners serve when the zygote is off (tests/acceptance/test_zygote_runs.py: when it is on).
        self.server = ServerProcess(
            database_url, tmp_path / "data", PO_LOCAL_WARM_RUNNERS="2", PO_LOCAL_ZYGOTE="off"
        )
        self.server.start()
        self.stack: Stack = build_stack(self.server.url, tmp_path)
        patched = self.stack.client.patch(
            f"/orgs/{self.stack.org}/modules/demo-app", json={"module_source_code": _probe_module(self.found)}
        )
        assert 200 == patched.status_code, patched.text

    def deploy(self) -> tuple[int, str, dict[str, str]]:
        """One deployment; the pid, command line and engine environment of the runner that ran it."""
        before = set(self.found.glob("cmdline.*"))
        deployment = self.stack.deploy(demo_manifest())
        assert "succeeded" == deployment["status"], deployment["status_message"]
        (written,) = set(self.found.glob("cmdline.*")) - before
        pid = int(written.suffix.removeprefix("."))
        env = (self.found / f"env.{pid}").read_text()
        return pid, written.read_text(), dict(line.split("=", 1) for line in env.splitlines() if "=" in line)

    def idle_runners(self) -> list[int]:
        """Live warm runners of this server: their stderr is a file of its runs dir's ``.warm``."""
        found = []
        warm_dir = str(self.server.runs_dir / ".warm") + os.sep
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (
                    os.readlink(entry / "fd" / "2").startswith(warm_dir)
                    and (entry / "stat").read_text().split(") ")[1][0] not in "ZX"
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found


@pytest.fixture
def warm(database_url: str, tmp_path: Path) -> Iterator[Warm]:
    made = Warm(database_url, tmp_path)
    yield made
    made.stack.client.close()
    made.server.stop()


def test_warm__runs_after_the_first_are_handed_to_started_runners_one_deployment_each(warm: Warm) -> None:
    runs = [warm.deploy() for _ in range(3)]

    pids = [pid for pid, _, _ in runs]
    commands = [command.split()[-1] for _, command, _ in runs]
    # The first run finds the pool empty (it fills on first use); the next ones are handed to it.
    assert ["standard", "warm", "warm"] == commands
    assert len(set(pids)) == 3  # never one process for two deployments
    # The pool is refilled: two idle runners wait again.
    wait_for(lambda: len(warm.idle_runners()) == 2, 30, "the pool to be refilled")


def test_warm__a_warm_run_gets_what_a_cold_one_gets_and_nothing_of_the_server(warm: Warm) -> None:
    (_, cold_command, cold), (_, warm_command, hot) = warm.deploy(), warm.deploy()

    assert (cold_command.split()[-1], warm_command.split()[-1]) == ("standard", "warm")
    # The same variables (values differ per run: its token, directory, deployment id)...
    assert sorted(cold) == sorted(hot)
    # ... and its own HOME, TMPDIR and code directory, in its run directory.
    for name in ("HOME", "TMPDIR", "IAC_CODE_DIR"):
        assert warm.server.runs_dir in Path(hot[name]).parents, name
        assert hot[name] != cold[name], name
    assert [] == [name for name in hot if name.startswith("PO_")]
    assert hot["DEPLOYMENT_ID"] != cold["DEPLOYMENT_ID"]


def test_warm__idle_runners_exit_when_the_server_stops_or_dies(warm: Warm) -> None:
    warm.deploy()
    first = wait_for(lambda: len(warm.idle_runners()) == 2 and warm.idle_runners(), 30, "two idle runners")

    warm.server.stop()  # SIGTERM: the lifespan closes the pool
    wait_for(lambda: not warm.idle_runners(), 30, f"idle runners {first} to exit after a stop")

    warm.server.start()
    warm.deploy()
    wait_for(lambda: len(warm.idle_runners()) == 2, 30, "two idle runners again")
    warm.server.kill()  # SIGKILL: their stdin pipes close with the server
    wait_for(lambda: not warm.idle_runners(), 30, "idle runners to exit after the server was killed")
