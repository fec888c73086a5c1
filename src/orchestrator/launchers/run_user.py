"""Who local runs execute as, where they live, and whether that user can run the runner at all.

A local run executes tenants' Terraform code (providers, ``local-exec`` provisioners, ``file()``) on the
launcher's own host. When the launcher runs as root, runs execute as an unprivileged user instead
(``RunUser``, the setting ``PO_LOCAL_RUN_USER`` / ``AGENT_RUN_USER``, default ``nobody``): its primary group
only, no supplementary groups, no capabilities (the kernel clears them when all uids leave 0), umask 077.
The data dir (0700) and everything in it are then out of its reach, as are the launcher's other files
that are not world-readable.

The runs dir is the launcher's own (0711: the run user may pass through it to its run, not list it);
each run's working directory inside belongs to the run user (0700).

The run user must be able to execute the runner's Python and read its libraries: an interpreter under
``/root`` (mode 0700, as pyenv installs it) is out of its reach. ``unreachable`` finds the first path on
the way that the user may not pass, for a message that says what to fix.
"""

from __future__ import annotations

import os
import pwd
import stat
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigurationError

#: Mode of the runs dir when runs execute as another user: it may pass through, not list or create.
SHARED_RUNS_DIR_MODE = 0o711
PRIVATE_DIR_MODE = 0o700
#: Access bits as in a mode's owner, group or other digit.
READ, WRITE, EXECUTE = 4, 2, 1


@dataclass(frozen=True, kw_only=True)
class RunUser:
    """The unprivileged account local runs execute as."""

    name: str
    uid: int
    gid: int

    @classmethod
    def resolve(cls, name: str, *, setting: str) -> RunUser | None:
        """The account named ``name`` if the launcher must switch to it: only when it runs as root, and
        ``name`` is neither empty nor root (then runs execute as root, without isolation)."""
        if not name or os.geteuid() != 0:
            return None
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ConfigurationError(
                f"{setting}: there is no user '{name}' on this host; local runs execute as that user when "
                f"this process runs as root (create it, name another unprivileged user, or set {setting}"
                "=root to run them as root, without isolation)"
            ) from None
        if entry.pw_uid == 0:
            return None
        return cls(name=name, uid=entry.pw_uid, gid=entry.pw_gid)

    def may(self, path: Path, bits: int) -> bool:
        """Whether the mode bits of ``path`` give this user ``bits`` (4 read, 2 write, 1 execute/search).
        Root's group memberships do not carry over: the run has its primary group only."""
        info = path.stat()
        if info.st_uid == self.uid:
            granted = info.st_mode >> 6
        elif info.st_gid == self.gid:
            granted = info.st_mode >> 3
        else:
            granted = info.st_mode
        return granted & bits == bits


def runner_paths(python: str) -> list[tuple[Path, int]]:
    """What a run of ``python -m orchestrator.cli.runner`` needs, with the access it needs: the
    interpreter (as named and its real file), the standard library, the installed packages and this
    package (as this process sees them: the runner runs the same installation)."""
    paths = sysconfig.get_paths()
    return [
        (Path(python), EXECUTE),
        (Path(python).resolve(), EXECUTE),
        (Path(paths["stdlib"]), READ | EXECUTE),
        (Path(paths["purelib"]), READ | EXECUTE),
        (Path(__file__).resolve().parent.parent, READ | EXECUTE),
    ]


def unreachable(user: RunUser, paths: list[tuple[Path, int]]) -> tuple[Path, str] | None:
    """The first path (or directory on its way) that ``user`` may not use as needed, with its mode."""
    for path, bits in paths:
        absolute = Path(os.path.abspath(path))
        for directory in reversed(absolute.parents):
            blocked = _blocked(user, directory, EXECUTE)
            if blocked is not None:
                return blocked
        blocked = _blocked(user, absolute, bits)
        if blocked is not None:
            return blocked
    return None


def _blocked(user: RunUser, path: Path, bits: int) -> tuple[Path, str] | None:
    try:
        if user.may(path, bits):
            return None
        return path, f"mode {stat.filemode(path.stat().st_mode)}, owner uid {path.stat().st_uid}"
    except OSError as exc:
        return path, exc.strerror or str(exc)


def prepare_runs_dir(runs_dir: Path, user: RunUser | None, *, setting: str) -> None:
    """Create the runs dir (0711 when runs execute as another user, 0700 otherwise), or check that the
    existing one is ours and no one else may write into it: it may be in the shared temp dir, where
    another user could have made it first."""
    mode = SHARED_RUNS_DIR_MODE if user is not None else PRIVATE_DIR_MODE
    try:
        runs_dir.parent.mkdir(parents=True, exist_ok=True)
        runs_dir.mkdir(mode=mode, exist_ok=True)
        info = runs_dir.lstat()
    except OSError as exc:
        raise ConfigurationError(f"{setting}: cannot create the runs dir {runs_dir}: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise ConfigurationError(
            f"{setting}: {runs_dir} exists but is not a directory of this process's user (uid "
            f"{os.geteuid()}); remove it or choose another runs dir"
        )
    if stat.S_IMODE(info.st_mode) != mode:
        runs_dir.chmod(mode)


def python_unreachable_message(user: RunUser, python: str, problem: str, *, setting: str) -> str:
    """What a failed check of the run user says: who, what is out of reach, and the three fixes."""
    return (
        f"local runs execute as user '{user.name}' ({setting}), who cannot run the runner's Python "
        f"{python}: {problem}. Fix one of: install the orchestrator and its Python where '{user.name}' can "
        f"read them; grant traverse-only access to the directories on the way (chmod o+x DIR; "
        f"scripts/grant-run-user-access does that for a checkout); or set {setting} to another "
        f"unprivileged user ({setting}=root runs them as root, without isolation)"
    )
