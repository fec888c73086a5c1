"""bench/metrics.py keeps running: the metrics overhead benchmark as a user runs it (``python
bench/metrics.py``), with tiny numbers. Nothing here looks at how long anything took or at the overhead it
measured (too few requests to mean anything): only that both servers were measured, as configured, without
errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_metrics_bench__measures_the_middleware_against_a_server_without_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "metrics.py"),
            *("--requests", "100", "--rounds", "2", "--warmup", "10", "--scrapes", "5", "--json"),
            *("--results-dir", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
    )

    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result == json.loads((tmp_path / "metrics.json").read_text())
    assert {"metrics": {}, "baseline": {}} == result["errors"]
    assert ["GET /healthz", "GET /orgs/{org}/runners/{id}"] == list(result["operations"])
    for name, row in result["operations"].items():
        # Two rounds of 100 requests to each server.
        assert 200 == row["requests_each"], name
        assert len(row["overhead_per_round"]) <= 2, name
        if row["baseline_cpu_ms"] > 0:
            expected = row["metrics_cpu_ms"] / row["baseline_cpu_ms"] - 1
            assert row["overhead"] == pytest.approx(expected, abs=1e-3), name
    overheads = [row["overhead"] for row in result["operations"].values()]
    assert result["met"] == all(o is not None and o <= 0.05 for o in overheads)
    assert result["scrape_cpu_ms"] >= 0
    assert result["middleware_us"] > 0
