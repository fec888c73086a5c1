"""Replicas under load (issue 25): three ``orchestrator serve`` on one PostgreSQL and one S3-compatible object
store (moto), behind one address (a round-robin front), take a burst of deployments; one replica is killed
(``kill -9``) in the middle of it, while it holds dispatch leases, then another is stopped (SIGTERM). The
third carries on alone; the two come back for the checks.

The deployments spread over three kinds of runner, each talking to the front only: local ``vm`` runs (the
replicas launch them; a dead replica's runs live on and the others check them), an agent (``po-runner
remote``) and two managed runners (``po-runner managed``). Every deployment has an environment of its own
and runs the fault suite's history module (tests/support/fault_workload.py), whose resources leave a trace
of every creation and destruction, so the checks know what Terraform did, whoever launched it:

- every deployment ends, succeeded; the API lists exactly one per environment (nothing lost, none doubled);
- every deployment created its resources exactly once (none ran twice);
- every environment's stored state holds exactly the resources its deployment created, and a plan of each
  adds nothing; no state lock is held; no process is left in any runs directory;
- the leases the killed replica held are taken over once they run out (``PO_DISPATCH_LEASE_SECONDS``).

Each deployment's fate is printed: its runner, its status, how long it took, how often it ran, where it
was at each fault (pending, leased by the victim, before/in/after its apply, ended), and when a lease of
the dead replica was taken over. ``PO_FAULT_DEPLOYMENTS`` sets the size (default 24; 200 for the issue's
full run), ``PO_FAULT_SEED`` replays the choice of victims and moments:

    PO_FAULT_DEPLOYMENTS=200 scripts/test tests/faults/test_replicas.py -s -n 0
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.protocol import age, agent_auth
from tests.support.agent_process import AgentProcess
from tests.support.emulators import emulator_or_skip, start_moto
from tests.support.fault_workload import COUNT, History, local_runner, module_code, processes_in
from tests.support.managed import MANAGED_SECRET, RunnerProcess
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.outages import StoredState, resource_ids
from tests.support.postgres import PostgresServer
from tests.support.replicas import (
    FINAL,
    DispatchRow,
    DispatchView,
    Replicas,
    owner_prefix,
    s3_object_count,
    s3_object_store,
)
from tests.support.stack import build_stack, demo_manifest

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(3600)]

DEPLOYMENTS = int(os.environ.get("PO_FAULT_DEPLOYMENTS") or 24)
REPLICAS = 3
#: The template database the session's PostgreSQL fixture migrated (tests/conftest.py).
TEMPLATE_DB = "po_template"
#: The dispatcher's lease: a dead replica's claims are taken over this long after they were made.
LEASE_SECONDS = 15
#: Of every six environments: four deploy on the local runner, one through the agent, one on the pool.
KINDS = ("local", "local", "local", "local", "agent", "managed")
ENV_TYPES = {"local": "development", "agent": "agent", "managed": "managed"}
MANAGED_RUNNERS = 2
CREATE_CONCURRENCY = 8
BURST_TIMEOUT_SECONDS = 300 + 6 * DEPLOYMENTS

#: Read at import: tests/conftest.py clears every PO_ variable but PO_TEST_* before each test.
FIXED_SEED = os.environ.get("PO_FAULT_SEED")


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    value = int(FIXED_SEED) if FIXED_SEED else random.SystemRandom().randrange(1, 2**31)
    _say(request, f"{request.node.name}: PO_FAULT_SEED={value}")
    return value


def _say(request: pytest.FixtureRequest, line: str) -> None:
    """A line on the terminal whether or not output is captured."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None:  # pragma: no cover - capture plugin disabled
        print(line, flush=True)
        return
    with capture.global_and_fixture_disabled():
        print(line, flush=True)


@pytest.fixture
def database_url(postgres_server: PostgresServer) -> str:
    """A fresh migrated PostgreSQL database (replicas need PostgreSQL, whatever PO_TEST_DATABASES says)."""
    name = f"replicas_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    postgres_server.create_database(name, template=TEMPLATE_DB)
    return postgres_server.url(name)


@dataclass
class Record:
    """One deployment of the burst: its environment, runner kind and what became of it."""

    env: str
    kind: str
    label: str
    id: str | None = None
    final: dict[str, Any] | None = None
    #: Seconds from the kill until a lease the killed replica held on it was taken over.
    taken_over_after: float | None = None
    leased_by_victim: bool = False


