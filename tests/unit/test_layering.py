"""Runner, launcher and client code ship without the server: importing them loads no server module."""

from __future__ import annotations

import subprocess
import sys

import pytest

SERVER_ONLY = (
    "orchestrator.store",
    "orchestrator.dispatch",
    "orchestrator.api",
    "orchestrator.gateway",
    "orchestrator.server",
    "fastapi",
    "sqlalchemy",
    "asyncpg",
    "aiosqlite",
)


@pytest.mark.parametrize(
    "module",
    [
        "orchestrator.cli.runner",
        "orchestrator.runner.standard",
        "orchestrator.launchers.local",
        "orchestrator.launchers.kubernetes",
        "orchestrator.launchers.kubernetes_job",
        "orchestrator.protocol.launch",
        "orchestrator.client.api",
        "orchestrator.agent.main",
        "orchestrator.cli.octl.commands.agent_keys",
        "orchestrator.cli.octl",
    ],
)
def test_layering__shippable_code_imports_no_server_code(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith({SERVER_ONLY!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout

    assert "[]\n" == out
