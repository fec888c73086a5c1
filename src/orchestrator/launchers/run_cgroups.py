"""A cgroup (v2) of its own for every local run and warm runner, where the host lets the launcher make one.

A run's processes can leave its session (``setsid``, a double fork) and, when runs share one user, its
uid: neither the session nor the uid then finds them all. A cgroup does: every process a run's runner
starts is born in the runner's cgroup and an unprivileged process cannot move itself out (that needs
write access to the ``cgroup.procs`` of a common ancestor, which is the launcher's). When the run ends,
``cgroup.kill`` (Linux 5.14 and later) kills every process in it at once, a fork racing it included.

``RunCgroups.from_setting`` (``PO_LOCAL_RUN_CGROUPS``, ``AGENT_RUN_CGROUPS``, ``RUNNER_RUN_CGROUPS``:
``auto``, the default, or ``off``) finds the cgroup v2 hierarchy (``/proc/self/mountinfo``; a pure v2
host has it at ``/sys/fs/cgroup``, a hybrid one at ``/sys/fs/cgroup/unified``) and this process's cgroup
in it (``/proc/self/cgroup``), and makes ``<that cgroup>/po-runs-<hash of the runs dir>/`` (mode 0700):
one parent per launcher, so several launchers on one host never touch each other's runs. It is used only
where it works: the directory can be made (root, or a cgroup delegated to the launcher's user) and has
``cgroup.kill``; anywhere else (cgroup v1 only, a container's read-only ``/sys/fs/cgroup``, an older
kernel) it is ``None`` and runs rely on their uid (``launchers.run_uids``) as before. No controller is
enabled: the cgroups only group processes, they limit nothing.

A run's cgroup is ``<parent>/<name>``; the launcher records its path in the run's directory
(``runner.cgroup``), so a run adopted after a restart is killed as surely as its own.

Pitfalls: a process is moved into its cgroup right after it is started (Python's ``subprocess`` has no
way to start it there), before the runner does anything of the run's (it forks nothing before it has
fetched its bundle); the run's uid sweep stays as a second net. ``kill`` is SIGKILL: the launcher sends
SIGTERM to the run's session first (Terraform saves its state and releases its lock), as before.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from orchestrator.errors import ConfigurationError

#: The values the setting accepts.
AUTO: Final = "auto"
OFF: Final = "off"
#: A run directory's record of its cgroup (the launcher's file: the run cannot change it).
CGROUP_FILE: Final = "runner.cgroup"
MOUNTINFO: Final = Path("/proc/self/mountinfo")
OWN_CGROUP: Final = Path("/proc/self/cgroup")
#: How long ``kill`` waits for the cgroup to empty (a process in uninterruptible sleep takes its time).
KILL_WAIT_SECONDS: Final = 10.0


def cgroup2_mount(mountinfo: Path = MOUNTINFO) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (its root mounted, not a part of it), or None."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        before, sep, after = line.partition(" - ")
        fields = before.split()
        if sep and after.split()[:1] == ["cgroup2"] and len(fields) >= 5 and fields[3] == "/":
            return Path(fields[4].replace("\\040", " "))
    return None


def own_cgroup(path: Path = OWN_CGROUP) -> str | None:
    """This process's cgroup in the v2 hierarchy (``0::/a/b`` in ``/proc/self/cgroup``), or None."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:]
    return None


@dataclass(frozen=True)
class RunCgroups:
    """The parent cgroup of one launcher's runs (see the module's text)."""

    parent: Path

    @classmethod
    def from_setting(cls, text: str, runs_dir: Path, *, setting: str) -> RunCgroups | None:
        """``auto``: the runs' parent cgroup if this host lets this process make and use it, else None;
        ``off``: None; anything else: ConfigurationError naming ``setting``."""
        value = text.strip().lower()
        if value == OFF:
            return None
        if value != AUTO:
            raise ConfigurationError(f"{setting}: '{text}' is neither '{AUTO}' nor '{OFF}'")
        mount, own = cgroup2_mount(), own_cgroup()
        if mount is None or own is None:
            return None
        digest = hashlib.sha256(str(runs_dir.resolve()).encode()).hexdigest()[:16]
        made = cls(mount / own.lstrip("/") / f"po-runs-{digest}")
        if not made.usable():
            return None
        made.remove_idle()  # what an earlier process of this launcher left when it was killed
        return made

    def usable(self) -> bool:
        """Make the parent (0700) and check that a cgroup of a run can be made in it and killed."""
        try:
            self.parent.mkdir(mode=0o700, exist_ok=True)
            self.parent.chmod(0o700)
            probe = self.parent / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            try:
                return (probe / "cgroup.kill").exists() and (probe / "cgroup.procs").exists()
            finally:
                probe.rmdir()
        except OSError:
            return False

    def create(self, name: str) -> Path:
        """A new empty cgroup ``name`` in the parent (an empty one left by a crash is made again)."""
        path = self.parent / name
        try:
            path.mkdir()
        except FileExistsError:
            if not self.kill(path):
                raise
            path.mkdir()
        return path

    def enter(self, cgroup: Path, pid: int) -> None:
        """Move ``pid`` (all its threads) into ``cgroup``; OSError if it cannot be moved."""
        self._check(cgroup)
        (cgroup / "cgroup.procs").write_text(str(pid))

    def pids(self, cgroup: Path) -> list[int]:
        """The processes in ``cgroup`` (none once it is gone)."""
        try:
            return [int(line) for line in (cgroup / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def populated(self, cgroup: Path) -> bool:
        try:
            for line in (cgroup / "cgroup.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "populated":
                    return value.strip() != "0"
        except OSError:
            return False
        return False

    def kill(self, cgroup: Path) -> bool:
        """SIGKILL every process in ``cgroup`` (``cgroup.kill``), wait until it is empty and remove it;
        True once it is gone (or never was)."""
        self._check(cgroup)
        if not cgroup.is_dir():
            return True
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while True:
            try:
                (cgroup / "cgroup.kill").write_text("1")
            except FileNotFoundError:
                return True
            except OSError:
                for pid in self.pids(cgroup):  # no cgroup.kill: one by one
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            if not self.populated(cgroup):
                try:
                    cgroup.rmdir()
                    return True
                except FileNotFoundError:
                    return True
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def remove_idle(self) -> list[Path]:
        """Remove the empty cgroups a killed launcher left in the parent (their runs are over); those
        with processes stay: they are runs to adopt."""
        removed: list[Path] = []
        with contextlib.suppress(OSError):
            for child in self.parent.iterdir():
                if child.is_dir() and not self.populated(child):
                    with contextlib.suppress(OSError):
                        child.rmdir()
                        removed.append(child)
        return removed

    def close(self) -> None:
        """Remove the parent if no run is left in it (runs outlive their launcher: then it stays)."""
        self.remove_idle()
        with contextlib.suppress(OSError):
            self.parent.rmdir()

    def record(self, run_dir: Path, cgroup: Path) -> None:
        (run_dir / CGROUP_FILE).write_text(str(cgroup))

    def recorded(self, run_dir: Path) -> Path | None:
        """The cgroup recorded for a run, if it is one of this launcher's."""
        try:
            path = Path((run_dir / CGROUP_FILE).read_text().strip())
        except OSError:
            return None
        return path if path.parent == self.parent and path.name not in ("", ".", "..") else None

    def _check(self, cgroup: Path) -> None:
        if cgroup.parent != self.parent:
            raise ValueError(f"{cgroup} is not a cgroup of this launcher's runs")