@dataclass
class Burst:
    """The organization, its environments and the deployments of the burst, through the front."""

    url: str
    token: str
    work: Path
    records: list[Record]
    env_uuids: dict[str, str]
    history: Path
    creates_5xx: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self) -> httpx.Client:
        """A client of its own connection per request (so the front spreads them over the replicas)."""
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def call(
        self, client: httpx.Client, method: str, path: str, *, deadline: float, **kw: Any
    ) -> httpx.Response:
        """One request through outages: a cut connection or no replica answering is tried again."""
        while True:
            try:
                return client.request(method, path, **kw)
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def create(self, client: httpx.Client, record: Record, *, plan_only: bool = False) -> str:
        _, recipient = age.generate_identity()
        body = {
            "project_id": "shop",
            "env_id": record.env,
            "mode": "deploy",
            "manifest": demo_manifest(record.label),
            "plan_only": plan_only,
            "encrypted_outputs_recipient": recipient,
            "encrypted_logs_recipient": recipient,
        }
        key = f"{self.work.name}-{record.label}-{'plan' if plan_only else 'deploy'}"
        deadline = time.monotonic() + 300
        while True:
            answer = self.call(
                client,
                "POST",
                "/orgs/acme/deployments",
                json=body,
                headers={"Idempotency-Key": key},
                deadline=deadline,
            )
            if answer.status_code in (200, 201):
                deployment_id: str = answer.json()["id"]
                return deployment_id
            if answer.status_code >= 500 and answer.status_code != 503:
                # Never expected (a replica dying cuts its connections, it answers nothing): a problem,
                # reported with the fates; the create is tried again meanwhile.
                with self._lock:
                    self.creates_5xx.append(f"{record.label}: {answer.status_code} {answer.text[:200]}")
            else:
                # 503: a replica starting or stopping; 409: the environment's deployment still executes.
                assert answer.status_code in (409, 503), (record.label, answer.status_code, answer.text)
            assert time.monotonic() < deadline, (record.label, answer.text)
            time.sleep(0.5)

    def create_all(self) -> None:
        queue = iter(self.records)
        lock = threading.Lock()
        failures: list[BaseException] = []

        def worker() -> None:
            try:
                with self.client() as client:
                    while True:
                        with lock:
                            record = next(queue, None)
                        if record is None:
                            return
                        record.id = self.create(client, record)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(CREATE_CONCURRENCY)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]

    def listed(self, client: httpx.Client, deadline: float) -> list[dict[str, Any]]:
        """Every deployment of project shop, as the list answers (one page at a time)."""
        items: list[dict[str, Any]] = []
        page: str | None = None
        while True:
            params: dict[str, Any] = {"project_id": "shop", "per_page": 1000}
            if page:
                params["page"] = page
            answer = self.call(client, "GET", "/orgs/acme/deployments", params=params, deadline=deadline)
            if answer.status_code == 503:
                time.sleep(0.5)
                continue
            assert answer.status_code == 200, answer.text
            items += answer.json()["items"]
            page = answer.json().get("next_page_token")
            if not page:
                return items

    def wait_all(self, timeout_seconds: float) -> None:
        deadline = time.monotonic() + timeout_seconds
        by_id = {record.id: record for record in self.records if record.id}
        with self.client() as client:
            while time.monotonic() < deadline:
                for item in self.listed(client, deadline):
                    record = by_id.get(item["id"])
                    if record is not None and item["status"] in FINAL and record.final is None:
                        record.final = item
                if all(record.final is not None for record in self.records):
                    return
                time.sleep(1.0)

    def wait_one(
        self, client: httpx.Client, deployment_id: str, timeout_seconds: float = 300
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_seconds
        while True:
            answer = self.call(client, "GET", f"/orgs/acme/deployments/{deployment_id}", deadline=deadline)
            if answer.status_code == 200 and answer.json()["status"] in FINAL:
                final: dict[str, Any] = answer.json()
                return final
            assert time.monotonic() < deadline, f"{deployment_id} did not end: {answer.text}"
            time.sleep(0.5)

    def where(self, rows: dict[str, DispatchRow], names: dict[str, str]) -> dict[str, str]:
        """Per label: where its deployment is now (not created yet, pending, queued, leased by which replica,
        before/in/after its apply, ended)."""
        history = History.read(self.history)
        found: dict[str, str] = {}
        for record in self.records:
            row = rows.get(record.id or "")
            if row is None:
                found[record.label] = "not created"
                continue
            if row.status != "executing":
                found[record.label] = f"ended ({row.status})"
                continue
            leased = next(
                (name for prefix, name in names.items() if (row.owner or "").startswith(prefix)), None
            )
            if row.dispatch_state == "launched":
                phase = history.phase(record.label)
                short = {"apply": "in apply"}.get(phase, phase.split(" (")[0])
                found[record.label] = f"launched, {short}" + (f", checked by {leased}" if leased else "")
            else:
                found[record.label] = row.dispatch_state + (f", leased by {leased}" if leased else "")
        return found


def _set_up(url: str, work: Path, runs: Path, agent_public_pem: str) -> Burst:
    stack = build_stack(url, work, runner=local_runner(work, runs))
    client = stack.client
    history = work / "history"
    patched = client.patch(
        "/orgs/acme/modules/demo-app", json={"module_source_code": module_code(history, sleep_seconds=1.0)}
    )
    assert 200 == patched.status_code, patched.text
    agent_runner = local_runner(work, work / "unused")
    del agent_runner["runner_configuration"]["job"]["work_dir"]
    agent_runner["runner_configuration"]["connection"] = {"type": "agent", "key": agent_public_pem}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}) as admin:
        made = admin.post("/orgs/acme/runners", json={"id": "agent", **agent_runner})
        assert 201 == made.status_code, made.text
    for path, body in [
        ("/env-types", {"id": "agent"}),
        ("/env-types", {"id": "managed"}),
        ("/runner-rules", {"runner_id": "agent", "env_type_id": "agent"}),
        ("/runner-rules", {"runner_id": "managed", "env_type_id": "managed"}),
    ]:
        answer = client.post(f"/orgs/acme{path}", json=body)
        assert 201 == answer.status_code, (path, answer.text)
    records = []
    env_uuids: dict[str, str] = {}
    for n in range(DEPLOYMENTS):
        env, kind = f"e{n:03d}", KINDS[n % len(KINDS)]
        answer = client.post(
            "/orgs/acme/projects/shop/envs", json={"id": env, "env_type_id": ENV_TYPES[kind]}
        )
        assert 201 == answer.status_code, answer.text
        env_uuids[env] = str(client.get(f"/orgs/acme/projects/shop/envs/{env}").json()["uuid"])
        records.append(Record(env=env, kind=kind, label=f"b-{env}"))
    token = client.headers["Authorization"].removeprefix("Bearer ")
    client.close()
    return Burst(url=url, token=token, work=work, records=records, env_uuids=env_uuids, history=history)


