"""Where local runs live and who they run as, checked before anything runs: a run user who cannot start
the runner's Python fails launches with what to fix; settings that would put runs within reach of the
server's files stop the server. (The runs themselves: tests/acceptance/test_local_isolation.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from pydantic import SecretStr, ValidationError

from orchestrator.agent.settings import AgentSettings
from orchestrator.errors import ConfigurationError
from orchestrator.launchers import run_uids
from orchestrator.launchers.base import LaunchError, RunState
from orchestrator.launchers.local import LocalLauncher
from orchestrator.launchers.run_user import RunUser
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import RunnerMode
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.run_user import nobody

DEPLOYMENT = "6f1c1d2e-0000-4000-8000-000000000001"
ROOT = Path(__file__).parent.parent.parent


def _spec() -> RunSpec:
    return RunSpec(
        org_id="acme",
        runner_id="local",
        deployment_id=DEPLOYMENT,
        env_uuid="6f1c1d2e-0000-4000-8000-0000000000e1",
        mode=RunnerMode.DEPLOY,
        token=SecretStr("deployment-token"),
        gateway_url="http://127.0.0.1:9",
        runner_configuration={"type": "vm", "connection": {"type": "local"}, "job": {"runtime": "process"}},
    )


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("local runs switch to the run user only when the server runs as root")


@pytest.fixture
def private() -> Iterator[Path]:
    """A directory of root's, mode 0700, in the system temp dir: out of other users' reach, as /root is."""
    made = Path(tempfile.mkdtemp(prefix="po-private-"))
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.mark.usefixtures("as_root")
async def test_run_user__a_python_out_of_its_reach_fails_the_launch_saying_what_to_fix(
    private: Path, tmp_path: Path
) -> None:
    python = private / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    user = RunUser.resolve("nobody", setting="PO_LOCAL_RUN_USER")
    launcher = LocalLauncher(tmp_path / "runs", environ=os.environ, run_user=user, python=str(python))

    with pytest.raises(LaunchError) as raised:
        await launcher.launch(_spec())

    message = raised.value.message
    assert not raised.value.retryable
    assert message.startswith(
        "local runs execute as user 'nobody' (PO_LOCAL_RUN_USER), who cannot run the runner's Python "
        f"{python}: 'nobody' may not pass {private} (mode drwx------, owner uid 0). Fix one of: "
    )
    for fix in ("install the orchestrator and its Python where 'nobody' can read them", "chmod o+x"):
        assert fix in message
    assert (
        "set PO_LOCAL_RUN_USER to another unprivileged user (PO_LOCAL_RUN_USER=root runs them as root"
        in message
    )
    assert not (tmp_path / "runs" / DEPLOYMENT).exists()


def _settings(tmp_path: Path, **values: object) -> ServerSettings:
    return ServerSettings.model_validate(
        {
            "data_dir": tmp_path / "data",
            "local_runs_dir": tmp_path / "runs",
            "allow_local_runners": True,
            **values,
        }
    )


@pytest.mark.usefixtures("as_root")
def test_run_user__an_unknown_user_stops_the_server(tmp_path: Path) -> None:
    configured = _settings(tmp_path, local_run_user="po-no-such-user")

    with pytest.raises(ConfigurationError, match=r"^PO_LOCAL_RUN_USER: there is no user 'po-no-such-user'"):
        create_app(configured)


@pytest.mark.usefixtures("as_root")
def test_runs_dir__one_of_another_user_stops_the_server(tmp_path: Path) -> None:
    """The default runs dir is in the shared temp dir: someone else may have made it first."""
    taken = tmp_path / "runs"
    taken.mkdir()
    os.chown(taken, 65534, 65534)
    configured = _settings(tmp_path, local_runs_dir=taken)

    with pytest.raises(
        ConfigurationError, match=r"PO_LOCAL_RUNS_DIR: .* is not a directory of this process's user"
    ):
        create_app(configured)


def test_runs_dir__inside_the_data_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"PO_LOCAL_RUNS_DIR \(.*\) must be outside PO_DATA_DIR"):
        ServerSettings(data_dir=tmp_path / "data", local_runs_dir=tmp_path / "data" / "runs")


def test_runs_dir__default_is_outside_the_data_dir_per_server_user() -> None:
    settings = ServerSettings()

    assert (
        Path(tempfile.gettempdir()) / f"platform-orchestrator-runs-{os.geteuid()}" == settings.local_runs_dir
    )
    assert settings.data_dir not in settings.local_runs_dir.parents


async def test_data_dir__made_private_with_its_key_and_database(tmp_path: Path) -> None:
    """An existing data dir that others could read (as ``mkdir`` leaves it) becomes 0700; the key file and
    the SQLite database in it 0600."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    (data_dir / "server.key").write_text("A" * 43 + "=")
    (data_dir / "server.key").chmod(0o644)
    app: FastAPI = create_app(_settings(tmp_path, local_run_user=""))

    async with app.router.lifespan_context(app):
        pass

    assert 0o700 == data_dir.stat().st_mode & 0o777
    assert 0o600 == (data_dir / "server.key").stat().st_mode & 0o777
    assert 0o600 == (data_dir / "orchestrator.db").stat().st_mode & 0o777


