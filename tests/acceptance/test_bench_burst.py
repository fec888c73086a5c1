"""bench/burst.py keeps running: the burst benchmark as a user runs it (``python bench/burst.py``), with tiny
numbers: a burst of three deployments on the local launcher, the floor measured once, and ten creates
alone. Nothing here looks at how long anything took: only that every part was measured, every
deployment succeeded and no create failed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_burst_bench__measures_a_burst_its_cpu_and_the_creates_alone(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "burst.py"),
            *("--deployments", "3", "--concurrency", "2", "--creates", "10", "--floor-runs", "1"),
            *("--json", "--results-dir", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    result = json.loads(done.stdout)
    run = result["databases"]["sqlite"]
    assert json.loads((tmp_path / "burst-sqlite.json").read_text())["databases"]["sqlite"] == run
    assert "embedded" == run["options"]["engine"]
    assert (tmp_path / "burst-sqlite-server.log").is_file()
    burst = run["burst"]
    assert (burst["created"], burst["succeeded"], burst["not_completed"]) == (3, 3, 0), burst
    assert (burst["failed"], burst["create_errors"]) == ([], {}), burst
    assert (burst["run_twice"], burst["runs_not_seen"], burst["server_errors"]) == ([], [], 0), burst
    assert burst["deployments_per_minute"] > 0
    assert burst["create_call_s"]["count"] == 3 and burst["created_to_completed_s"]["count"] == 3
    # Every run was reaped, so the runners' and the engine's CPU is all in the server's cutime; each runner
    # started engine processes, which the sampler saw.
    assert burst["all_runs_reaped"] and burst["runner_processes_seen"] == 3, burst
    cpu = burst["cpu_s_per_deployment"]
    assert cpu["server"] > 0 and cpu["runners"] > 0 and cpu["engine"] > 0, cpu
    assert cpu["runners_and_engine"] >= cpu["engine"], cpu
    for floor in run["floor"].values():
        assert floor["cpu_s"]["count"] == 1 and floor["cpu_s"]["p50"] > 0, floor
    creates = run["creates"]
    assert (creates["answered"], creates["errors"]) == (10, {}), creates
    assert creates["creates_per_s"] > 0 and creates["cpu_ms_per_create"]["server"] > 0, creates


@pytest.mark.timeout(400)
def test_burst_bench__two_replicas_on_one_postgresql_run_each_deployment_once(tmp_path: Path) -> None:
    """The issue's correctness check: two `orchestrator serve` on one PostgreSQL, creates spread over both;
    every deployment completes, none runs twice (one runner process each), no 5xx."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "burst.py"),
            *("--database", "postgresql", "--replicas", "2", "--only", "burst"),
            *("--deployments", "6", "--concurrency", "4", "--floor-runs", "1"),
            *("--json", "--results-dir", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=340,
    )

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    burst = json.loads(done.stdout)["databases"]["postgresql"]["burst"]
    assert burst["replicas"] == 2 and (burst["created"], burst["succeeded"]) == (6, 6), burst
    assert (burst["run_twice"], burst["runs_not_seen"], burst["server_errors"]) == ([], [], 0), burst
    assert burst["create_errors"] == {} and burst["failed"] == [], burst
    assert (tmp_path / "burst-postgresql-1-server.log").is_file()


@pytest.mark.timeout(400)
def test_burst_bench__the_ways_a_local_run_starts_one_burst_each(tmp_path: Path) -> None:
    """``--local-runs cold,warm,zygote``: a burst per way, each measured alone (its runners seen, its CPU
    split), results under ``<database>-<way>``."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "burst.py"),
            *("--only", "burst", "--local-runs", "cold,warm,zygote"),
            *("--deployments", "3", "--concurrency", "2", "--floor-runs", "1"),
            *("--json", "--results-dir", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=340,
    )

    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    runs = json.loads(done.stdout)["databases"]
    assert ["sqlite-cold", "sqlite-warm", "sqlite-zygote"] == list(runs)
    for name, run in runs.items():
        burst = run["burst"]
        assert (burst["succeeded"], burst["run_twice"], burst["runs_not_seen"]) == (3, [], []), (name, burst)
        assert burst["all_runs_reaped"] and burst["runner_processes_seen"] == 3, (name, burst)
        cpu = burst["cpu_s_per_deployment"]
        assert cpu["runners"] > 0 and cpu["engine"] > 0, (name, cpu)
        assert (tmp_path / f"burst-{name}.json").is_file()


def test_burst_bench__an_engine_not_on_path_is_refused_before_anything_starts(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "burst.py"), "--engine", "opentofu", "--only", "burst"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(empty)},
    )

    assert 2 == done.returncode, (done.stdout, done.stderr)
    assert "--engine opentofu: no `tofu` executable on PATH" in done.stderr
    assert not list(tmp_path.glob("*.json"))
