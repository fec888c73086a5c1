"""The fork server of local runs (``launchers.zygote``): what a forked child becomes (its own session, user,
fds, environment, directory, signal state and random state, nothing of the zygote's or another child's),
how the zygote's failures end (an abandoned fork runs nothing; a killed zygote leaves its runs running and
is replaced), and the local launcher on it (``po-runner zygote``, with a fallback to a cold runner).

Real processes throughout: a probe zygote (``tests.support.zygote_probe``: ``serve`` with children that
report instead of running a deployment) for the child's state, the real ``po-runner zygote`` for the
launcher. Memory is read through ``/proc/<pid>/mem`` (root only) to show where a secret is and is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from orchestrator.launchers import processes, run_cgroups, zygote
from orchestrator.launchers.base import RunState
from orchestrator.launchers.local import LocalLauncher
from orchestrator.protocol.launch import RunSpec, WarmOrder
from orchestrator.protocol.results import RunnerMode
from tests.support.outages import wait_for
from tests.support.zygote_probe import memory_holds

ROOT = Path(__file__).parent.parent.parent
#: A uid and gid no account has, for the children that switch users (root only).
CHILD_UID = 2150300

pytestmark = pytest.mark.skipif(not zygote.supported(), reason="the zygote needs Linux")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory any uid may pass through (tmp_path is 0700), with a ``found`` dir any uid may write."""
    made = Path(tempfile.mkdtemp(prefix="po-zygote-"))
    made.chmod(0o755)
    (made / "found").mkdir(mode=0o777)
    (made / "found").chmod(0o777)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def _probe_starter(log: Path, *, argv: list[str] | None = None) -> Callable[[socket.socket], Any]:
    """Starts the probe zygote as the launcher starts ``po-runner zygote``: the channel as its stdin."""

    def start(channel: socket.socket) -> subprocess.Popen[bytes]:
        with open(log, "wb") as stderr:
            return subprocess.Popen(
                argv or [sys.executable, "-m", "tests.support.zygote_probe"],
                stdin=channel.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=ROOT,
                env={"PATH": os.environ["PATH"], "HOME": "/nonexistent"},
            )

    return start


@pytest.fixture
def probe(shared: Path) -> Iterator[zygote.Zygote]:
    made = zygote.Zygote(_probe_starter(shared / "zygote.log"), log_file=shared / "zygote.log")
    yield made
    made.close()


class Child:
    """One child of the probe zygote: its directory, its order's environment, its report."""

    def __init__(self, shared: Path, name: str, *, uid: int | None = None, **environ: str) -> None:
        self.work = shared / name
        self.work.mkdir()
        (self.work / "tmp").mkdir()
        if uid is not None:
            for directory in (self.work, self.work / "tmp"):
                os.chown(directory, uid, uid)
        self.report_file = shared / "found" / f"{name}.json"
        self.environ = {
            "PATH": os.environ["PATH"],
            "TMPDIR": str(self.work / "tmp"),
            "PROBE_REPORT": str(self.report_file),
            **environ,
        }

    def fork(
        self,
        made: zygote.Zygote,
        *,
        uid: int | None = None,
        cgroup: Path | None = None,
        go: bool = True,
    ) -> zygote.ForkedRun:
        fd = os.open(self.work.parent / f"{self.work.name}.stderr", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            forked = made.fork(stderr=fd, user=None if uid is None else (uid, uid), cgroup=cgroup)
        finally:
            os.close(fd)
        if go:
            forked.go(WarmOrder(environ=self.environ, cwd=str(self.work)))
        return forked

    def report(self) -> dict[str, Any]:
        return dict(json.loads(self.report_file.read_text()))

    def stderr(self) -> str:
        return (self.work.parent / f"{self.work.name}.stderr").read_text()


def _fresh() -> dict[str, Any]:
    """The probe's report from a fresh interpreter: what a cold runner's process starts with."""
    ran = subprocess.run(
        [sys.executable, "-m", "tests.support.zygote_probe", "--fresh"],
        capture_output=True,
        check=True,
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "HOME": "/nonexistent"},
    )
    return dict(json.loads(ran.stdout))


