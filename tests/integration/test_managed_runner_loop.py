"""``po-runner managed``'s loop against ``tests/support/managed_standin.py``, a STAND-IN for the managed
runner routes of MANAGED.md's contract (clearly not the real server).

What the real server can be made to do is tested end to end in tests/acceptance/test_managed_runners_e2e.py
(real ``orchestrator serve``, real ``po-runner managed`` processes): a deployment run through the pool,
same-name restarts, a replaced or pruned record, a wrong secret, a server without managed runners, API
outages, tags, two organizations. What stays here needs what the real server cannot be made to give on
demand: a claim whose ``environment`` carries a probe's variables (the child's exact environment and work
directory, any exit code), a heartbeat's 409 for a claim the server dropped while the runner still
heartbeats, every route answering 503 then coming back, and the runner's waits injected
(``ManagedRunner.sleep`` records the backoff; ``tick`` is the heartbeat interval, made short), so that no
test waits for a real backoff or grace.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from orchestrator.managed.client import ManagedClient
from orchestrator.managed.loop import Delays, ManagedRunner
from orchestrator.managed.settings import ManagedSettings
from tests.support.managed_standin import SECRET, ManagedStandin, Queued

NAME = "managed-0"
#: A stand-in for ``po-runner standard``: writes its environment and work directory to PROBE_OUT, sleeps
#: PROBE_SLEEP seconds and exits with PROBE_EXIT.
PROBE = (
    "import json, os, sys, time\n"
    "with open(os.environ['PROBE_OUT'], 'w') as out:\n"
    "    json.dump({'env': dict(os.environ), 'cwd': os.getcwd()}, out)\n"
    "print(json.dumps({'event': 'probe ran', 'level': 'info'}), flush=True)\n"
    "time.sleep(float(os.environ.get('PROBE_SLEEP', '0')))\n"
    "sys.exit(int(os.environ.get('PROBE_EXIT', '0')))\n"
)


@pytest.fixture
def standin() -> Iterator[ManagedStandin]:
    server = ManagedStandin(heartbeat_seconds=1)
    with server.serving():
        yield server


class Waits:
    """The runner's injected waits: ``sleep`` records each backoff or grace and waits 10 ms (or, with
    ``real``, the time asked, at most 5 s); ``tick`` (the heartbeat interval) waits 20 ms. ``on_sleep``
    is called with the number of waits so far."""

    def __init__(self, *, real: bool = False) -> None:
        self.slept: list[float] = []
        self.real = real
        self.on_sleep: Callable[[int], Awaitable[None]] | None = None

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.on_sleep is not None:
            await self.on_sleep(len(self.slept))
        await asyncio.sleep(min(seconds, 5.0) if self.real else 0.01)

    async def tick(self, _seconds: float) -> None:
        await asyncio.sleep(0.02)


def managed_settings(url: str, tmp_path: Path, **values: Any) -> ManagedSettings:
    fields: dict[str, Any] = {
        "runner_url": url,
        "runner_managed_secret": SECRET,
        "runner_name": NAME,
        "runner_work_dir": tmp_path / "work",
        **values,
    }
    return ManagedSettings(**fields)


class Running:
    """A runner serving in the background of the test's event loop."""

    def __init__(self, standin: ManagedStandin, tmp_path: Path, waits: Waits, **values: Any) -> None:
        self.settings = managed_settings(standin.url, tmp_path, **values)
        self.client = ManagedClient(standin.url, timeout_seconds=5.0)
        self.runner = ManagedRunner(
            settings=self.settings,
            client=self.client,
            tags=["linux"],
            argv=[sys.executable, "-c", PROBE],
            sleep=waits.sleep,
            tick=waits.tick,
            rng=random.Random(11),
        )
        self.stop = asyncio.Event()
        self.task: asyncio.Task[int] | None = None

    async def __aenter__(self) -> Running:
        self.settings.runner_work_dir.mkdir(parents=True, exist_ok=True)
        self.task = asyncio.create_task(self.runner.run(self.stop))
        return self

    async def exit_code(self) -> int:
        assert self.task is not None
        return await asyncio.wait_for(self.task, 30)

    async def __aexit__(self, *_exc: object) -> None:
        self.stop.set()
        if self.task is not None and not self.task.done():
            await asyncio.wait_for(self.task, 30)
        await self.client.aclose()


async def until(condition: Callable[[], bool], what: str, within: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.01)


def probe(tmp_path: Path, deployment: str, **env: str) -> Queued:
    environment = {
        "DEPLOYMENT_ID": deployment,
        "TOKEN": f"token-of-{deployment}",
        "MODE": "deploy",
        "ORG_ID": "org-a",
        "RUNNER_ID": "managed",
        "PROBE_OUT": str(tmp_path / f"{deployment}.json"),
        **env,
    }
    return Queued(id=deployment, environment=environment)


