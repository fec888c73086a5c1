"""``octl`` on a terminal against the real server: lists that fit 80 columns, ids completed by the shell,
and ``octl logs`` without a key.

The server is the real app under uvicorn with its dispatcher; the deployments are real ones, created
through the API for a ``kubernetes-agent`` runner whose agent never connects, so they stay executing.
``octl`` runs as the installed program on a pseudo-terminal of 80 columns.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.shell_completion import ShellComplete

from orchestrator.cli.octl import main
from orchestrator.client.api import ApiClient
from orchestrator.protocol import age
from orchestrator.settings import ServerSettings
from tests.support.octl import OCTL_EXECUTABLE, ORG, Octl, on_terminal, org_admin_token, serve

pytestmark = [pytest.mark.spread]

RUNNER_DATA = Path(__file__).parents[1] / "data" / "runners"
PROJECT, ENV = "checkout-service", "production-eu-west-1"
RUNNERS = ("kubernetes-agent-production-eu", "kubernetes-agent-staging")
MANIFEST = {"workloads": {"app": {"outputs": {"x": "y"}}}}


@pytest.fixture
def octl(settings: ServerSettings, tmp_path: Path) -> Iterator[Octl]:
    with serve(settings) as base_url:
        yield Octl(base_url=base_url, token=org_admin_token(base_url), config_path=tmp_path / "octl.yaml")


@pytest.fixture
def platform(octl: Octl) -> dict[str, Any]:
    """Two runners with long ids, a project and two environments of long ids, three deployments."""
    runner = yaml.safe_load((RUNNER_DATA / "seed000-agent.yaml").read_text())
    with ApiClient(octl.base_url, octl.token) as client:
        for runner_id in RUNNERS:
            description = (
                f"Runs the {runner_id.rsplit('-', 1)[-1]} deployments of the EU clusters through its agent"
            )
            client.create_runner(ORG, {**runner, "id": runner_id, "description": description})
        client.create_env_type(ORG, {"id": "production"})
        client.create_project(ORG, {"id": PROJECT})
        client.create_project(ORG, {"id": "payments"})
        for env_id in (ENV, "production-us-east-1"):
            client.create_env(ORG, PROJECT, {"id": env_id, "env_type_id": "production"})
        client.create_runner_rule(ORG, {"runner_id": RUNNERS[0]})
        deployments = []
        for env_id in (ENV, "production-us-east-1"):
            body = {
                "project_id": PROJECT,
                "env_id": env_id,
                "mode": "deploy",
                "manifest": MANIFEST,
                "encrypted_outputs_recipient": age.generate_identity()[1],
                "encrypted_logs_recipient": age.generate_identity()[1],
            }
            deployments.append(client.create_deployment(ORG, body)["id"])
    return {"deployments": deployments}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _rows(text: str) -> list[str]:
    """The lines shown, without the header's bold."""
    return [line for line in _ANSI.sub("", text).splitlines() if line.strip()]


def _fits(text: str, ids: list[str], *, columns: int = 80) -> None:
    """Every line within ``columns``, one line per id, each id whole on it."""
    lines = _rows(text)
    assert all(len(line) <= columns for line in lines), text
    for object_id in ids:
        assert 1 == sum(1 for line in lines if re.search(rf"(^|\s){re.escape(object_id)}(\s|$)", line)), (
            object_id,
            text,
        )


