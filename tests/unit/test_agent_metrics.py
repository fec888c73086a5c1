"""The agent's metrics endpoint setting (``AGENT_METRICS_ADDR``): off by default, a bad address refused
naming the variable, and a bound endpoint answering the exposition."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from orchestrator.agent import metrics
from orchestrator.agent.settings import AgentSettings
from orchestrator.protocol import agent_auth

PRIVATE_PEM, _PUBLIC_PEM = agent_auth.generate_key_pair()


def _settings(**values: Any) -> AgentSettings:
    return AgentSettings(
        org_id="acme",
        runner_id="r1",
        private_key=PRIVATE_PEM,
        runner_gateway_url="https://po.example.com",
        **values,
    )


def test_agent_metrics__off_unless_an_address_is_set() -> None:
    assert "" == _settings().agent_metrics_addr
    assert "127.0.0.1:9090" == _settings(agent_metrics_addr=" 127.0.0.1:9090 ").agent_metrics_addr


@pytest.mark.parametrize("address", ["9090", "localhost", "host:http", "host:0", "host:70000", ":9090"])
def test_agent_metrics__a_bad_address_is_refused_naming_the_setting(address: str) -> None:
    with pytest.raises(ValidationError) as raised:
        _settings(agent_metrics_addr=address)

    assert "agent_metrics_addr" in str(raised.value)
    assert "is not host:port" in str(raised.value)


def test_agent_metrics__the_endpoint_answers_every_family() -> None:
    server = metrics.MetricsServer("127.0.0.1:0")
    try:
        before = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
        metrics.run_finished(0)
        metrics.run_finished(3)
        after = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
    finally:
        server.close()

    def value(text: str, outcome: str) -> float:
        return next(
            (
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "po_agent_runs_finished_total" and sample.labels == {"outcome": outcome}
            ),
            0.0,
        )

    assert 200 == after.status_code
    assert after.headers["content-type"].startswith("text/plain")
    assert (1.0, 1.0) == (
        value(after.text, "succeeded") - value(before.text, "succeeded"),
        value(after.text, "failed") - value(before.text, "failed"),
    )
    names = {family.name for family in text_string_to_metric_families(after.text)}
    assert {
        "po_agent_polls",
        "po_agent_commands_received",
        "po_agent_commands_refused",
        "po_agent_runs_launched",
        "po_agent_launch_failures",
        "po_agent_runs_finished",
        "po_agent_runs_watched",
        "po_agent_command_answers",
    } <= names
