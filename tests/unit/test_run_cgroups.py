"""A cgroup (v2) per run: the setting, where it is used and where not, and what it kills.

The tests that make cgroups need root and a writable cgroup v2 hierarchy (this machine's hybrid
``/sys/fs/cgroup/unified``); they are skipped elsewhere, saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import ConfigurationError
from orchestrator.launchers import run_cgroups
from orchestrator.launchers.run_cgroups import RunCgroups

HYBRID = """\
25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
35 25 0:29 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
40 35 0:33 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 35 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_ONLY = "\n".join(HYBRID.splitlines()[:3]) + "\n"
#: A container's view: a part of the hierarchy bind-mounted, not its root.
PART = "50 40 0:38 /kubepods/pod1 /sys/fs/cgroup ro,relatime - cgroup2 cgroup2 rw\n"


def test_the_setting_takes_auto_or_off_and_names_itself_otherwise(tmp_path: Path) -> None:
    assert RunCgroups.from_setting("off", tmp_path, setting="PO_LOCAL_RUN_CGROUPS") is None
    with pytest.raises(
        ConfigurationError, match=r"^PO_LOCAL_RUN_CGROUPS: 'yes' is neither 'auto' nor 'off'$"
    ):
        RunCgroups.from_setting("yes", tmp_path, setting="PO_LOCAL_RUN_CGROUPS")


def test_the_cgroup2_hierarchy_is_found_where_it_is_mounted_whole(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(HYBRID)
    assert Path("/sys/fs/cgroup/unified") == run_cgroups.cgroup2_mount(mountinfo)
    mountinfo.write_text(V1_ONLY)
    assert run_cgroups.cgroup2_mount(mountinfo) is None
    mountinfo.write_text(PART)
    assert run_cgroups.cgroup2_mount(mountinfo) is None


def test_own_cgroup_is_read_from_the_v2_line(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("4:memory:/process_api/x\n0::/system.slice/po.service\n")
    assert "/system.slice/po.service" == run_cgroups.own_cgroup(cgroup)
    cgroup.write_text("4:memory:/x\n")
    assert run_cgroups.own_cgroup(cgroup) is None


def test_a_directory_that_is_no_cgroup_is_not_used(tmp_path: Path) -> None:
    # mkdir works there, but no cgroup.kill appears: not a cgroup v2 hierarchy.
    assert not RunCgroups(tmp_path / "po-runs").usable()


@pytest.fixture
def cgroups(tmp_path: Path) -> Iterator[RunCgroups]:
    if os.geteuid() != 0:
        pytest.skip("making cgroups needs root (or a delegated cgroup)")
    made = RunCgroups.from_setting("auto", tmp_path, setting="PO_LOCAL_RUN_CGROUPS")
    if made is None:
        pytest.skip("no writable cgroup v2 hierarchy with cgroup.kill on this host")
    yield made
    made.close()
    assert not made.parent.exists()


def test_auto_makes_a_private_parent_per_runs_dir(cgroups: RunCgroups, tmp_path: Path) -> None:
    mount = run_cgroups.cgroup2_mount()
    assert mount is not None and mount in cgroups.parent.parents
    assert 0o700 == cgroups.parent.stat().st_mode & 0o777
    other = RunCgroups.from_setting("auto", tmp_path / "other", setting="PO_LOCAL_RUN_CGROUPS")
    assert other is not None and other.parent != cgroups.parent
    other.close()


def test_every_process_of_a_run_is_killed_with_its_cgroup_whatever_session_it_made(
    cgroups: RunCgroups,
) -> None:
    # A runner that, once in its cgroup, starts a process in a session of its own (setsid) and exits.
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; sys.stdin.readline(); "
            "p = subprocess.Popen(['sleep', '300'], start_new_session=True); print(p.pid, flush=True)",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as runner:
        cgroup = cgroups.create("run-1")
        cgroups.enter(cgroup, runner.pid)
        assert runner.stdin is not None and runner.stdout is not None
        runner.stdin.write("go\n")
        runner.stdin.flush()
        detached = int(runner.stdout.readline())
    try:
        assert os.getsid(detached) == detached  # it left the runner's session
        assert [detached] == cgroups.pids(cgroup)
        assert cgroups.populated(cgroup)

        assert cgroups.kill(cgroup)

        assert not cgroup.exists()
        assert not _alive(detached)
    finally:
        if _alive(detached):
            os.kill(detached, 9)


def test_a_crashed_launchers_empty_cgroups_go_and_its_live_runs_stay(cgroups: RunCgroups) -> None:
    empty = cgroups.create("over")
    live = cgroups.create("running")
    sleeper = subprocess.Popen(["sleep", "300"])
    cgroups.enter(live, sleeper.pid)
    try:
        assert [empty] == cgroups.remove_idle()
        assert live.is_dir()
        # A run's record is trusted only for a cgroup of this launcher's.
        run_dir = cgroups.parent.parent / "not-a-run-dir"
        assert cgroups.recorded(run_dir) is None
        with pytest.raises(ValueError, match="not a cgroup of this launcher's runs"):
            cgroups.kill(cgroups.parent.parent)
        assert cgroups.kill(live)
        sleeper.wait(10)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()


def test_a_record_is_trusted_only_for_a_cgroup_of_the_launcher(cgroups: RunCgroups, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cgroup = cgroups.create("run-2")
    cgroups.record(run_dir, cgroup)
    assert cgroup == cgroups.recorded(run_dir)
    (run_dir / run_cgroups.CGROUP_FILE).write_text(str(cgroups.parent.parent))
    assert cgroups.recorded(run_dir) is None
    (run_dir / run_cgroups.CGROUP_FILE).write_text(f"{cgroups.parent}/..")
    assert cgroups.recorded(run_dir) is None
    assert cgroups.kill(cgroup)


def _alive(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "Z":
            return False
        time.sleep(0.05)
    return True