def test_lists__fit_80_columns_one_line_a_row_no_id_cut(octl: Octl, platform: dict[str, Any]) -> None:
    deployments = on_terminal(octl, "get", "deployments")
    runners = on_terminal(octl, "get", "runners")
    envs = on_terminal(octl, "get", "envs")
    wide = on_terminal(octl, "get", "deployments", "-o", "wide")

    assert 0 == deployments.exit_code, deployments.output
    _fits(deployments.stdout, platform["deployments"])
    assert 1 + len(platform["deployments"]) == len(_rows(deployments.stdout))
    assert re.search(r"\b(\d+s ago|just now)\b", deployments.stdout), deployments.stdout
    assert "executing" in deployments.stdout
    assert 0 == runners.exit_code, runners.output
    _fits(runners.stdout, list(RUNNERS))
    assert "…" in runners.stdout  # the descriptions, shortened; the ids whole
    assert 0 == envs.exit_code, envs.output
    _fits(envs.stdout, [ENV, "production-us-east-1"])
    assert all(PROJECT in line for line in _rows(envs.stdout)[1:])
    # Every column, one line a row, full timestamps: wider than the terminal.
    assert 0 == wide.exit_code
    assert "RunnerId" in wide.stdout and "StatusMessage" in wide.stdout
    rows = [line for line in _rows(wide.stdout) if any(d in line for d in platform["deployments"])]
    assert 2 == len(rows)
    assert all(re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", row) for row in rows)


def test_lists__piped_every_column_whole_as_upstream(octl: Octl, platform: dict[str, Any]) -> None:
    piped = octl("get", "deployments")

    lines = _rows(piped.stdout)
    assert ["Id", "ProjectId", "EnvId", "Mode", "Status", "Phase", "CreatedAt"] == lines[0].split()
    assert {PROJECT} == {line.split()[1] for line in lines[1:]}
    assert all(re.search(r"\d{4}-\d\d-\d\dT", line) for line in lines[1:])


# -- completion -------------------------------------------------------------------------------------


def _complete(octl: Octl, monkeypatch: pytest.MonkeyPatch, line: str, **env: str) -> list[str]:
    """What click's completion offers for the last word of ``line`` (the environment as octl's)."""
    for name, value in {
        "PO_API_URL": octl.base_url,
        "PO_AUTH_TOKEN": octl.token,
        "PO_ORG_ID": ORG,
        "OCTL_CONFIG": str(octl.config_path),
        **env,
    }.items():
        monkeypatch.setenv(name, value)
    words = line.split(" ")
    completer = ShellComplete(main, {}, "octl", "_OCTL_COMPLETE")
    return [item.value for item in completer.get_completions(words[1:-1], words[-1])]


def test_completion__ids_from_the_server(
    octl: Octl, platform: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = platform["deployments"][0]

    assert sorted(RUNNERS) == sorted(_complete(octl, monkeypatch, "octl get runner kub"))
    assert [RUNNERS[1]] == _complete(octl, monkeypatch, "octl delete runner kubernetes-agent-s")
    assert ["checkout-service"] == _complete(octl, monkeypatch, "octl get project ch")
    assert [PROJECT, "payments"] == sorted(_complete(octl, monkeypatch, "octl deploy "))
    assert [ENV, "production-us-east-1"] == sorted(
        _complete(octl, monkeypatch, f"octl deploy {PROJECT} prod")
    )
    assert [] == _complete(octl, monkeypatch, "octl deploy payments prod")
    assert [ENV] == _complete(
        octl, monkeypatch, f"octl get deployments --project {PROJECT} --env production-eu"
    )
    assert sorted(platform["deployments"]) == sorted(_complete(octl, monkeypatch, "octl logs "))
    assert [first] == _complete(octl, monkeypatch, f"octl get deployment {first[:8]}")
    assert [first] == _complete(octl, monkeypatch, f"octl rollback {PROJECT} {ENV} ")
    # Commands complete as before.
    assert {"runner", "runners", "runner-rule", "runner-rules"} <= set(
        _complete(octl, monkeypatch, "octl get runn")
    )


def test_completion__silent_on_errors(
    octl: Octl, platform: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused token, another organization, no server: nothing offered, nothing printed, no delay."""
    refused = _complete(octl, monkeypatch, "octl get runner ", PO_AUTH_TOKEN="po_wrong")
    other_org = _complete(octl, monkeypatch, "octl get runner --org nowhere ")
    started = time.monotonic()
    unreachable = _complete(octl, monkeypatch, "octl logs ", PO_API_URL="http://127.0.0.1:9")

    assert [] == refused == other_org == unreachable
    assert time.monotonic() - started < 5
    assert sorted(RUNNERS) == sorted(_complete(octl, monkeypatch, f"octl get runner --org {ORG} "))


def test_completion__through_the_shell_protocol(octl: Octl, platform: dict[str, Any]) -> None:
    """The installed program, as bash calls it on Tab (``_OCTL_COMPLETE=bash_complete``)."""
    done = subprocess.run(
        [str(OCTL_EXECUTABLE)],
        env={
            **os.environ,
            "PO_API_URL": octl.base_url,
            "PO_AUTH_TOKEN": octl.token,
            "PO_ORG_ID": ORG,
            "OCTL_CONFIG": str(octl.config_path),
            "_OCTL_COMPLETE": "bash_complete",
            "COMP_WORDS": "octl get runner kubernetes-agent-p",
            "COMP_CWORD": "3",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert 0 == done.returncode, done.stderr
    assert [f"plain,{RUNNERS[0]}"] == done.stdout.splitlines()


# -- octl logs without a key ------------------------------------------------------------------------


def test_logs__without_a_key_on_a_terminal_says_how_to_decrypt(octl: Octl, tmp_path: Path) -> None:
    deployment_id = str(uuid.uuid4())

    result = on_terminal(octl, "logs", deployment_id)

    assert 2 == result.exit_code
    text = " ".join(result.stdout.split())
    assert f"Error: the logs of deployment {deployment_id} are encrypted to the deployer's logs key" in text
    assert f"({deployment_id}.logs.key not found)" in text
    assert "--key AGE-SECRET-KEY-1... or --key @FILE" in text
    assert "--keys-dir DIR" in text
    assert "age-encryption" not in result.stdout


def test_logs__key_found_where_deploy_saves_it_and_key_flag_wins(octl: Octl, tmp_path: Path) -> None:
    """A saved key that does not open the logs is named as such (the server is asked for them)."""
    deployment_id = str(uuid.uuid4())
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir()
    (keys_dir / f"{deployment_id}.logs.key").write_text(age.generate_identity()[0] + "\n")

    saved = octl("logs", deployment_id, OCTL_KEYS_DIR=str(keys_dir))
    bad_flag = octl("logs", deployment_id, "--key", "AGE-SECRET-KEY-1NOPE", OCTL_KEYS_DIR=str(keys_dir))
    elsewhere = on_terminal(octl, "logs", deployment_id, "--keys-dir", str(tmp_path / "elsewhere"))

    assert (1, f"Error: not found: deployment '{deployment_id}' not found\n") == (
        saved.exit_code,
        saved.stderr,
    )
    assert 2 == bad_flag.exit_code
    assert "--key: not a valid age secret key" in bad_flag.stderr
    assert 2 == elsewhere.exit_code
    assert f"not in {tmp_path / 'elsewhere'} ({deployment_id}.logs.key not found)" in " ".join(
        elsewhere.stdout.split()
    )
