"""An empty AGENT_RUN_UIDS / RUNNER_RUN_UIDS turns the uid per run off (every run as the run user, or as the
runner's own user), as their descriptions say; unset keeps the default range. The settings ignore other empty
variables (``env_ignore_empty``), which must not swallow these."""

from __future__ import annotations

import pytest
from pydantic_settings import BaseSettings

from orchestrator.agent.settings import AgentSettings
from orchestrator.managed.settings import ManagedSettings

AGENT = {"ORG_ID": "acme", "RUNNER_ID": "r", "PRIVATE_KEY": "k", "RUNNER_GATEWAY_URL": "https://gw.example"}
MANAGED = {
    "RUNNER_URL": "https://po.example",
    "RUNNER_MANAGED_SECRET": "s" * 48,
    "RUNNER_NAME": "pool-1",
}
#: (the settings class, its required variables, the range variable, its default, its field).
PROGRAMS: list[tuple[type[BaseSettings], dict[str, str], str, str, str]] = [
    (AgentSettings, AGENT, "AGENT_RUN_UIDS", "2200000-2200999", "agent_run_uids"),
    (ManagedSettings, MANAGED, "RUNNER_RUN_UIDS", "2300000-2300999", "runner_run_uids"),
]


@pytest.mark.parametrize(
    ("settings", "required", "variable", "default", "field"), PROGRAMS, ids=["agent", "managed"]
)
@pytest.mark.parametrize("value", [None, "", "5-9"], ids=["unset", "empty", "range"])
def test_run_uids(
    monkeypatch: pytest.MonkeyPatch,
    settings: type[BaseSettings],
    required: dict[str, str],
    variable: str,
    default: str,
    field: str,
    value: str | None,
) -> None:
    for name, given in required.items():
        monkeypatch.setenv(name, given)
    if value is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, value)

    assert (default if value is None else value) == getattr(settings(), field)
