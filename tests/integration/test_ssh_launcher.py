"""The ``vm`` runner over SSH against a real OpenSSH server on loopback (tests/support/sshd.py): the login is
this test's user, and the remote ``po-runner`` is this checkout's (``.venv/bin``, on the PATH the job's
environment gives). Runs talk to a gateway that refuses connections (127.0.0.1:9): with
``RUNNER_HTTP_ATTEMPTS=1`` the runner gives up at once and exits 1, otherwise it keeps retrying
(``RUNNER_GATEWAY_CONNECT_SECONDS`` raised: a run that stays up until it is cancelled)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import SecretStr

from orchestrator.domain.runner_types import VmRunnerJob
from orchestrator.launchers import processes
from orchestrator.launchers.base import LaunchError, RunState, RunStatus
from orchestrator.launchers.egress import EgressPolicy
from orchestrator.launchers.ssh import SshConnection, SshLauncher
from orchestrator.launchers.ssh_scripts import Handle
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import RunnerMode
from tests.support.container_engine import install_engine
from tests.support.postgres import free_port
from tests.support.sshd import SshServer, new_key_pair, running_sshd

VENV_BIN = str(Path(sys.executable).parent)
RUN_PATH = f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin"
SECRET = "s3cr3t-job-value-4711"
TOKEN = "deployment-token-0815-abcdef"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_run_left(tmp_path: Path) -> Iterator[None]:
    """Whatever a test leaves running of its runs is killed (by pid, found through /proc) after it."""
    yield
    for pid_file in tmp_path.glob("runs/*/runner.pid"):
        leader, started = (int(part) for part in pid_file.read_text().split())
        processes.send(processes.members(leader, started), signal.SIGKILL)


def job(tmp_path: Path, *, quick: bool = False, **environment: str) -> dict[str, Any]:
    env = {"PATH": RUN_PATH, **environment}
    if quick:
        env["RUNNER_HTTP_ATTEMPTS"] = "1"
    else:
        env["RUNNER_GATEWAY_CONNECT_SECONDS"] = "3600"
    return {"work_dir": str(tmp_path / "runs"), "environment": env, "secrets": {"MY_SECRET": SECRET}}


def spec(job_config: dict[str, Any], deployment_id: str | None = None) -> RunSpec:
    return RunSpec(
        org_id="acme",
        runner_id="vm-ssh",
        deployment_id=deployment_id or str(uuid.uuid4()),
        env_uuid=str(uuid.uuid4()),
        mode=RunnerMode.DEPLOY,
        token=SecretStr(TOKEN),
        gateway_url="http://127.0.0.1:9",
        runner_configuration={"type": "vm", "connection": {"type": "ssh"}, "job": job_config},
    )


def launcher(server: SshServer, job_config: dict[str, Any] | None = None, **connection: Any) -> SshLauncher:
    values: dict[str, Any] = {
        "host": server.host,
        "port": server.port,
        "username": server.username,
        "host_public_key": server.host_public_key,
        "private_key": server.private_key,
        "connect_timeout_seconds": 10.0,
        **connection,
    }
    return SshLauncher(
        SshConnection(**values),
        job=VmRunnerJob.model_validate(job_config or {}),
        egress=EgressPolicy(denied_networks=()),
        reap_grace_seconds=5,
    )


async def wait_for(
    check: Callable[[], Awaitable[RunStatus]], done: Callable[[RunStatus], bool], within_seconds: float = 90
) -> RunStatus:
    deadline = asyncio.get_running_loop().time() + within_seconds
    while True:
        status = await check()
        if done(status) or asyncio.get_running_loop().time() > deadline:
            return status
        await asyncio.sleep(0.3)


def run_processes(handle: str) -> list[int]:
    """The live processes of the run (the host is this one): its session, through /proc."""
    pid_file = Path(Handle.parse(handle).run_dir) / "runner.pid"
    leader, started = (int(part) for part in pid_file.read_text().split())
    return processes.members(leader, started)


def runner_pid(handle: str) -> int | None:
    for pid in run_processes(handle):
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"po-runner" in cmdline.read():
                return pid
    return None


async def wait_until_runner_started(handle: str) -> int:
    for _ in range(300):
        pid = runner_pid(handle)
        if pid is not None:
            return pid
        await asyncio.sleep(0.1)
    raise AssertionError("po-runner did not start")


def environment_of(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def files_under(directory: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in directory.rglob("*") if path.is_file()}


def rsa_public_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


def all_command_lines() -> str:
    """What ``ps`` shows: the command line of every process of the host (this one), one a line."""
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return "\n".join(lines)


# --- running ----------------------------------------------------------------------------------------------


async def test_launch__a_detached_run_followed_to_its_exit_code(sshd: SshServer, tmp_path: Path) -> None:
    """The runner runs on the host in its run directory until it exits; its exit code and last stderr
    line are the status; its working directory is removed (no unsaved state)."""
    config = job(tmp_path, quick=True)
    run = spec(config)
    ssh = launcher(sshd, config)

    handle = await ssh.launch(run)
    first = await ssh.status(handle)
    ended = await wait_for(lambda: ssh.status(handle), lambda s: s.state is RunState.EXITED)

    run_dir = tmp_path / "runs" / run.deployment_id
    assert handle == f"ssh:{sshd.username}@127.0.0.1:{sshd.port}:process:{run_dir}"
    assert first.state in (RunState.RUNNING, RunState.EXITED)
    assert (RunState.EXITED, 1) == (ended.state, ended.exit_code)
    assert ended.detail is not None and ended.detail.startswith("po-runner: ")
    assert "1\n" == (run_dir / "exit_code").read_text()
    assert not (run_dir / "work").exists()


async def test_launch__removes_runs_that_ended_a_week_ago(sshd: SshServer, tmp_path: Path) -> None:
    """Run directories of runs that ended over seven days ago go at the next launch; one holding unsaved
    state stays, and so do recent ones."""
    runs = tmp_path / "runs"
    week_ago = time.time() - 8 * 86400
    for name, state in (("old", False), ("old-with-state", True), ("recent", False)):
        (runs / name / "work" / "code").mkdir(parents=True)
        (runs / name / "exit_code").write_text("0\n")
        if state:
            (runs / name / "work" / "code" / "errored.tfstate").write_text("{}")
        if name.startswith("old"):
            os.utime(runs / name / "exit_code", (week_ago, week_ago))
    config = job(tmp_path, quick=True)

    handle = await launcher(sshd, config).launch(spec(config))

    assert {"old-with-state", "recent", Path(Handle.parse(handle).run_dir).name} == {
        path.name for path in runs.iterdir()
    }


async def test_launch__again_adopts_the_run_also_after_a_restart(sshd: SshServer, tmp_path: Path) -> None:
    """A second launch for the deployment, by a new launcher (the orchestrator restarted), returns the
    running run's handle and starts nothing; the new launcher sees it running and can stop it."""
    config = job(tmp_path)
    run = spec(config)
    handle = await launcher(sshd, config).launch(run)
    runner = await wait_until_runner_started(handle)

    restarted = launcher(sshd, config)
    status = await restarted.status(handle)
    again = await restarted.launch(run)
    runners_after = runner_pid(handle)
    await restarted.cancel(handle, grace_seconds=3)

    assert RunState.RUNNING is status.state
    assert handle == again
    assert runner == runners_after


