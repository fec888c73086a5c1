"""bench/terraform.py keeps running: one measured round of seed 000's example by Terraform (through our
provider) and by octl, and two provider starts on their own. Nothing here looks at how long anything
took, only that everything was measured and the ratio is theirs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_terraform_bench__measures_terraform_and_octl(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "terraform.py"),
            "--runs",
            "1",
            "--starts",
            "2",
            "--json",
            "--results-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=360,
    )

    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result == json.loads((tmp_path / "terraform.json").read_text())
    assert len(result["terraform_seconds"]) == len(result["octl_seconds"]) == 1
    assert len(result["terraform_cpu_seconds"]) == len(result["octl_cpu_seconds"]) == 1
    assert result["ratio"] == result["terraform_median"] / result["octl_median"]
    startup = result["startup"]
    assert startup["starts"] == 2
    assert 0 < startup["handshake_median"] <= startup["schema_median"] <= startup["exit_median"]
    assert startup["cpu_median"] > 0
    # Terraform starts the provider for the schema, then for the work (and for validation in a plan).
    assert result["provider_starts"]["plan"] >= 2 and result["provider_starts"]["apply"] >= 2
