"""One claimed deployment's ``po-runner standard``: its work directory, its environment, the process, its
output and its exit code.

The work directory is ``RUNNER_WORK_DIR/run-<deployment id>-<random>`` (mode 0700) with ``home``, ``tmp``
and ``code``; it is removed when the run ends, and what an earlier process left (it died mid-run) is
removed when the runner starts: nothing of another deployment stays on disk.

The child's environment is the claim's ``environment`` plus :data:`OWN_NAMES`, and nothing else of the
runner's own: no ``RUNNER_MANAGED_SECRET``, no runner token, no Kubernetes service account variables.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

import structlog

log = structlog.get_logger("po-runner.managed")

#: The names the runner itself sets in a child's environment; the claim's value of any of them is ignored.
OWN_NAMES: Final = (
    "RUNNER_GATEWAY_URL",
    "RUNNER_GATEWAY_CA",
    "PATH",
    "HOME",
    "TMPDIR",
    "IAC_CODE_DIR",
)
#: ``PATH`` when the runner has none.
DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The exit code reported when ``po-runner standard`` could not be started at all (the shell's).
NOT_STARTED_EXIT_CODE: Final = 127
#: Work directories of runs start with this; the runner removes leftovers of them when it starts.
RUN_DIR_PREFIX: Final = "run-"


def standard_argv() -> list[str]:
    """``po-runner standard`` with this runner's own interpreter."""
    return [sys.executable, "-m", "orchestrator.cli.runner", "standard"]


def exit_code_of(returncode: int) -> int:
    """The exit code to report: a process killed by signal N (``-N`` from asyncio) as the shell says it,
    ``128 + N``."""
    return 128 - returncode if returncode < 0 else returncode


def child_environment(
    claim_environment: Mapping[str, str],
    *,
    gateway_url: str,
    gateway_ca: str | None,
    work: Path,
    path: str | None,
) -> dict[str, str]:
    """Exactly what a deployment's ``po-runner standard`` gets: the claim's variables, the gateway's URL
    and CA, ``PATH``, and ``HOME``, ``TMPDIR`` and ``IAC_CODE_DIR`` inside its work directory."""
    env = {name: value for name, value in claim_environment.items() if name not in OWN_NAMES}
    env.update(
        RUNNER_GATEWAY_URL=gateway_url,
        PATH=path or DEFAULT_PATH,
        HOME=str(work / "home"),
        TMPDIR=str(work / "tmp"),
        IAC_CODE_DIR=str(work / "code"),
    )
    if gateway_ca is not None:
        env["RUNNER_GATEWAY_CA"] = gateway_ca
    return env


def prepare_work_root(root: Path, *, other_users: bool = False) -> None:
    """``RUNNER_WORK_DIR``, private (0700; 0711 when runs execute as other uids, who must pass through to
    their own directory, never list it), without the work directories of runs of an earlier process."""
    mode = 0o711 if other_users else 0o700
    root.mkdir(parents=True, exist_ok=True, mode=mode)
    root.chmod(mode)
    for leftover in root.glob(f"{RUN_DIR_PREFIX}*"):
        log.warning("removing the work directory of an earlier run", path=str(leftover))
        remove_tree(leftover)


def make_work_dir(root: Path, deployment_id: str) -> Path:
    """A fresh work directory for one run, with ``home``, ``tmp`` and ``code``."""
    work = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{deployment_id}-", dir=root))
    for name in ("home", "tmp", "code"):
        (work / name).mkdir(mode=0o700)
    return work


def give_work_dir(work: Path, uid: int) -> None:
    """The work directory and its three folders (0700) to the run's uid (and group of the same number)."""
    for path in (work / "home", work / "tmp", work / "code", work):
        os.chown(path, uid, uid, follow_symlinks=False)


def remove_tree(path: Path) -> bool:
    """Remove ``path`` and all it holds; False (logged) when something stayed. Directories the run made
    read-only (a module's files) are opened first: their entries could not be removed otherwise."""
    if path.is_dir() and not path.is_symlink():
        for directory, subdirectories, _files in os.walk(path):
            for name in subdirectories:
                entry = os.path.join(directory, name)
                if not os.path.islink(entry):  # a link is removed, never followed
                    with contextlib.suppress(OSError):
                        os.chmod(entry, 0o700)
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("cannot remove a work directory", path=str(path), error=str(exc))
    return not (path.exists() or path.is_symlink())


@dataclass
class Child:
    """A running ``po-runner standard`` and the tasks copying its output."""

    process: asyncio.subprocess.Process
    copying: list[asyncio.Task[None]]

    async def wait(self) -> int:
        returncode = await self.process.wait()
        await asyncio.gather(*self.copying, return_exceptions=True)
        return exit_code_of(returncode)

    def signal(self, signum: int) -> None:
        """``signum`` to the child's process group (the engine it started too); gone already: nothing."""
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass


async def start(
    argv: Sequence[str],
    env: Mapping[str, str],
    work: Path,
    *,
    deployment_id: str,
    sink: TextIO,
    uid: int | None = None,
) -> Child:
    """Start ``argv`` in its own session (a terminal's Ctrl-C reaches the runner only, which decides),
    as ``uid`` (its group of the same number, no other group, umask 077) when given, and copy its output,
    line by line, to ``sink``: its JSON lines as they are, any other line as a JSON line naming the
    deployment. ``OSError`` if it cannot start."""
    as_user: dict[str, object] = (
        {} if uid is None else {"user": uid, "group": uid, "extra_groups": [], "umask": 0o077}
    )
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=dict(env),
        cwd=work,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        **as_user,  # type: ignore[arg-type]
    )
    assert process.stdout is not None and process.stderr is not None
    copying = [
        asyncio.create_task(_copy(stream, sink, deployment_id, name))
        for stream, name in ((process.stdout, "stdout"), (process.stderr, "stderr"))
    ]
    return Child(process, copying)


async def _copy(stream: asyncio.StreamReader, sink: TextIO, deployment_id: str, name: str) -> None:
    while True:
        try:
            raw = await stream.readline()
        except ValueError:  # a line over the stream's limit: take what there is
            raw = await stream.read(1 << 16)
        if not raw:
            return
        line = raw.decode(errors="replace").rstrip("\n")
        if not line:
            continue
        if not _is_json_object(line):
            # With the deployment's ids the managed runner bound (this task was made in their context).
            context = structlog.contextvars.get_contextvars()
            line = json.dumps(
                {
                    "event": line,
                    "stream": name,
                    **context,
                    "deployment_id": deployment_id,
                    "source": "po-runner",
                }
            )
        sink.write(line + "\n")
        sink.flush()


def _is_json_object(line: str) -> bool:
    if not line.startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
