"""A uid of its own for every local run and every warm runner, from a configured range.

Runs that shared one user (``nobody``) could read each other's ``/proc/<pid>/environ`` (a deployment token,
the runner's secrets), open each other's ``/proc/<pid>/mem``, write into each other's directories and
outlive their deployment in a process of their own session. With a uid per run none of that is possible:
``/proc/<pid>/environ``, ``mem`` and ``fd`` of another uid's processes are closed to a process without
capabilities, a run's ``work/`` (mode 0700) is its own uid's, and when the run ends every process of its
uid is killed, whatever session it made (``sweep``).

``RunUids`` hands out uids of ``START-END`` (``PO_LOCAL_RUN_UIDS``, ``AGENT_RUN_UIDS``,
``RUNNER_RUN_UIDS``): numbers that no account of the host has (``getpwuid`` knows none of them;
such a uid is skipped), with the group of the same number. A uid is taken by creating
``<lock dir>/<uid>`` exclusively (``O_EXCL``); the file names what holds it (a run's directory, or a warm
runner's stderr file until it is handed a run). A uid is taken again only once nothing of it is left: no
process of it lives, the run directory its lock names has no ``work/`` any more (a run whose state could not
be saved keeps its ``work/``, and so its uid, until that state is recovered), and its files in the shared
temporary directories (``/tmp``, ``/var/tmp``, ``/dev/shm``) are removed. Locks survive a restart: a run
adopted after one keeps its uid (``<run dir>/runner.uid`` records it, in the launcher's part of the run
directory), and a lock left by a crash is taken again only under the same conditions.

Several launchers on one host (two servers, a server and an agent, each with its own runs dir and so its
own locks) also keep out of each other's uids when their ranges overlap: each uid taken is entered in the
host's register (``HOST_DIR``, ``/var/lib/orchestrator/run-uids/<uid>``, under an ``flock``), naming the
launcher lock that holds it; another launcher skips it until that lock is gone, or is older than a minute
with neither a process nor a ``work/`` of its uid left (its launcher was killed). Where the register cannot
be written (not root, a read-only ``/var/lib``) each launcher has only its own locks and the check for live
processes: give each launcher of such a host a range of its own (the defaults differ).

Pitfalls: the uids have no passwd entry: a tool that looks its user up (``ssh``, ``whoami``) finds none
(``HOME`` is set for every run). ``sweep`` refuses uid 0 and uids outside the range.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from orchestrator.errors import ConfigurationError

#: The shared, world-writable directories a run may leave files in outside its own ``work/``.
SHARED_TEMP_DIRS: Final = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
#: How many rounds ``sweep`` kills the uid's processes before it gives up (a fork loop racing it).
SWEEP_ROUNDS: Final = 50
#: ``kill -KILL -1`` as the run's uid: every process of that uid at once (a fork cannot escape it).
KILL_PROGRAM: Final = ("/bin/kill", "/usr/bin/kill")
#: The lock dir's name in the launcher's runs dir.
LOCK_DIR: Final = ".uids"
#: A run directory's record of its uid (the launcher's file: the run cannot change it).
UID_FILE: Final = "runner.uid"
PROC: Final = Path("/proc")
#: The largest range accepted (the lock dir holds a file per uid in use, not per uid of the range).
MAX_RANGE: Final = 1_000_000
#: The host's register of uids held by any launcher (server, agent, managed runner, whatever their runs
#: dirs): ``<uid>`` names the launcher lock file that holds it. On disk, so it survives a reboot as the
#: launchers' locks do (a run's ``work/`` with unsaved state keeps its uid across one).
HOST_DIR: Final = Path("/var/lib/orchestrator/run-uids")
#: How long another launcher's lock holds its uid without a process or a ``work/`` of it.
FRESH_LOCK_SECONDS: Final = 60.0


@dataclass(frozen=True)
class UidRange:
    first: int
    last: int

    @classmethod
    def parse(cls, text: str, *, setting: str) -> UidRange:
        """``START-END`` (inclusive), both above 0 and below 2**32 - 1; ConfigurationError naming
        ``setting`` otherwise."""
        start, sep, end = text.strip().partition("-")
        try:
            first, last = int(start), int(end)
        except ValueError:
            raise ConfigurationError(
                f"{setting}: '{text}' is not a uid range START-END (for example 2100000-2100999)"
            ) from None
        if not sep or first < 1 or last < first or last >= 2**32 - 1:
            raise ConfigurationError(
                f"{setting}: '{text}' is not a uid range START-END with 0 < START <= END < 4294967295"
            )
        if last - first + 1 > MAX_RANGE:
            raise ConfigurationError(f"{setting}: '{text}' holds more than {MAX_RANGE} uids")
        return cls(first, last)

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.first, self.last + 1))


def _uids_by_pid() -> Iterator[tuple[int, set[int]]]:
    """``(pid, its uids: real, effective, saved, file system)`` of each live process; ``/proc/<pid>/status``
    is readable for every process, non-dumpable ones too."""
    with contextlib.suppress(OSError):
        for name in os.listdir(PROC):
            if not name.isdigit():
                continue
            try:
                with open(PROC / name / "status", encoding="ascii", errors="replace") as status:
                    for line in status:
                        if line.startswith("State:") and line.split()[1] == "Z":
                            break  # a zombie: dead already, only waiting for its parent
                        if line.startswith("Uid:"):
                            yield int(name), {int(value) for value in line.split()[1:5]}
                            break
            except (OSError, ValueError, IndexError):
                continue


def process_uids() -> set[int]:
    """Every uid some live process has."""
    found: set[int] = set()
    for _, uids in _uids_by_pid():
        found |= uids
    return found


def pids_of(uid: int) -> list[int]:
    """The live processes with ``uid`` as one of their uids."""
    return [pid for pid, uids in _uids_by_pid() if uid in uids]


def remove_shared_temp_files(uid: int, directories: Iterable[Path] = SHARED_TEMP_DIRS) -> list[Path]:
    """Remove what ``uid`` left at the top of the shared temporary directories (a sticky directory lets a
    run create entries there and nowhere deeper but in its own); links are removed, never followed."""
    removed: list[Path] = []
    for directory in directories:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid != uid:
                continue
            path = Path(entry.path)
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
            removed.append(path)
    return removed


class RunUids:
    """The uid range of one launcher and the locks of the uids it holds (see the module's text)."""

    def __init__(self, uids: UidRange, lock_dir: Path, *, setting: str, host_dir: Path | None = None) -> None:
        self.uids = uids
        self.lock_dir = lock_dir
        self.setting = setting
        #: The host's register (``HOST_DIR``), shared by every launcher of the host; None: this launcher's
        #: locks only (ranges of their own per launcher then keep launchers apart).
        self.host_dir = host_dir
        self._next = uids.first
        self._lock = threading.Lock()
        #: The uids this process took and still holds: never taken over as abandoned, whatever their
        #: holder looks like (a run whose ``work/`` is not made yet, a warm runner not started yet).
        self._held: set[int] = set()

    @classmethod
    def from_setting(cls, text: str, runs_dir: Path, *, setting: str) -> RunUids | None:
        """The uids of a setting's range, their locks in ``<runs dir>/.uids``; None for an empty setting or
        ``off`` (every run as the one run user, as before; the agent's and the managed runner's settings
        take an empty variable for an unset one, so ``off`` is how they say it) or when this process is not
        root (it cannot switch)."""
        if text.strip().lower() in ("", "off") or os.geteuid() != 0:
            return None
        return cls(
            UidRange.parse(text, setting=setting), runs_dir / LOCK_DIR, setting=setting, host_dir=HOST_DIR
        )

    def prepare(self) -> None:
        """The lock dir, the launcher's only (0700)."""
        self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = self.lock_dir.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise ConfigurationError(
                f"{self.setting}: {self.lock_dir} exists but is not a directory of this process's user"
            )
        self.lock_dir.chmod(0o700)

    def take(self, holder: Path) -> int:
        """A free uid, now held by ``holder`` (a run directory or a warm runner's file); OSError when every
        uid of the range is in use."""
        with self._lock:
            self.prepare()
            in_use = process_uids()
            span = self.uids.last - self.uids.first + 1
            for step in range(span):
                uid = self.uids.first + (self._next - self.uids.first + step) % span
                if uid in in_use or uid in self._held or _is_account(uid):
                    continue
                registered = self._register(uid)
                if registered is None:
                    continue  # another launcher of the host holds it
                if self._claim(uid, holder):
                    self._next = uid + 1 if uid < self.uids.last else self.uids.first
                    self._held.add(uid)
                    return uid
                if registered:
                    self._unregister(uid)
        raise OSError(
            errno.EAGAIN,
            f"every uid of {self.setting} ({self.uids.first}-{self.uids.last}) is held by a run or by what a "
            "run left (state to recover, processes); widen the range or wait",
        )

    def _register(self, uid: int) -> bool | None:
        """Hold ``uid`` in the host's register: True when this call entered it, False when it named this
        launcher's lock already (or there is no register), None when another launcher's lock holds it. An
        entry whose lock file is gone (its launcher freed the uid, or was removed) is taken over."""
        if self.host_dir is None:
            return False
        mine = str(self.lock_dir.resolve() / str(uid))
        try:
            with _host_lock(self.host_dir):
                entry = self.host_dir / str(uid)
                try:
                    owner = entry.read_text().strip()
                except FileNotFoundError:
                    owner = None
                if owner == mine:
                    return False
                if owner and not _left_over(Path(owner)):
                    return None
                self._write(entry, Path(mine))
                return True
        except OSError:
            return False  # no register here (read-only, not root): this launcher's locks alone

    def _unregister(self, uid: int) -> None:
        """Leave the host's register (only an entry naming this launcher's lock)."""
        if self.host_dir is None:
            return
        mine = str(self.lock_dir.resolve() / str(uid))
        with contextlib.suppress(OSError), _host_lock(self.host_dir):
            entry = self.host_dir / str(uid)
            if entry.read_text().strip() == mine:
                entry.unlink()

    def _claim(self, uid: int, holder: Path) -> bool:
        path = self.lock_dir / str(uid)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            if not self._abandoned(path):
                return False
            # Left by a run that is over (a crash before its release): nothing of it lives any more.
            remove_shared_temp_files(uid)
            self._write(path, holder)
            return True
        with os.fdopen(fd, "w") as lock:
            lock.write(str(holder))
        remove_shared_temp_files(uid)
        return True

    @staticmethod
    def _write(path: Path, holder: Path) -> None:
        temporary = path.with_name(f".{path.name}.new")
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as lock:
            lock.write(str(holder))
        os.replace(temporary, path)

    @staticmethod
    def _abandoned(path: Path) -> bool:
        """A lock whose holder has no ``work/`` any more (no process of the uid lives: the caller checked)."""
        try:
            holder = Path(path.read_text().strip())
        except (OSError, ValueError):
            return True
        return not (holder / "work").exists()

    def hand_over(self, uid: int, holder: Path) -> None:
        """The uid (a warm runner's) now held by ``holder`` (the run it was handed)."""
        self._write(self.lock_dir / str(uid), holder)

    def release(self, uid: int, *, holder_done: bool = False) -> None:
        """Kill what is left of ``uid``, remove its files in the shared temporary directories and free it;
        unless its holder still has its ``work/`` (state to recover): then it stays held. ``holder_done``:
        that ``work/`` is another uid's now (a new attempt of the same run)."""
        if uid not in self.uids:
            return
        sweep(uid, self.uids)
        path = self.lock_dir / str(uid)
        try:
            holder = Path(path.read_text().strip())
        except OSError:
            holder = None
        if not holder_done and holder is not None and (holder / "work").exists():
            return
        remove_shared_temp_files(uid)
        self.forget(uid)

    def forget(self, uid: int) -> None:
        """Free ``uid`` at once: nothing ever ran as it (a launch that failed before its process started)."""
        with contextlib.suppress(FileNotFoundError):
            (self.lock_dir / str(uid)).unlink()
        self._unregister(uid)
        with self._lock:
            self._held.discard(uid)


def _left_over(lock: Path) -> bool:
    """Whether another launcher's lock no longer holds its uid (the caller saw no process of it): the
    lock is gone, or its holder has no ``work/`` and the lock is older than ``FRESH_LOCK_SECONDS`` (a run
    that was just given the uid has no ``work/`` yet, a warm runner no process yet)."""
    try:
        holder = Path(lock.read_text().strip())
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    return not (holder / "work").exists() and age > FRESH_LOCK_SECONDS


@contextlib.contextmanager
def _host_lock(host_dir: Path) -> Iterator[None]:
    """The host register's lock (``flock`` on ``<host dir>/.lock``): one launcher at a time reads and
    writes entries; made (0700, root's) on first use."""
    host_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = host_dir.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"{host_dir} is not a directory of this process's user")
    fd = os.open(host_dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _is_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def sweep(uid: int, allowed: UidRange) -> bool:
    """Kill every process of ``uid`` (``kill -KILL -1`` as that uid, again while any is left); True once
    none is left. Only for a uid of ``allowed``, never 0."""
    if uid == 0 or uid not in allowed:
        raise ValueError(f"uid {uid} is not a run's uid")
    program = next((p for p in KILL_PROGRAM if os.access(p, os.X_OK)), None)
    for _ in range(SWEEP_ROUNDS):
        if uid not in process_uids():
            return True
        if program is not None and os.geteuid() == 0:
            # All of the uid's processes in one call (the kill process itself is spared, and exits).
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [program, "-KILL", "-1"],  # procps' kill takes no "--"
                    user=uid,
                    group=uid,
                    extra_groups=[],
                    env={},
                    cwd="/",
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=10,
                    check=False,
                )
        # And one by one, whatever was left (another kill program, or not root).
        for pid in pids_of(uid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return uid not in process_uids()


def read_uid(run_dir: Path) -> int | None:
    """The uid recorded for a run (``<run dir>/runner.uid``), or None."""
    try:
        return int((run_dir / UID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def record_uid(run_dir: Path, uid: int) -> None:
    (run_dir / UID_FILE).write_text(str(uid))
