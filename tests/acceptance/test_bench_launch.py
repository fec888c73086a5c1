"""bench/launch.py keeps running: the launch latency benchmark as a user runs it (``python
bench/launch.py``), with one measured deployment on the local launcher (its baseline) and on a ``vm``
agent runner, the cheapest type with a stand-in of its own (a real ``po-runner remote``). Nothing here
looks at how long anything took: only that every deployment was measured, in the order a run happens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_launch_bench__measures_the_local_launcher_and_an_agent_runner(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "launch.py"),
            *("--types", "vm-agent", "--runs", "1", "--warmup", "0", "--json"),
            *("--results-dir", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result == json.loads((tmp_path / "launch-sqlite.json").read_text())
    assert list(result["types"]) == ["vm-local", "vm-agent"]
    assert result["failures"] == [] and result["runs_killed_at_exit"] == []
    for name, row in result["types"].items():
        assert (row["deployments"], row["failed"]) == (1, 0), name
        started, completed = row["started_s"]["p50"], row["completed_s"]["p50"]
        # The runner asks for its bundle after the deployment was created and before it completes.
        assert 0 < started < completed, (name, row)
    assert result["types"]["vm-local"]["started_x_local"] == 1.0
    samples = result["samples"]
    assert [(s["type"], s["status"]) for s in samples] == [
        ("vm-local", "succeeded"),
        ("vm-agent", "succeeded"),
    ]
    assert len({s["deployment_id"] for s in samples}) == 2
    assert (tmp_path / "launch-sqlite-server.log").is_file()