async def test_cancel__ends_every_process_of_the_run(sshd: SshServer, tmp_path: Path) -> None:
    """SIGTERM to the run (the runner reports and retries), SIGKILL after the grace period: nothing of the
    run's session is left, and the run counts as exited."""
    config = job(tmp_path)
    ssh = launcher(sshd, config)
    handle = await ssh.launch(spec(config))
    await wait_until_runner_started(handle)
    before = run_processes(handle)

    await ssh.cancel(handle, grace_seconds=2)
    after = run_processes(handle)
    status = await ssh.status(handle)

    assert len(before) >= 2  # the session leader and the runner
    assert [] == after
    assert RunState.EXITED is status.state


async def test_run__secrets_only_in_its_environment(sshd: SshServer, tmp_path: Path) -> None:
    """The job's secret and the deployment token reach the runner's environment, and no command line of
    the host (``ps``) nor any file of the run directory."""
    config = job(tmp_path)
    ssh = launcher(sshd, config)
    handle = await ssh.launch(spec(config))
    runner = await wait_until_runner_started(handle)
    environ = environment_of(runner)
    command_lines = all_command_lines()
    run_dir = Path(Handle.parse(handle).run_dir)
    files = files_under(run_dir)
    await ssh.cancel(handle, grace_seconds=2)

    assert f"MY_SECRET={SECRET}".encode() in environ
    assert f"TOKEN={TOKEN}".encode() in environ
    assert f"PATH={RUN_PATH}".encode() in environ
    assert f"HOME={run_dir}/work/home".encode() in environ
    assert f"IAC_CODE_DIR={run_dir}/work/code".encode() in environ
    assert str(run_dir) in command_lines  # the run is there: `sh <run dir>/run.sh`
    assert SECRET not in command_lines
    assert TOKEN not in command_lines
    assert {"runner.pid", "run.sh", "stderr.log"} <= {path.name for path in files}
    assert [] == [path for path, data in files.items() if SECRET.encode() in data or TOKEN.encode() in data]


