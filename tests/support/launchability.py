"""What the server makes of each runner example (``tests/data/runners``): the launcher kind, the reason
``launchers.availability`` gives GET runner, and what ``server.launcher_for`` answers: in this process, or
in a fresh one that cannot import some libraries, as if an extra of the package were not installed.

A module is made unimportable the import system's documented way: ``None`` in ``sys.modules`` makes every
import of it (and of its submodules) raise ``ModuleNotFoundError`` naming it, as a missing one does. No
library or orchestrator code is touched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy.ext.asyncio import create_async_engine

from orchestrator.domain.runner_types import parse_runner_configuration, runner_configuration_to_dict
from orchestrator.identity.issuer import WorkloadIssuer
from orchestrator.launchers import availability
from orchestrator.launchers.base import LaunchTarget
from orchestrator.launchers.local import LocalLauncher
from orchestrator.secretbox import SecretBox
from orchestrator.server import launcher_for
from orchestrator.settings import ServerSettings

RUNNERS = Path(__file__).resolve().parents[1] / "data" / "runners"
EXAMPLES = sorted(path.name for path in RUNNERS.glob("*.yaml"))
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One runner example on one server."""

    #: ``launchers.availability.launcher_kind``: None for a runner an agent launches.
    kind: str | None
    #: ``unlaunchable_reason``: what GET runner answers as ``status.message``.
    reason: str | None
    #: The class of the launcher ``launcher_for`` answered; None when it answered None or raised.
    launcher: str | None
    #: The message of the LauncherUnavailableError ``launcher_for`` raised.
    error: str | None


def example_configuration(example: str) -> tuple[str, dict[str, Any]]:
    """The runner type and configuration of an example, as the API stores it."""
    raw = yaml.safe_load((RUNNERS / example).read_text())["runner_configuration"]
    parsed = parse_runner_configuration(raw)
    return parsed.type, runner_configuration_to_dict(parsed)


def outcomes(tmp_path: Path, *, allow_local_runners: bool) -> dict[str, Outcome]:
    """Every example's outcome in this process, on a server with or without local runners."""
    settings = ServerSettings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'po.db'}",
        allow_local_runners=allow_local_runners,
        local_run_user="",
        local_runs_dir=tmp_path / "runs",
    )
    # Never connected: the issuer mints no token while launchers are only made.
    issuer = WorkloadIssuer(create_async_engine("sqlite+aiosqlite://"), SecretBox(bytes(32)), settings)
    local = LocalLauncher(tmp_path / "runs", environ={})
    found: dict[str, Outcome] = {}
    for example in EXAMPLES:
        runner_type, configuration = example_configuration(example)
        target = LaunchTarget(
            org_id="acme", runner_id="r1", runner_type=runner_type, configuration=configuration
        )
        launcher: str | None = None
        error: str | None = None
        try:
            made = launcher_for(settings, local, issuer, target)
            launcher = None if made is None else type(made).__name__
        except availability.LauncherUnavailableError as exc:
            error = exc.message
        found[example] = Outcome(
            kind=availability.launcher_kind(runner_type, configuration),
            reason=availability.unlaunchable_reason(
                runner_type, configuration, allow_local_runners=allow_local_runners
            ),
            launcher=launcher,
            error=error,
        )
    return found


#: The child process: blocks the modules named in argv[2:] before importing anything of ours, then prints
#: the outcomes as JSON (argv[1]: a directory of its own).
_CHILD = """
import json, sys
from dataclasses import asdict
from pathlib import Path
for name in sys.argv[2:]:
    sys.modules[name] = None
from tests.support.launchability import outcomes
found = outcomes(Path(sys.argv[1]), allow_local_runners=True)
print(json.dumps({example: asdict(outcome) for example, outcome in found.items()}))
"""


def outcomes_without(unimportable: Sequence[str], tmp_path: Path) -> dict[str, Outcome]:
    """Every example's outcome in a fresh process that cannot import the modules ``unimportable``."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path), *unimportable],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert 0 == done.returncode, done.stderr[-3000:]
    answered: dict[str, dict[str, Any]] = json.loads(done.stdout.splitlines()[-1])
    return {example: Outcome(**outcome) for example, outcome in answered.items()}
