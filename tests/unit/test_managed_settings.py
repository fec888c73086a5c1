"""MANAGED_RUNNER_SECRET: seed 004's name (no PO_ prefix); shorter than 48 characters refuses the start,
saying so without the value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.settings import ServerSettings


def test_settings__managed_runner_secret_from_its_seed_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MANAGED_RUNNER_SECRET", "s" * 48)
    monkeypatch.setenv("PO_MANAGED_LEASE_SECONDS", "30")

    settings = ServerSettings(data_dir=tmp_path / "data", local_runs_dir=tmp_path / "runs")

    assert settings.managed_runners_enabled
    assert "s" * 48 == settings.managed_runner_secret.get_secret_value()  # type: ignore[union-attr]
    assert (30.0, 15.0, 86400.0) == (
        settings.managed_lease_seconds,
        settings.managed_heartbeat_seconds,
        settings.managed_prune_after_seconds,
    )
    assert "s" * 48 not in repr(settings)


def test_settings__unset_or_empty_secret_means_off(tmp_path: Path) -> None:
    data, runs = tmp_path / "data", tmp_path / "runs"
    assert not ServerSettings(data_dir=data, local_runs_dir=runs).managed_runners_enabled
    assert not ServerSettings(
        data_dir=data, local_runs_dir=runs, managed_runner_secret=""
    ).managed_runners_enabled


def test_settings__short_secret_is_refused_with_its_length(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        ServerSettings(
            data_dir=tmp_path / "data", local_runs_dir=tmp_path / "runs", managed_runner_secret="x" * 47
        )

    assert (
        "MANAGED_RUNNER_SECRET must be at least 48 characters (it has 47)" == caught.value.errors()[0]["msg"]
    )


def test_serve__short_secret_refuses_to_start_without_printing_it(tmp_path: Path) -> None:
    secret = "short-secret-value-1234"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PO_")},
        "PO_DATA_DIR": str(tmp_path / "data"),
        "PO_LISTEN": "127.0.0.1:0",
        "MANAGED_RUNNER_SECRET": secret,
    }

    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.server", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert 0 != done.returncode
    assert f"MANAGED_RUNNER_SECRET must be at least 48 characters (it has {len(secret)})" in done.stderr
    assert secret not in done.stdout + done.stderr
