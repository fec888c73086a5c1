"""bench/managed.py keeps running: the Managed pool benchmark as a user runs it (``python
bench/managed.py``), with tiny numbers: one real ``po-runner managed`` for a measured deployment next to the
local launcher's, then a few in-process pollers draining a small backlog next to a small local burst.
Nothing here looks at how long anything took: only that everything was measured, each backlog deployment
claimed exactly once, and nothing errored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_managed_bench__measures_claims_against_the_local_launcher(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "managed.py"),
            *("--runs", "1", "--warmup", "0", "--real-runners", "1"),
            *("--pollers", "3", "--backlog", "6", "--local-backlog", "2", "--json"),
            *("--results-dir", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
    )

    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result == json.loads((tmp_path / "managed.json").read_text())
    run = result["databases"]["sqlite"]
    assert list(run["latency"]) == ["vm-local", "managed"]
    assert run["failures"] == [] and run["processes_killed_at_exit"] == []
    for name, row in run["latency"].items():
        assert (row["deployments"], row["failed"]) == (1, 0), name
        # The runner asks for its bundle after the deployment was created and before it completes.
        assert 0 < row["started_s"]["p50"] < row["completed_s"]["p50"], (name, row)
    managed = run["latency"]["managed"]
    # Its claim was answered before its po-runner asked for the bundle.
    assert 0 < managed["claim_s"]["p50"] < managed["started_s"]["p50"], managed
    assert run["latency"]["vm-local"]["started_x_local"] == 1.0
    local, drained = run["throughput"]["local"], run["throughput"]["managed"]
    assert (local["deployments"], local["failed"]) == (2, 0), local
    assert local["launches_per_s"] > 0
    assert (drained["backlog"], drained["claimed"], drained["never_claimed"]) == (6, 6, 0), drained
    assert (drained["claimed_twice"], drained["errors"]) == ([], {}), drained
    assert drained["claims_per_s"] > 0 and drained["claims_per_s_x_local"] is not None
    burst = run["throughput"]["managed_burst"]
    assert (burst["deployments"], burst["claimed"], burst["never_claimed"]) == (2, 2, 0), burst
    assert (burst["claimed_twice"], burst["errors"]) == ([], {}), burst
    assert burst["claims_per_s"] > 0
    assert (tmp_path / "managed-sqlite-server.log").is_file()