async def test_run__values_reach_the_runner_as_they_are(sshd: SshServer, tmp_path: Path) -> None:
    """Quotes, newlines, ``$`` and backquotes in values pass the remote shell unchanged."""
    tricky = 'it\'s "quoted"\n$HOME `id` $(id) \\ end'
    config = job(tmp_path, TRICKY=tricky)
    ssh = launcher(sshd, config)
    handle = await ssh.launch(spec(config))
    runner = await wait_until_runner_started(handle)
    environ = environment_of(runner)
    await ssh.cancel(handle, grace_seconds=2)

    assert f"TRICKY={tricky}".encode() in environ


async def test_unsaved_state__kept_reported_and_removed_once_recovered(
    sshd: SshServer, tmp_path: Path
) -> None:
    """State Terraform could not save stays on the host when the run ends: the status reads it back, a
    new launch for the deployment refuses to replace it, and once recovered it is removed."""
    config = job(tmp_path, quick=True)
    run = spec(config)
    ssh = launcher(sshd, config)
    handle = await ssh.launch(run)
    code = Path(Handle.parse(handle).run_dir) / "work" / "code"
    (code / "errored.tfstate").write_text('{"version": 4, "serial": 7}')

    ended = await wait_for(lambda: ssh.status(handle), lambda s: s.state is RunState.EXITED)
    with pytest.raises(LaunchError) as relaunch:
        await ssh.launch(run)
    ssh.forget_unsaved_state(handle)
    # The run directory goes in the background, its files before the directory itself (rm -rf): wait for the
    # directory, not the file, or a loaded machine sees the file gone and the directory still there.
    for _ in range(300):
        if not code.parent.exists():
            break
        await asyncio.sleep(0.1)

    assert ended.unsaved_state is not None
    assert ended.unsaved_state.data == b'{"version": 4, "serial": 7}'
    assert ended.unsaved_state.path == f"127.0.0.1:{code / 'errored.tfstate'}"
    assert not relaunch.value.retryable
    assert "holds state Terraform could not save" in relaunch.value.message
    assert not code.parent.exists()


# --- containers (a stand-in engine CLI: tests/support/container_engine.py) ------------------------------


def container_job(tmp_path: Path, *, quick: bool = False) -> dict[str, Any]:
    install_engine(tmp_path / "engine")
    env = {"PATH": f"{tmp_path / 'engine'}:/usr/bin:/bin"}
    if quick:
        env["RUNNER_HTTP_ATTEMPTS"] = "1"
    else:
        env["RUNNER_GATEWAY_CONNECT_SECONDS"] = "3600"
    return {
        "work_dir": str(tmp_path / "runs"),
        "runtime": "docker",
        "image": "registry.example.com/runner:test",
        "environment": env,
        "secrets": {"MY_SECRET": SECRET},
    }


def engine_runs(tmp_path: Path) -> list[list[str]]:
    """The argv of each ``docker run`` the machine saw."""
    lines = (tmp_path / "engine" / "runs.log").read_text().splitlines()
    return [json.loads(line) for line in lines]


def container_runner(tmp_path: Path, name: str) -> int | None:
    try:
        return int((tmp_path / "engine" / "containers" / name / "pid").read_text().split()[0])
    except (OSError, ValueError):
        return None


