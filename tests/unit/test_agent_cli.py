"""`octl create agent-key`, the agent's backoff, and the agent shipping without server code."""

from __future__ import annotations

import random
import stat
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.agent.loop import backoff_seconds
from orchestrator.cli.octl import main as octl
from orchestrator.domain.key_material import load_agent_public_key
from orchestrator.domain.runner_types import launched_by, parse_runner_configuration
from orchestrator.protocol import agent_auth


def _create(tmp_path: Path, *args: str) -> tuple[int, str, Path]:
    key_file = tmp_path / "agent.pem"
    result = CliRunner().invoke(
        octl,
        ["create", "agent-key", "--private-key-file", str(key_file), *args],
        env={"OCTL_CONFIG": str(tmp_path / "octl.yaml")},
    )
    return result.exit_code, result.stdout, key_file


@pytest.mark.parametrize("runner_type", ["vm", "kubernetes-agent"])
def test_octl_create_agent_key__a_runner_configuration_matching_the_private_key(
    tmp_path: Path, runner_type: str
) -> None:
    code, out, key_file = _create(tmp_path, "--runner-type", runner_type)
    configuration = yaml.safe_load(out)["runner_configuration"]
    parsed = parse_runner_configuration(configuration)
    public_pem = (
        configuration["key"] if runner_type == "kubernetes-agent" else configuration["connection"]["key"]
    )
    private = agent_auth.load_private_key(key_file.read_text())
    token = agent_auth.sign(private, "acme", "r1")

    assert 0 == code
    assert runner_type == parsed.type
    assert "agent" == launched_by(runner_type, configuration)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert "PRIVATE KEY" not in out
    agent_auth.verify(token, load_agent_public_key(public_pem), org_id="acme", runner_id="r1")


def test_octl_create_agent_key__kubernetes_job_options_and_json(tmp_path: Path) -> None:
    code, out, _ = _create(
        tmp_path,
        "--runner-type",
        "kubernetes-agent",
        "--namespace",
        "runners",
        "--service-account",
        "sa",
        "-o",
        "json",
    )

    assert 0 == code
    assert {"namespace": "runners", "service_account": "sa"} == yaml.safe_load(out)["runner_configuration"][
        "job"
    ]


def test_octl_create_agent_key__never_overwrites_a_key(tmp_path: Path) -> None:
    (tmp_path / "agent.pem").write_text("precious")

    code, _, key_file = _create(tmp_path, "--runner-type", "vm")

    assert 0 != code
    assert "precious" == key_file.read_text()


def test_backoff__doubles_to_the_cap_with_jitter() -> None:
    rng = random.Random(7)
    delays = [backoff_seconds(n, cap=64.0, rng=rng) for n in range(1, 10)]

    assert all(2 ** min(n, 6) / 2 <= d <= 2 ** min(n, 6) for n, d in zip(range(1, 10), delays, strict=True))
    assert max(delays) <= 64.0
    assert backoff_seconds(10, cap=5.0, rng=rng) <= 5.0
    assert len({round(backoff_seconds(3, cap=64.0, rng=rng), 6) for _ in range(20)}) > 1