@pytest.mark.usefixtures("as_root")
def test_grant_run_user_access__traverse_only_on_the_way_to_the_checkouts_python(private: Path) -> None:
    """scripts/grant-run-user-access (scripts/demo and .ci/run call it) lets others pass through the
    directories on the way to the checkout's Python and code, and read nothing more."""
    checkout = private / "home" / "checkout"
    (checkout / "scripts").mkdir(parents=True, mode=0o700)
    (checkout / ".venv" / "bin").mkdir(parents=True, mode=0o700)
    (checkout / "src").mkdir(mode=0o700)
    (checkout / ".venv" / "bin" / "python").symlink_to(sys.executable)
    shutil.copy(ROOT / "scripts" / "grant-run-user-access", checkout / "scripts")
    for directory in (private, private / "home", checkout, checkout / ".venv", checkout / ".venv" / "bin"):
        directory.chmod(0o700)

    granted = subprocess.run(
        ["bash", str(checkout / "scripts" / "grant-run-user-access")],
        capture_output=True,
        text=True,
        check=True,
    )

    on_the_way = [private, private / "home", checkout, checkout / ".venv", checkout / ".venv" / "bin"]
    assert [0o701] * 6 == [d.stat().st_mode & 0o777 for d in [*on_the_way, checkout / "src"]]
    for directory in on_the_way:
        assert f"chmod o+x {directory} (was 700)" in granted.stderr
    assert 0o700 == (checkout / "scripts").stat().st_mode & 0o777


@pytest.mark.parametrize("name", ["", "root"])
def test_run_user__empty_or_root_runs_as_root(name: str) -> None:
    assert RunUser.resolve(name, setting="PO_LOCAL_RUN_USER") is None


def test_run_user__a_server_not_root_runs_as_itself() -> None:
    """Only root switches users: run as nobody, the server would run its runs as nobody too."""
    user = nobody()
    code = (
        "from orchestrator.launchers.run_user import RunUser; print(RunUser.resolve('daemon', setting='X'))"
    )

    ran = subprocess.run(
        [sys.executable, "-c", code],
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        capture_output=True,
        text=True,
    )

    assert (0, "None\n") == (ran.returncode, ran.stdout), ran.stderr


