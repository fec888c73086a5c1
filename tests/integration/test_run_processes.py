"""The processes of a run, through /proc: found by session and process group even once their leader is
gone, stopped with one SIGTERM each then SIGKILL; and nothing an engine command started outlives it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from orchestrator.launchers import processes
from orchestrator.launchers.base import RunState
from orchestrator.launchers.local import LocalLauncher
from orchestrator.launchers.run_cgroups import RunCgroups
from orchestrator.runner import engine, iac, logs
from tests.support.outages import run_processes, wait_for


def _gone(pid: int) -> bool:
    info = processes.read_stat(pid)
    return info is None or info.state == "Z"


def _pids(path: Path, count: int) -> list[int]:
    found = wait_for(lambda: path.exists() and len(path.read_text().split()) >= count, 30, f"{path}")
    assert found
    return [int(p) for p in path.read_text().split()]


def _run(tmp_path: Path, script: str) -> subprocess.Popen[bytes]:
    """A run's leader in its own session, as the local launcher starts the runner."""
    return subprocess.Popen(["/bin/sh", "-c", script], cwd=tmp_path, start_new_session=True)


def test_members__the_session_and_groups_of_the_leader_also_after_it_died(tmp_path: Path) -> None:
    before = subprocess.Popen(["sleep", "60"])  # started earlier, not in the session: never a member
    leader = _run(
        tmp_path,
        # A child in the leader's group, and one in a group of its own (as the runner starts the engine).
        "sleep 60 & echo $! >> pids; "
        f"{sys.executable} -c 'import os, time; os.setpgid(0, 0); time.sleep(60)' & echo $! >> pids; "
        "wait",
    )
    try:
        children = _pids(tmp_path / "pids", 2)
        started = processes.start_ticks(leader.pid)
        assert started is not None

        with_leader = set(processes.members(leader.pid, started))
        leader.send_signal(signal.SIGKILL)
        leader.wait()
        orphans = set(processes.members(leader.pid, started))

        assert {leader.pid, *children} == with_leader
        assert set(children) == orphans
        assert before.pid not in with_leader | orphans
    finally:
        before.kill()
        before.wait()
        processes.send(children, signal.SIGKILL)


def _stubborn(tmp_path: Path, name: str) -> Path:
    """A script that records each SIGTERM it gets (and ignores it), after writing its pid."""
    script = tmp_path / f"{name}.sh"
    script.write_text(
        f"trap 'echo {name} >> {tmp_path}/terms' TERM\necho $$ >> {tmp_path}/pids\n"
        "while true; do sleep 0.1; done\n"
    )
    return script


def test_stop__orphans_get_one_sigterm_then_sigkill(tmp_path: Path) -> None:
    """The leader killed -9: what is left gets SIGTERM once (a second would make Terraform exit without
    saving state), however often it is stopped, then SIGKILL once the grace is over."""
    leader = _run(tmp_path, f"sh {_stubborn(tmp_path, 'child')} & wait")
    child = _pids(tmp_path / "pids", 1)[0]
    run = processes.RunProcesses(leader.pid, processes.start_ticks(leader.pid) or 0)
    leader.send_signal(signal.SIGKILL)
    leader.wait()

    run.terminate()
    run.terminate()
    run.stop(grace_seconds=1.0)

    assert [] == run.members()
    assert _gone(child)
    assert ["child"] == (tmp_path / "terms").read_text().split()


def test_stop__a_live_leader_alone_gets_the_sigterm(tmp_path: Path) -> None:
    """With the leader alive, the signal goes to it alone (the runner passes it on to its engine once);
    what it leaves when it exits gets its own SIGTERM then, and SIGKILL after the grace."""
    leader = _run(
        tmp_path, f"sh {_stubborn(tmp_path, 'child')} & trap 'echo leader >> terms; exit 0' TERM; wait"
    )
    child = _pids(tmp_path / "pids", 1)[0]
    run = processes.RunProcesses(leader.pid, processes.start_ticks(leader.pid) or 0)

    run.stop(grace_seconds=1.0)
    leader.wait()

    assert [] == run.members()
    assert _gone(child)
    assert ["leader", "child"] == (tmp_path / "terms").read_text().split()


