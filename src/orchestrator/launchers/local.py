"""Runs ``po-runner standard`` as a process on this host: the `vm` runner with ``connection: {type: local}``.

Each run gets ``<runs dir>/<deployment id>/`` holding the unpacked code (removed when the run ends: plan
files hold output values in clear text), a pid file and the runner's stderr. Processes start in their own
session, so they outlive a restart of the orchestrator; the handle carries the host, pid and the process
start time, so a recycled pid is never mistaken for the run.

A run ends when its whole session has: when the runner exits (or is killed) and processes of its session
are left (the engine, a provisioner's children), they get SIGTERM (Terraform then saves its state and
releases its lock), then SIGKILL after ``reap_grace_seconds``; until then the run counts as running, so
its deployment is not failed (nor its state lock released) while its engine may still write state. A
code directory holding state Terraform could not save (``errored.tfstate``, or a local backend's
``terraform.tfstate``) is never removed (``processes`` finds the members, ``RunStatus.unsaved_state``
reports the file).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.launchers import processes
from orchestrator.launchers.base import LaunchError, RunState, RunStatus, UnsavedState
from orchestrator.protocol.launch import RunSpec

#: Variables of the orchestrator's own environment a local run inherits; nothing else leaks into it.
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR", "TZ")
STDERR_TAIL_BYTES = 4096
#: State files a run's code directory may hold that no backend has: Terraform's ``errored.tfstate`` (it
#: could not write to its backend) and the state of a local backend.
UNSAVED_STATE_FILES = ("errored.tfstate", "terraform.tfstate")
#: How long the processes a runner left behind get after SIGTERM, before SIGKILL: Terraform finishes the
#: operations in flight, saves its state and releases its lock in that time.
REAP_GRACE_SECONDS = 60.0


def _start_time(pid: int) -> str | None:
    """Clock ticks since boot when ``pid`` started (field 22 of /proc/pid/stat), or None if it is gone."""
    ticks = processes.start_ticks(pid)
    return None if ticks is None else str(ticks)


def unsaved_state(code_dir: Path) -> Path | None:
    """The state file a run left in its code directory that no backend holds, if any."""
    for name in UNSAVED_STATE_FILES:
        path = code_dir / name
        if path.is_file():
            return path
    return None


def remove_code_dir(run_dir: Path, *, whole_run: bool) -> Path | None:
    """Remove the run's code (plan files hold outputs in clear text), or the whole run directory; but
    never state Terraform could not save: then nothing is removed and the state file is answered."""
    kept = unsaved_state(run_dir / "code")
    if kept is None:
        shutil.rmtree(run_dir if whole_run else run_dir / "code", ignore_errors=True)
    return kept


class LocalLauncher:
    """Launcher for local runs; one per orchestrator process."""

    def __init__(
        self,
        runs_dir: Path,
        *,
        environ: Mapping[str, str],
        python: str = sys.executable,
        reap_grace_seconds: float = REAP_GRACE_SECONDS,
    ) -> None:
        self.runs_dir = runs_dir
        self.hostname = socket.gethostname()
        self._inherited = {k: environ[k] for k in INHERITED if k in environ}
        self._python = python
        self._reap_grace_seconds = reap_grace_seconds
        self._running: set[str] = set()
        self._exit_codes: dict[str, int] = {}
        #: Per handle: the run's processes (which of them already had their SIGTERM).
        self._processes: dict[str, processes.RunProcesses] = {}
        #: Adopted runs (launched before a restart) whose leftover processes are being stopped.
        self._reaping: set[str] = set()
        self._lock = threading.Lock()

    def _run_dir(self, spec: RunSpec, job: Mapping[str, Any]) -> Path:
        base = Path(job["work_dir"]) if job.get("work_dir") else self.runs_dir
        return base / spec.deployment_id

    def _argv(self, job: Mapping[str, Any], env_names: list[str]) -> list[str]:
        runtime = job.get("runtime", "process")
        if runtime == "process":
            return [self._python, "-m", "orchestrator.cli.runner", "standard"]
        # docker/podman: values travel in the environment (`-e NAME`), never on the command line.
        argv = [runtime, "run", "--rm", "--network", "host"]
        for name in env_names:
            argv += ["-e", name]
        return [*argv, str(job["image"]), "standard"]

    async def launch(self, spec: RunSpec) -> str:
        job: Mapping[str, Any] = spec.runner_configuration.get("job") or {}
        run_dir = self._run_dir(spec, job)
        pid_file = run_dir / "runner.pid"
        adopted = self._adopt(pid_file)
        if adopted is not None:
            return adopted
        code_dir = run_dir / "code"
        code_dir.mkdir(parents=True, exist_ok=True)
        run_env = {
            **dict(job.get("environment") or {}),
            **dict(job.get("secrets") or {}),
            **spec.runner_environment(),
        }
        if job.get("runtime", "process") == "process":
            run_env["IAC_CODE_DIR"] = str(code_dir)
        argv = self._argv(job, sorted(run_env))
        try:
            process = await asyncio.to_thread(self._spawn, argv, {**self._inherited, **run_env}, run_dir)
        except OSError as exc:
            error = LaunchError(f"cannot start the runner process ({argv[0]}): {exc.strerror or exc}")
            error.retryable = False
            raise error from exc
        handle = f"local:{self.hostname}:{process.pid}:{_start_time(process.pid) or '0'}:{run_dir}"
        pid_file.write_text(handle)
        self._running.add(handle)
        # A thread, not the event loop, waits for the process: a run outlives the loop that started it.
        threading.Thread(target=self._reap, args=(handle, process, run_dir), daemon=True).start()
        return handle

    @staticmethod
    def _spawn(argv: list[str], env: dict[str, str], run_dir: Path) -> subprocess.Popen[bytes]:
        with open(run_dir / "stderr.log", "wb") as stderr:
            return subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=run_dir,
                start_new_session=True,
            )

    def _reap(self, handle: str, process: subprocess.Popen[bytes], run_dir: Path) -> None:
        """Once the runner exited: stop what it left running, record the exit code, and remove the run's
        code (plan files hold outputs in clear text) unless it holds unsaved state; the stderr of a failed
        run stays for the dispatcher's message."""
        code = process.wait()
        self._stop_leftovers(handle)
        remove_code_dir(run_dir, whole_run=code == 0)
        self._exit_codes[handle] = code
        self._running.discard(handle)

    def _run_processes(self, handle: str) -> processes.RunProcesses:
        with self._lock:
            found = self._processes.get(handle)
            if found is None:
                _, pid, started, _ = self._parse(handle)
                found = processes.RunProcesses(pid, int(started) if started.isdigit() else 0)
                self._processes[handle] = found
            return found

    def _stop_leftovers(self, handle: str) -> None:
        """The runner is gone: SIGTERM what is left of its session, SIGKILL after the reap grace."""
        run = self._run_processes(handle)
        if run.members():
            run.stop(self._reap_grace_seconds)

    def _reap_adopted(self, handle: str) -> None:
        try:
            self._stop_leftovers(handle)
        finally:
            with self._lock:
                self._reaping.discard(handle)

    def resume(self) -> list[str]:
        """Watch the runs an earlier process of this launcher started under ``runs_dir`` (before a
        restart) that still have processes, as if they were its own: once the runner is gone, what it
        left is stopped and its code removed (unsaved state kept). For the agent, whose local runs no
        dispatcher checks on. The handles of the runs now watched."""
        resumed: list[str] = []
        for pid_file in sorted(self.runs_dir.glob("*/runner.pid")):
            try:
                handle = pid_file.read_text().strip()
                host, _, _, run_dir = self._parse(handle)
            except (OSError, ValueError):
                continue
            if host != self.hostname or handle in self._running or not self._alive(handle):
                continue
            self._running.add(handle)
            threading.Thread(target=self._watch_resumed, args=(handle, run_dir), daemon=True).start()
            resumed.append(handle)
        return resumed

    def _watch_resumed(self, handle: str, run_dir: Path, poll_seconds: float = 0.5) -> None:
        run = self._run_processes(handle)
        try:
            # Not this process's child: its exit cannot be waited for, only seen.
            while run.leader_alive():
                time.sleep(poll_seconds)
            self._stop_leftovers(handle)
            remove_code_dir(run_dir, whole_run=False)
        finally:
            self._running.discard(handle)

    def _adopt(self, pid_file: Path) -> str | None:
        """A run launched before a crash, still alive: launching again would run the deployment twice."""
        with contextlib.suppress(OSError):
            handle = pid_file.read_text().strip()
            if self._alive(handle):
                return handle
        return None

    def _parse(self, handle: str) -> tuple[str, int, str, Path]:
        kind, host, pid, started, run_dir = handle.split(":", 4)
        if kind != "local":
            raise ValueError(handle)
        return host, int(pid), started, Path(run_dir)

    def _alive(self, handle: str) -> bool:
        """Whether any process of the run is left: the runner, or what it started."""
        host, _pid, _started, _ = self._parse(handle)
        return host == self.hostname and bool(self._run_processes(handle).members())

    async def status(self, handle: str) -> RunStatus:
        host, _pid, _, run_dir = self._parse(handle)
        if host != self.hostname:
            return RunStatus(state=RunState.UNKNOWN, detail=f"the run is on host {host}")
        if handle in self._running:
            return RunStatus(state=RunState.RUNNING)
        if handle in self._exit_codes:
            return RunStatus(
                state=RunState.EXITED,
                exit_code=self._exit_codes[handle],
                detail=_last_line(run_dir),
                unsaved_state=_unsaved(run_dir),
            )
        run = self._run_processes(handle)
        if run.leader_alive():
            return RunStatus(state=RunState.RUNNING)
        if run.members():
            # Launched before a restart, its runner gone, processes of it left: stop them (once), and
            # count the run as running until they are gone.
            with self._lock:
                start = handle not in self._reaping
                self._reaping.add(handle)
            if start:
                threading.Thread(target=self._reap_adopted, args=(handle,), daemon=True).start()
            return RunStatus(state=RunState.RUNNING)
        return RunStatus(
            state=RunState.EXITED,
            detail=_last_line(run_dir) or "the runner process is gone",
            unsaved_state=_unsaved(run_dir),
        )

    def forget_unsaved_state(self, handle: str) -> None:
        """The run's unsaved state is saved elsewhere now (the orchestrator recovered it): remove the
        run's code directory like that of any failed run."""
        _, _, _, run_dir = self._parse(handle)
        kept = unsaved_state(run_dir / "code")
        if kept is not None:
            kept.unlink(missing_ok=True)
        remove_code_dir(run_dir, whole_run=False)

    async def cancel(self, handle: str, *, grace_seconds: float) -> None:
        """SIGTERM the run (see ``_stop``), then SIGKILL what is left of it after the grace period."""
        await asyncio.to_thread(self._stop, handle, grace_seconds)

    def _stop(self, handle: str, grace_seconds: float) -> None:
        """SIGTERM the runner (it passes the signal on to the engine once) or, when it is gone already,
        every process it left; SIGKILL whatever of the session is left after the grace period."""
        host, _, _, _ = self._parse(handle)
        if host != self.hostname:
            return
        self._run_processes(handle).stop(grace_seconds)


def _unsaved(run_dir: Path) -> UnsavedState | None:
    path = unsaved_state(run_dir / "code")
    if path is None:
        return None
    try:
        return UnsavedState(path=str(path), data=path.read_bytes())
    except OSError:
        return None


def _last_line(run_dir: Path) -> str | None:
    """The last line the runner wrote to stderr (its summary of what went wrong), if any."""
    try:
        with open(run_dir / "stderr.log", "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - STDERR_TAIL_BYTES))
            lines = handle.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return None
    return lines[-1] if lines else None