@pytest.mark.usefixtures("as_root")
async def test_run_user__container_runtimes_run_as_the_server(tmp_path: Path) -> None:
    """A `docker`/`podman` run needs the server's access to the container engine; the container, started
    without mounts, isolates it. (A stand-in `docker` on PATH records who started it.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text('#!/bin/sh\nid -u > "$FOUND"\n')
    (bin_dir / "docker").chmod(0o755)
    found = tmp_path / "found"
    user = RunUser.resolve("nobody", setting="PO_LOCAL_RUN_USER")
    launcher = LocalLauncher(tmp_path / "runs", environ={"PATH": f"{bin_dir}:/usr/bin:/bin"}, run_user=user)
    job = {"runtime": "docker", "image": "example.test/runner:1", "environment": {"FOUND": str(found)}}
    spec = _spec().model_copy(update={"runner_configuration": {**_spec().runner_configuration, "job": job}})

    handle = await launcher.launch(spec)
    for _ in range(300):
        status = await launcher.status(handle)
        if status.state is RunState.EXITED:
            break
        await asyncio.sleep(0.1)

    assert (RunState.EXITED, 0) == (status.state, status.exit_code)
    assert "0" == found.read_text().strip()


def test_agent_settings__local_runs_default_to_nobody_in_the_temp_dir() -> None:
    """The agent's own defaults match the server's: the run user's reach (not the agent's home)."""
    settings = AgentSettings(
        org_id="acme", runner_id="r", private_key=SecretStr("unused"), runner_gateway_url="https://po.test"
    )

    assert "nobody" == settings.agent_run_user
    assert Path(tempfile.gettempdir()) / f"po-agent-runs-{os.geteuid()}" == settings.agent_runs_dir


#: A uid range of this module's own: other tests' launchers take uids of the default range meanwhile.
RESTART_UIDS = "2150000-2150099"
#: The "server" that launches a run and then dies with it (``kill -9``): its launcher never sees the end.
LAUNCH_AND_WAIT = """
import asyncio, json, os, sys, time
from pathlib import Path
from orchestrator.launchers.local import LocalLauncher
from orchestrator.launchers.run_uids import RunUids
from orchestrator.launchers.run_user import RunUser
from orchestrator.protocol.launch import RunSpec
runs, uids, spec = Path(sys.argv[1]), sys.argv[2], RunSpec.model_validate_json(sys.argv[3])
user = RunUser.resolve("nobody", setting="PO_LOCAL_RUN_USER")
run_uids = RunUids.from_setting(uids, runs, setting="PO_LOCAL_RUN_UIDS")
launcher = LocalLauncher(runs, environ=os.environ, run_user=user, run_uids=run_uids)
print(asyncio.run(launcher.launch(spec)), flush=True)
time.sleep(600)
"""


def _launched_by_a_server_that_dies(runs: Path, spec: RunSpec) -> tuple[str, int]:
    """A run launched by a server process that is then killed, and the run's uid; the run goes on."""
    with subprocess.Popen(
        [sys.executable, "-c", LAUNCH_AND_WAIT, str(runs), RESTART_UIDS, spec.model_dump_json()],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ) as server:
        try:
            assert server.stdout is not None
            handle = server.stdout.readline().strip()
        finally:
            server.kill()
    uid = run_uids.read_uid(runs / DEPLOYMENT)
    assert handle.startswith("local:") and uid is not None, handle
    return handle, uid


def _kill_uid(uid: int) -> None:
    for _ in range(100):
        pids = run_uids.pids_of(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    raise AssertionError(f"processes of uid {uid} still alive")


@pytest.fixture
def traversable_runs() -> Iterator[Path]:
    """A runs dir a run's own uid can pass through to its work dir (pytest's tmp_path is 0700)."""
    made = Path(tempfile.mkdtemp(prefix="po-restart-"))
    made.chmod(0o711)
    yield made / "runs"
    shutil.rmtree(made, ignore_errors=True)


@pytest.mark.parametrize("unsaved", [False, True], ids=["plan-only", "unsaved-state"])
async def test_restart__a_run_that_ended_meanwhile_loses_its_code_and_its_uid_unless_state_is_unsaved(
    traversable_runs: Path, unsaved: bool
) -> None:
    """A run launched before a restart whose runner ended while no server watched: the restarted launcher,
    asked for its status, says it exited and removes its ``work/`` (plan files hold output values in clear
    text) and frees its uid; but a state Terraform could not save keeps both, and is answered."""
    user = nobody()
    handle, uid = _launched_by_a_server_that_dies(traversable_runs, _spec())
    run_dir = traversable_runs / DEPLOYMENT
    code = run_dir / "work" / "code"
    code.mkdir(parents=True, exist_ok=True)
    (code / "tfplan").write_bytes(b"a plan: output values in clear text")
    if unsaved:
        (code / "errored.tfstate").write_text('{"version": 4, "serial": 3}')
    _kill_uid(uid)  # the runner ends while no server watches
    restarted = LocalLauncher(
        traversable_runs,
        environ=os.environ,
        run_user=user,
        run_uids=run_uids.RunUids.from_setting(RESTART_UIDS, traversable_runs, setting="PO_LOCAL_RUN_UIDS"),
    )

    status = await restarted.status(handle)

    assert RunState.EXITED is status.state
    if unsaved:
        assert status.unsaved_state is not None
        assert (code / "errored.tfstate").is_file()
        assert (traversable_runs / ".uids" / str(uid)).exists()  # held until the state is recovered
    else:
        assert status.unsaved_state is None
        assert not (run_dir / "work").exists()
        assert not (traversable_runs / ".uids" / str(uid)).exists()