def test_zygote__a_child_is_its_own_session_with_its_orders_environment_and_directory_only(
    probe: zygote.Zygote, shared: Path
) -> None:
    secret = f"secret-{secrets.token_hex(12)}"
    child = Child(shared, "one", MY_SECRET=secret)

    forked = child.fork(probe)
    code = forked.wait()
    found = child.report()
    fresh = _fresh()

    assert 0 == code, child.stderr()
    # A session and process group of its own, under the zygote.
    assert found["pid"] == forked.pid == found["sid"] == found["pgid"]
    assert probe.pid == found["ppid"]
    # Exactly its order's environment and directory; its own TMPDIR; `po-runner standard`'s argv.
    assert child.environ == found["environ"]
    assert str(child.work) == found["cwd"]
    assert str(child.work / "tmp") == found["tempdir"]
    assert "standard" == found["argv"][-1]
    # No fd beyond stdin, stdout and stderr: not the channel, not the order pipe, nothing of other children.
    assert [] == found["open_fds"]
    # Not dumpable; signal handlers and mask as a fresh interpreter has them.
    assert 0 == found["dumpable"]
    assert fresh["signals"] == found["signals"]
    assert fresh["blocked"] == found["blocked"]
    # The secret is in its environment only, never in what /proc shows of it, nor in the zygote's.
    assert secret not in (found["proc_environ"] or "")
    assert probe.pid is not None
    assert secret.encode() not in Path(f"/proc/{probe.pid}/environ").read_bytes()