@pytest.mark.timeout(30)
def test_iac_cli__what_the_engine_left_running_is_killed_when_it_exits(tmp_path: Path) -> None:
    """A provisioner's background process does not outlive the engine command that started it, nor does
    its hold on the engine's output keep the command from ending (before: `run` read the output to its
    end, here until the background sleep ended)."""
    fake_engine = tmp_path / "terraform"
    fake_engine.write_text(f"#!/bin/sh\nsleep 600 & echo $! > {tmp_path}/left\nexit 0\n")
    fake_engine.chmod(0o755)
    cli = iac.IacCli(
        engine.Engine(backend=engine.IacBackend.TERRAFORM, command=(str(fake_engine),)),
        workdir=tmp_path,
        environ={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        sink=logs.LogBuffer(max_bytes=1 << 20),
    )

    result = cli.run("apply")

    assert result.ok
    left = int((tmp_path / "left").read_text())
    wait_for(lambda: _gone(left), 10, "the background sleep to be gone")


def _reaped(run_dir: Path) -> bool:
    return not run_processes(run_dir)


def test_local_launcher__resumed_runs_are_reaped_when_their_runner_dies(tmp_path: Path) -> None:
    """Runs an earlier launcher process started (the agent restarted since): once their runner dies,
    what it left is stopped, and their code removed, except state Terraform could not save."""
    runs = tmp_path / "runs"
    watched: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    for name, unsaved in (("plain", False), ("unsaved", True)):
        run_dir = runs / name
        (run_dir / "work" / "code").mkdir(parents=True)
        if unsaved:
            (run_dir / "work" / "code" / "errored.tfstate").write_text("{}")
        leader = _run(run_dir, "sleep 600 & echo $! >> pids; wait")
        _pids(run_dir / "pids", 1)
        started = processes.start_ticks(leader.pid)
        handle = f"local:{socket.gethostname()}:{leader.pid}:{started}:{run_dir}"
        (run_dir / "runner.pid").write_text(handle)
        watched[handle] = (leader, run_dir)
    launcher = LocalLauncher(runs, environ={})

    resumed = launcher.resume()
    for leader, _ in watched.values():
        leader.send_signal(signal.SIGKILL)
        leader.wait()
    for _, run_dir in watched.values():
        wait_for(partial(_reaped, run_dir), 30, f"{run_dir.name} to be reaped")

    assert set(watched) == set(resumed)
    wait_for(lambda: not (runs / "plain" / "work").exists(), 10, "the plain run's code to be removed")
    assert (runs / "unsaved" / "work" / "code" / "errored.tfstate").exists()
    assert [] == launcher.resume()


def test_iac_cli__the_engine_outlives_its_killed_runner_while_it_writes_output(tmp_path: Path) -> None:
    """kill -9 of the runner must not kill its engine on its next line of output (a closed pipe would,
    by SIGPIPE, before it saved its state): the engine writes into files, and goes on to its end."""
    fake_engine = tmp_path / "terraform"
    fake_engine.write_text(
        f"#!/bin/sh\ntouch {tmp_path}/running\nwhile [ ! -e {tmp_path}/go ]; do sleep 0.05; done\n"
        f"echo saving state\necho saving state >&2\necho saved > {tmp_path}/saved\n"
    )
    fake_engine.chmod(0o755)
    runner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from pathlib import Path\n"
            "from orchestrator.runner import engine, iac, logs\n"
            f"fake = engine.Engine(backend=engine.IacBackend.TERRAFORM, command=({str(fake_engine)!r},))\n"
            f"cli = iac.IacCli(fake, workdir=Path({str(tmp_path)!r}), environ={{'PATH': '/usr/bin:/bin'}},"
            " sink=logs.LogBuffer(max_bytes=1 << 20))\n"
            "cli.run('apply')\n",
        ],
        start_new_session=True,
    )
    wait_for(lambda: (tmp_path / "running").exists(), 30, "the engine to start")
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    (tmp_path / "go").touch()

    wait_for(lambda: (tmp_path / "saved").exists(), 30, "the engine to finish")


def test_local_launcher__a_run_adopted_after_a_restart_whose_runner_is_gone_is_finished(
    tmp_path: Path,
) -> None:
    """A server restarted while its runs' runners died: asked for such a run, the new launcher finds
    nothing of its session left, kills what left the session in the run's cgroup (recorded in the run's
    directory), and removes its ``work/`` unless it holds state Terraform could not save."""
    runs = tmp_path / "runs"
    cgroups = RunCgroups.from_setting("auto", runs, setting="PO_LOCAL_RUN_CGROUPS")
    if cgroups is None:
        pytest.skip("no writable cgroup v2 hierarchy with cgroup.kill on this host (or not root)")
    handles: dict[str, str] = {}
    detached: dict[str, int] = {}
    try:
        for name, unsaved in (("plain", False), ("unsaved", True)):
            run_dir = runs / name
            (run_dir / "work" / "code").mkdir(parents=True)
            if unsaved:
                (run_dir / "work" / "code" / "errored.tfstate").write_text("{}")
            # A runner that waits for its cgroup, starts a process in a session of its own, and dies.
            leader = subprocess.Popen(
                ["/bin/sh", "-c", "read go; setsid sleep 600 & echo $! > pids; exec sleep 600"],
                cwd=run_dir,
                stdin=subprocess.PIPE,
                start_new_session=True,
            )
            cgroup = cgroups.create(f"{name}.run")
            cgroups.enter(cgroup, leader.pid)
            cgroups.record(run_dir, cgroup)
            assert leader.stdin is not None
            leader.stdin.write(b"go\n")
            leader.stdin.close()
            detached[name] = _pids(run_dir / "pids", 1)[0]
            started = processes.start_ticks(leader.pid)
            handles[name] = f"local:{socket.gethostname()}:{leader.pid}:{started}:{run_dir}"
            (run_dir / "runner.pid").write_text(handles[name])
            leader.kill()
            leader.wait()
        # The restarted server's launcher.
        launcher = LocalLauncher(runs, environ={}, run_cgroups=cgroups)

        status = {name: asyncio.run(launcher.status(handle)) for name, handle in handles.items()}

        assert {RunState.EXITED} == {found.state for found in status.values()}
        assert [] == [name for name, pid in detached.items() if not _gone_soon(pid)]
        assert not (runs / "plain" / "work").exists()
        assert (runs / "unsaved" / "work" / "code" / "errored.tfstate").exists()
        assert status["unsaved"].unsaved_state is not None
        assert [] == [path for path in cgroups.parent.iterdir() if path.is_dir()]
    finally:
        for pid in detached.values():
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        for left in [path for path in cgroups.parent.iterdir() if path.is_dir()]:
            cgroups.kill(left)
        cgroups.close()


def _gone_soon(pid: int) -> bool:
    try:
        return bool(wait_for(partial(_gone, pid), 10, f"pid {pid} to be gone"))
    except AssertionError:
        return False
