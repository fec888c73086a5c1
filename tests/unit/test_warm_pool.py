"""The warm runner pool (``launchers.warm``) and ``po-runner warm``'s side of the hand-over, with real
processes: a runner taken is alive, a dead one is skipped, the pool refills, and closing it ends the idle
ones; ``po-runner warm`` exits on a closed pipe, refuses a malformed order, and runs with the order's
environment only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.launchers.warm import WarmPool
from orchestrator.protocol.launch import WarmOrder
from tests.support.outages import wait_for

#: A stand-in runner: waits for its order, then writes it where its stderr goes.
STAND_IN = "import sys; sys.stderr.write(sys.stdin.readline())"


def _start(path: Path) -> subprocess.Popen[bytes]:
    with open(path, "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-c", STAND_IN], stdin=subprocess.PIPE, stderr=stderr, start_new_session=True
        )


@pytest.fixture
def pool(tmp_path: Path) -> WarmPool:
    return WarmPool(_start, tmp_path / ".warm", 2)


def test_pool__empty_until_first_use_then_filled(pool: WarmPool) -> None:
    assert (None, 0) == (pool.take(), 0)  # nothing started before the first take
    wait_for(lambda: pool.idle() == 2, 30, "the pool to fill")

    runner = pool.take()

    assert runner is not None and runner.alive()
    wait_for(lambda: pool.idle() == 2, 30, "the pool to refill")
    runner.discard()
    pool.close()


def test_pool__hand_over_moves_the_stderr_file_and_sends_the_order(pool: WarmPool, tmp_path: Path) -> None:
    pool.take()
    wait_for(lambda: pool.idle() == 2, 30, "the pool to fill")
    runner = pool.take()
    assert runner is not None
    order = WarmOrder(environ={"TOKEN": "t-1"}, cwd="/work")

    runner.hand_over(order, tmp_path / "stderr.log")

    assert 0 == runner.process.wait(30)
    assert not runner.stderr.exists()
    assert order == WarmOrder.decode((tmp_path / "stderr.log").read_bytes())
    pool.close()


def test_pool__a_dead_runner_is_skipped_and_its_file_removed(pool: WarmPool) -> None:
    pool.take()
    wait_for(lambda: pool.idle() == 2, 30, "the pool to fill")
    dead = pool._idle[0]
    dead.process.kill()
    dead.process.wait()

    taken = [pool.take(), pool.take()]

    assert dead not in taken and all(runner is None or runner.alive() for runner in taken)
    assert not dead.stderr.exists()
    for runner in taken:
        if runner is not None:
            runner.discard()
    pool.close()


def test_pool__close_ends_the_idle_runners_and_starts_no_more(pool: WarmPool) -> None:
    pool.take()
    wait_for(lambda: pool.idle() == 2, 30, "the pool to fill")
    idle = list(pool._idle)

    pool.close()

    assert [] == [runner for runner in idle if runner.process.poll() is None]
    assert (None, 0) == (pool.take(), pool.idle())
    assert [] == list(pool.directory.iterdir())


def test_pool__size_zero_never_starts_a_runner(tmp_path: Path) -> None:
    pool = WarmPool(_start, tmp_path / ".warm", 0)

    assert (None, False) == (pool.take(), pool.directory.exists())


def _warm_runner(stdin: bytes, **environ: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.runner", "warm"],
        input=stdin,
        env={"PATH": os.environ["PATH"], **environ},
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_po_runner_warm__a_closed_pipe_exits_without_running() -> None:
    done = _warm_runner(b"")

    assert (0, b"") == (done.returncode, done.stderr)


def test_po_runner_warm__a_malformed_order_is_refused_naming_what_is_wrong() -> None:
    done = _warm_runner(json.dumps({"environ": {"A": 1}, "cwd": "/"}).encode() + b"\n")

    assert 2 == done.returncode
    assert "invalid warm runner order: a warm runner's order needs 'environ', an object of strings" in (
        done.stderr.decode()
    )


def test_po_runner_warm__runs_with_the_orders_environment_only(tmp_path: Path) -> None:
    """Its own environment holds a whole runner's settings; the order's holds none: the runner says which
    are missing, so it read the order's."""
    own = {
        "MODE": "deploy",
        "DEPLOYMENT_ID": "6f1c1d2e-0000-4000-8000-000000000001",
        "DEPLOYMENT_ENV_UUID": "6f1c1d2e-0000-4000-8000-0000000000e1",
        "TOKEN": "a-token",
        "RUNNER_GATEWAY_URL": "http://127.0.0.1:9",
    }
    order = WarmOrder(environ={"PATH": os.environ["PATH"]}, cwd=str(tmp_path))

    done = _warm_runner(order.encode(), **own)

    assert 2 == done.returncode
    message = done.stderr.decode()
    assert "invalid runner environment" in message
    assert all(name in message for name in ("MODE", "DEPLOYMENT_ID", "TOKEN")), message
    assert "a-token" not in message


def test_pool__stderr_files_an_earlier_process_left_are_removed_at_the_first_fill(
    pool: WarmPool, tmp_path: Path
) -> None:
    """A server killed with SIGKILL leaves its idle runners' stderr files (the runners exit, their files
    stay): the next pool removes them before it starts its own."""
    pool.directory.mkdir(mode=0o700)
    stale = [pool.directory / f"{name}.stderr" for name in ("a1", "b2")]
    for path in stale:
        path.write_text("")

    pool.take()
    wait_for(lambda: pool.idle() == 2, 30, "the pool to fill")
    left = sorted(pool.directory.glob("*.stderr"))

    assert not any(path.exists() for path in stale)
    assert 2 == len(left)  # the new runners' own
    pool.close()