def test_zygote__children_start_from_the_zygote_never_from_each_other(
    probe: zygote.Zygote, shared: Path
) -> None:
    first, second = Child(shared, "first"), Child(shared, "second")

    codes = [first.fork(probe).wait(), second.fork(probe).wait()]
    one, two = first.report(), second.report()

    assert [0, 0] == codes
    assert one["pid"] != two["pid"] and one["ppid"] == two["ppid"] == probe.pid
    # Random state of their own: Python's and OpenSSL's.
    assert one["random"] != two["random"]
    assert one["ssl_random"] != two["ssl_random"]
    assert "PROBE_REPORT" in one["environ"] and one["environ"] != two["environ"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a child switches users only when the zygote is root")
def test_zygote__as_root_a_child_becomes_its_runs_uid_without_groups_and_the_secret_stays_out_of_the_zygote(
    probe: zygote.Zygote, shared: Path
) -> None:
    secret = f"secret-{secrets.token_hex(12)}"
    release = shared / "found" / "release"
    child = Child(shared, "as-uid", uid=CHILD_UID, MY_SECRET=secret, PROBE_WAIT=str(release))

    forked = child.fork(probe, uid=CHILD_UID)
    wait_for(child.report_file.exists, 30, "the child's report")
    assert probe.pid is not None
    # While it runs: the secret is in the child's memory (the scan finds what is there)...
    in_child = memory_holds(forked.pid, secret.encode())
    # ... and nowhere in the zygote's (the order went from the launcher to the child only).
    in_zygote = memory_holds(probe.pid, secret.encode())
    release.touch()
    code = forked.wait()
    found = child.report()

    assert 0 == code, child.stderr()
    assert [CHILD_UID] * 3 == found["uids"]
    assert [CHILD_UID] * 3 == found["gids"]
    assert [] == found["groups"]
    assert 0o077 == found["umask"]
    assert 0 == found["dumpable"]
    assert found["proc_environ"] is None  # not even its own uid reads it
    assert (in_child, in_zygote) == (True, False)


def test_zygote__an_abandoned_fork_runs_nothing(probe: zygote.Zygote, shared: Path) -> None:
    child = Child(shared, "abandoned")

    forked = child.fork(probe, go=False)
    forked.abandon()
    code = forked.wait()

    assert zygote.NOT_STARTED == code
    assert not child.report_file.exists()
    assert "" == child.stderr()


def test_zygote__exit_codes_as_popen_gives_them(probe: zygote.Zygote, shared: Path) -> None:
    failing = Child(shared, "failing", PROBE_EXIT="3")
    waiting = Child(shared, "waiting", PROBE_WAIT=str(shared / "never"))

    failed = failing.fork(probe)
    killed = waiting.fork(probe)
    wait_for(waiting.report_file.exists, 30, "the waiting child's report")
    os.kill(killed.pid, signal.SIGKILL)

    assert 3 == failed.wait()
    assert -signal.SIGKILL == killed.wait()


def test_zygote__killed_its_runs_go_on_and_the_next_fork_starts_another(
    probe: zygote.Zygote, shared: Path
) -> None:
    release = shared / "found" / "release"
    running = Child(shared, "running", PROBE_WAIT=str(release))
    forked = running.fork(probe)
    wait_for(running.report_file.exists, 30, "the running child's report")
    first = probe.pid
    assert first is not None

    os.kill(first, signal.SIGKILL)
    lost = forked.wait()  # the zygote's channel closed: its exit code will not come
    still_running = processes.read_stat(forked.pid)
    later = Child(shared, "later")
    code = later.fork(probe).wait()
    release.touch()

    assert lost is None
    assert still_running is not None and still_running.state != "Z"
    assert still_running.sid == forked.pid
    assert 0 == code
    assert probe.pid not in (None, first)
    assert later.report()["ppid"] == probe.pid
    wait_for(lambda: processes.read_stat(forked.pid) is None, 30, "the released run to end")


def test_zygote__one_that_cannot_start_is_tried_again_later(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = shared / "zygote.log"
    starts: list[int] = []
    broken = _probe_starter(log, argv=[sys.executable, "-c", "import sys; sys.exit('no runner here')"])

    def start(channel: socket.socket) -> Any:
        starts.append(1)
        return broken(channel)

    made = zygote.Zygote(start, log_file=log)
    try:
        first = made.ready()
        again = made.ready()
        with pytest.raises(zygote.ZygoteUnavailableError, match="failed to start a moment ago"):
            Child(shared, "refused").fork(made)
        monkeypatch.setattr(zygote, "RETRY_SECONDS", 0.0)
        later = made.ready()
    finally:
        made.close()

    assert (first, again, later) == (False, False, False)
    assert 2 == len(starts)  # the first, and once the retry time was over


def test_zygote__a_child_is_moved_into_the_cgroup_it_is_given(probe: zygote.Zygote, shared: Path) -> None:
    cgroups = run_cgroups.RunCgroups.from_setting("auto", shared, setting="test")
    if cgroups is None:
        pytest.skip("no writable cgroup v2 hierarchy with cgroup.kill on this host")
    child = Child(shared, "contained")
    cgroup = cgroups.create(f"zygote-test-{secrets.token_hex(4)}")
    try:
        forked = child.fork(probe, cgroup=cgroup)
        code = forked.wait()
    finally:
        cgroups.kill(cgroup)
        cgroups.close()

    assert 0 == code
    assert forked.cgroup_problem is None
    assert child.report()["cgroup"].endswith(f"/{cgroup.name}")


# --- the local launcher on `po-runner zygote` ----------------------------------------------------------


def _spec(deployment_id: str) -> RunSpec:
    return RunSpec(
        org_id="acme",
        runner_id="local",
        deployment_id=deployment_id,
        env_uuid="6f1c1d2e-0000-4000-8000-0000000000e1",
        mode=RunnerMode.DEPLOY,
        token=SecretStr("deployment-token"),
        gateway_url="http://127.0.0.1:9",
        runner_configuration={
            "type": "vm",
            "connection": {"type": "local"},
            # No gateway answers there: the runner fails fast, saying so.
            "job": {"runtime": "process", "environment": {"RUNNER_GATEWAY_CONNECT_SECONDS": "0.5"}},
        },
    )


async def _ended(launcher: LocalLauncher, handle: str) -> Any:
    for _ in range(600):
        status = await launcher.status(handle)
        if status.state is RunState.EXITED:
            return status
        await asyncio.sleep(0.1)
    raise AssertionError(f"{handle} did not end")


def _command(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def _parent(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return None


async def test_local_launcher__process_runs_are_forked_from_one_zygote(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path / "runs", environ={"PATH": os.environ["PATH"]}, fork_server=True)
    try:
        first = await launcher.launch(_spec("6f1c1d2e-0000-4000-8000-000000000011"))
        parent_of_first = _parent(int(first.split(":")[2]))
        second = await launcher.launch(_spec("6f1c1d2e-0000-4000-8000-000000000012"))
        parent_of_second = _parent(int(second.split(":")[2]))
        statuses = [await _ended(launcher, first), await _ended(launcher, second)]
        assert launcher.zygote is not None
        zygote_pid = launcher.zygote.pid
    finally:
        launcher.close()

    assert zygote_pid is not None
    assert parent_of_first == parent_of_second == zygote_pid
    assert first != second
    assert [(RunState.EXITED, 1)] * 2 == [(s.state, s.exit_code) for s in statuses]
    # Each run's stderr (its status detail) is its own: the runner's summary of what went wrong.
    assert all(s.detail and s.detail.startswith("po-runner: ") for s in statuses), statuses
    assert (tmp_path / "runs" / zygote.LOG_FILE).read_text() == ""


async def test_local_launcher__runs_start_cold_while_no_zygote_can_start(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path / "runs", environ={"PATH": os.environ["PATH"]}, fork_server=True)
    assert launcher.zygote is not None
    launcher.zygote._start = _probe_starter(  # a zygote that exits at once
        tmp_path / "runs" / zygote.LOG_FILE, argv=[sys.executable, "-c", "import sys; sys.exit('gone')"]
    )
    (tmp_path / "runs").mkdir()
    try:
        handle = await launcher.launch(_spec("6f1c1d2e-0000-4000-8000-000000000021"))
        command = _command(int(handle.split(":")[2]))
        status = await _ended(launcher, handle)
    finally:
        launcher.close()

    assert b"standard" in command  # a cold runner
    assert (RunState.EXITED, 1) == (status.state, status.exit_code)


async def test_local_launcher__a_run_outlives_its_zygote_and_is_watched_to_its_end(tmp_path: Path) -> None:
    launcher = LocalLauncher(tmp_path / "runs", environ={"PATH": os.environ["PATH"]}, fork_server=True)
    spec = _spec("6f1c1d2e-0000-4000-8000-000000000031")
    # A gateway that takes the connection and never answers: the runner waits on it, alive.
    silent = socket.create_server(("127.0.0.1", 0))
    spec = spec.model_copy(update={"gateway_url": f"http://127.0.0.1:{silent.getsockname()[1]}"})
    try:
        handle = await launcher.launch(spec)
        assert launcher.zygote is not None and launcher.zygote.pid is not None
        zygote_pid = launcher.zygote.pid
        os.kill(zygote_pid, signal.SIGKILL)
        pid = int(handle.split(":")[2])
        wait_for(lambda: _parent(pid) != zygote_pid, 30, "the run to be reparented")
        running = await launcher.status(handle)
        os.kill(pid, signal.SIGKILL)
        ended = await _ended(launcher, handle)
    finally:
        silent.close()
        launcher.close()

    assert RunState.RUNNING is running.state
    # Its exit code went with the zygote: the run is seen gone through /proc, as an adopted run.
    assert (RunState.EXITED, None) == (ended.state, ended.exit_code)
