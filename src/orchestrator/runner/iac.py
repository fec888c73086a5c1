"""Running one IaC command (tofu/terraform/po-terraform) as a subprocess, its output teed to the log.

Deliberately synchronous: ``subprocess.Popen`` with an argv list (never a shell), stdout read line by
line on this thread, stderr on a helper thread. If the runner is interrupted (SIGTERM → exception),
the child gets SIGTERM, a grace period, then SIGKILL.

The engine runs in its own process group: a signal to the runner's group (a terminal's Ctrl-C, a
launcher's cancel) reaches the engine once, through the runner, and not twice (Terraform exits at once on
a second interrupt, without saving its state or releasing its lock). When the engine has exited, whatever
is left of its group (a provisioner's background children) is killed: nothing a command started outlives
it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from orchestrator.runner.engine import Engine
from orchestrator.runner.logs import LogBuffer

#: Variables never passed to the IaC engine: the deployment token and the age recipients.
HIDDEN_VARIABLES = frozenset({"TOKEN"})
HIDDEN_PREFIXES = ("ENCRYPTING_",)


@dataclass(frozen=True, kw_only=True)
class CommandResult:
    """Exit code and output lines (without newlines) of one IaC command."""

    argv: tuple[str, ...]
    exit_code: int
    stdout: list[str]
    stderr: list[str]

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def engine_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The runner's environment for the IaC engine: secrets removed, automation defaults added."""
    env = {
        key: value
        for key, value in environ.items()
        if key not in HIDDEN_VARIABLES and not key.startswith(HIDDEN_PREFIXES)
    }
    env.setdefault("CHECKPOINT_DISABLE", "1")
    env.setdefault("TF_IN_AUTOMATION", "1")
    env.setdefault("TF_INPUT", "0")
    return env


class IacCli:
    """Runs engine commands in ``workdir`` (``-chdir``), teeing their output into ``sink``."""

    def __init__(
        self,
        engine: Engine,
        *,
        workdir: Path,
        environ: Mapping[str, str],
        sink: LogBuffer,
        terminate_grace_seconds: float = 10.0,
    ) -> None:
        self.engine = engine
        self._workdir = workdir
        self._env = engine_environment(environ)
        self._sink = sink
        self._grace_seconds = terminate_grace_seconds

    def run(self, *args: str, log_stdout: bool = True) -> CommandResult:
        """Run ``<engine> -chdir=<workdir> *args``.

        stderr always goes to the log; stdout only with ``log_stdout`` (``show``/``output`` print
        output values, which may be secret, so they are kept out of the log).
        """
        argv = (*self.engine.command, f"-chdir={self._workdir}", *args)
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env,
            text=True,
            encoding="utf-8",
            errors="replace",
            # Its own process group (see the module docstring); the runner's session all the same.
            process_group=0,
        )
        stdout: list[str] = []
        stderr: list[str] = []
        assert process.stdout is not None and process.stderr is not None
        # Both streams on helper threads: this thread waits for the engine itself, so that output held
        # open by something the engine left behind does not keep the command from ending.
        readers = [
            threading.Thread(target=self._pump, args=(process.stdout, stdout, log_stdout), daemon=True),
            threading.Thread(target=self._pump, args=(process.stderr, stderr, True), daemon=True),
        ]
        for reader in readers:
            reader.start()
        try:
            exit_code = _wait_and_clear(process)
        except BaseException:
            self._stop(process)
            raise
        finally:
            for reader in readers:
                reader.join(timeout=self._grace_seconds)
        return CommandResult(argv=argv, exit_code=exit_code, stdout=stdout, stderr=stderr)

    def _pump(self, stream: IO[str], lines: list[str], log: bool) -> None:
        with stream:
            for raw in stream:
                line = raw.rstrip("\n")
                lines.append(line)
                if log:
                    self._sink.write_line(line)

    def _stop(self, process: subprocess.Popen[str]) -> None:
        if process.returncode is not None:
            return
        if not _exited(process):
            # One SIGTERM: Terraform stops gracefully, saving its state and releasing its lock.
            process.terminate()
            try:
                _wait_and_clear(process, timeout_seconds=self._grace_seconds)
                return
            except subprocess.TimeoutExpired:
                process.kill()
        _wait_and_clear(process)


def _exited(process: subprocess.Popen[str]) -> bool:
    """Whether the process has exited, without collecting its exit status (its pid stays reserved)."""
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_and_clear(process: subprocess.Popen[str], *, timeout_seconds: float | None = None) -> int:
    """Wait for the engine to exit, SIGKILL what is left of its process group, then collect its exit
    status. The group is signalled before the exit status is collected: until then the engine's pid (the
    group's id) cannot be handed to another process, so the signal reaches only what the engine left."""
    if timeout_seconds is None:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    else:
        deadline = time.monotonic() + timeout_seconds
        while not _exited(process):
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(process.args, timeout_seconds)
            time.sleep(0.05)
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    return process.wait()
