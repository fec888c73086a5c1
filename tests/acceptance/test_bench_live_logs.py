"""bench/live_logs.py keeps running: the live logs benchmark as a user runs it
(``python bench/live_logs.py``), with tiny numbers: two deployments printing markers at once (and one
alone), a 1 MiB log, and bursts of two with streaming off and on. Nothing here looks at how long anything
took: only that every part was measured, every marker and every chunk reached its follower once, and
streaming was off where it was turned off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_live_logs_bench__measures_latency_memory_and_cost_with_no_chunk_lost(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "live_logs.py"),
            *("--followers", "2", "--mark-seconds", "1", "--log-mib", "1", "--idle-seconds", "0.5"),
            *("--burst", "2", "--cost-rounds", "1", "--concurrency", "2"),
            *("--json", "--results-dir", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result = json.loads(done.stdout)
    run = result["databases"]["sqlite"]
    assert json.loads((tmp_path / "live-logs-sqlite.json").read_text())["databases"]["sqlite"] == run
    for part in ("latency", "memory", "cost"):
        assert (tmp_path / f"live-logs-sqlite-{part}-server.log").is_file(), part

    latency = run["latency"]
    for key, deployments in (("alone", 1), ("staggered", 2), ("aligned", 2)):
        measured = latency[key]
        assert (measured["deployments"], measured["succeeded"], measured["ready_at_release"]) == (
            deployments,
            deployments,
            deployments,
        ), measured
        # Every marker reached its follower once, in chunks numbered 1, 2, ... with none lost or repeated.
        assert measured["marks_expected"] == measured["marks_received"] == 5 * deployments, measured
        assert (measured["marks_missing"], measured["marks_repeated"]) == (0, 0), measured
        assert (measured["lost"], measured["repeated"], measured["undecryptable"]) == (0, 0, 0), measured
        assert (measured["not_ended"], measured["follow_errors"]) == (0, []), measured
        assert measured["chunks"] >= deployments, measured
        assert measured["latency_s"]["count"] == 5 * deployments, measured
        assert measured["stored_to_follower_s"]["count"] == 5 * deployments, measured
    for key in ("staggered", "aligned"):
        assert latency["ratios"][key]["p50"] > 0 and latency["ratios"][key]["p99"] > 0, latency

    steps = run["memory"]["steps"]
    assert list(steps) == ["idle", "trivial", "big"]
    assert steps["idle"]["server_peak_above_idle_mib"] == 0.0
    for key in ("trivial", "big"):
        step = steps[key]
        assert step["follow"]["status"] == "succeeded", step
        assert (step["lost"], step["repeated"], step["undecryptable"], step["not_ended"]) == (0, 0, 0, 0), (
            step
        )
        assert step["server_peak_kib"] > 0 and step["runner_peak_kib"] > 0, step
    # The large log was streamed whole: at least the MiB its provisioner printed (in Terraform's JSON lines).
    assert steps["big"]["follow"]["text_bytes"] > 1 << 20, steps["big"]["follow"]
    assert steps["big"]["follow"]["chunks"] > steps["trivial"]["follow"]["chunks"], steps

    cost = run["cost"]
    assert [r["streaming"] for r in cost["rounds"]] == ["off", "on"]
    for measured in cost["rounds"]:
        assert (measured["created"], measured["succeeded"], measured["not_completed"]) == (2, 2, 0), measured
        assert (measured["failed"], measured["create_errors"], measured["run_twice"]) == ([], {}, []), (
            measured
        )
        stored = measured["stored"]
        assert (stored["deployments"], stored["with_whole_log"]) == (2, 2), stored
        # RUNNER_LOG_STREAM_MAX_BYTES=0 in the runner's job environment turns streaming off; on, each streams.
        assert stored["with_chunks"] == (0 if measured["streaming"] == "off" else 2), stored
    for mode in ("off", "on"):
        assert cost["modes"][mode]["deployments_per_minute"] > 0, cost["modes"]
        assert cost["modes"][mode]["cpu_s_per_deployment"] > 0, cost["modes"]
    assert cost["ratio_rate_on_off"] > 0 and cost["ratio_cpu_on_off"] > 0, cost
