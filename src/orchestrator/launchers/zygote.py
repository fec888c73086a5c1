"""A fork server ("zygote") for local runs: the runner's Python started and imported once per launcher, one
process forked from it per deployment.

Starting ``po-runner standard`` costs about 0.5 CPU-seconds before it does anything of its deployment
(the interpreter and its imports: pydantic models, httpx, click; bench/README.md "Where a runner's CPU
goes"), most of what a runner spends. Warm runners (``launchers.warm``) moved that off a deployment's path,
not off the CPU. The zygote pays it once: ``po-runner zygote``, started by the local launcher on first use
as the launcher's own user (root when the server is root), imports the runner and what a run imports
lazily, then waits. For each ``process`` run it forks a child, which:

1. calls ``setsid`` (its own session: the run's processes are its session, ``launchers.processes``);
2. takes its stderr (the run's ``stderr.log``, opened by the launcher and passed over the channel),
   ``/dev/null`` as stdin and stdout, and closes every other inherited fd but its order pipe;
3. becomes the run's user (its uid of ``launchers.run_uids`` or the run user: no supplementary groups,
   umask 0077) and non-dumpable;
4. restores the signal handlers and mask a fresh interpreter has, reads its order (``WarmOrder``: the
   run's whole environment and working directory) from its pipe, replaces its environment by it,
   changes into the directory, reseeds ``random`` and OpenSSL's generator;
5. runs ``po-runner standard`` (the callback ``serve`` is given) and exits with its code.

The zygote meanwhile moves the child into the run's cgroup (``launchers.run_cgroups``; the launcher made
it) and answers its pid and start time; it waits for its children (a pidfd each) and reports each exit
code. One deployment per process stays the rule, and the zygote never runs a deployment: each child
starts from the zygote's state as it was after the imports (``gc.freeze``), never from another run's.

Secrets never pass through the zygote: the order is written by the launcher into a pipe whose read end
only the child keeps (the zygote closes its copy right after the fork), and only once the launcher has
recorded the child's pid (``runner.pid``). A launcher that dies before that closes the pipe unwritten: the
child exits without running anything, and the restarted server launches the deployment again, once. The
zygote's own environment is the launcher's ``INHERITED`` variables and ``HOME=/nonexistent``.

The control channel is a ``SOCK_SEQPACKET`` socket pair, the zygote's end its stdin: nothing else can
reach it (no path in the file system; the zygote is not dumpable, so not even a process of its uid can
take its fds). One message per order (``ForkOrder``, two fds beside it: the stderr file and the order
pipe's read end), one per answer (``{"id", "pid", "started", "cgroup_problem"}`` or ``{"id", "error"}``),
one per exit (``{"exited": pid, "code": ...}``); the zygote's first message is ``{"ready": pid}``.

Failures: the launcher's channel closing (the server stopped or was killed) makes the zygote exit; its
children run on, each in its own session, and a restarted server adopts them from ``runner.pid`` like any
local run. The zygote dying (``kill -9``) leaves its children running (reparented, as after a double
fork); the launcher sees the channel close, fails the forks waiting for an answer (the run then starts as a
cold runner: a child forked meanwhile never gets its order and exits without running anything), watches
the runs it forked through ``/proc`` (their exit codes are lost: a run's results say how it went), and
starts a new zygote at the next launch. A zygote that cannot start is tried again after
``RETRY_SECONDS``; meanwhile runs start as before (warm or cold).

Pitfalls: fork only from a single thread (the zygote has no other; ``serve`` checks before each fork).
``/proc/<child>/cmdline`` and ``environ`` are the zygote's (``python -m orchestrator.cli.runner zygote``,
nothing secret): the run's environment is in its ``os.environ`` only. What the interpreter fixed at its
start is the zygote's for every child: the hash seed, the memory layout (ASLR), the locale's encodings
and ``PYTHON*`` variables (a job's ``PYTHONPATH`` reaches the engine, not the runner); ``TZ`` is read
again (``time.tzset``). Linux only (pidfds, ``SCM_RIGHTS``).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NoReturn

import structlog

from orchestrator.errors import ConfigurationError
from orchestrator.launchers import processes
from orchestrator.protocol.launch import WarmOrder

log = structlog.get_logger(__name__)

#: The values of the setting (``PO_LOCAL_ZYGOTE``).
AUTO: Final = "auto"
OFF: Final = "off"
#: The zygote's stderr, in the launcher's runs dir (the launcher's file).
LOG_FILE: Final = ".zygote.log"
#: How long a starting zygote may take to import the runner.
READY_TIMEOUT_SECONDS: Final = 60.0
#: How long a fork may take to be answered before the zygote counts as hung (and is killed).
ANSWER_TIMEOUT_SECONDS: Final = 30.0
#: After a zygote could not be started, how long runs start without one before it is tried again.
RETRY_SECONDS: Final = 60.0
#: How long a closed zygote has to exit before it is killed.
CLOSE_TIMEOUT_SECONDS: Final = 5.0
#: The largest control message (orders and answers are a few hundred bytes).
MAX_MESSAGE: Final = 65536
#: The largest order a child reads from its pipe (the run's environment and directory).
MAX_ORDER_BYTES: Final = 16 * 1024 * 1024
#: Exit code of a child that got no order (its launcher gave the run up) or could not become the run's.
NOT_STARTED: Final = 2
#: The fd a child reads its order from, once its other fds are closed.
ORDER_FD: Final = 3
#: ``prctl`` option that sets whether the process may be dumped and traced (``linux/prctl.h``).
PR_SET_DUMPABLE: Final = 4


def supported() -> bool:
    """Whether this platform can run a zygote (Linux: ``fork``, pidfds, fd passing)."""
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


def enabled(text: str, *, setting: str) -> bool:
    """``auto``: a zygote where this platform can run one; ``off``: none; anything else:
    ConfigurationError naming ``setting``."""
    value = text.strip().lower()
    if value not in (AUTO, OFF):
        raise ConfigurationError(f"{setting}: '{text}' is neither '{AUTO}' nor '{OFF}'")
    return value == AUTO and supported()


class ZygoteUnavailableError(Exception):
    """The zygote cannot fork this run (not started, gone, hung, or the fork failed): start the runner
    another way."""


@dataclass(frozen=True, kw_only=True)
class ForkOrder:
    """What the zygote reads of a fork (nothing secret): the order's number, who the child becomes
    (``uid``/``gid``; None: the zygote's user) and the cgroup it is moved into. The run's stderr file and
    the read end of its order pipe travel beside it (``SCM_RIGHTS``)."""

    id: int
    uid: int | None = None
    gid: int | None = None
    cgroup: str | None = None

    def encode(self) -> bytes:
        return json.dumps({"id": self.id, "uid": self.uid, "gid": self.gid, "cgroup": self.cgroup}).encode()

    @classmethod
    def decode(cls, data: bytes) -> ForkOrder:
        """The order of one message; ValueError naming what is wrong."""
        value = json.loads(data)
        if not isinstance(value, dict) or not isinstance(value.get("id"), int):
            raise ValueError("a fork order is a JSON object with an integer 'id'")
        uid, gid, cgroup = value.get("uid"), value.get("gid"), value.get("cgroup")
        if (uid is None) != (gid is None) or not all(v is None or isinstance(v, int) for v in (uid, gid)):
            raise ValueError("a fork order's 'uid' and 'gid' are both integers or both null")
        if cgroup is not None and not isinstance(cgroup, str):
            raise ValueError("a fork order's 'cgroup' is a path or null")
        return cls(id=value["id"], uid=uid, gid=gid, cgroup=cgroup)


# --- the launcher's side -------------------------------------------------------------------------------


@dataclass(eq=False)
class ForkedRun:
    """A runner the zygote forked: its pid and start time (``processes.start_ticks``), and why it is not
    in its cgroup, if it is not. Waiting for its order until ``go`` or ``abandon``."""

    pid: int
    started: int
    cgroup_problem: str | None = None
    #: The write end of the child's order pipe; -1 once written or abandoned.
    _order: int = -1
    _ended: threading.Event = field(default_factory=threading.Event)
    _code: int | None = None

    def go(self, order: WarmOrder) -> None:
        """Send the child its order (the run's environment and directory) and close the pipe; OSError
        (BrokenPipeError) if the child is gone."""
        fd, self._order = self._order, -1
        try:
            data = memoryview(order.encode())
            while data:
                written = os.write(fd, data)
                data = data[written:]
        finally:
            os.close(fd)

    def abandon(self) -> None:
        """Close the order pipe unwritten: the child exits without running anything."""
        fd, self._order = self._order, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def wait(self) -> int | None:
        """Block until the child exited: its exit code (negative: killed by that signal, as ``Popen``), or
        None when the zygote died first (the child runs on; only ``/proc`` tells when it ends)."""
        self._ended.wait()
        return self._code

    def _end(self, code: int | None) -> None:
        self._code = code
        self._ended.set()


@dataclass(eq=False)
class _Answer:
    """Where the reader thread puts the zygote's answer to one fork."""

    ready: threading.Event = field(default_factory=threading.Event)
    value: dict[str, Any] | None = None


class _Connection:
    """One zygote process and its channel; a zygote that died is replaced by a new connection."""

    def __init__(self, process: subprocess.Popen[bytes], channel: socket.socket, pid: int) -> None:
        self.process = process
        self.channel = channel
        self.pid = pid
        self.alive = True
        self.closing = False
        self.lock = threading.Lock()
        self.answers: dict[int, _Answer] = {}
        #: The runs this zygote forked that have not exited, by pid.
        self.runs: dict[int, ForkedRun] = {}

    def read(self) -> None:
        """The reader thread: answers to their forks, exits to their runs; at the end, the zygote's."""
        try:
            while True:
                data = self.channel.recv(MAX_MESSAGE)
                if not data:
                    break
                self._dispatch(json.loads(data))
        except (OSError, ValueError) as exc:
            if not self.closing:
                log.warning("the zygote's channel failed", error=str(exc))
        finally:
            self._lost()

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "exited" in message:
            with self.lock:
                run = self.runs.pop(int(message["exited"]), None)
            if run is not None:
                run._end(int(message["code"]))
            return
        with self.lock:
            answer = self.answers.pop(int(message["id"]), None)
            if answer is not None and "pid" in message:
                # Registered here, before anyone hears of it: its exit may be the very next message.
                run = ForkedRun(
                    int(message["pid"]), int(message["started"]), message.get("cgroup_problem") or None
                )
                self.runs[run.pid] = run
                message["run"] = run
        if answer is not None:
            answer.value = message
            answer.ready.set()

    def _lost(self) -> None:
        """The channel closed: every fork waiting is answered with nothing, every run forked is left to
        ``/proc`` (its exit code is lost), and the zygote process is collected."""
        with self.lock:
            self.alive = False
            answers, self.answers = self.answers, {}
            runs, self.runs = self.runs, {}
        for answer in answers.values():
            answer.ready.set()
        for run in runs.values():
            run._end(None)
        with contextlib.suppress(OSError):
            self.channel.close()
        try:
            code = self.process.wait(CLOSE_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if not self.closing:
            log.warning(
                "the zygote exited; its runs go on, the next local run starts a new one",
                pid=self.pid,
                exit_code=code,
                runs=len(runs),
            )

    def send(self, order: ForkOrder, fds: list[int]) -> _Answer:
        answer = _Answer()
        with self.lock:
            if not self.alive:
                raise ZygoteUnavailableError("the zygote is gone")
            self.answers[order.id] = answer
        try:
            socket.send_fds(self.channel, [order.encode()], fds)
        except OSError as exc:
            with self.lock:
                self.answers.pop(order.id, None)
            raise ZygoteUnavailableError(f"cannot reach the zygote: {exc.strerror or exc}") from exc
        return answer

    def stop(self, *, kill: bool = False) -> None:
        """Close the channel (the zygote exits; its runs go on), or kill it (hung)."""
        self.closing = not kill
        if kill:
            with contextlib.suppress(OSError):
                self.process.kill()
        with contextlib.suppress(OSError):
            self.channel.shutdown(socket.SHUT_RDWR)


class Zygote:
    """The launcher's zygote: started on first use by ``start`` (which starts ``po-runner zygote`` with
    the socket given as its stdin), replaced when it died, tried again ``RETRY_SECONDS`` after a failed
    start. Thread-safe: launches fork from worker threads."""

    def __init__(self, start: Callable[[socket.socket], subprocess.Popen[bytes]], *, log_file: Path) -> None:
        self._start = start
        #: The zygote's stderr, quoted when it fails to start.
        self.log_file = log_file
        self._lock = threading.Lock()
        self._connection: _Connection | None = None
        self._failed_at: float | None = None
        self._closed = False
        self._ids = 0

    @property
    def pid(self) -> int | None:
        """The live zygote's pid, if there is one."""
        connection = self._connection
        return connection.pid if connection is not None and connection.alive else None

    def ready(self) -> bool:
        """Whether a zygote answers forks, starting one if there is none (blocks while it imports);
        False while one cannot be started."""
        try:
            self._connected()
        except ZygoteUnavailableError:
            return False
        return True

    def fork(self, *, stderr: int, user: tuple[int, int] | None, cgroup: Path | None) -> ForkedRun:
        """Fork a runner as ``user`` (uid, gid; None: the zygote's), moved into ``cgroup``, writing to the
        open file ``stderr``; it waits for its order (``ForkedRun.go``). ZygoteUnavailableError if the zygote
        cannot: nothing of the run started then."""
        connection = self._connected()
        with self._lock:
            self._ids += 1
            order = ForkOrder(
                id=self._ids,
                uid=None if user is None else user[0],
                gid=None if user is None else user[1],
                cgroup=None if cgroup is None else str(cgroup),
            )
        read_end, write_end = os.pipe()
        try:
            try:
                answer = connection.send(order, [stderr, read_end])
            finally:
                os.close(read_end)
            if not answer.ready.wait(ANSWER_TIMEOUT_SECONDS):
                log.warning("the zygote did not answer a fork; killing it", pid=connection.pid)
                connection.stop(kill=True)
                raise ZygoteUnavailableError(
                    f"the zygote did not answer within {ANSWER_TIMEOUT_SECONDS:.0f} s"
                )
            if answer.value is None:
                raise ZygoteUnavailableError("the zygote exited before it answered")
            if "run" not in answer.value:
                raise ZygoteUnavailableError(f"the zygote could not fork: {answer.value.get('error')}")
        except BaseException:
            os.close(write_end)  # a child forked meanwhile gets no order: it exits without running
            raise
        run: ForkedRun = answer.value["run"]
        run._order = write_end
        return run

    def _connected(self) -> _Connection:
        with self._lock:
            if self._closed:
                raise ZygoteUnavailableError("the launcher is closed")
            connection = self._connection
            if connection is not None and connection.alive:
                return connection
            if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_SECONDS:
                raise ZygoteUnavailableError("the zygote failed to start a moment ago")
            try:
                self._connection = self._started()
            except ZygoteUnavailableError as exc:
                self._failed_at = time.monotonic()
                log.warning(
                    "cannot start the zygote; local runs start without it for a while",
                    retry_seconds=RETRY_SECONDS,
                    problem=str(exc),
                )
                raise
            self._failed_at = None
            return self._connection

    def _started(self) -> _Connection:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = self._start(theirs)
        except OSError as exc:
            ours.close()
            raise ZygoteUnavailableError(f"cannot start it: {exc.strerror or exc}") from exc
        finally:
            theirs.close()
        try:
            ours.settimeout(READY_TIMEOUT_SECONDS)
            data = ours.recv(MAX_MESSAGE)
            ours.settimeout(None)
            pid = int(json.loads(data)["ready"]) if data else None
        except (OSError, ValueError, KeyError, TypeError):
            pid = None
        if pid is None:
            process.kill()
            process.wait()
            ours.close()
            raise ZygoteUnavailableError(
                f"it did not start (exit code {process.returncode}): {self._log_tail()}"
            )
        connection = _Connection(process, ours, pid)
        threading.Thread(target=connection.read, name="zygote-reader", daemon=True).start()
        return connection

    def _log_tail(self) -> str:
        try:
            lines = self.log_file.read_bytes()[-2048:].decode(errors="replace").strip().splitlines()
        except OSError:
            return "no output"
        return lines[-1] if lines else "no output"

    def close(self) -> None:
        """Stop the zygote (its runs go on) and start no other."""
        with self._lock:
            self._closed = True
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.stop()


# --- the zygote's side ---------------------------------------------------------------------------------


def serve(channel: socket.socket, run: Callable[[], object]) -> int:
    """The zygote: after its imports (the caller's), answer forks on ``channel`` until the launcher
    closes it; each child runs ``run`` (``po-runner standard``) and exits with its code. 0 once closed."""
    dispositions = _signal_dispositions()
    # The imports' objects are never collected again: a child touching them copies no page for the GC.
    gc.collect()
    gc.freeze()
    selector = selectors.DefaultSelector()
    selector.register(channel, selectors.EVENT_READ, None)
    channel.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        for key, _ in selector.select():
            if key.data is None:
                try:
                    data, fds, _, _ = socket.recv_fds(channel, MAX_MESSAGE, 2)
                except OSError:
                    return 0
                if not data:
                    return 0  # the launcher is gone: its runs go on without us
                answer = _fork(data, fds, selector, run, dispositions)
            else:
                pid: int = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                answer = {"exited": pid, "code": os.waitstatus_to_exitcode(status)}
            try:
                channel.send(json.dumps(answer).encode())
            except OSError:
                return 0


def _fork(
    data: bytes,
    fds: list[int],
    selector: selectors.BaseSelector,
    run: Callable[[], object],
    dispositions: Mapping[signal.Signals, Any],
) -> dict[str, Any]:
    """Fork one child for the order in ``data``; the answer to send back."""
    try:
        order = ForkOrder.decode(data)
    except ValueError as exc:
        for fd in fds:
            os.close(fd)
        return {"id": -1, "error": str(exc)}
    if len(fds) != 2 or threading.active_count() != 1:
        for fd in fds:
            os.close(fd)
        why = "two fds (stderr, order pipe)" if len(fds) != 2 else "a single thread to fork from"
        return {"id": order.id, "error": f"the zygote needs {why}"}
    stderr, order_pipe = fds
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(stderr)
        os.close(order_pipe)
        return {"id": order.id, "error": f"fork: {exc.strerror or exc}"}
    if pid == 0:
        _become(order, stderr, order_pipe, run, dispositions)
    os.close(stderr)
    os.close(order_pipe)
    started = processes.start_ticks(pid) or 0
    problem = None
    if order.cgroup is not None:
        try:
            Path(order.cgroup, "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            problem = exc.strerror or str(exc)
    selector.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
    return {"id": order.id, "pid": pid, "started": started, "cgroup_problem": problem}


def _become(
    order: ForkOrder,
    stderr: int,
    order_pipe: int,
    run: Callable[[], object],
    dispositions: Mapping[signal.Signals, Any],
) -> NoReturn:
    """The child: become the run's process (see the module's text), run it, exit with its code."""
    try:
        os.setsid()
        os.dup2(stderr, 2)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(order_pipe, ORDER_FD)
        # Everything else inherited goes: the channel, the other children's pidfds, these originals.
        _close_fds_from(ORDER_FD + 1)
        if order.uid is not None and order.gid is not None:
            os.setgroups([])
            os.setresgid(order.gid, order.gid, order.gid)
            os.setresuid(order.uid, order.uid, order.uid)
            os.umask(0o077)
        not_dumpable()
        for signum, handler in dispositions.items():
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        data = _read_order()
        if not data:
            os._exit(NOT_STARTED)  # the launcher gave the run up before sending it: nothing ran
        warm = WarmOrder.decode(data)
        os.chdir(warm.cwd)
        os.environ.clear()
        os.environ.update(warm.environ)
        tempfile.tempdir = None  # TMPDIR is the run's now
        time.tzset()
        _reseed()
        sys.argv = [sys.argv[0], "standard"]
    except BaseException as exc:
        with contextlib.suppress(Exception):
            print(f"po-runner: could not become the run's process: {exc!r}", file=sys.stderr)
        _exit(NOT_STARTED)
    try:
        run()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
        code = 1
    _exit(code)


def _close_fds_from(first: int) -> None:
    """Close every open fd numbered ``first`` or above (those ``/proc/self/fd`` lists: a huge fd limit
    costs nothing)."""
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(first, os.sysconf("SC_OPEN_MAX"))
        return
    for fd in open_fds:
        if fd >= first:
            with contextlib.suppress(OSError):
                os.close(fd)  # the listing's own fd is closed already


def _read_order() -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_ORDER_BYTES:
        chunk = os.read(ORDER_FD, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    os.close(ORDER_FD)
    return b"".join(chunks)


def _signal_dispositions() -> dict[signal.Signals, Any]:
    """The handlers this process has now, as a fresh interpreter set them (``serve`` changes none, but a
    child must not depend on that)."""
    found: dict[signal.Signals, Any] = {}
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            handler = signal.getsignal(signum)
            if handler is not None:
                found[signal.Signals(signum)] = handler
    return found


def _reseed() -> None:
    """A child's random state is its own: ``random`` (its at-fork hook reseeds it too) and OpenSSL's
    generator (OpenSSL 3 notices the fork itself); ``secrets``, ``uuid4`` and ``tempfile`` names read
    ``os.urandom`` or reseed per pid."""
    random.seed()
    ssl = sys.modules.get("ssl")
    if ssl is not None:
        ssl.RAND_add(os.urandom(32), 32.0)


def _exit_code(exc: SystemExit) -> int:
    """The exit status ``sys.exit(value)`` gives a process."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _exit(code: int) -> NoReturn:
    """Leave as a runner's interpreter would (its threads joined, ``atexit`` run, output flushed), without
    returning into the zygote's loop."""
    try:
        current = threading.current_thread()
        for thread in threading.enumerate():
            if thread is not current and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    finally:
        os._exit(code)


def not_dumpable() -> None:
    """Make this process non-dumpable (``/proc/<pid>/environ``, ``mem``, ``fd`` root's; no ptrace by its
    own uid); Linux only, elsewhere nothing happens. ``cli.runner.not_dumpable`` for each runner."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass
