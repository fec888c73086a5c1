"""Whether the container engine of a ``runtime: docker`` / ``podman`` run answers (issue 26): without a
daemon ``docker run`` fails with "Run 'docker run --help' for more information", which names nothing. The
local launcher asks the engine before each container launch, and a runner's GET asks it for
``status.launchable``: ``docker version --format {{.Server.Version}}`` (it needs the daemon) or ``podman
info`` (podman needs no daemon unless it is remote), with the run's environment (PATH, DOCKER_HOST,
CONTAINER_HOST), for at most :data:`CHECK_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from typing import Final

#: What of the server's own environment the engine's client gets for a runner's GET (nothing secret).
CLIENT_VARIABLES: Final = (
    "PATH",
    "HOME",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "CONTAINER_HOST",
)
#: How long the engine may take to answer.
CHECK_TIMEOUT_SECONDS: Final = 10.0
#: The command that needs the engine itself (not only its client) to answer, per runtime.
_CHECKS: Final = {
    "docker": ["docker", "version", "--format", "{{.Server.Version}}"],
    "podman": ["podman", "info", "--format", "{{.Host.Arch}}"],
}


def address(runtime: str, environ: Mapping[str, str]) -> str:
    """Where the engine's client looks for it: DOCKER_HOST / CONTAINER_HOST, else its default."""
    if runtime == "docker":
        return environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    return environ.get("CONTAINER_HOST") or "podman's default (local storage or its socket)"


def problem(runtime: str, environ: Mapping[str, str], *, where: str = "this host") -> str | None:
    """None when the engine of ``runtime`` answers; else what is wrong, naming the address asked."""
    argv = _CHECKS.get(runtime)
    if argv is None:
        return None
    at = address(runtime, environ)
    try:
        subprocess.run(
            argv,
            env=dict(environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=True,
            timeout=CHECK_TIMEOUT_SECONDS,
        )
    except FileNotFoundError:
        return f"the container engine {runtime} is not on the PATH of {where} ({environ.get('PATH', '')})"
    except OSError as exc:
        return f"the container engine {runtime} cannot be started on {where}: {exc.strerror or exc}"
    except subprocess.CalledProcessError as exc:
        lines = [line for line in exc.stderr.decode(errors="replace").splitlines() if line.strip()]
        said = f": {lines[-1].strip()[:300]}" if lines else f" (exit code {exc.returncode})"
        return f"no container engine answers at {at} on {where}{said}"
    except subprocess.TimeoutExpired:
        return f"no container engine answers at {at} on {where} within {CHECK_TIMEOUT_SECONDS:.0f} s"
    return None
