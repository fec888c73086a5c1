"""Runs ``po-runner standard`` as a process on this host: the `vm` runner with ``connection: {type: local}``.

Each run gets ``<runs dir>/<deployment id>/`` holding the unpacked code (removed when the run ends: plan
files hold output values in clear text), a pid file and the runner's stderr. Processes start in their own
session, so they outlive a restart of the orchestrator; the handle carries the host, pid and the process
start time, so a recycled pid is never mistaken for the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.launchers.base import LaunchError, RunState, RunStatus
from orchestrator.protocol.launch import RunSpec

#: Variables of the orchestrator's own environment a local run inherits; nothing else leaks into it.
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR", "TZ")
STDERR_TAIL_BYTES = 4096


def _start_time(pid: int) -> str | None:
    """Clock ticks since boot when ``pid`` started (field 22 of /proc/pid/stat), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing parenthesis.
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None


class LocalLauncher:
    """Launcher for local runs; one per orchestrator process."""

    def __init__(self, runs_dir: Path, *, environ: Mapping[str, str], python: str = sys.executable) -> None:
        self.runs_dir = runs_dir
        self.hostname = socket.gethostname()
        self._inherited = {k: environ[k] for k in INHERITED if k in environ}
        self._python = python
        self._running: set[str] = set()
        self._exit_codes: dict[str, int] = {}

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
        """Record the exit code, and remove the run's code (plan files hold outputs in clear text); the
        stderr of a failed run stays for the dispatcher's message."""
        code = process.wait()
        shutil.rmtree(run_dir if code == 0 else run_dir / "code", ignore_errors=True)
        self._exit_codes[handle] = code
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
        host, pid, started, _ = self._parse(handle)
        return host == self.hostname and _start_time(pid) == started

    async def status(self, handle: str) -> RunStatus:
        host, _pid, _, run_dir = self._parse(handle)
        if host != self.hostname:
            return RunStatus(state=RunState.UNKNOWN, detail=f"the run is on host {host}")
        if handle in self._running:
            return RunStatus(state=RunState.RUNNING)
        if handle in self._exit_codes:
            return RunStatus(
                state=RunState.EXITED, exit_code=self._exit_codes[handle], detail=_last_line(run_dir)
            )
        if self._alive(handle):
            return RunStatus(state=RunState.RUNNING)
        return RunStatus(state=RunState.EXITED, detail=_last_line(run_dir) or "the runner process is gone")

    async def cancel(self, handle: str, *, grace_seconds: float) -> None:
        """SIGTERM the run's process group, then SIGKILL after the grace period."""
        await asyncio.to_thread(self._stop, handle, grace_seconds)

    def _stop(self, handle: str, grace_seconds: float) -> None:
        if not self._alive(handle):
            return
        _, pid, _, _ = self._parse(handle)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while self._alive(handle) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._alive(handle):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


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
