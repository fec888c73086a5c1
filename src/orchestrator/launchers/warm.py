"""Warm runners: ``po-runner warm`` processes started before their deployment, each waiting for one.

Starting the runner's Python and importing it costs about 0.3-0.5 CPU-seconds, a third of a small
deployment's overhead (``bench/deploy.py --only overhead``). The local launcher keeps a few runners already
started and imported (``PO_LOCAL_WARM_RUNNERS``, default 2) and hands a deployment to one of them; the pool
is refilled in the background. A warm runner serves exactly one deployment and then exits, like a cold
one: nothing of one deployment can reach the next.

A warm runner is started as a cold one would be (its own session, the run user, no inherited
environment beyond ``INHERITED``, stdout to ``/dev/null``), with its stderr in ``<runs dir>/.warm/`` (the
launcher's, mode 0700) and its stdin a pipe from the launcher. The hand-over
(``protocol.launch.WarmOrder``) is one JSON line on that pipe: the run's environment and working
directory; the launcher first moves the stderr file into the run's directory (a rename: the process keeps
writing to the same file), then writes the line and closes the pipe. An idle runner
whose pipe closes (the pool closed, the orchestrator stopped or died) exits at once without running
anything.

Pitfalls: a warm runner only serves runs whose directory is on the runs dir's file system (the stderr
file is renamed), so runs with their own ``job.work_dir`` start cold; a runner found dead when taken (an
operator killed it) is skipped, and the run starts cold if none is left.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.protocol.launch import WarmOrder

#: The launcher's own folder in the runs dir for the warm runners' stderr files (not a deployment's).
WARM_DIR = ".warm"
#: How long an idle warm runner has to exit once its pipe is closed, before it is killed.
CLOSE_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class WarmRunner:
    """A started runner waiting for its order; ``stderr`` is where its stderr is written until handed over."""

    process: subprocess.Popen[bytes]
    stderr: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def hand_over(self, order: WarmOrder, stderr: Path) -> None:
        """Move the stderr file to ``stderr`` and send the order; OSError (BrokenPipeError: it died) when it
        cannot be handed over, the stderr file then put back."""
        os.replace(self.stderr, stderr)
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(order.encode())
            stdin.close()
        except OSError:
            with contextlib.suppress(OSError):
                os.replace(stderr, self.stderr)
            raise

    def discard(self) -> None:
        """Close its pipe (an idle runner then exits), wait for it (kill it after a while), drop its file."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(CLOSE_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            self.stderr.unlink()


class WarmPool:
    """Up to ``size`` idle warm runners; ``take`` hands one out (or None) and starts a replacement in a
    background thread. Filled on first use: a server that never launches a local run starts none."""

    def __init__(self, start: Callable[[Path], subprocess.Popen[bytes]], directory: Path, size: int) -> None:
        #: Starts a runner with its stderr at the path given (``LocalLauncher`` knows the command and user).
        self._start = start
        self.directory = directory
        self.size = size
        self._idle: list[WarmRunner] = []
        self._starting = 0
        self._closed = False
        self._swept = False
        self._lock = threading.Lock()

    def take(self) -> WarmRunner | None:
        """An idle warm runner that is still alive, or None; the pool is topped up either way."""
        if self.size <= 0:
            return None
        found: WarmRunner | None = None
        dead: list[WarmRunner] = []
        with self._lock:
            while self._idle and found is None:
                runner = self._idle.pop(0)
                if runner.alive():
                    found = runner
                else:
                    dead.append(runner)
        for runner in dead:
            runner.discard()
        self._top_up()
        return found

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def _top_up(self) -> None:
        with self._lock:
            if not self._swept:
                self._sweep_stale()
                self._swept = True
            missing = 0 if self._closed else self.size - len(self._idle) - self._starting
            self._starting += max(missing, 0)
        for _ in range(missing):
            threading.Thread(target=self._add, name="warm-runner", daemon=True).start()

    def _sweep_stale(self) -> None:
        """Before the first fill: remove the stderr files of warm runners an earlier process of this
        launcher left (it was killed: its idle runners exited, their files stayed)."""
        with contextlib.suppress(OSError):
            for stale in self.directory.glob("*.stderr"):
                with contextlib.suppress(OSError):
                    stale.unlink()

    def _add(self) -> None:
        runner: WarmRunner | None = None
        try:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            path = self.directory / f"{uuid.uuid4().hex}.stderr"
            runner = WarmRunner(self._start(path), path)
        except OSError:
            runner = None  # a failed start leaves a gap; the next take tries again
        finally:
            with self._lock:
                self._starting -= 1
                keep = runner is not None and not self._closed
                if keep and runner is not None:
                    self._idle.append(runner)
        if runner is not None and not keep:
            runner.discard()

    def close(self) -> None:
        """Stop the idle runners (handed-over ones run on, as their deployments need) and start no more."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for runner in idle:
            runner.discard()