async def test_container__run_to_its_exit_code_then_removed(sshd: SshServer, tmp_path: Path) -> None:
    """``docker run -d`` with ``-e NAME`` only (the values in the client's environment); the status check
    that sees the container ended records its exit code and stderr, and removes the container."""
    config = container_job(tmp_path, quick=True)
    run = spec(config)
    ssh = launcher(sshd, config)

    handle = await ssh.launch(run)
    ended = await wait_for(lambda: ssh.status(handle), lambda s: s.state is RunState.EXITED)
    again = await ssh.status(handle)

    (argv,) = engine_runs(tmp_path)
    assert (
        handle == f"ssh:{sshd.username}@127.0.0.1:{sshd.port}:docker:{tmp_path / 'runs' / run.deployment_id}"
    )
    assert argv[:6] == ["run", "-d", "--name", run.deployment_id, "--network", "host"]
    assert argv[-2:] == ["registry.example.com/runner:test", "standard"]
    assert ["-e", "MY_SECRET"] == argv[argv.index("MY_SECRET") - 1 : argv.index("MY_SECRET") + 1]
    assert [] == [arg for arg in argv if SECRET in arg or TOKEN in arg]
    assert (RunState.EXITED, 1) == (ended.state, ended.exit_code)
    assert ended.detail is not None and ended.detail.startswith("po-runner: ")
    assert (again.state, again.exit_code, again.detail) == (ended.state, ended.exit_code, ended.detail)
    assert not (tmp_path / "engine" / "containers" / run.deployment_id).exists()


async def test_container__no_daemon_answering_fails_the_launch_naming_its_address(
    sshd: SshServer, tmp_path: Path
) -> None:
    """Issue 26: a Docker CLI whose daemon does not answer is asked before `docker run`, whose own error
    ("Run 'docker run --help' for more information") names nothing."""
    config = container_job(tmp_path, quick=True)
    (tmp_path / "engine" / "daemon-down").touch()

    with pytest.raises(LaunchError) as refused:
        await launcher(sshd, config).launch(spec(config))

    assert refused.value.retryable is False
    assert (
        f"no container engine answers at unix:///var/run/docker.sock on {sshd.username}@127.0.0.1"
        in refused.value.message
    )
    assert "Cannot connect to the Docker daemon" in refused.value.message
    assert "docker run --help" not in refused.value.message
    assert not (tmp_path / "engine" / "runs.log").exists()


async def test_container__adopted_while_it_runs_and_stopped(sshd: SshServer, tmp_path: Path) -> None:
    config = container_job(tmp_path)
    run = spec(config)
    ssh = launcher(sshd, config)
    handle = await ssh.launch(run)
    for _ in range(100):
        if container_runner(tmp_path, run.deployment_id) is not None:
            break
        await asyncio.sleep(0.1)
    runner = container_runner(tmp_path, run.deployment_id)
    assert runner is not None
    environ = environment_of(runner)

    again = await launcher(sshd, config).launch(run)
    running = await ssh.status(handle)
    await ssh.cancel(handle, grace_seconds=2)
    stopped = await ssh.status(handle)

    assert handle == again
    assert 1 == len(engine_runs(tmp_path))
    assert f"MY_SECRET={SECRET}".encode() in environ
    assert f"TOKEN={TOKEN}".encode() in environ
    assert RunState.RUNNING is running.state
    assert RunState.EXITED is stopped.state
    assert stopped.exit_code in (1, 137, 143)


# --- what stops a launch ----------------------------------------------------------------------------------


async def test_host_key_mismatch__refused_naming_the_cause(sshd: SshServer, tmp_path: Path) -> None:
    """A host presenting another key than ``connection.host_public_key`` is never used: not retryable,
    the message names the host and the cause, and holds no secret."""
    config = job(tmp_path)
    ssh = launcher(sshd, config, host_public_key=new_key_pair().public_key)

    with pytest.raises(LaunchError) as raised:
        await ssh.launch(spec(config))
    status = await ssh.status(f"ssh:{sshd.username}@127.0.0.1:{sshd.port}:process:{tmp_path}/runs/x")

    message = raised.value.message
    assert not raised.value.retryable
    assert message.startswith(
        f"the SSH host key of 127.0.0.1:{sshd.port} does not match the runner's connection.host_public_key"
    )
    assert "it presents ssh-ed25519 SHA256:" in message
    assert (RunState.UNKNOWN, message) == (status.state, status.detail)
    assert not (tmp_path / "runs").exists()
    for secret in (SECRET, TOKEN, *sshd.private_key.splitlines()[1:-1]):
        assert secret not in message


