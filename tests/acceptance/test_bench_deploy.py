"""bench/deploy.py keeps running: the overhead benchmark as a user runs it (``python bench/deploy.py --only
overhead``), with two measured deployments of a two-resource module. It rotted once unnoticed (bundles became
sealed in the object store and the benchmark still read them as plain tar.gz): this runs it end to end.
Nothing here looks at how long anything took: only that every part was measured and the engines agreed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_deploy_bench__overhead_measures_octl_against_the_same_code_applied_directly(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "deploy.py"),
            *("--only", "overhead", "--runs", "2", "--resources", "2"),
            *("--results-dir", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result = json.loads((tmp_path / "deploy.json").read_text())
    assert result["engine"] == "embedded"
    assert (tmp_path / "deploy-embedded-server.log").is_file()
    assert "overhead = median(octl) - median(baseline)" in done.stdout
    runs = result["overhead"]["runs"]
    assert len(runs) == 2 and len({run["deployment_id"] for run in runs}) == 2
    for run in runs:
        # The orchestrated deploy, the bundle's code applied directly and the runner's steps each changed
        # the same two resources (their inputs change on every run).
        assert run["changed"] == {"orchestrated": [0, 2, 0], "baseline": [0, 2, 0], "runner_steps": [0, 2, 0]}
        assert run["octl_s"] > 0 and run["baseline_s"] > 0
