"""The unprivileged run user of local runs, for tests that need runs to switch to it."""

from __future__ import annotations

import os
import sys

import pytest

from orchestrator.launchers import run_user
from orchestrator.launchers.run_user import RunUser
from tests.support.tools import tools_required


def nobody() -> RunUser:
    """The default run user; skips where runs do not switch users (not root), and where ``nobody`` cannot
    start this Python: fails there in CI, which runs scripts/grant-run-user-access first."""
    if os.geteuid() != 0:
        pytest.skip("local runs switch to the run user only when the launcher runs as root")
    user = RunUser.resolve("nobody", setting="PO_LOCAL_RUN_USER")
    assert user is not None
    blocked = run_user.unreachable(user, run_user.runner_paths(sys.executable))
    if blocked is not None:
        message = (
            f"user nobody cannot start this Python ({blocked[0]}: {blocked[1]}); "
            "run scripts/grant-run-user-access (as .ci/run and scripts/demo do)"
        )
        if tools_required():
            pytest.fail(message)
        pytest.skip(message)
    return user
