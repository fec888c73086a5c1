"""The processes of a local run, found through ``/proc``: every process of its session, safely.

A local run starts in its own session (``start_new_session``): the runner is the session leader, and
everything it starts (the IaC engine in its own process group, providers, a provisioner's shell and what
that shell starts) stays in the session unless it calls ``setsid`` itself. Signalling the leader's
process group is not enough: the engine has its own group (so that one interrupt reaches it once, not
twice: Terraform exits at once, without saving its state, on a second interrupt), and when the leader is
gone (killed) ``killpg`` on its pid reaches nobody in the other groups.

A run's members are the processes whose session or process group is the leader's pid and that started no
earlier than the leader. That is safe against pid reuse: Linux does not hand out a pid again while a
process still uses it as its session or group id, so members of the old session keep the leader's pid
reserved; and a process started before the run cannot be one of its members.

Pitfalls: ``/proc`` is Linux-only (elsewhere only a live leader's group is found); a process that left
the session (``setsid``, a double-forked daemon) is no longer the run's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True, kw_only=True)
class ProcessInfo:
    """The fields of ``/proc/<pid>/stat`` a run's membership needs."""

    pid: int
    pgid: int
    sid: int
    #: Clock ticks since boot when the process started (field 22).
    start_ticks: int
    #: ``Z`` for a zombie: dead, only waiting for its parent to collect its exit status.
    state: str


def read_stat(pid: int) -> ProcessInfo | None:
    """``/proc/<pid>/stat`` of a live process, or None if it is gone (or unreadable)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last closing parenthesis.
    fields = stat.rsplit(")", 1)[1].split()
    try:
        return ProcessInfo(
            pid=pid, state=fields[0], pgid=int(fields[2]), sid=int(fields[3]), start_ticks=int(fields[19])
        )
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None if it is gone."""
    info = read_stat(pid)
    return None if info is None else info.start_ticks


def _all_pids() -> Iterable[int]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return []
    return (int(name) for name in names if name.isdigit())


def members(leader: int, started: int) -> list[int]:
    """Live processes of the run whose session leader is (or was) ``leader``, started at ``started``
    ticks: the leader itself if it still runs, and every process of its session or process group that
    started no earlier. Zombies are left out: they have exited already."""
    found: list[int] = []
    for pid in _all_pids():
        info = read_stat(pid)
        if info is None or info.state == "Z":
            continue
        if pid == leader:
            if info.start_ticks == started:
                found.append(pid)
            continue
        if leader in (info.sid, info.pgid) and info.start_ticks >= started:
            found.append(pid)
    return found


def send(pids: Iterable[int], signum: signal.Signals) -> None:
    """Signal each process; one that is gone meanwhile is no error."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


@dataclass(eq=False, repr=False)
class RunProcesses:
    """Stopping one run: each process gets SIGTERM at most once (a second interrupt makes Terraform exit
    at once, losing the state it was about to save), then SIGKILL once the grace period is over.

    Thread-safe enough for its use: the launcher's reaper thread and a cancel may both stop the same run;
    the set of signalled pids only grows, and a pid signalled twice with SIGTERM is what it prevents.
    """

    leader: int
    started: int
    _: KW_ONLY
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    _terminated: set[int] = field(init=False, default_factory=set)

    def members(self) -> list[int]:
        return members(self.leader, self.started)

    def leader_alive(self) -> bool:
        info = read_stat(self.leader)
        return info is not None and info.state != "Z" and info.start_ticks == self.started

    def terminate(self) -> None:
        """SIGTERM the leader (the runner passes it on to the engine once) while it lives; once it is
        gone, every other process of the run that has not had one yet."""
        if self.leader_alive():
            targets = [self.leader]
        else:
            targets = [pid for pid in self.members() if pid not in self._terminated]
        self._terminated.update(targets)
        send(targets, signal.SIGTERM)

    def kill(self) -> None:
        send(self.members(), signal.SIGKILL)

    def wait_gone(self, timeout_seconds: float, *, leader_only: bool = False) -> bool:
        """Wait until no process of the run is left (or only until the leader is gone); False on timeout."""
        deadline = self.clock() + timeout_seconds
        while True:
            left = self.leader_alive() if leader_only else bool(self.members())
            if not left:
                return True
            if self.clock() >= deadline:
                return False
            self.sleep(0.1)

    def stop(self, grace_seconds: float) -> None:
        """SIGTERM (the leader, or the orphans once it is gone), wait up to ``grace_seconds`` for the whole
        run to end, then SIGKILL whatever is left, and wait for it to go."""
        deadline = self.clock() + grace_seconds
        self.terminate()
        while self.members() and self.clock() < deadline:
            # The leader may exit during the grace period, leaving orphans that never got a signal.
            if not self.leader_alive():
                self.terminate()
            self.sleep(0.1)
        if self.members():
            self.kill()
            self.wait_gone(5.0)
