"""Runs ``po-runner standard`` as a process on this host: the `vm` runner with ``connection: {type: local}``.

Each run gets ``<runs dir>/<deployment id>/``, the launcher's own (a pid file and the runner's stderr), and
in it ``work/``, the run's working directory: its ``HOME`` (``work/home``), ``TMPDIR`` (``work/tmp``) and
the unpacked code (``work/code``; removed when the run ends: plan files hold output values in clear text).
When the launcher runs as root, a ``process`` run executes as an unprivileged user (``RunUser``, see
``launchers.run_user``) who owns ``work/`` (mode 0700) and can reach nothing else of the launcher's.
The run's environment holds only what it needs: ``PATH``, the locale and time zone, ``SSL_CERT_*``, its
own ``HOME`` and ``TMPDIR``, the runner's variables and the runner configuration's ``job.environment``
and ``job.secrets``; nothing else of the launcher's environment (its keys, tokens, database URL, cloud
credentials).

At most ``run_limit`` runs of this host execute at once (``PO_LOCAL_RUN_LIMIT``, default four per CPU): the
dispatcher counts the host's launched deployments before each launch (``run_slots``) and leaves the others
pending, queued, so a burst runs as a pipeline instead of a hundred engines fighting for the CPUs.

Processes start in their own session, so they outlive a restart of the orchestrator; the handle carries
the host, pid and the process start time, so a recycled pid is never mistaken for the run.

A run ends when its whole session has: when the runner exits (or is killed) and processes of its session
are left (the engine, a provisioner's children), they get SIGTERM (Terraform then saves its state and
releases its lock), then SIGKILL after ``reap_grace_seconds``; until then the run counts as running, so
its deployment is not failed (nor its state lock released) while its engine may still write state. A
code directory (``work/code``) holding state Terraform could not save (``errored.tfstate``, or a local
backend's ``terraform.tfstate``) is never removed (``processes`` finds the members,
``RunStatus.unsaved_state`` reports the file, read without following links: ``work/`` is the run user's).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from orchestrator.launchers import engine, processes, run_cgroups, run_uids, run_user, warm, zygote
from orchestrator.launchers.base import LaunchError, RunState, RunStatus, UnsavedState
from orchestrator.launchers.run_cgroups import RunCgroups
from orchestrator.launchers.run_uids import RunUids
from orchestrator.launchers.run_user import RunUser
from orchestrator.protocol.launch import RunSpec, WarmOrder

log = structlog.get_logger(__name__)

#: Variables of the launcher's own environment a local run gets; nothing else leaks into it.
INHERITED = ("PATH", "LANG", "LC_ALL", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR")
STDERR_TAIL_BYTES = 4096
#: How long the check that the run user can start the runner's Python may take.
PROBE_TIMEOUT_SECONDS = 60.0
#: State files a run's code directory may hold that no backend has: Terraform's ``errored.tfstate`` (it
#: could not write to its backend) and the state of a local backend.
UNSAVED_STATE_FILES = ("errored.tfstate", "terraform.tfstate")
#: Errors preparing a run's directory that retrying cannot mend.
_PERMANENT_DIRECTORY_ERRORS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.EEXIST})
#: The largest unsaved state read back from a run (as the state backend's limit).
MAX_UNSAVED_STATE_BYTES = 64 * 1024 * 1024
#: How long the processes a runner left behind get after SIGTERM, before SIGKILL: Terraform finishes the
#: operations in flight, saves its state and releases its lock in that time.
REAP_GRACE_SECONDS = 60.0


def _start_time(pid: int) -> str | None:
    """Clock ticks since boot when ``pid`` started (field 22 of /proc/pid/stat), or None if it is gone."""
    ticks = processes.start_ticks(pid)
    return None if ticks is None else str(ticks)


def code_dir(run_dir: Path) -> Path:
    """Where a run's code is unpacked (the run's ``IAC_CODE_DIR``)."""
    return run_dir / "work" / "code"


def unsaved_state(run_dir: Path) -> Path | None:
    """The state file a run left in its code directory that no backend holds, if any."""
    for name in UNSAVED_STATE_FILES:
        path = code_dir(run_dir) / name
        if path.is_file():
            return path
    return None


def read_unsaved_state(run_dir: Path, name: str) -> bytes:
    """Read ``work/code/<name>`` of a run without following a symbolic link anywhere below ``run_dir``:
    ``work/`` is the run user's, who could have made ``code`` or the file a link to the server's files."""
    flags = os.O_RDONLY | os.O_NOFOLLOW
    fds: list[int] = []
    try:
        fds.append(os.open(run_dir, flags | os.O_DIRECTORY))
        for part in ("work", "code"):
            fds.append(os.open(part, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
        fds.append(os.open(name, flags, dir_fd=fds[-1]))
        if not stat.S_ISREG(os.fstat(fds[-1]).st_mode):
            raise OSError(errno.EINVAL, f"{name} is not a regular file")
        with os.fdopen(fds.pop(), "rb") as handle:
            return handle.read(MAX_UNSAVED_STATE_BYTES + 1)
    finally:
        for fd in fds:
            os.close(fd)


def remove_code_dir(run_dir: Path, *, whole_run: bool) -> Path | None:
    """Remove the run's working directory (plan files hold outputs in clear text), or the whole run
    directory; but never state Terraform could not save: then nothing is removed and the state file is
    answered."""
    kept = unsaved_state(run_dir)
    if kept is None:
        shutil.rmtree(run_dir if whole_run else run_dir / "work", ignore_errors=True)
    return kept


#: Default local runs at once per CPU: a run waits on the server (bundle, state, logs, results) and on its
#: engine's start-up for much of its time, so one per CPU leaves CPUs to other work (bench/burst.py).
RUNS_PER_CPU = 4


def default_run_limit() -> int:
    """Local runs executing at once by default: four per CPU."""
    return RUNS_PER_CPU * (os.cpu_count() or 1)


class LocalLauncher:
    """Launcher for local runs; one per orchestrator (or agent) process.

    ``run_user``: who ``process`` runs execute as (None: the launcher's own user); ``user_setting`` names
    the setting that chose it, for messages."""

    def __init__(
        self,
        runs_dir: Path,
        *,
        environ: Mapping[str, str],
        run_user: RunUser | None = None,
        user_setting: str = "PO_LOCAL_RUN_USER",
        python: str = sys.executable,
        reap_grace_seconds: float = REAP_GRACE_SECONDS,
        on_exit: Callable[[int], None] | None = None,
        run_limit: int | None = None,
        warm_runners: int = 0,
        run_uids: RunUids | None = None,
        gateway_ca: Callable[[], str | None] | None = None,
        run_cgroups: RunCgroups | None = None,
        fork_server: bool = False,
    ) -> None:
        #: A cgroup of its own for each ``process`` run and warm runner (``launchers.run_cgroups``), where
        #: the host lets this process make one; killed whole when the run ends.
        self.run_cgroups = run_cgroups
        #: The cgroup of each idle warm runner, by its stderr file.
        self._warm_cgroups: dict[Path, Path] = {}
        #: The server's own certificate (PEM), read at each launch: runs trust it unless their job
        #: environment names a CA itself (``RUNNER_GATEWAY_CA``, ``RUNNER_GATEWAY_CA_FILE``).
        self.gateway_ca = gateway_ca
        self.runs_dir = runs_dir
        #: A uid of its own for each run and warm runner (``launchers.run_uids``), when runs execute as
        #: another user; None: every run as ``run_user``.
        self.run_uids = run_uids if run_user is not None else None
        #: Told the exit code of each runner this launcher started, once it exited (the agent's metrics).
        self.on_exit = on_exit
        #: How many runs of this host execute at once (the dispatcher queues the others).
        self.run_limit = run_limit or default_run_limit()
        self.run_user = run_user
        self.hostname = socket.gethostname()
        self._inherited = {k: environ[k] for k in INHERITED if k in environ}
        self._user_setting = user_setting
        self._python = python
        self._reap_grace_seconds = reap_grace_seconds
        self._running: set[str] = set()
        self._exit_codes: dict[str, int] = {}
        self._runnable = False
        self._checking: asyncio.Lock | None = None
        #: Per handle: the run's processes (which of them already had their SIGTERM).
        self._processes: dict[str, processes.RunProcesses] = {}
        #: Adopted runs (launched before a restart) whose leftover processes are being stopped.
        self._reaping: set[str] = set()
        self._lock = threading.Lock()
        #: Runners started ahead, each waiting for one ``process`` run (``launchers.warm``).
        self.warm_pool = warm.WarmPool(self._start_warm, runs_dir / warm.WARM_DIR, warm_runners)
        #: The user each idle warm runner was started as (its own uid), by its stderr file.
        self._warm_users: dict[Path, RunUser] = {}
        #: Adopted runs found gone whose uid was released already.
        self._released: set[str] = set()
        #: The fork server ``process`` runs are forked from (``launchers.zygote``), when ``fork_server``
        #: and the platform can; runs start warm or cold while it cannot answer.
        self.zygote = (
            zygote.Zygote(self._start_zygote, log_file=runs_dir / zygote.LOG_FILE)
            if fork_server and zygote.supported()
            else None
        )

    def close(self) -> None:
        """Stop the zygote and the idle warm runners (the runs go on) and remove their cgroups."""
        if self.zygote is not None:
            self.zygote.close()
        self.warm_pool.close()
        if self.run_cgroups is not None:
            for cgroup in self._warm_cgroups.values():
                self.run_cgroups.kill(cgroup)
            self._warm_cgroups.clear()
            self.run_cgroups.close()

    def run_slots(self) -> tuple[str, int]:
        """This host's runs (their handles start with ``local:<host>:``) and how many execute at once."""
        return f"local:{self.hostname}:", self.run_limit

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

    async def check_runnable(self) -> None:
        """Raise a (not retryable) LaunchError saying what to fix if the run user cannot start the
        runner's Python; checked once (a failed check is repeated at the next launch: the fix needs no
        restart)."""
        if self._runnable or self.run_user is None:
            return
        if self._checking is None:
            self._checking = asyncio.Lock()
        async with self._checking:
            if self._runnable:
                return
            problem = await asyncio.to_thread(self._probe, self.run_user)
            if problem is not None:
                error = LaunchError(
                    run_user.python_unreachable_message(
                        self.run_user, self._python, problem, setting=self._user_setting
                    )
                )
                error.retryable = False
                raise error
            self._runnable = True

    def _probe(self, user: RunUser) -> str | None:
        """Start the runner's Python as ``user``, as a run would, and import the runner; what stopped it."""
        blocked = run_user.unreachable(user, run_user.runner_paths(self._python))
        if blocked is not None:
            path, why = blocked
            return f"'{user.name}' may not pass {path} ({why})"
        try:
            subprocess.run(
                [self._python, "-c", "import orchestrator.cli.runner"],
                env={**self._inherited, "HOME": "/nonexistent"},
                cwd="/",
                stdin=subprocess.DEVNULL,
                capture_output=True,
                check=True,
                timeout=PROBE_TIMEOUT_SECONDS,
                **self._user_arguments(user),
            )
        except OSError as exc:
            return f"it cannot be started as '{user.name}': {exc.strerror or exc}"
        except subprocess.CalledProcessError as exc:
            lines = exc.stderr.decode(errors="replace").strip().splitlines()
            return f"it fails as '{user.name}': {lines[-1] if lines else f'exit code {exc.returncode}'}"
        except subprocess.TimeoutExpired:
            return f"it did not start as '{user.name}' within {PROBE_TIMEOUT_SECONDS:.0f} s"
        return None

    @staticmethod
    def _user_arguments(user: RunUser | None) -> dict[str, Any]:
        """Popen's arguments that make the process ``user``'s: its primary group only, no supplementary
        groups (root's would carry over otherwise), files private to it."""
        if user is None:
            return {}
        return {"user": user.uid, "group": user.gid, "extra_groups": [], "umask": 0o077}

    async def launch(self, spec: RunSpec) -> str:
        job: Mapping[str, Any] = spec.runner_configuration.get("job") or {}
        run_dir = self._run_dir(spec, job)
        pid_file = run_dir / "runner.pid"
        adopted = self._adopt(pid_file)
        if adopted is not None:
            return adopted
        process_runtime = job.get("runtime", "process") == "process"
        # Container runtimes isolate the run themselves (no mounts) and need the launcher's own access to
        # the container engine; the run user applies to runs that are plain processes.
        user = self.run_user if process_runtime else None
        if user is not None:
            await self.check_runnable()
        forking = process_runtime and self.zygote is not None and await asyncio.to_thread(self.zygote.ready)
        # A warm runner only serves runs on the runs dir's file system (its stderr file is renamed).
        warm_runner = (
            await asyncio.to_thread(self._take_warm)
            if process_runtime and not forking and run_dir.parent == self.runs_dir
            else None
        )
        user, work = await self._place(run_dir, user, warm_runner)
        if user is not None:
            self._check_reachable(user, work)
        run_env = {
            **dict(job.get("environment") or {}),
            **dict(job.get("secrets") or {}),
            **spec.runner_environment(),
        }
        if process_runtime:
            run_env["IAC_CODE_DIR"] = str(work / "code")
        _trust_gateway(run_env, self.gateway_ca)
        own = {**self._inherited, "HOME": str(work / "home"), "TMPDIR": str(work / "tmp")}
        argv = self._argv(job, sorted(run_env))
        if not process_runtime:
            await asyncio.to_thread(_check_engine, str(job.get("runtime")), {**own, **run_env})
        process: subprocess.Popen[bytes] | None = None
        if forking:
            forked = await asyncio.to_thread(self._fork, {**own, **run_env}, run_dir, work, user)
            if forked is not None:
                return forked
        if warm_runner is not None:
            process = await asyncio.to_thread(
                self._hand_to_warm, warm_runner, {**own, **run_env}, run_dir, work
            )
        if process is None:
            try:
                process = await asyncio.to_thread(
                    partial(
                        self._spawn, argv, {**own, **run_env}, run_dir, work, user, contain=process_runtime
                    )
                )
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

    async def _place(
        self, run_dir: Path, user: RunUser | None, warm_runner: warm.WarmRunner | None
    ) -> tuple[RunUser | None, Path]:
        """Who the run executes as (the warm runner's uid, a uid of its own, or ``user``) and its prepared
        working directory; the uid recorded in ``run_dir`` and held by it. An earlier attempt's uid (its
        process is gone, or the run would have been adopted) is freed."""
        earlier = self._run_uid(run_dir)
        try:
            if warm_runner is not None:
                user = self._warm_users.pop(warm_runner.stderr, user)
            elif user is not None and self.run_uids is not None:
                user = self._own_user(await asyncio.to_thread(self.run_uids.take, run_dir))
            work = await asyncio.to_thread(self._prepare, run_dir, user)
        except OSError as exc:
            if warm_runner is not None:
                await asyncio.to_thread(warm_runner.discard)
            if user is not None and self.run_uids is not None and user.uid in self.run_uids.uids:
                # Nothing ran as it for this run: the warm runner's is swept, a fresh one just dropped.
                drop = self.run_uids.release if warm_runner is not None else self.run_uids.forget
                await asyncio.to_thread(drop, user.uid)
            error = LaunchError(f"cannot prepare the run's directory {run_dir}: {exc.strerror or exc}")
            # A directory the server may not write (permissions, read-only) stays so, and unsaved state
            # waits for its recovery; anything else (a full disk, a path being set up) may clear up.
            error.retryable = exc.errno not in _PERMANENT_DIRECTORY_ERRORS
            raise error from exc
        if user is not None and self.run_uids is not None:
            self.run_uids.hand_over(user.uid, run_dir)
            run_uids.record_uid(run_dir, user.uid)
            if earlier is not None and earlier != user.uid:
                await asyncio.to_thread(self.run_uids.release, earlier, holder_done=True)
        return user, work

    def _check_reachable(self, user: RunUser, work: Path) -> None:
        """The run user must reach its working directory (``job.work_dir`` may be anywhere)."""
        blocked = run_user.unreachable(user, [(work, run_user.READ | run_user.WRITE | run_user.EXECUTE)])
        if blocked is not None:
            error = LaunchError(
                f"local runs execute as user '{user.name}' ({self._user_setting}), who cannot reach its "
                f"working directory {work}: it may not pass {blocked[0]} ({blocked[1]})"
            )
            error.retryable = False
            raise error

    @staticmethod
    def _prepare(run_dir: Path, user: RunUser | None) -> Path:
        """The run's directories: ``run_dir`` the launcher's (the run user may only pass through), and a
        fresh ``work/`` of the run user's, mode 0700, with ``home``, ``tmp`` and ``code``. A ``work/``
        left by an earlier attempt (its process is gone) is removed first: its owner could have put
        symbolic links in it."""
        mode = run_user.SHARED_RUNS_DIR_MODE if user is not None else run_user.PRIVATE_DIR_MODE
        run_dir.mkdir(parents=True, exist_ok=True, mode=mode)
        info = run_dir.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise OSError(errno.EPERM, "it exists and is not a directory of the launcher's user")
        run_dir.chmod(mode)
        work = run_dir / "work"
        kept = unsaved_state(run_dir)
        if kept is not None:
            # State is never thrown away for a new attempt: it needs recovering first.
            raise OSError(errno.EEXIST, f"it holds state Terraform could not save ({kept})")
        shutil.rmtree(work, ignore_errors=True)
        directories = [work, work / "home", work / "tmp", work / "code"]
        for directory in directories:
            directory.mkdir(mode=run_user.PRIVATE_DIR_MODE)
        if user is not None:
            # Innermost first: until work/ is the run user's, nothing in it can be swapped.
            for directory in reversed(directories):
                os.chown(directory, user.uid, user.gid, follow_symlinks=False)
        return work

    @staticmethod
    def _own_user(uid: int) -> RunUser:
        """The run user of a uid of the range: its group of the same number, no account."""
        return RunUser(name=f"uid {uid}", uid=uid, gid=uid)

    def _fork(self, env: dict[str, str], run_dir: Path, work: Path, user: RunUser | None) -> str | None:
        """The run forked from the zygote, in a cgroup of its own (where there are run cgroups), its
        handle recorded before the child is sent its order (``zygote.ForkedRun.go``): a launcher that dies
        in between leaves a child that never runs. None when the zygote cannot fork (the run then starts
        cold, as the same user)."""
        assert self.zygote is not None
        cgroup = self._new_cgroup(f"{run_dir.name}.{secrets.token_hex(4)}")
        fd = os.open(run_dir / "stderr.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            forked = self.zygote.fork(
                stderr=fd, user=None if user is None else (user.uid, user.gid), cgroup=cgroup
            )
        except zygote.ZygoteUnavailableError as exc:
            log.info("a local run starts without the zygote", run_dir=str(run_dir), problem=str(exc))
            if cgroup is not None and self.run_cgroups is not None:
                self.run_cgroups.kill(cgroup)  # and a child forked into it meanwhile, waiting for nothing
            return None
        finally:
            os.close(fd)
        if cgroup is not None:
            if forked.cgroup_problem is None:
                self._record_cgroup(run_dir, cgroup)
            else:
                self._uncontained(forked.pid, forked.cgroup_problem, cgroup)
        handle = f"local:{self.hostname}:{forked.pid}:{forked.started}:{run_dir}"
        try:
            (run_dir / "runner.pid").write_text(handle)
        except OSError:
            forked.abandon()
            raise
        self._running.add(handle)
        threading.Thread(target=self._reap_forked, args=(handle, forked, run_dir), daemon=True).start()
        with contextlib.suppress(BrokenPipeError):
            # Gone already (killed): its exit is reaped and reported like any runner's.
            forked.go(WarmOrder(environ=env, cwd=str(work)))
        return handle

    def _start_zygote(self, channel: socket.socket) -> subprocess.Popen[bytes]:
        """``po-runner zygote`` as this launcher's user (it becomes each run's user when it forks), with
        nothing of the launcher's environment beyond ``INHERITED``, ``channel`` as its stdin and its stderr
        in the runs dir (the launcher's file)."""
        self.runs_dir.mkdir(mode=run_user.PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        fd = os.open(
            self.runs_dir / zygote.LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600
        )
        with open(fd, "wb") as stderr:
            return subprocess.Popen(
                [self._python, "-m", "orchestrator.cli.runner", "zygote"],
                env={**self._inherited, "HOME": "/nonexistent"},
                stdin=channel.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd="/",
            )

    def _reap_forked(self, handle: str, forked: zygote.ForkedRun, run_dir: Path) -> None:
        """As ``_reap`` for a run forked from the zygote; when the zygote died before the run (its exit
        code is lost), the run is watched through ``/proc`` as an adopted one."""
        code = forked.wait()
        if code is None:
            self._watch_resumed(handle, run_dir)
            return
        self._finish(handle, run_dir, whole_run=code == 0)
        self._exit_codes[handle] = code
        self._running.discard(handle)
        if self.on_exit is not None:
            self.on_exit(code)

    def _take_warm(self) -> warm.WarmRunner | None:
        """A live idle warm runner, or None (the pool is topped up either way)."""
        return self.warm_pool.take()

    def _hand_to_warm(
        self, runner: warm.WarmRunner, env: dict[str, str], run_dir: Path, work: Path
    ) -> subprocess.Popen[bytes] | None:
        """The run handed to ``runner`` (its stderr moved to ``run_dir/stderr.log``), or None when it died
        meanwhile (the run then starts cold, as the same user: the runner's uid now holds the run)."""
        cgroup = self._warm_cgroups.pop(runner.stderr, None)
        if cgroup is not None:
            self._record_cgroup(run_dir, cgroup)
        try:
            runner.hand_over(WarmOrder(environ=env, cwd=str(work)), run_dir / "stderr.log")
        except OSError:
            runner.discard()
            if cgroup is not None and self.run_cgroups is not None:
                self.run_cgroups.kill(cgroup)
            return None
        return runner.process

    def _start_warm(self, stderr_path: Path) -> subprocess.Popen[bytes]:
        """A warm runner (``po-runner warm``) as a run user of its own (a uid of the range, or the run
        user), started as a cold one is, its stderr to ``stderr_path`` (the launcher's) and its stdin a pipe
        the order comes through."""
        user = self.run_user
        if user is not None and self.run_uids is not None:
            user = self._own_user(self.run_uids.take(stderr_path))
        try:
            process = self._start(
                [self._python, "-m", "orchestrator.cli.runner", "warm"],
                # Its HOME until the order sets the run's (a user site-packages folder is looked up there).
                {**self._inherited, "HOME": "/nonexistent"},
                stderr_path,
                os.O_EXCL,
                stdin=subprocess.PIPE,
                cwd=Path("/"),
                user=user,
            )
        except OSError:
            if user is not None and self.run_uids is not None:
                self.run_uids.release(user.uid)
            raise
        if user is not None:
            self._warm_users[stderr_path] = user
        cgroup = self._contain(process, f"warm-{stderr_path.stem}")
        if cgroup is not None:
            self._warm_cgroups[stderr_path] = cgroup
        return process

    def _spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        run_dir: Path,
        work: Path,
        user: RunUser | None,
        *,
        contain: bool = False,
    ) -> subprocess.Popen[bytes]:
        """A cold runner; ``contain``: in a cgroup of its own (a ``process`` run: a container's processes
        are its engine's)."""
        # The launcher's files stay in run_dir, which the run user cannot change: the stderr it reads
        # back for the deployment's message cannot be swapped for a link to something else.
        process = self._start(
            argv, env, run_dir / "stderr.log", os.O_TRUNC, stdin=subprocess.DEVNULL, cwd=work, user=user
        )
        if contain:
            cgroup = self._contain(process, f"{run_dir.name}.{secrets.token_hex(4)}")
            if cgroup is not None:
                self._record_cgroup(run_dir, cgroup)
        return process

    def _record_cgroup(self, run_dir: Path, cgroup: Path) -> None:
        """Record the run's cgroup in its directory; what an earlier attempt's cgroup still holds (a
        process that left its session; the attempt is over, or it would have been adopted) is killed first."""
        if self.run_cgroups is None:
            return
        earlier = self.run_cgroups.recorded(run_dir)
        if earlier is not None and earlier != cgroup:
            self.run_cgroups.kill(earlier)
        self.run_cgroups.record(run_dir, cgroup)

    def _contain(self, process: subprocess.Popen[bytes], name: str) -> Path | None:
        """Move a runner just started into a new cgroup of its own (``launchers.run_cgroups``), before it
        does anything of its run's; None where there are no run cgroups or the move failed (the run's uid
        sweep is left)."""
        cgroup = self._new_cgroup(name)
        if cgroup is None or self.run_cgroups is None:
            return None
        try:
            self.run_cgroups.enter(cgroup, process.pid)
        except OSError as exc:
            self._uncontained(process.pid, exc.strerror or str(exc), cgroup)
            return None
        return cgroup

    def _new_cgroup(self, name: str) -> Path | None:
        """A new cgroup for a runner, or None (no run cgroups here, or it cannot be made: warned)."""
        if self.run_cgroups is None:
            return None
        try:
            return self.run_cgroups.create(name)
        except OSError as exc:
            self._uncontained(None, exc.strerror or str(exc), None)
            return None

    @staticmethod
    def _uncontained(pid: int | None, problem: str, cgroup: Path | None) -> None:
        log.warning(
            "cannot put a runner into a cgroup of its own; its run is stopped by session and uid only",
            pid=pid,
            error=problem,
        )
        if cgroup is not None:
            with contextlib.suppress(OSError):
                cgroup.rmdir()

    def _start(
        self,
        argv: list[str],
        env: dict[str, str],
        stderr_path: Path,
        create: int,
        *,
        stdin: int,
        cwd: Path,
        user: RunUser | None,
    ) -> subprocess.Popen[bytes]:
        """A runner process in its own session, as ``user``, stdout to /dev/null, stderr to ``stderr_path``
        (opened without following a link; ``create``: ``O_TRUNC`` or ``O_EXCL``)."""
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | create | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as stderr:
            return subprocess.Popen(
                argv,
                env=env,
                stdin=stdin,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=cwd,
                start_new_session=True,
                **self._user_arguments(user),
            )

    def _reap(self, handle: str, process: subprocess.Popen[bytes], run_dir: Path) -> None:
        """Once the runner exited: stop what it left running, record the exit code, and remove the run's
        code (plan files hold outputs in clear text) unless it holds unsaved state; the stderr of a failed
        run stays for the dispatcher's message."""
        code = process.wait()
        self._finish(handle, run_dir, whole_run=code == 0)
        self._exit_codes[handle] = code
        self._running.discard(handle)
        if self.on_exit is not None:
            self.on_exit(code)

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

    def _finish(self, handle: str, run_dir: Path, *, whole_run: bool) -> None:
        """The runner is gone: stop what is left of its session (SIGTERM first: Terraform saves its state
        and releases its lock), then every other process of the run's uid, whatever session it made;
        remove the run's code (unsaved state kept) and free its uid (held while unsaved state keeps
        ``work/``)."""
        self._stop_leftovers(handle)
        if self.run_cgroups is not None:
            # Whatever left the session (setsid, a double fork), whatever its uid: killed with its cgroup.
            cgroup = self.run_cgroups.recorded(run_dir)
            if cgroup is not None and self.run_cgroups.kill(cgroup):
                with contextlib.suppress(OSError):
                    (run_dir / run_cgroups.CGROUP_FILE).unlink()
        uid = self._run_uid(run_dir)
        if uid is not None and self.run_uids is not None:
            run_uids.sweep(uid, self.run_uids.uids)
        remove_code_dir(run_dir, whole_run=whole_run)
        if uid is not None and self.run_uids is not None:
            self.run_uids.release(uid)

    def _run_uid(self, run_dir: Path) -> int | None:
        """The uid of the range a run executes as (``runner.uid`` in its directory), if any."""
        if self.run_uids is None:
            return None
        uid = run_uids.read_uid(run_dir)
        return uid if uid is not None and uid in self.run_uids.uids else None

    def _reap_adopted(self, handle: str) -> None:
        try:
            _, _, _, run_dir = self._parse(handle)
            self._finish(handle, run_dir, whole_run=False)
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
            self._finish(handle, run_dir, whole_run=False)
            with self._lock:
                # Finished here: a status check must not release its uid again (another run may hold it).
                self._released.add(handle)
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
        with self._lock:
            first = handle not in self._released
            self._released.add(handle)
        if first:
            # Launched before a restart, nothing of it left: its code and uid go as a reaped run's do.
            await asyncio.to_thread(self._finish, handle, run_dir, whole_run=False)
        return RunStatus(
            state=RunState.EXITED,
            detail=_last_line(run_dir) or "the runner process is gone",
            unsaved_state=_unsaved(run_dir),
        )

    def forget_unsaved_state(self, handle: str) -> None:
        """The run's unsaved state is saved elsewhere now (the orchestrator recovered it): remove the
        run's code directory like that of any failed run."""
        _, _, _, run_dir = self._parse(handle)
        kept = unsaved_state(run_dir)
        if kept is not None:
            kept.unlink(missing_ok=True)
        remove_code_dir(run_dir, whole_run=False)
        uid = self._run_uid(run_dir)
        if uid is not None and self.run_uids is not None:
            self.run_uids.release(uid)

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


def _check_engine(runtime: str, environ: Mapping[str, str]) -> None:
    """A LaunchError (not retryable) naming the engine's address when no container engine answers."""
    found = engine.problem(runtime, environ)
    if found is not None:
        error = LaunchError(f"cannot start the {runtime} run: {found}")
        error.retryable = False
        raise error


def _trust_gateway(run_env: dict[str, str], gateway_ca: Callable[[], str | None] | None) -> None:
    """Give the run the server's own certificate as ``RUNNER_GATEWAY_CA`` unless its job environment
    names a CA itself (what it is told wins)."""
    if gateway_ca is None or {"RUNNER_GATEWAY_CA", "RUNNER_GATEWAY_CA_FILE"} & run_env.keys():
        return
    pem = gateway_ca()
    if pem:
        run_env["RUNNER_GATEWAY_CA"] = pem


def _unsaved(run_dir: Path) -> UnsavedState | None:
    path = unsaved_state(run_dir)
    if path is None:
        return None
    try:
        data = read_unsaved_state(run_dir, path.name)
    except OSError:
        return None
    if len(data) > MAX_UNSAVED_STATE_BYTES:
        return None
    return UnsavedState(path=str(path), data=data)


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
