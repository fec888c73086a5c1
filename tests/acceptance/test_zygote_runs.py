"""Local runs forked from the zygote (``PO_LOCAL_ZYGOTE=auto``, the default; ``launchers.zygote``): every
deployment of a server gets a runner process of its own, forked from the one zygote the server started at
its first local run; a forked run gets exactly what a runner started as a process of its own gets (the
same variables, its own HOME, TMPDIR and code directory, nothing of the server's); the zygote ends with its
server, stopped or killed, and the runs it forked go on.

A real ``orchestrator serve``, real runner processes and the embedded engine; what a run sees is read by a
``local-exec`` provisioner of the deployed module: the runner process above it (its pid, its parent, its
command line) and the environment the engine got.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.outages import ServerProcess, wait_for, zygote_of
from tests.support.stack import EXAMPLES, Stack, build_stack, demo_manifest

pytestmark = [pytest.mark.slow, pytest.mark.spread]

MODULE = yaml.safe_load((EXAMPLES / "module.yaml").read_text())


def _probe_module(found: Path) -> str:
    """The demo module and a resource replaced on every deploy whose provisioner finds the runner above it
    (the process running ``orchestrator.cli.runner``) and writes down its command line, its parent's pid
    and the environment the engine got, in files named by the runner's pid."""
    script = f"""
p=$PPID
while [ "$p" -gt 1 ] && ! tr '\\0' ' ' < /proc/$p/cmdline | grep -q orchestrator.cli.runner; do
  p=$(cut -d ' ' -f 4 /proc/$p/stat)
done
tr '\\0' ' ' < /proc/$p/cmdline > {found}/cmdline.$p
cut -d ' ' -f 4 /proc/$p/stat > {found}/parent.$p
env > {found}/env.$p
"""
    code: str = MODULE["module_source_code"]
    return code + (
        '\nresource "terraform_data" "probe" {\n  triggers_replace = timestamp()\n'
        '  provisioner "local-exec" {\n'
        f"    command = <<-EOT\n{script}\n    EOT\n  }}\n}}\n"
    )


class Served:
    """A server (with ``environment``) whose demo module records the runner of each deployment."""

    def __init__(self, database_url: str, tmp_path: Path, **environment: str) -> None:
        self.found = tmp_path / "found"
        self.found.mkdir(parents=True)
        self.server = ServerProcess(database_url, tmp_path / "data", **environment)
        self.server.start()
        self.stack: Stack = build_stack(self.server.url, tmp_path)
        patched = self.stack.client.patch(
            f"/orgs/{self.stack.org}/modules/demo-app", json={"module_source_code": _probe_module(self.found)}
        )
        assert 200 == patched.status_code, patched.text

    def deploy(self) -> tuple[int, str, int, dict[str, str]]:
        """One deployment; the pid, command line, parent pid and engine environment of its runner."""
        before = set(self.found.glob("cmdline.*"))
        deployment = self.stack.deploy(demo_manifest())
        assert "succeeded" == deployment["status"], deployment["status_message"]
        (written,) = set(self.found.glob("cmdline.*")) - before
        pid = int(written.suffix.removeprefix("."))
        env = (self.found / f"env.{pid}").read_text()
        parent = int((self.found / f"parent.{pid}").read_text())
        variables = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
        return pid, written.read_text(), parent, variables

    def close(self) -> None:
        self.stack.client.close()
        self.server.stop()


@pytest.fixture
def served(database_url: str, tmp_path: Path) -> Iterator[Served]:
    made = Served(database_url, tmp_path / "zygote")
    yield made
    made.close()


def test_zygote__each_deployment_is_a_process_of_its_own_forked_from_one_zygote(served: Served) -> None:
    runs = [served.deploy() for _ in range(3)]
    zygote = zygote_of(served.server)

    pids = [pid for pid, _, _, _ in runs]
    assert zygote is not None
    assert len(set(pids)) == 3  # never one process for two deployments
    assert [zygote] * 3 == [parent for _, _, parent, _ in runs]
    assert all(command.split()[-1] == "zygote" for _, command, _, _ in runs)
    # No warm runner is started beside it.
    assert not (served.server.runs_dir / ".warm").exists()


def test_zygote__a_forked_run_gets_what_a_runner_of_its_own_gets(served: Served) -> None:
    _, forked_command, _, forked = served.deploy()
    # The same server restarted with the zygote off: a runner process of its own (no warm one).
    served.server.stop()
    served.server.env.update(PO_LOCAL_ZYGOTE="off", PO_LOCAL_WARM_RUNNERS="0")
    served.server.start()
    _, own_command, _, cold = served.deploy()

    assert (forked_command.split()[-1], own_command.split()[-1]) == ("zygote", "standard")
    # The same variables (values differ per run: its token, directory, deployment id)...
    assert sorted(cold) == sorted(forked)
    # ... and its own HOME, TMPDIR and code directory, in its run directory; nothing of the server's.
    for name in ("HOME", "TMPDIR", "IAC_CODE_DIR"):
        assert served.server.runs_dir in Path(forked[name]).parents, name
    assert [] == [name for name in forked if name.startswith("PO_")]
    assert {k: v for k, v in cold.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")} == {
        k: v for k, v in forked.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")
    }


def test_zygote__ends_with_its_server_stopped_or_killed(served: Served) -> None:
    served.deploy()
    first = zygote_of(served.server)
    assert first is not None

    served.server.stop()  # SIGTERM: the lifespan closes the launcher
    wait_for(lambda: not os.path.exists(f"/proc/{first}") or _zombie(first), 30, "the zygote to exit")

    served.server.start()
    served.deploy()
    second = zygote_of(served.server)
    assert second is not None and second != first
    served.server.kill()  # SIGKILL: its channel closes with the server
    wait_for(lambda: not os.path.exists(f"/proc/{second}") or _zombie(second), 30, "the zygote to exit")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
