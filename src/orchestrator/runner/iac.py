"""Running one IaC command (tofu/terraform/po-terraform) as a subprocess, its output teed to the log.

Deliberately synchronous: ``subprocess.Popen`` with an argv list (never a shell); this thread waits for
the engine, helper threads follow its output. If the runner is interrupted (SIGTERM/SIGINT → exception),
the engine gets one SIGINT (as from a terminal: Terraform stops gracefully, saves its state and releases its
lock), a grace period (``RUNNER_STOP_GRACE_SECONDS``), then SIGKILL.

The engine writes its stdout and stderr into files (in a hidden directory of the working directory,
removed after each command), not into pipes: when the runner is killed, a pipe's reading end closes, and
a Go program (terraform, tofu) dies of SIGPIPE at its next line of output, before it can save its state.
A file takes its output whoever reads it.

Memory does not grow with the log: the lines of a logged stream go to the log (``LogBuffer``, which keeps
its first 10 MiB) and to ``diagnostics.OutputScan`` as they are read, and the result keeps only their last
``TAIL_LINES``; only the stdout of a command that is not logged (``show``, ``output``, ``version``: the
document the runner reads) is kept whole.

The engine runs in its own process group: a signal to the runner's group (a terminal's Ctrl-C, a
launcher's cancel) reaches the engine once, through the runner, and not twice (Terraform exits at once on
a second interrupt, without saving its state or releasing its lock). When the engine has exited, whatever
is left of its group (a provisioner's background children) is killed: nothing a command started outlives
it.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Mapping, MutableSequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.runner.diagnostics import OutputScan
from orchestrator.runner.engine import Engine
from orchestrator.runner.logs import LogBuffer

#: Variables never passed to the IaC engine: the deployment token and the age recipients.
HIDDEN_VARIABLES = frozenset({"TOKEN"})
HIDDEN_PREFIXES = ("ENCRYPTING_",)
#: Lines of a logged stream a command's result keeps (its last ones; the log has them all) ...
TAIL_LINES = 200
#: ... each cut to this many characters.
TAIL_LINE_CHARS = 8192


@dataclass(frozen=True, kw_only=True)
class CommandResult:
    """Exit code and output lines (without newlines) of one IaC command: ``stdout`` whole for a command
    whose stdout is not logged, else its last ``TAIL_LINES`` (each at most ``TAIL_LINE_CHARS``), and so
    ``stderr``; with what ``diagnostics.OutputScan`` found in each stream, every line read."""

    argv: tuple[str, ...]
    exit_code: int
    stdout: list[str]
    stderr: list[str]
    stdout_scan: OutputScan = field(default_factory=OutputScan)
    stderr_scan: OutputScan = field(default_factory=OutputScan)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def error_diagnostic(self) -> dict[str, Any] | None:
        """The last error diagnostic of stdout then stderr (stderr's if it has one)."""
        return self.stderr_scan.error or self.stdout_scan.error


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
        output_dir = Path(tempfile.mkdtemp(prefix=".po-engine-output-", dir=self._workdir))
        try:
            return self._run(argv, output_dir, log_stdout=log_stdout)
        finally:
            # `show`/`output` print output values: never leave them behind.
            shutil.rmtree(output_dir, ignore_errors=True)

    def _run(self, argv: tuple[str, ...], output_dir: Path, *, log_stdout: bool) -> CommandResult:
        stdout_path, stderr_path = output_dir / "stdout", output_dir / "stderr"
        with open(stdout_path, "wb") as stdout_file, open(stderr_path, "wb") as stderr_file:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=stdout_file,
                stderr=stderr_file,
                env=self._env,
                # Its own process group (see the module docstring); the runner's session all the same.
                process_group=0,
            )
        stdout: MutableSequence[str] = deque(maxlen=TAIL_LINES) if log_stdout else []
        stderr: MutableSequence[str] = deque(maxlen=TAIL_LINES)
        stdout_scan, stderr_scan = OutputScan(), OutputScan()
        exited = threading.Event()
        readers = [
            threading.Thread(
                target=self._follow,
                args=(stdout_path, stdout, stdout_scan, log_stdout, exited),
                daemon=True,
            ),
            threading.Thread(
                target=self._follow, args=(stderr_path, stderr, stderr_scan, True, exited), daemon=True
            ),
        ]
        for reader in readers:
            reader.start()
        try:
            exit_code = _wait_and_clear(process)
        except BaseException:
            self._stop(process)
            raise
        finally:
            exited.set()
            for reader in readers:
                reader.join(timeout=self._grace_seconds)
        return CommandResult(
            argv=argv,
            exit_code=exit_code,
            stdout=list(stdout),
            stderr=list(stderr),
            stdout_scan=stdout_scan,
            stderr_scan=stderr_scan,
        )

    def _follow(
        self,
        path: Path,
        lines: MutableSequence[str],
        scan: OutputScan,
        log: bool,
        exited: threading.Event,
    ) -> None:
        """Read ``path`` as the engine writes it, line by line, until the engine has exited and all of it
        is read."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        with open(path, "rb") as stream:
            while True:
                # Checked before reading: whatever was written before the exit is read afterwards.
                done = exited.is_set()
                chunk = stream.read(65536)
                if chunk:
                    pending += decoder.decode(chunk)
                    *complete, pending = pending.split("\n")
                    for line in complete:
                        self._line(line, lines, scan, log)
                elif done:
                    break
                else:
                    time.sleep(0.02)
        pending += decoder.decode(b"", final=True)
        if pending:
            self._line(pending, lines, scan, log)

    def _line(self, raw: str, lines: MutableSequence[str], scan: OutputScan, log: bool) -> None:
        line = raw.rstrip("\r")
        scan.feed(line)
        if log:
            lines.append(line[:TAIL_LINE_CHARS])
            self._sink.write_line(line)
        else:
            lines.append(line)

    def _stop(self, process: subprocess.Popen[Any]) -> None:
        if process.returncode is not None:
            return
        if not _exited(process):
            # One SIGINT, as a terminal's Ctrl-C: Terraform stops gracefully, saving its state and
            # releasing its lock (a second one would make it exit at once).
            process.send_signal(signal.SIGINT)
            try:
                _wait_and_clear(process, timeout_seconds=self._grace_seconds)
                return
            except subprocess.TimeoutExpired:
                process.kill()
        _wait_and_clear(process)


def _exited(process: subprocess.Popen[Any]) -> bool:
    """Whether the process has exited, without collecting its exit status (its pid stays reserved)."""
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_and_clear(process: subprocess.Popen[Any], *, timeout_seconds: float | None = None) -> int:
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
