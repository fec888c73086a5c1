"""bench/gateway_requests.py keeps running: as a user runs it, with a few requests of each kind. Nothing
here looks at how long anything took: only that every kind was measured, its server CPU read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_gateway_requests_bench__measures_every_kind_of_request() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gateway_requests.py"), "--requests", "5", "--warmup", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
    )

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    rows = {line[:28].strip(): line[28:].split() for line in done.stdout.splitlines()[1:6]}
    assert [
        "GET /healthz (baseline)",
        "GET bundle",
        "POST state",
        "GET state",
        "LOCK + UNLOCK state (pair)",
    ] == list(rows)
    baseline_cpu = float(rows["GET /healthz (baseline)"][0])
    for cpu, ratio, wall in rows.values():
        assert float(cpu) >= 0 and float(wall) > 0, rows
        # /proc's CPU ticks are 10 ms: five requests of the baseline may read zero, and then no ratio.
        assert (float(ratio) >= 0) if baseline_cpu > 0 else ("n/a" == ratio), rows
    assert "load average" in done.stdout
