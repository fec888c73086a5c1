"""Which runners this orchestrator can launch itself, and why not: the one table that both the server's
``launcher_for`` and ``GET /orgs/{org}/runners/{id}`` (``status.launchable``, ``status.message``) read, so
that a runner GET calls launchable is one the dispatcher launches, and one it calls unlaunchable fails its
deployments with the same message.

A runner's *kind* is its type, or ``vm:<connection type>`` for a ``vm`` runner; runners an agent launches
(``kubernetes-agent``, ``vm`` with an ``agent`` connection) have none: the orchestrator only queues their
commands. A kind is launchable when it has a row in :data:`LAUNCHERS`, the libraries of its row import,
then its launcher modules, and (``vm:local``) the server allows local runners (``PO_ALLOW_LOCAL_RUNNERS``).
Otherwise the reason names the extra of the ``platform-orchestrator`` package to install and its
libraries, the setting, or the module that does not import.

Nothing is imported when this module is: the libraries and launcher modules are imported when a kind is
first asked about. A server without an extra still starts, and the runner image (which holds this package
but no server code) imports no cloud library it does not use. A successful import is kept by Python
(``sys.modules``); a failed one is tried again at the next question (a path scan).

Adding a launcher: its row here (kind, modules, libraries), and its branch in ``server.launcher_for``;
``tests/unit/test_launcher_availability.py`` checks that every direct kind has a row and that
``launcher_for`` builds a launcher exactly for the kinds this table calls launchable.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.domain.runner_types import launched_by
from orchestrator.launchers.base import LaunchError

__all__ = [
    "DISTRIBUTION",
    "LAUNCHERS",
    "LOCAL_KIND",
    "LauncherUnavailableError",
    "Library",
    "Row",
    "launcher_kind",
    "require",
    "unlaunchable_reason",
]

#: The distribution whose extras bring the launchers' libraries.
DISTRIBUTION: Final = "platform-orchestrator"


@dataclass(frozen=True, kw_only=True)
class Library:
    """A library a launcher needs: the module it is imported as, the distribution that installs it and
    the extra of :data:`DISTRIBUTION` that brings it (``pyproject.toml``'s optional dependencies)."""

    module: str
    distribution: str
    extra: str


LIGHTKUBE: Final = Library(module="lightkube", distribution="lightkube", extra="kubernetes")
GOOGLE_AUTH: Final = Library(module="google.auth", distribution="google-auth", extra="cloud")
AZURE_IDENTITY: Final = Library(module="azure.identity", distribution="azure-identity", extra="cloud")
REQUESTS: Final = Library(module="requests", distribution="requests", extra="cloud")
#: botocore comes with the ``server`` extra's boto3.
BOTOCORE: Final = Library(module="botocore", distribution="botocore", extra="server")
ASYNCSSH: Final = Library(module="asyncssh", distribution="asyncssh", extra="server")


@dataclass(frozen=True, kw_only=True)
class Row:
    """How the runners of one kind are launched here: the modules holding the launcher (imported after
    its libraries), the libraries they need, and whether local runners must be allowed."""

    modules: tuple[str, ...]
    libraries: tuple[Library, ...] = ()
    #: Needs ``PO_ALLOW_LOCAL_RUNNERS``: the run executes on the orchestrator's own host.
    local: bool = False


#: The kind of a ``vm`` runner with a local connection.
LOCAL_KIND: Final = "vm:local"

#: Runner kind -> how it is launched: every kind the orchestrator launches itself.
LAUNCHERS: Final[Mapping[str, Row]] = {
    LOCAL_KIND: Row(modules=("orchestrator.launchers.local",), local=True),
    "vm:ssh": Row(modules=("orchestrator.launchers.ssh",), libraries=(ASYNCSSH,)),
    "kubernetes": Row(modules=("orchestrator.launchers.kubernetes",), libraries=(LIGHTKUBE,)),
    "kubernetes-gke": Row(
        modules=("orchestrator.launchers.kubernetes_cloud", "orchestrator.launchers.gke"),
        libraries=(LIGHTKUBE, GOOGLE_AUTH, REQUESTS),
    ),
    "kubernetes-aks": Row(
        modules=("orchestrator.launchers.kubernetes_cloud", "orchestrator.launchers.aks"),
        libraries=(LIGHTKUBE, AZURE_IDENTITY, REQUESTS),
    ),
    "kubernetes-eks": Row(modules=("orchestrator.launchers.eks",), libraries=(LIGHTKUBE, BOTOCORE)),
    "serverless-ecs": Row(modules=("orchestrator.launchers.ecs",), libraries=(BOTOCORE,)),
}


class LauncherUnavailableError(LaunchError):
    """This orchestrator cannot launch the runner's runs."""

    retryable = False


def launcher_kind(runner_type: str, configuration: Mapping[str, Any]) -> str | None:
    """The key of a runner in :data:`LAUNCHERS`: its type, or ``vm:<connection type>``; None for a
    runner an agent launches."""
    if launched_by(runner_type, configuration) == "agent":
        return None
    if runner_type == "vm":
        connection = configuration.get("connection")
        connection_type = connection.get("type") if isinstance(connection, Mapping) else None
        return f"vm:{connection_type}"
    return runner_type


def _runners(kind: str) -> str:
    """The runners of a kind, as the messages name them."""
    if kind.startswith("vm:"):
        connection = kind.removeprefix("vm:")
        article = "an" if connection[:1] in tuple("aeio") or connection == "ssh" else "a"
        return f"vm runners with {article} {connection} connection"
    return f"{kind} runners"


def _words(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _missing(library: Library, exc: ImportError) -> bool:
    """Whether ``exc`` says the library itself is not installed (rather than that it does not import)."""
    name = exc.name or ""
    return isinstance(exc, ModuleNotFoundError) and (
        name == library.module or library.module.startswith(f"{name}.")
    )


def _libraries_reason(libraries: tuple[Library, ...]) -> str | None:
    """Why the libraries do not all import, and which extras to install; None when they do."""
    missing: list[Library] = []
    broken: list[tuple[Library, ImportError]] = []
    for library in libraries:
        try:
            importlib.import_module(library.module)
        except ImportError as exc:
            if _missing(library, exc):
                missing.append(library)
            else:
                broken.append((library, exc))
    if not missing and not broken:
        return None
    problems = []
    if missing:
        names = [library.distribution for library in missing]
        problems.append(f"{_words(names)} {'is' if len(names) == 1 else 'are'} not installed")
    problems += [f"{library.distribution} does not import ({exc})" for library, exc in broken]
    extras = list(dict.fromkeys(library.extra for library in (*missing, *(b[0] for b in broken))))
    quoted = _words([f"'{extra}'" for extra in extras])
    return (
        f"{'; '.join(problems)}: install the {quoted} extra{'s' if len(extras) > 1 else ''} "
        f"(pip install '{DISTRIBUTION}[{','.join(extras)}]') and restart the orchestrator"
    )


def _reason(kind: str, *, allow_local_runners: bool) -> str | None:
    row = LAUNCHERS.get(kind)
    if row is None:
        return "it has no launcher for them"
    if row.local and not allow_local_runners:
        return "local runners are off on this server (start it with PO_ALLOW_LOCAL_RUNNERS=true)"
    libraries = _libraries_reason(row.libraries)
    if libraries is not None:
        return libraries
    for module in row.modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"its launcher ({module}) does not import ({exc})"
    return None


def require(kind: str, *, allow_local_runners: bool) -> None:
    """Nothing when this orchestrator can launch runners of ``kind`` (its modules are imported then);
    LauncherUnavailableError saying why not, with the message :func:`unlaunchable_reason` answers.
    ``allow_local_runners``: the server's ``PO_ALLOW_LOCAL_RUNNERS``."""
    reason = _reason(kind, allow_local_runners=allow_local_runners)
    if reason is not None:
        raise LauncherUnavailableError(f"this orchestrator cannot launch {_runners(kind)}: {reason}")


def engine_reason(
    runner_type: str, configuration: Mapping[str, Any], environ: Mapping[str, str]
) -> str | None:
    """For a ``vm`` runner with a local connection and ``runtime: docker`` / ``podman``: why its container
    engine does not answer on this host (``launchers.engine``, with the server's PATH and the job's
    environment), else None. Blocks up to ``engine.CHECK_TIMEOUT_SECONDS``: call it in a thread."""
    if launcher_kind(runner_type, configuration) != LOCAL_KIND:
        return None
    job = configuration.get("job") or {}
    runtime = job.get("runtime", "process") if isinstance(job, Mapping) else "process"
    if runtime not in ("docker", "podman"):
        return None
    from orchestrator.launchers import engine

    job_env = job.get("environment") or {}
    variables = {k: str(v) for k, v in job_env.items()} if isinstance(job_env, Mapping) else {}
    own = {k: environ[k] for k in engine.CLIENT_VARIABLES if k in environ}
    found = engine.problem(runtime, {**own, **variables})
    return None if found is None else f"this orchestrator cannot launch its runs: {found}"


def unlaunchable_reason(
    runner_type: str, configuration: Mapping[str, Any], *, allow_local_runners: bool
) -> str | None:
    """Why this orchestrator cannot launch the runs of this runner; None when it can, or when an agent
    launches them. ``allow_local_runners``: the server's ``PO_ALLOW_LOCAL_RUNNERS``."""
    kind = launcher_kind(runner_type, configuration)
    if kind is None:
        return None
    try:
        require(kind, allow_local_runners=allow_local_runners)
    except LauncherUnavailableError as exc:
        return exc.message
    return None
