"""An empty AGENT_RUN_UIDS / RUNNER_RUN_UIDS turns the uid per run off (every run as the run user, or as the
runner's own user), as their descriptions say; unset keeps the default range. The settings ignore other empty
variables (``env_ignore_empty``), which must not swallow these."""

from __future__ import annotations

import pytest

from orchestrator.agent.settings import AgentSettings
from orchestrator.managed.settings import ManagedSettings

AGENT = {"ORG_ID": "acme", "RUNNER_ID": "r", "PRIVATE_KEY": "k", "RUNNER_GATEWAY_URL": "https://gw.example"}
MANAGED = {
    "RUNNER_URL": "https://po.example",
    "RUNNER_MANAGED_SECRET": "s" * 48,
    "RUNNER_NAME": "pool-1",
}


@pytest.mark.parametrize(("value", "expected"), [(None, "2200000-2200999"), ("", ""), ("5-9", "5-9")])
def test_agent_run_uids(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: str) -> None:
    for name, given in AGENT.items():
        monkeypatch.setenv(name, given)
    if value is None:
        monkeypatch.delenv("AGENT_RUN_UIDS", raising=False)
    else:
        monkeypatch.setenv("AGENT_RUN_UIDS", value)

    assert expected == AgentSettings().agent_run_uids


@pytest.mark.parametrize(("value", "expected"), [(None, "2300000-2300999"), ("", ""), ("5-9", "5-9")])
def test_managed_run_uids(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: str) -> None:
    for name, given in MANAGED.items():
        monkeypatch.setenv(name, given)
    if value is None:
        monkeypatch.delenv("RUNNER_RUN_UIDS", raising=False)
    else:
        monkeypatch.setenv("RUNNER_RUN_UIDS", value)

    assert expected == ManagedSettings().runner_run_uids
