"""Fault injection: deployments in several environments at once while the orchestrator server is killed
(``kill -9``) or stopped (SIGTERM) for 1-60 s, runners are killed, or the agent is killed and its command
leases run out; after each round every check of ``tests.support.fault_workload`` must hold.

Randomized: the seed is printed (``PO_FAULT_SEED=...``) and replays the fault schedule (which fault,
when, how long; the interleaving with the deployments depends on timing). ``PO_FAULT_DEPLOYMENTS`` sets
the size (default 12: the whole suite takes a few minutes for both databases on a 2-core machine; 100 for
the full run). Run it:

    PO_TEST_DATABASES=sqlite,postgresql scripts/test tests/faults -m faults -s
"""

from __future__ import annotations

import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.protocol import agent_auth
from tests.support.agent_process import AgentProcess
from tests.support.fault_workload import BEFORE_APPLY, PHASES, History, Workload, local_runner, outage_seconds
from tests.support.outages import ServerProcess, run_processes, zygote_of

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(1800)]

#: Deployments of the server round; the runner and agent rounds take half as many each.
DEPLOYMENTS = int(os.environ.get("PO_FAULT_DEPLOYMENTS") or 8)
ENVS = ["dev", "stage", "prod"]
#: Command leases of the agent round: short, so that they run out while the agent is down.
AGENT_LEASE_SECONDS = 3

#: Read at import: tests/conftest.py clears every PO_ variable but PO_TEST_* before each test.
FIXED_SEED = os.environ.get("PO_FAULT_SEED")


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    value = int(FIXED_SEED) if FIXED_SEED else random.SystemRandom().randrange(1, 2**31)
    _say(request, f"{request.node.name}: PO_FAULT_SEED={value}")
    return value


def _say(request: pytest.FixtureRequest, line: str) -> None:
    """A line on the terminal whether or not output is captured (the seed must always be seen)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None:  # pragma: no cover - capture plugin disabled
        print(line, flush=True)
        return
    with capture.global_and_fixture_disabled():
        print(line, flush=True)


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    made = ServerProcess(
        database_url,
        tmp_path / "data",
        PO_AGENT_LEASE_SECONDS=str(AGENT_LEASE_SECONDS),
        PO_AGENT_FETCH_WAIT_SECONDS="5",
    )
    made.start()
    yield made
    made.stop()


def _with_faults(
    workload: Workload, deployments: int, prefix: str, inject: Callable[[threading.Event], None]
) -> None:
    """Run the deployments while ``inject`` runs its faults (until told to stop)."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def faults() -> None:
        try:
            inject(stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=faults, daemon=True)
    thread.start()
    failure: BaseException | None = None
    try:
        workload.run_envs(deployments, prefix=prefix)
    except BaseException as exc:
        failure = exc
    finally:
        stop.set()
        thread.join()
    # A fault that went wrong (a server that did not start again) explains the deployments' failure.
    if errors:
        raise errors[0] from failure
    if failure is not None:
        raise failure


