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

The embedded engine runs a deployment's commands in one process, an :class:`EngineSession`
(``po-terraform --po-session``, see ``runner.embedded_terraform``): each ``po-terraform`` start costs
about 0.1 CPU-s (Python, the library's load, the Go runtime's first command), more than ``init`` and
``apply`` of a small module together. Its commands write into the same files, are followed the same way
and are interrupted the same way (one SIGINT to the session, which the library hands to the command that
runs, the grace, SIGKILL); what a command left running is killed when the session ends
(:meth:`IacCli.close`, at the end of the deployment) or dies. A ``po-terraform`` that cannot be a session
(an older one on PATH) answers nothing: the commands then run one process each, as for tofu and terraform.
"""

from __future__ import annotations

import codecs
import contextlib
import json
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
from types import TracebackType
from typing import IO, Any

from orchestrator.runner.diagnostics import OutputScan
from orchestrator.runner.embedded_terraform import SESSION_FLAG
from orchestrator.runner.engine import Engine, IacBackend
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


class EngineSession:
    """One ``po-terraform --po-session`` process, running commands one at a time (module docstring)."""

    def __init__(self, process: subprocess.Popen[bytes], commands: IO[bytes], results: IO[bytes]) -> None:
        self.process = process
        self._commands: IO[bytes] | None = commands
        self._results = results

    @classmethod
    def start(
        cls, command: tuple[str, ...], *, env: Mapping[str, str], log_path: Path
    ) -> EngineSession | None:
        """The session, once it answered that it is ready; None when it cannot be one (it exited)."""
        command_read, command_write = os.pipe()
        result_read, result_write = os.pipe()
        try:
            with open(log_path, "wb") as log_file:
                process = subprocess.Popen(
                    [*command, SESSION_FLAG, str(command_read), str(result_write)],
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    env=dict(env),
                    process_group=0,
                    pass_fds=(command_read, result_write),
                )
        except BaseException:
            for fd in (command_write, result_read):
                os.close(fd)
            raise
        finally:
            os.close(command_read)
            os.close(result_write)
        session = cls(process, os.fdopen(command_write, "wb", buffering=0), os.fdopen(result_read, "rb"))
        try:
            ready = session._answer()
        except BaseException:
            session.stop(grace_seconds=0.0)
            raise
        if ready is None or not ready.get("ready"):
            session.stop(grace_seconds=0.0)
            return None
        return session

    def send(self, argv: tuple[str, ...], stdout_path: Path, stderr_path: Path) -> None:
        """Start one command (OSError: the session is gone)."""
        if self._commands is None:
            raise BrokenPipeError("the engine session was closed")
        order = {
            "argv": list(argv),
            "stdout": os.path.abspath(stdout_path),
            "stderr": os.path.abspath(stderr_path),
        }
        self._commands.write(json.dumps(order).encode() + b"\n")

    def wait(self) -> int:
        """The command's exit code; that of the session when it died meanwhile (it is then cleared)."""
        answer = self._answer()
        if answer is not None and isinstance(answer.get("exit_code"), int):
            return int(answer["exit_code"])
        self._close_commands()
        return _wait_and_clear(self.process)

    def alive(self) -> bool:
        return self._commands is not None and self.process.returncode is None and not _exited(self.process)

    def stop(self, *, grace_seconds: float) -> None:
        """Interrupt the command that runs (one SIGINT), end the session, SIGKILL after ``grace_seconds``."""
        if self.process.returncode is None and not _exited(self.process):
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGINT)
        self.close(grace_seconds=grace_seconds)

    def close(self, *, grace_seconds: float) -> None:
        """End the session (the end of its commands), SIGKILL after ``grace_seconds``; then what its
        commands left running."""
        self._close_commands()
        try:
            _wait_and_clear(self.process, timeout_seconds=grace_seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _wait_and_clear(self.process)
        finally:
            self._results.close()

    def _close_commands(self) -> None:
        if self._commands is not None:
            with contextlib.suppress(OSError):
                self._commands.close()
            self._commands = None

    def _answer(self) -> dict[str, Any] | None:
        line = self._results.readline()
        try:
            answer = json.loads(line) if line else None
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None


class IacCli:
    """Runs engine commands in ``workdir`` (``-chdir``), teeing their output into ``sink``.

    ``session`` (default: for the embedded engine): the commands run in one :class:`EngineSession`,
    started at the first and ended by :meth:`close`.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        workdir: Path,
        environ: Mapping[str, str],
        sink: LogBuffer,
        terminate_grace_seconds: float = 10.0,
        session: bool | None = None,
    ) -> None:
        self.engine = engine
        self._workdir = workdir
        self._env = engine_environment(environ)
        self._sink = sink
        self._grace_seconds = terminate_grace_seconds
        self._session_wanted = engine.backend is IacBackend.EMBEDDED if session is None else session
        self._session: EngineSession | None = None
        #: The session's own output (outside its commands), read into the log when it ends.
        self._session_dir: Path | None = None

    def __enter__(self) -> IacCli:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def in_session(self) -> bool:
        """Whether commands run in an engine session (one is running, or the next will start one)."""
        return self._session_wanted

    def run(self, *args: str, log_stdout: bool = True) -> CommandResult:
        """Run ``<engine> -chdir=<workdir> *args``.

        stderr always goes to the log; stdout only with ``log_stdout`` (``show``/``output`` print
        output values, which may be secret, so they are kept out of the log).
        """
        argv = (*self.engine.command, f"-chdir={self._workdir}", *args)
        output_dir = Path(tempfile.mkdtemp(prefix=".po-engine-output-", dir=self._workdir))
        try:
            session = self._started_session() if self._session_wanted else None
            return self._run(argv, output_dir, log_stdout=log_stdout, session=session)
        finally:
            # `show`/`output` print output values: never leave them behind.
            shutil.rmtree(output_dir, ignore_errors=True)

    def close(self) -> None:
        """End the engine session, if one runs (what its commands left running is killed)."""
        session, self._session = self._session, None
        if session is not None:
            session.close(grace_seconds=self._grace_seconds)
        self._end_session_log()

    def _started_session(self) -> EngineSession | None:
        if self._session is not None and self._session.alive():
            return self._session
        if self._session is not None:  # it died: what it left is killed, a new one takes over
            self._session.close(grace_seconds=0.0)
            self._session = None
        self._end_session_log()
        self._session_dir = Path(tempfile.mkdtemp(prefix=".po-engine-session-", dir=self._workdir))
        try:
            self._session = EngineSession.start(
                self.engine.command, env=self._env, log_path=self._session_dir / "log"
            )
        except OSError:
            self._session = None
        if self._session is None:
            # Not a session (an older po-terraform, no engine): one process per command, as before.
            self._session_wanted = False
            self._end_session_log()
        return self._session

    def _end_session_log(self) -> None:
        """The session's own output into the log (a Go runtime message outside any command)."""
        directory, self._session_dir = self._session_dir, None
        if directory is None:
            return
        with contextlib.suppress(OSError):
            text = (directory / "log").read_bytes().decode(errors="replace")
            for line in text.splitlines():
                if line.strip():
                    self._sink.write_line(line)
        shutil.rmtree(directory, ignore_errors=True)

    def _run(
        self, argv: tuple[str, ...], output_dir: Path, *, log_stdout: bool, session: EngineSession | None
    ) -> CommandResult:
        stdout_path, stderr_path = output_dir / "stdout", output_dir / "stderr"
        process: subprocess.Popen[bytes] | None = None
        with open(stdout_path, "wb") as stdout_file, open(stderr_path, "wb") as stderr_file:
            if session is not None:
                try:
                    session.send(argv[len(self.engine.command) :], stdout_path, stderr_path)
                except OSError:  # it died since it was seen alive: this command runs on its own
                    self._session = None
                    session.close(grace_seconds=0.0)
                    session = None
            if session is None:
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
            if session is not None:
                exit_code = session.wait()
            else:
                assert process is not None
                exit_code = _wait_and_clear(process)
        except BaseException:
            if session is not None:
                self._session = None
                session.stop(grace_seconds=self._grace_seconds)
            else:
                assert process is not None
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