@dataclass
class Fault:
    """A replica killed or stopped: when (wall clock), where each deployment was then, the dispatch leases
    the replica held at its death and when each was taken over."""

    name: str
    at: float
    where: dict[str, str]
    leases: dict[str, DispatchRow] = field(default_factory=dict)
    takeover: dict[str, float | None] = field(default_factory=dict)


def test_replicas__burst_with_a_replica_killed_and_another_stopped(
    database_url: str, tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(seed)
    moto = emulator_or_skip(start_moto, tmp_path / "moto")
    runs = tmp_path / "runs"
    private_pem, public_pem = agent_auth.generate_key_pair()
    faults: list[Fault] = []
    with contextlib.ExitStack() as stack:
        stack.callback(moto.stop)
        replicas = Replicas(
            REPLICAS,
            database_url,
            tmp_path,
            environment={
                **s3_object_store(moto.url, "po-replicas"),
                "MANAGED_RUNNER_SECRET": MANAGED_SECRET,
                "PO_MANAGED_HEARTBEAT_SECONDS": "2",
                "PO_MANAGED_LEASE_SECONDS": "20",
                "PO_AGENT_LEASE_SECONDS": "5",
                "PO_AGENT_FETCH_WAIT_SECONDS": "5",
                "PO_DISPATCH_LEASE_SECONDS": str(LEASE_SECONDS),
            },
        )
        stack.enter_context(replicas)
        names = {owner_prefix(server): replicas.name(server) for server in replicas.servers}
        burst = _set_up(replicas.url, tmp_path, runs, public_pem)
        agent = AgentProcess(replicas.url, private_pem, tmp_path)
        agent.env["RUNNER_ID"] = "agent"
        agent.start()
        stack.callback(agent.stop)
        pool = []
        for n in range(MANAGED_RUNNERS):
            runner = RunnerProcess(
                replicas.url,
                f"pool-{n}",
                tmp_path,
                RUNNER_RUN_UIDS="",  # as the test's user: the history file is in tmp_path (0700)
                PYTHONPATH=os.environ.get("PYTHONPATH", ""),
            )
            pool.append(runner.start())
            stack.callback(runner.stop)
            if os.geteuid() == 0:
                stack.callback(shutil.rmtree, runner.work_dir.parent, True)
        view = stack.enter_context(DispatchView(database_url))
        view_for_takeover = stack.enter_context(DispatchView(database_url))

        victim, stopped = rng.sample(replicas.servers, 2)
        stop = threading.Event()
        errors: list[BaseException] = []

        def inject() -> None:
            try:
                # kill -9 in the middle: once a quarter of the burst has ended, at a moment the victim
                # holds dispatch leases (it is launching deployments, or checking on their runs).
                while not stop.wait(0.2):
                    ended = sum(row.status != "executing" for row in view.all().values())
                    if ended >= max(1, DEPLOYMENTS // 4):
                        break
                if stop.is_set():
                    return
                view.wait_held_by(owner_prefix(victim), timeout_seconds=30)
                prefix = owner_prefix(victim)
                victim.kill()
                killed_at = time.monotonic()
                rows = view.all()
                kill = Fault(f"kill -9 of {replicas.name(victim)}", time.time(), burst.where(rows, names))
                kill.leases = view.held_by(prefix)
                faults.append(kill)
                watcher = threading.Thread(
                    target=lambda: kill.takeover.update(
                        view_for_takeover.watch_takeover(
                            prefix, kill.leases, since=killed_at, timeout_seconds=LEASE_SECONDS + 60
                        )
                    ),
                    daemon=True,
                )
                watcher.start()
                # Soon: with the fork server and the engine session a burst's last three quarters end in
                # a few seconds (the SIGTERM came after the burst when it waited 3-8 s).
                if stop.wait(rng.uniform(0.0, 0.5)):
                    watcher.join()
                    return
                term = Fault(
                    f"SIGTERM of {replicas.name(stopped)}", time.time(), burst.where(view.all(), names)
                )
                stopped.terminate()
                faults.append(term)
                watcher.join()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=inject, daemon=True)
        started = time.monotonic()
        thread.start()
        try:
            burst.create_all()
            burst.wait_all(BURST_TIMEOUT_SECONDS)
        finally:
            stop.set()
            thread.join()
        burst_seconds = time.monotonic() - started
        if errors:
            raise errors[0]

        # The two come back (a killed replica restarts on the same database), for the checks.
        for server in (victim, stopped):
            server.start()
        outcome = _check(burst, replicas, faults, [runs, agent.runs_dir, *(r.work_dir for r in pool)])
        objects = s3_object_count(moto.url, "po-replicas")

    _report(request, burst, replicas, faults, outcome, burst_seconds, objects)
    assert len(faults) == 2, f"the faults were not both injected (PO_FAULT_SEED={seed})"
    assert outcome.problems == [], f"{outcome.problems} (PO_FAULT_SEED={seed})"


@dataclass
class Outcome:
    problems: list[str] = field(default_factory=list)
    runs: dict[str, int] = field(default_factory=dict)


def _check(burst: Burst, replicas: Replicas, faults: list[Fault], runs_dirs: list[Path]) -> Outcome:
    """Every check of the module docstring; the problems found (reported with the fates, then asserted)."""
    outcome = Outcome()
    for fault in faults:
        for deployment_id, seconds in fault.takeover.items():
            record = next((r for r in burst.records if r.id == deployment_id), None)
            if record is not None:
                record.leased_by_victim = True
                record.taken_over_after = seconds
            if seconds is None:
                outcome.problems.append(f"{deployment_id}: the dead replica's lease was never taken over")
    outcome.problems += [f"a create answered {answer}" for answer in burst.creates_5xx]
    _check_records(burst, replicas, outcome)
    with burst.client() as client:
        _check_listed_and_planned(burst, client, outcome.problems)
    deadline = time.monotonic() + 30
    while (left := processes_in(runs_dirs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        outcome.problems.append(f"processes left running: {left}")
    return outcome


def _check_records(burst: Burst, replicas: Replicas, outcome: Outcome) -> None:
    """Each deployment succeeded, ran once, and its environment's state holds what it created, unlocked."""
    problems = outcome.problems
    history = History.read(burst.history)
    stored = StoredState(replicas.database_url, replicas.servers[0].key())
    for record in burst.records:
        if record.final is None:
            problems.append(f"{record.label} ({record.kind}) never ended")
        elif record.final["status"] != "succeeded":
            problems.append(
                f"{record.label} ({record.kind}) {record.final['status']}: {record.final['status_message']}"
            )
        created, started = history.created.get(record.label, []), history.started.get(record.label, [])
        outcome.runs[record.label] = len(started) // COUNT
        if len(created) != COUNT or len(started) != COUNT:
            problems.append(
                f"{record.label}: created {len(created)}, started {len(started)} (expected {COUNT})"
            )
        in_state = set(resource_ids(stored.latest(burst.env_uuids[record.env])).values())
        if in_state != set(created):
            problems.append(
                f"{record.label}: state holds {sorted(in_state)}, the deployment created {created}"
            )
        if stored.lock(burst.env_uuids[record.env]) is not None:
            problems.append(f"{record.label}: the state lock of {record.env} is held")


def _check_listed_and_planned(burst: Burst, client: httpx.Client, problems: list[str]) -> None:
    """The API lists one deployment per environment; a plan of each adds nothing."""
    per_env = Counter(item["env_id"] for item in burst.listed(client, time.monotonic() + 120))
    doubled = {env: n for env, n in per_env.items() if n != 1}
    if doubled or len(per_env) != len(burst.records):
        problems.append(f"deployments per environment not one each: {doubled}, {len(per_env)} environments")
    plans = {record.label: burst.create(client, record, plan_only=True) for record in burst.records}
    for record in burst.records:
        planned = burst.wait_one(client, plans[record.label])
        if planned["status"] != "succeeded":
            problems.append(f"{record.label}: the plan {planned['status']}: {planned['status_message']}")
        elif planned["metrics"]["num_tf_resources_added"] != 0:
            problems.append(f"{record.label}: the plan adds {planned['metrics']}")


def _report(
    request: pytest.FixtureRequest,
    burst: Burst,
    replicas: Replicas,
    faults: list[Fault],
    outcome: Outcome,
    burst_seconds: float,
    objects: int,
) -> None:
    def say(line: str) -> None:
        _say(request, line)

    statuses = Counter((r.kind, (r.final or {}).get("status", "never ended")) for r in burst.records)
    say(
        f"  {len(burst.records)} deployments on {REPLICAS} replicas in {burst_seconds:.0f} s: "
        + ", ".join(f"{kind} {status} {n}" for (kind, status), n in sorted(statuses.items()))
    )
    ports = {server.port: replicas.name(server) for server in replicas.servers}
    say(
        "  connections through the front: "
        + ", ".join(f"{ports[p]} {n}" for p, n in sorted(replicas.front.connections.items()))
        + f"; refused {sum(replicas.front.refused.values())}, dropped {replicas.front.dropped}"
        + f"; objects in the store {objects}"
    )
    for fault in faults:
        counted = Counter(fault.where.values())
        say(f"  {fault.name}: " + ", ".join(f"{n} {where}" for where, n in counted.most_common()))
        if fault.leases:
            taken = [s for s in fault.takeover.values() if s is not None]
            say(
                f"    {len(fault.leases)} leases held, taken over after "
                + (f"{min(taken):.1f}-{max(taken):.1f} s" if taken else "never")
                + f" (lease {LEASE_SECONDS} s)"
            )
    if outcome.problems:
        for problem in outcome.problems[:50]:
            say(f"  PROBLEM: {problem}")
    say("  fates:")
    for record in burst.records:
        final = record.final or {}
        took = launched = "-"
        if final.get("created_at"):
            created = datetime.fromisoformat(final["created_at"])
            if final.get("completed_at"):
                took = f"{(datetime.fromisoformat(final['completed_at']) - created).total_seconds():.1f} s"
            if final.get("launched_at"):
                launched = f"{(datetime.fromisoformat(final['launched_at']) - created).total_seconds():.1f} s"
        at = "; ".join(
            f"at {fault.name.split(' of ')[0]}: {fault.where.get(record.label, '-')}" for fault in faults
        )
        note = f"; its lease taken over after {record.taken_over_after} s" if record.leased_by_victim else ""
        say(
            f"    {record.label} {record.kind:<7} {final.get('status', 'never ended'):<9} launched after "
            f"{launched}, ended after {took}, ran {outcome.runs.get(record.label, 0)}x; {at}{note}"
        )