def test_faults__server_killed_and_stopped(
    server: ServerProcess, tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(seed)
    runs = tmp_path / "runs"
    workload = Workload(server=server, work=tmp_path, envs=ENVS, runner=local_runner(tmp_path, runs))
    # One of the first two outages lasts 30-45 s, far longer than Terraform's own default retries (3 s).
    long_at = rng.randrange(2)
    longest = 60.0 if DEPLOYMENTS >= 50 else 20.0
    done: list[str] = []

    def inject(stop: threading.Event) -> None:
        # Up a while after each restart (runners catch up: their retries wait up to 10 s), then aim at a
        # phase of some deployment, and strike after a random moment of it.
        while not stop.wait(rng.uniform(1.0, 5.0)):
            target = rng.choice(PHASES)
            delay = rng.uniform(0.0, 1.5)
            how = rng.choice([signal.SIGKILL, signal.SIGTERM])
            outage = rng.uniform(30.0, 45.0) if len(done) == long_at else outage_seconds(rng, longest=longest)
            if not workload.reach(target, stop) or stop.wait(delay):
                continue
            phases = workload.phases()
            server.kill() if how is signal.SIGKILL else server.terminate()
            time.sleep(outage)
            server.start()
            done.append(f"{how.name} for {outage:.1f} s; deployments: {workload.summary(phases)}")

    _with_faults(workload, DEPLOYMENTS, "s", inject)
    outcomes = workload.check(seed, runs_dirs=[runs])
    workload.stack.client.close()

    _say(request, f"  {len(done)} server outages, deployments {outcomes}")
    for line in done:
        _say(request, f"    {line}")
    assert done, f"no fault was injected (PO_FAULT_SEED={seed})"


def test_faults__runners_killed(
    server: ServerProcess, tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(seed)
    runs = tmp_path / "runs"
    workload = Workload(server=server, work=tmp_path, envs=ENVS, runner=local_runner(tmp_path, runs))
    done: list[str] = []

    def inject(stop: threading.Event) -> None:
        while not stop.wait(rng.uniform(0.5, 3.0)):
            candidates = sorted(
                (r for r in workload.executing() if (runs / str(r.id) / "runner.pid").exists()),
                key=lambda r: r.label,
            )
            if not candidates:
                continue
            victim = rng.choice(candidates)
            alive = run_processes(runs / str(victim.id))
            pid = int((runs / str(victim.id) / "runner.pid").read_text().split(":")[2])
            if pid not in alive:
                continue
            phase = History.read(workload.history).phase(victim.label)
            os.kill(pid, signal.SIGKILL)
            done.append(f"runner of {victim.label} killed, at: {phase}")

    _with_faults(workload, math.ceil(DEPLOYMENTS / 2), "r", inject)
    outcomes = workload.check(seed, runs_dirs=[runs])
    workload.stack.client.close()

    _say(request, f"  {len(done)} runners killed, deployments {outcomes}")
    for line in done:
        _say(request, f"    {line}")


def test_faults__zygote_killed(
    server: ServerProcess, tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    """The zygote the local runs are forked from (``PO_LOCAL_ZYGOTE``, on by default) killed at random
    moments, a fork in flight or not: the runs it forked go on and report, the next runs start (forked from
    a new zygote, or as a cold runner while none answers), and every deployment succeeds, once."""
    rng = random.Random(seed)
    runs = tmp_path / "runs"
    workload = Workload(server=server, work=tmp_path, envs=ENVS, runner=local_runner(tmp_path, runs))
    done: list[str] = []

    def inject(stop: threading.Event) -> None:
        while not stop.wait(rng.uniform(0.3, 3.0)):
            pid = zygote_of(server)
            if pid is None:
                continue
            phases = workload.phases()
            os.kill(pid, signal.SIGKILL)
            done.append(f"zygote {pid} killed; deployments: {workload.summary(phases)}")

    _with_faults(workload, math.ceil(DEPLOYMENTS / 2), "z", inject)
    outcomes = workload.check(seed, runs_dirs=[runs])
    workload.stack.client.close()

    _say(request, f"  zygote killed {len(done)} times, deployments {outcomes}")
    for line in done:
        _say(request, f"    {line}")
    assert done, f"the zygote was never killed (PO_FAULT_SEED={seed})"
    # Its death is none of its runs': nothing failed.
    assert {"succeeded": math.ceil(DEPLOYMENTS / 2)} == outcomes, f"PO_FAULT_SEED={seed}"


def test_faults__agent_killed_while_its_leases_run_out(
    server: ServerProcess, tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(seed)
    private_pem, public_pem = agent_auth.generate_key_pair()
    runner = local_runner(tmp_path, tmp_path / "unused")
    del runner["runner_configuration"]["job"]["work_dir"]
    runner["runner_configuration"]["connection"] = {"type": "agent", "key": public_pem}
    agent = AgentProcess(server.url, private_pem, tmp_path).start()
    workload = Workload(server=server, work=tmp_path, envs=ENVS, runner=runner)
    done: list[str] = []

    def delivering() -> bool:
        """A deployment whose run the agent has not started yet: its command is queued or delivered."""
        history = History.read(workload.history)
        return any(
            history.phase(r.label) == BEFORE_APPLY and not (agent.runs_dir / str(r.id)).exists()
            for r in workload.executing()
        )

    def inject(stop: threading.Event) -> None:
        while not stop.wait(rng.uniform(0.3, 3.0)):
            # Half of the kills aim at a delivery (between the command's delivery and its ack, the lease
            # then runs out and the command comes again), the others strike at any moment.
            aimed = rng.random() < 0.5
            delay = rng.uniform(0.0, 0.3)
            down = rng.uniform(0.5, 3 * AGENT_LEASE_SECONDS)
            if aimed:
                deadline = time.monotonic() + 20
                while not delivering() and time.monotonic() < deadline and not stop.is_set():
                    time.sleep(0.02)
            if stop.wait(delay):
                return
            phases = workload.phases()
            agent.kill()
            time.sleep(down)
            agent.start()
            what = "at a delivery" if aimed else "at a random moment"
            done.append(f"agent killed {what} for {down:.1f} s; deployments: {workload.summary(phases)}")

    try:
        _with_faults(workload, math.ceil(DEPLOYMENTS / 2), "a", inject)
        outcomes = workload.check(seed, runs_dirs=[agent.runs_dir])
    finally:
        agent.stop()
        workload.stack.client.close()

    _say(request, f"  agent killed {len(done)} times, deployments {outcomes}")
    for line in done:
        _say(request, f"    {line}")