def removed(directory: str) -> bool:
    return not Path(directory).exists()


def probed(tmp_path: Path, deployment: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((tmp_path / f"{deployment}.json").read_text())
    return result


async def test_loop__registers_claims_runs_in_a_fresh_work_dir_and_reports_the_exit_code(
    standin: ManagedStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # the runner's own: never passed on
    monkeypatch.setenv("RUNNER_MANAGED_SECRET", SECRET)
    standin.enqueue(probe(tmp_path, "d-1", PROBE_SLEEP="0.4", PROBE_EXIT="3"))

    with capture_logs() as logged:
        async with Running(standin, tmp_path, Waits()) as running:
            await until(lambda: "d-1" in standin.finished, "the exit code reported")

    seen = probed(tmp_path, "d-1")
    assert 3 == standin.finished["d-1"]
    assert {
        "DEPLOYMENT_ID",
        "TOKEN",
        "MODE",
        "ORG_ID",
        "RUNNER_ID",
        "PROBE_OUT",
        "PROBE_SLEEP",
        "PROBE_EXIT",
        "RUNNER_GATEWAY_URL",
        "PATH",
        "HOME",
        "TMPDIR",
        "IAC_CODE_DIR",
    } == set(seen["env"]) - {"LC_CTYPE"}  # LC_CTYPE: Python's own C-locale coercion in the child
    assert f"{standin.url}/runner-gateway" == seen["env"]["RUNNER_GATEWAY_URL"]
    assert seen["env"]["HOME"].startswith(seen["cwd"]) and seen["cwd"].startswith(str(tmp_path / "work"))
    assert removed(seen["cwd"]), "the work directory is removed after the run"
    assert SECRET not in json.dumps(seen)
    heartbeats = [call.body for call in standin.calls if call.route == "heartbeat" and call.status == 200]
    assert {"deploymentId": "d-1"} in heartbeats, "heartbeats carry the running deployment"
    assert [{"name": NAME, "tags": ["linux"]}] == [c.body for c in standin.calls if c.route == "register"]
    assert {"waitSeconds": 25} == next(c.body for c in standin.calls if c.route == "claim")
    assert 0 == await running.exit_code()
    events = [entry["event"] for entry in logged]
    assert {"registered", "deployment claimed", "po-runner exited", "exit code reported"} <= set(events)
    assert SECRET not in repr(logged)


async def test_loop__registering_again_mid_run_stops_the_deployment_and_reports_nothing(
    standin: ManagedStandin, tmp_path: Path
) -> None:
    standin.enqueue(probe(tmp_path, "d-3", PROBE_SLEEP="60"))

    async with Running(standin, tmp_path, Waits()) as running:
        await until(lambda: (tmp_path / "d-3.json").exists(), "the deployment running")
        standin.revoke(NAME)  # the record is gone: its claim with it
        await until(lambda: running.runner.registrations == 2, "registered again")
        await until(lambda: running.runner._deployment is None, "the run ended")

    assert "d-3" not in standin.finished
    assert removed(probed(tmp_path, "d-3")["cwd"])
    assert 2 == standin.registrations


async def test_loop__a_claim_the_server_dropped_stops_the_deployment(
    standin: ManagedStandin, tmp_path: Path
) -> None:
    standin.enqueue(probe(tmp_path, "d-4", PROBE_SLEEP="60"))

    async with Running(standin, tmp_path, Waits()) as running:
        await until(lambda: (tmp_path / "d-4.json").exists(), "the deployment running")
        standin.drop_claim(NAME)  # its lease ran out
        await until(lambda: running.runner._deployment is None, "the run ended")

    assert "d-4" not in standin.finished
    assert any(call.route == "heartbeat" and call.status == 409 for call in standin.calls)
    assert 1 == standin.registrations


async def test_loop__backs_off_while_the_server_is_down_and_recovers(
    standin: ManagedStandin, tmp_path: Path
) -> None:
    standin.stop()  # connections refused from the start
    waits = Waits()

    async def back_after_four(count: int) -> None:
        if count == 4:
            await asyncio.to_thread(standin.start)  # on the same port

    waits.on_sleep = back_after_four
    standin.enqueue(probe(tmp_path, "d-5"))

    async with Running(standin, tmp_path, waits):
        await until(lambda: "d-5" in standin.finished, "the deployment run after the outage")
        down = list(waits.slept)
        standin.outage = 503
        await until(lambda: len(waits.slept) >= len(down) + 3, "three more failures")
        standin.outage = 429
        await until(lambda: len(waits.slept) >= len(down) + 4, "a 429 retried too")
        standin.outage = None
        standin.enqueue(probe(tmp_path, "d-6"))
        await until(lambda: "d-6" in standin.finished, "recovered again")

    ceilings = [Delays().ceiling(n) for n in range(1, 5)]
    assert 4 == len(down)
    assert all(2.0 <= wait <= ceiling for wait, ceiling in zip(down, ceilings, strict=True)), down
    again = waits.slept[len(down) : len(down) + 4]
    assert 2.0 == again[0], "a success resets the backoff"
    assert all(2.0 <= wait <= ceiling for wait, ceiling in zip(again, ceilings, strict=True)), again
    assert 1 == standin.registrations


async def test_stop__the_running_deployment_finishes_within_the_grace(
    standin: ManagedStandin, tmp_path: Path
) -> None:
    standin.enqueue(probe(tmp_path, "d-7", PROBE_SLEEP="0.5"))

    async with Running(standin, tmp_path, Waits(real=True), runner_stop_grace_seconds=30) as running:
        await until(lambda: (tmp_path / "d-7.json").exists(), "the deployment running")
        running.stop.set()
        exit_code = await running.exit_code()

    assert 0 == exit_code
    assert 0 == standin.finished["d-7"]
    claims = [call for call in standin.calls if call.route == "claim" and call.status == 200]
    assert 1 == len(claims)


async def test_stop__after_the_grace_po_runner_gets_sigterm_and_its_code_is_reported(
    standin: ManagedStandin, tmp_path: Path
) -> None:
    standin.enqueue(probe(tmp_path, "d-8", PROBE_SLEEP="60"))
    waits = Waits()

    async with Running(standin, tmp_path, waits, runner_stop_grace_seconds=7) as running:
        await until(lambda: (tmp_path / "d-8.json").exists(), "the deployment running")
        running.stop.set()
        exit_code = await running.exit_code()

    assert 0 == exit_code
    assert 143 == standin.finished["d-8"], "128 + SIGTERM"
    assert 7 == waits.slept[0]
    assert removed(probed(tmp_path, "d-8")["cwd"])


def run_cli(env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.runner", "managed"],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_cli__missing_or_invalid_settings_exit_2_naming_them() -> None:
    missing = run_cli({})
    wrong = run_cli({"RUNNER_URL": "po", "RUNNER_MANAGED_SECRET": "short-secret", "RUNNER_NAME": "m-0"})

    assert 2 == missing.returncode
    for name in ("RUNNER_URL", "RUNNER_MANAGED_SECRET", "RUNNER_NAME"):
        assert name in missing.stderr
    assert 2 == wrong.returncode
    assert "RUNNER_URL" in wrong.stderr and "at least 48 characters (it has 12)" in wrong.stderr
    assert "short-secret" not in wrong.stderr


async def test_stop__a_second_signal_stops_po_runner_at_once(standin: ManagedStandin, tmp_path: Path) -> None:
    standin.enqueue(probe(tmp_path, "d-10", PROBE_SLEEP="60"))
    waits = Waits(real=True)

    async with Running(standin, tmp_path, waits, runner_stop_grace_seconds=3600) as running:
        await until(lambda: (tmp_path / "d-10.json").exists(), "the deployment running")
        running.stop.set()
        await until(lambda: 3600 in waits.slept, "the grace begun")
        running.runner.hurry.set()
        exit_code = await running.exit_code()

    assert 0 == exit_code
    assert 143 == standin.finished["d-10"]


async def test_cancel__a_heartbeat_saying_cancel_sigterms_po_runner_and_reports_its_code(
    standin: ManagedStandin, tmp_path: Path
) -> None:
    """The orchestrator answers a heartbeat ``cancel: true`` (the deployment was cancelled): po-runner gets
    SIGTERM at once (no stop grace), the kill grace is the answer's, and the exit code is reported."""
    standin.enqueue(probe(tmp_path, "d-c", PROBE_SLEEP="60"))
    waits = Waits()

    async with Running(standin, tmp_path, waits) as running:
        await until(lambda: (tmp_path / "d-c.json").exists(), "the deployment running")
        standin.cancelled["d-c"] = 12
        await until(lambda: "d-c" in standin.finished, "the exit code reported")
        running.stop.set()
        exit_code = await running.exit_code()

    assert 0 == exit_code
    assert 143 == standin.finished["d-c"], "128 + SIGTERM"
    assert 12 in waits.slept
    assert removed(probed(tmp_path, "d-c")["cwd"])