async def test_host_key_of_another_type__refused_as_a_mismatch(sshd: SshServer, tmp_path: Path) -> None:
    """A pinned RSA key when the host has an Ed25519 one: the key exchange fails; still a mismatch."""
    config = job(tmp_path)
    ssh = launcher(sshd, config, host_public_key=rsa_public_key())

    with pytest.raises(LaunchError) as raised:
        await ssh.launch(spec(config))

    assert not raised.value.retryable
    assert "does not match the runner's connection.host_public_key (ssh-rsa SHA256:" in raised.value.message


async def test_wrong_private_key__refused(sshd: SshServer, tmp_path: Path) -> None:
    config = job(tmp_path)
    other = new_key_pair().private_key
    ssh = launcher(sshd, config, private_key=other)

    with pytest.raises(LaunchError) as raised:
        await ssh.launch(spec(config))

    assert not raised.value.retryable
    assert raised.value.message.startswith(
        f"{sshd.username}@127.0.0.1:{sshd.port} refused the runner's connection.private_key: public key "
        "authentication failed"
    )
    assert all(line not in raised.value.message for line in other.splitlines()[1:-1])


async def test_unreachable_host__retryable_and_unknown(sshd: SshServer, tmp_path: Path) -> None:
    """Nothing listens on the port: the launch may succeed later; a status check cannot tell."""
    config = job(tmp_path)
    port = free_port()
    ssh = launcher(sshd, config, port=port)

    with pytest.raises(LaunchError) as raised:
        await ssh.launch(spec(config))
    status = await ssh.status(f"ssh:{sshd.username}@127.0.0.1:{port}:process:{tmp_path}/runs/x")

    assert raised.value.retryable
    assert raised.value.message.startswith(f"cannot connect to {sshd.username}@127.0.0.1:{port} over SSH: ")
    assert RunState.UNKNOWN is status.state
    assert status.detail == raised.value.message


async def test_runner_not_on_path__refused_naming_the_path(sshd: SshServer, tmp_path: Path) -> None:
    config = job(tmp_path, PATH="/usr/bin:/bin")
    ssh = launcher(sshd, config)

    with pytest.raises(LaunchError) as raised:
        await ssh.launch(spec(config))

    assert not raised.value.retryable
    assert raised.value.message.startswith(
        f"po-runner is not on the PATH of {sshd.username}@127.0.0.1:{sshd.port} "
        "(job.environment.PATH /usr/bin:/bin)"
    )


async def test_egress__loopback_refused_by_the_default_policy(sshd: SshServer, tmp_path: Path) -> None:
    config = job(tmp_path)
    ssh = SshLauncher(
        SshConnection(
            host="localhost",
            port=sshd.port,
            username=sshd.username,
            host_public_key=sshd.host_public_key,
            private_key=sshd.private_key,
        ),
        job=VmRunnerJob.model_validate(config),
        egress=EgressPolicy(),
    )

    with pytest.raises(LaunchError) as raised:
        await ssh.launch(spec(config))

    assert not raised.value.retryable
    assert raised.value.message.startswith("the SSH host of this runner is not reachable: localhost (")
    assert "which runners may not target (PO_RUNNER_DENIED_NETWORKS)" in raised.value.message
    assert not (tmp_path / "runs").exists()


async def test_status__of_a_run_on_another_host_is_unknown(sshd: SshServer, tmp_path: Path) -> None:
    ssh = launcher(sshd, job(tmp_path))

    status = await ssh.status(f"ssh:{sshd.username}@10.1.2.3:22:process:/runs/x")

    assert (RunState.UNKNOWN, f"the run is on {sshd.username}@10.1.2.3:22") == (status.state, status.detail)
