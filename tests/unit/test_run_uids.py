"""The uid allocator of local, agent and managed runs (``launchers.run_uids``): the range setting, locks that
survive a restart, no uid taken again while anything of it lives, and the sweep when a run ends.

The tests that start processes as other uids need root; they use uids of their own (2900000-...), which no
server's default range holds, and are skipped elsewhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import ConfigurationError
from orchestrator.launchers import run_uids
from orchestrator.launchers.run_uids import RunUids, UidRange

FIRST = 2900000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("abc", r"^PO_LOCAL_RUN_UIDS: 'abc' is not a uid range START-END \(for example 2100000-2100999\)$"),
        ("2100000", r"^PO_LOCAL_RUN_UIDS: '2100000' is not a uid range START-END \(for example"),
        (
            "0-10",
            r"^PO_LOCAL_RUN_UIDS: '0-10' is not a uid range START-END with 0 < START <= END < 4294967295$",
        ),
        ("20-10", r"^PO_LOCAL_RUN_UIDS: '20-10' is not a uid range START-END with 0 < START"),
        ("1-4294967295", r"^PO_LOCAL_RUN_UIDS: '1-4294967295' is not a uid range START-END with 0 < START"),
        ("1-2000000", r"^PO_LOCAL_RUN_UIDS: '1-2000000' holds more than 1000000 uids$"),
    ],
)
def test_range__a_bad_setting_names_itself_and_the_form(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        UidRange.parse(text, setting="PO_LOCAL_RUN_UIDS")


def test_range__start_and_end_inclusive() -> None:
    uids = UidRange.parse(" 2100000-2100002 ", setting="PO_LOCAL_RUN_UIDS")
    assert [2100000, 2100001, 2100002] == list(uids)
    assert 2100002 in uids and 2100003 not in uids and 0 not in uids


@pytest.mark.parametrize("text", ["", "  ", "off", "OFF"])
def test_setting__empty_or_off_means_no_uid_per_run(text: str, tmp_path: Path) -> None:
    assert RunUids.from_setting(text, tmp_path, setting="AGENT_RUN_UIDS") is None


def test_setting__a_bad_range_stops_the_start_naming_the_setting(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a process that is not root takes no uid range at all")
    with pytest.raises(ConfigurationError, match=r"^RUNNER_RUN_UIDS: 'x-y' is not a uid range"):
        RunUids.from_setting("x-y", tmp_path, setting="RUNNER_RUN_UIDS")


def test_sweep__refuses_root_and_uids_outside_the_range() -> None:
    allowed = UidRange(FIRST, FIRST + 1)
    for uid in (0, FIRST + 2):
        with pytest.raises(ValueError, match="is not a run's uid"):
            run_uids.sweep(uid, allowed)


def test_shared_temp_files__only_the_uids_are_removed_and_links_not_followed(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving files to another uid needs root")
    shared, target = tmp_path / "tmp", tmp_path / "target"
    shared.mkdir()
    target.write_text("the server's")
    (shared / "left").write_text("x")
    (shared / "dir").mkdir()
    (shared / "dir" / "inner").write_text("x")
    (shared / "link").symlink_to(target)
    (shared / "other").write_text("another user's")
    for name in ("left", "dir", "link"):
        os.chown(shared / name, FIRST, FIRST, follow_symlinks=False)

    removed = run_uids.remove_shared_temp_files(FIRST, [shared])

    assert {"left", "dir", "link"} == {path.name for path in removed}
    assert ["other"] == [path.name for path in shared.iterdir()]
    assert "the server's" == target.read_text()


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("processes of other uids need root")


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for process in made:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _sleep_as(uid: int, started: list[subprocess.Popen[bytes]], *, detach: bool = False) -> int:
    """A process of ``uid`` (``detach``: one in a session of its own whose parent exits), its pid."""
    command = ["/bin/sh", "-c", "setsid sleep 300 & echo $!"] if detach else ["sleep", "300"]
    process = subprocess.Popen(
        command, user=uid, group=uid, extra_groups=[], stdout=subprocess.PIPE, start_new_session=True
    )
    started.append(process)
    if not detach:
        return process.pid
    assert process.stdout is not None
    pid = int(process.stdout.readline())
    process.wait()
    process.stdout.close()
    return pid


def _wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.mark.usefixtures("as_root")
def test_take__a_uid_per_holder_locked_exclusively_naming_it(tmp_path: Path) -> None:
    uids = RunUids(UidRange(FIRST, FIRST + 2), tmp_path / ".uids", setting="PO_LOCAL_RUN_UIDS")
    first, second = uids.take(tmp_path / "run-a"), uids.take(tmp_path / "run-b")

    assert first != second and {first, second} <= set(uids.uids)
    assert str(tmp_path / "run-a") == (tmp_path / ".uids" / str(first)).read_text()
    assert 0o700 == (tmp_path / ".uids").stat().st_mode & 0o777
    # Another launcher on the same lock dir (or this one after a restart) never gets them.
    other = RunUids(UidRange(FIRST, FIRST + 2), tmp_path / ".uids", setting="PO_LOCAL_RUN_UIDS")
    (tmp_path / "run-a" / "work").mkdir(parents=True)
    (tmp_path / "run-b" / "work").mkdir(parents=True)
    assert {first, second}.isdisjoint({other.take(tmp_path / "run-c")})


@pytest.mark.usefixtures("as_root")
def test_take__an_account_and_a_uid_with_a_live_process_are_skipped(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    # 65534 is nobody's (an account): never handed out.
    accounts = RunUids(UidRange(65534, 65535), tmp_path / "a", setting="PO_LOCAL_RUN_UIDS")
    assert 65535 == accounts.take(tmp_path / "run")
    # A process of FIRST lives (a run whose lock was lost): FIRST is not taken.
    _sleep_as(FIRST, started)
    uids = RunUids(UidRange(FIRST, FIRST + 1), tmp_path / "b", setting="PO_LOCAL_RUN_UIDS")
    assert FIRST + 1 == uids.take(tmp_path / "run-1")
    with pytest.raises(OSError, match=r"every uid of PO_LOCAL_RUN_UIDS \(2900000-2900001\) is held"):
        uids.take(tmp_path / "run-2")


@pytest.mark.usefixtures("as_root")
def test_restart__a_crashed_runs_uid_is_not_reused_while_its_process_lives_then_is(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    lock_dir = tmp_path / ".uids"
    before = RunUids(UidRange(FIRST, FIRST), lock_dir, setting="PO_LOCAL_RUN_UIDS")
    run_dir = tmp_path / "run"
    uid = before.take(run_dir)
    run_uids.record_uid(tmp_path, uid)
    leftover = _sleep_as(uid, started, detach=True)  # the run left a process; then the server crashed

    after = RunUids(UidRange(FIRST, FIRST), lock_dir, setting="PO_LOCAL_RUN_UIDS")
    with pytest.raises(OSError, match="held by a run or by what a run left"):
        after.take(tmp_path / "next")
    os.kill(leftover, signal.SIGKILL)
    assert _wait_gone(leftover)

    # Nothing of it lives and its run has no work/ any more: the stale lock is taken over.
    assert uid == after.take(tmp_path / "next")
    assert str(tmp_path / "next") == (lock_dir / str(uid)).read_text()
    assert uid == run_uids.read_uid(tmp_path)  # the run's own record (an adopted run keeps its uid)


@pytest.mark.usefixtures("as_root")
def test_restart__a_run_with_work_left_keeps_its_uid_until_it_is_gone(tmp_path: Path) -> None:
    lock_dir = tmp_path / ".uids"
    run_dir = tmp_path / "run"
    (run_dir / "work").mkdir(parents=True)  # unsaved state waits there for its recovery
    uid = RunUids(UidRange(FIRST, FIRST), lock_dir, setting="PO_LOCAL_RUN_UIDS").take(run_dir)

    after = RunUids(UidRange(FIRST, FIRST), lock_dir, setting="PO_LOCAL_RUN_UIDS")
    after.release(uid)  # the adopted run ended: its work/ stays, so does its uid
    assert (lock_dir / str(uid)).exists()
    with pytest.raises(OSError, match="held by a run"):
        after.take(tmp_path / "next")

    (run_dir / "work").rmdir()  # the state was recovered
    after.release(uid)
    assert not (lock_dir / str(uid)).exists()
    assert uid == after.take(tmp_path / "next")


@pytest.mark.usefixtures("as_root")
def test_release__kills_every_process_of_the_uid_whatever_its_session(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    uids = RunUids(UidRange(FIRST, FIRST), tmp_path / ".uids", setting="PO_LOCAL_RUN_UIDS")
    uid = uids.take(tmp_path / "run")
    detached = [_sleep_as(uid, started, detach=True) for _ in range(3)]

    uids.release(uid)

    assert [] == [pid for pid in detached if not _wait_gone(pid)]
    assert [] == run_uids.pids_of(uid)
    assert not (tmp_path / ".uids" / str(uid)).exists()


@pytest.mark.usefixtures("as_root")
def test_host_register__two_launchers_with_one_range_never_hand_out_the_same_uid(tmp_path: Path) -> None:
    # A server and an agent (or two servers) on one host, each with its own runs dir, the same range;
    # neither has started a process yet, so the check for live processes cannot tell them apart.
    host = tmp_path / "host"
    server = RunUids(
        UidRange(FIRST, FIRST + 1), tmp_path / "server", setting="PO_LOCAL_RUN_UIDS", host_dir=host
    )
    agent = RunUids(UidRange(FIRST, FIRST + 1), tmp_path / "agent", setting="AGENT_RUN_UIDS", host_dir=host)

    taken = [server.take(tmp_path / "s1"), agent.take(tmp_path / "a1")]

    assert sorted(taken) == [FIRST, FIRST + 1]
    with pytest.raises(OSError, match="every uid of AGENT_RUN_UIDS"):
        agent.take(tmp_path / "a2")
    # Freed by the server: the agent may have it.
    server.forget(taken[0])
    assert taken[0] == agent.take(tmp_path / "a2")


@pytest.mark.usefixtures("as_root")
def test_host_register__a_killed_launchers_entries_are_taken_over_once_nothing_of_them_is_left(
    tmp_path: Path,
) -> None:
    host = tmp_path / "host"
    killed = RunUids(UidRange(FIRST, FIRST), tmp_path / "killed", setting="PO_LOCAL_RUN_UIDS", host_dir=host)
    uid = killed.take(tmp_path / "run")
    other = RunUids(UidRange(FIRST, FIRST), tmp_path / "other", setting="PO_LOCAL_RUN_UIDS", host_dir=host)
    # Fresh: its run may not have made its work/ yet.
    with pytest.raises(OSError, match="is held"):
        other.take(tmp_path / "mine")
    # A minute on, with no process and no work/ of it: left over by a launcher that was killed.
    lock = tmp_path / "killed" / str(uid)
    old = time.time() - 2 * run_uids.FRESH_LOCK_SECONDS
    os.utime(lock, (old, old))
    assert uid == other.take(tmp_path / "mine")
    assert str((tmp_path / "other").resolve() / str(uid)) == (host / str(uid)).read_text()


def test_host_register__without_one_launchers_keep_their_own_locks(tmp_path: Path) -> None:
    # Not writable (here: a file where the directory would be): each launcher has its own locks only.
    (tmp_path / "host").write_text("")
    if os.geteuid() != 0:
        pytest.skip("taking uids needs root")
    uids = RunUids(
        UidRange(FIRST, FIRST), tmp_path / "own", setting="PO_LOCAL_RUN_UIDS", host_dir=tmp_path / "host"
    )
    assert FIRST == uids.take(tmp_path / "run")
