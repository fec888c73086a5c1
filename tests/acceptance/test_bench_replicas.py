"""bench/replicas.py keeps running: the replicas benchmark as a user runs it (``python bench/replicas.py``),
with tiny numbers: bursts of six deployments with one and two replicas behind the round-robin front, then
the takeover round (two replicas, one killed). Nothing here looks at how long anything took: only that
every round was measured, every deployment succeeded once, and a killed replica's leases, when it held
any, were taken over."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_replicas_bench__measures_each_replica_count_and_the_takeover(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "replicas.py"),
            *("--deployments", "6", "--replicas", "1,2", "--concurrency", "3"),
            *("--lease-seconds", "5", "--local-run-limit", "2"),
            *("--json", "--results-dir", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result = json.loads(done.stdout)
    assert json.loads((tmp_path / "replicas.json").read_text())["rounds"] == result["rounds"]
    rounds = result["rounds"]
    assert ["1", "2", "takeover"] == list(rounds)
    for key, burst in rounds.items():
        assert (burst["created"], burst["succeeded"], burst["not_completed"]) == (6, 6, 0), (key, burst)
        assert (burst["failed"], burst["create_errors"], burst["run_twice"]) == ([], {}, []), (key, burst)
        assert burst["deployments_per_minute"] > 0, (key, burst)
    assert rounds["1"]["ratio_to_fewest_replicas"] == 1.0
    assert rounds["2"]["ratio_to_fewest_replicas"] > 0
    # The front spread the connections over both replicas.
    assert set(rounds["2"]["front_connections"]) == {"r0", "r1"}, rounds["2"]
    takeover = rounds["takeover"]["takeover"]
    if takeover["killed"] is not None:
        assert takeover["not_taken_over"] == [], takeover
        if takeover["leases_held"]:  # it may have released the one it was seen holding before the kill
            assert takeover["taken_over_after_s"]["max"] < 5 + 30, takeover
