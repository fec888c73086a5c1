"""``octl`` deployment verbs against the real server where no runner needs to run: what is refused
before or at creation, and what an unknown deployment answers. The deployments themselves run in
tests/acceptance/test_octl_deploy.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.settings import ServerSettings
from tests.support.octl import Octl, org_admin_token, serve

MANIFEST = "workloads:\n  app:\n    outputs: {x: y}\n"
MISSING = "00000000-0000-4000-8000-000000000001"


@pytest.fixture
def octl(settings: ServerSettings, tmp_path: Path) -> Iterator[Octl]:
    with serve(settings) as base_url:
        yield Octl(base_url=base_url, token=org_admin_token(base_url), config_path=tmp_path / "octl.yaml")


@pytest.fixture
def manifest_file(tmp_path: Path) -> Path:
    path = tmp_path / "manifest.yaml"
    path.write_text(MANIFEST)
    return path


def test_deploy__missing_environment_is_not_found(octl: Octl, manifest_file: Path) -> None:
    result = octl("deploy", "shop", "dev", str(manifest_file))

    assert 1 == result.exit_code
    assert result.stderr.endswith("Error: not found: environment 'dev' not found in project 'shop'\n")
    assert "Creating deploy deployment in shop/dev..." in result.stderr
    assert "" == result.stdout


def test_deploy__environment_without_a_matching_runner_is_a_conflict(octl: Octl, manifest_file: Path) -> None:
    for args in (
        ("create", "env-type", "development"),
        ("create", "project", "shop"),
        ("create", "env", "shop", "dev", "--set", "env_type_id=development"),
    ):
        assert 0 == octl(*args).exit_code

    result = octl("deploy", "shop", "dev", str(manifest_file))

    assert 1 == result.exit_code
    error = result.stderr.splitlines()[-1]
    assert error.startswith("Error: conflict: no matching runner found for the supplied environment: ")
    assert "`octl create runner-rule --set runner_id=RUNNER --set project_id=shop`" in error


def test_deploy__input_problems_are_usage_errors_before_any_request(octl: Octl, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    good = tmp_path / "m.yaml"
    good.write_text(MANIFEST)
    bad = tmp_path / "bad.yaml"
    bad.write_text("workloads: {}\nextra: 1\n")

    missing_file = octl("deploy", "shop", "dev", str(tmp_path / "nope.yaml"))
    unknown_key = octl("deploy", "shop", "dev", str(bad))
    stdin_list = octl("deploy", "shop", "dev", "-", input="- 1\n")
    keys_dir = octl("deploy", "shop", "dev", str(good), "--save-keys", str(not_a_dir / "keys"))
    log_level = octl("deploy", "shop", "dev", str(good), "--runner-logs-level", "trace")
    bad_target = octl("rollback", "shop", "dev", "not-a-uuid")

    assert [2] * 6 == [
        r.exit_code for r in (missing_file, unknown_key, stdin_list, keys_dir, log_level, bad_target)
    ]
    assert "MANIFEST: cannot read" in missing_file.stderr
    assert "unknown top-level keys: extra" in unknown_key.stderr
    assert "the manifest in standard input must be a mapping" in stdin_list.stderr
    assert "--save-keys: cannot create" in keys_dir.stderr
    assert "Creating" not in keys_dir.stderr, "refused before the deployment is created"
    assert "'trace' is not one of" in log_level.stderr
    assert "not-a-uuid" in bad_target.stderr


def test_deployment_verbs__unknown_deployment_is_not_found(octl: Octl) -> None:
    got = octl("get", "deployment", MISSING)
    tf = octl("tf", MISSING)
    logs = octl("logs", MISSING)
    rollback = octl("rollback", "shop", "dev", MISSING)

    expected = f"Error: not found: deployment '{MISSING}' not found\n"
    assert (1, expected) == (got.exit_code, got.stderr)
    assert (1, expected) == (tf.exit_code, tf.stderr)
    assert (1, expected) == (logs.exit_code, logs.stderr)
    assert 1 == rollback.exit_code
    assert rollback.stderr.startswith("Creating rollback deployment in shop/dev...\n")


def test_logs__bad_key_is_a_usage_error_before_any_request(octl: Octl) -> None:
    result = octl("-d", "logs", MISSING, "--key", "AGE-SECRET-KEY-1NOPE")

    assert 2 == result.exit_code
    assert "--key: not a valid age secret key" in result.stderr
    assert "> GET" not in result.stderr
    assert "AGE-SECRET-KEY-1NOPE" not in result.stderr


def test_get_deployments__empty_and_filters_checked(octl: Octl) -> None:
    empty = octl("get", "deployments")
    as_json = octl(
        "get", "deps", "--status", "failed", "--mode", "deploy", "--mode", "rollback", "-o", "json"
    )
    bad_status = octl("get", "deployments", "--status", "queued")

    assert (0, "") == (empty.exit_code, empty.stdout)
    assert "No deployments found in organization acme." in empty.stderr
    assert (0, "[]\n") == (as_json.exit_code, as_json.stdout)
    assert 2 == bad_status.exit_code


def test_get_deployments__filters_reach_the_server(octl: Octl) -> None:
    """Repeated --mode and --status become by_mode[] and by_status[] query parameters."""
    result = octl("-d", "get", "deployments", "--mode", "deploy", "--mode", "rollback", "--status", "failed")

    assert 0 == result.exit_code, result.output
    request = next(line for line in result.stderr.splitlines() if line.startswith("> GET"))
    assert "by_mode%5B%5D=deploy&by_mode%5B%5D=rollback" in request
    assert "by_status%5B%5D=failed" in request
