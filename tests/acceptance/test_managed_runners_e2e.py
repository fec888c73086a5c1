"""Managed runners end to end (project issue 11's "Must show", at the runner level): a real
``orchestrator serve`` with MANAGED_RUNNER_SECRET and real ``po-runner managed`` processes, started and
stopped by PID. One server per module (and database); each test starts its own runners and stops them.

The deployments run the demo module (two ``terraform_data``) with the engine the runner host has: the
child of a managed runner gets only the claim's environment (no IAC_BACKEND), so ``terraform`` or
``tofu`` on PATH runs them, as on a real runner host.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from orchestrator.launchers.run_cgroups import RunCgroups
from orchestrator.protocol import age
from orchestrator.store import db
from orchestrator.store.schema import deployments, managed_runners
from tests.support import run_probe
from tests.support.managed import MANAGED_SECRET, RunnerProcess
from tests.support.outages import ServerProcess, wait_for
from tests.support.postgres import PostgresServer
from tests.support.stack import Stack, build_stack, demo_manifest

pytestmark = pytest.mark.slow

DATABASES = [d.strip() for d in os.environ.get("PO_TEST_DATABASES", "sqlite").split(",") if d.strip()]
#: The template database the session's PostgreSQL fixture migrated (tests/conftest.py).
TEMPLATE_DB = "po_template"
#: Heartbeats every second; the default lease, longer than the API outage below.
HEARTBEAT_SECONDS = 1
LEASE_SECONDS = 60
#: A module whose apply takes a while: it touches the file ``marker`` names, then sleeps 25 s.
SLOW_MODULE = {
    "resource_type": "slow-app",
    "module_source": "inline",
    "module_params": {"marker": {"type": "string"}},
    "module_source_code": """
variable "marker" {
  type = string
}

resource "terraform_data" "slow" {
  input = var.marker
  provisioner "local-exec" {
    command = "touch '${var.marker}' && sleep 25"
  }
}

output "marker" {
  value = terraform_data.slow.output
}
""",
}
#: Environment types (one environment each, ``shop/<type>``) and the tags their rule requires.
ENVIRONMENTS: dict[str, list[str]] = {
    "edge": [],
    "gpu": ["gpu"],
    "k8s": ["kubernetes"],
    "late": ["late"],
    "probe": ["probe"],
    "leak": ["leak"],
}


@pytest.fixture(scope="module", params=DATABASES)
def e2e_database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('managed-e2e') / 'test.db'}"
    if request.param == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        name = f"managed_e2e_{os.getpid()}_{time.monotonic_ns() % 10**9}"
        server.create_database(name, template=TEMPLATE_DB)
        return server.url(name)
    raise ValueError(f"unknown database {request.param!r} in PO_TEST_DATABASES")


@pytest.fixture(scope="module")
def server(e2e_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("managed-server")
    process = ServerProcess(
        e2e_database,
        root / "data",
        MANAGED_RUNNER_SECRET=MANAGED_SECRET,
        # The tags the runners below declare beside the detected ones (issue 26: the platform decides).
        PO_MANAGED_SECRET_TAGS="linux,docker,late,gpu,probe,leak",
        PO_MANAGED_HEARTBEAT_SECONDS=str(HEARTBEAT_SECONDS),
        PO_MANAGED_LEASE_SECONDS=str(LEASE_SECONDS),
        PO_AGENT_POLL_FALLBACK_SECONDS="1",
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _managed_org(url: str, root: Path, org: str) -> Stack:
    made = build_stack(url, root, org=org)
    base = f"/orgs/{org}"
    for env_type, tags in ENVIRONMENTS.items():
        rule: dict[str, Any] = {"runner_id": "managed", "env_type_id": env_type}
        if tags:
            rule["required_tags"] = tags
        for path, body in [
            ("/env-types", {"id": env_type}),
            ("/projects/shop/envs", {"id": env_type, "env_type_id": env_type}),
            ("/runner-rules", rule),
        ]:
            response = made.client.post(base + path, json=body)
            assert 201 == response.status_code, (path, response.text)
    slow: list[tuple[str, dict[str, Any]]] = [
        ("/resource-types", {"id": "slow-app", "output_schema": {"type": "object"}}),
        ("/modules", {"id": "slow-app", **SLOW_MODULE}),
        ("/module-rules", {"module_id": "slow-app"}),
    ]
    for path, payload in slow:
        response = made.client.post(base + path, json=payload)
        assert 201 == response.status_code, (path, response.text)
    return made


@pytest.fixture(scope="module")
def acme(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    made = _managed_org(server.url, tmp_path_factory.mktemp("acme"), "acme")
    yield made
    made.client.close()


@pytest.fixture(scope="module")
def globex(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    made = _managed_org(server.url, tmp_path_factory.mktemp("globex"), "globex")
    yield made
    made.client.close()


@pytest.fixture
def runners(server: ServerProcess, tmp_path: Path) -> Iterator[list[RunnerProcess]]:
    """Runners a test starts (append them); all stopped by PID when it ends."""
    started: list[RunnerProcess] = []
    yield started
    for runner in started:
        if runner.process is not None:
            runner.stop()


def start_runner(
    server: ServerProcess, started: list[RunnerProcess], root: Path, name: str, **extra: str
) -> RunnerProcess:
    runner = RunnerProcess(server.url, name, root, **extra).start()
    started.append(runner)
    return runner


def registered(runner: RunnerProcess, count: int = 1) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        assert runner.process is not None
        assert runner.process.poll() is None, runner.log.read_text()[-3000:]
        found = runner.registrations()
        return found if len(found) >= count else None

    found: list[dict[str, Any]] = wait_for(enough, 60, f"runner {runner.name} to register ({count})")
    return found


def create(stack: Stack, env_id: str, manifest: dict[str, Any] | None = None) -> tuple[str, str]:
    """A deployment of ``manifest`` (the demo module's by default) on ``shop/<env_id>``: (its id, the
    identity its outputs and logs are encrypted to)."""
    identity, recipient = age.generate_identity()
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={
            "project_id": "shop",
            "env_id": env_id,
            "mode": "deploy",
            "manifest": manifest or demo_manifest(),
            "encrypted_outputs_recipient": recipient,
            "encrypted_logs_recipient": recipient,
        },
    )
    assert 201 == created.status_code, created.text
    deployment_id: str = created.json()["id"]
    return deployment_id, identity


def dispatch_state(server: ServerProcess, deployment_id: str) -> str:
    """Where the server's dispatch of a deployment is (``queued`` until a runner claims it): not in the
    API, whose status says ``executing`` from the start; read from its database."""

    async def read() -> str:
        engine = db.create_engine(server.database_url)
        try:
            async with engine.connect() as conn:
                value = await conn.scalar(
                    sa.select(deployments.c.dispatch_state).where(
                        deployments.c.id == uuid.UUID(deployment_id)
                    )
                )
                return str(value)
        finally:
            await engine.dispose()

    return asyncio.run(read())


def assert_succeeded(stack: Stack, deployment_id: str, identity: str) -> dict[str, Any]:
    deployment = stack.wait(deployment_id, timeout=150)
    assert ("succeeded", "managed") == (deployment["status"], deployment["runner_id"]), deployment
    outputs = stack.outputs(deployment, identity)
    assert {"url": "https://shop.example.test/bucket-shop", "bucket": "bucket-shop"} == outputs["shop"]
    return deployment


def records(server: ServerProcess, name: str) -> list[dict[str, Any]]:
    """The server's records of managed runners named ``name`` (read from its database)."""

    async def read() -> list[dict[str, Any]]:
        engine = db.create_engine(server.database_url)
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(sa.select(managed_runners).where(managed_runners.c.name == name))
                return [dict(row._mapping) for row in rows]
        finally:
            await engine.dispose()

    return asyncio.run(read())


def backdate(server: ServerProcess, name: str, by: timedelta) -> None:
    """The server's record of runner ``name`` as if last seen ``by`` earlier."""

    async def write() -> None:
        engine = db.create_engine(server.database_url)
        try:
            async with engine.begin() as conn:
                seen = await conn.scalar(
                    sa.select(managed_runners.c.last_seen_at).where(managed_runners.c.name == name)
                )
                assert seen is not None, f"no record of runner {name}"
                await conn.execute(
                    sa.update(managed_runners)
                    .where(managed_runners.c.name == name)
                    .values(last_seen_at=seen - by)
                )
        finally:
            await engine.dispose()

    asyncio.run(write())


def pool_status(stack: Stack) -> dict[str, Any]:
    response = stack.client.get(f"/orgs/{stack.org}/runners/managed")
    assert 200 == response.status_code, response.text
    found: dict[str, Any] = response.json()["status"]
    return found


# --- 1 -----------------------------------------------------------------------------------------------


def test_a_deployment_runs_through_po_runner_managed_and_leaves_nothing_behind(
    server: ServerProcess, acme: Stack, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    runner = start_runner(server, runners, tmp_path, "pool-a")
    registered(runner)
    deployment_id, identity = create(acme, "edge")

    assert_succeeded(acme, deployment_id, identity)
    logs = acme.client.get(
        f"/orgs/{acme.org}/deployments/{deployment_id}/actions/get-logs", headers={"DecryptKey": identity}
    )
    assert 200 == logs.status_code, logs.text
    assert "terraform_data" in logs.text
    wait_for(lambda: runner.events("exit code reported"), 30, "the exit code to be reported")
    # Nothing of the run; the uids' lock folder (.uids) stays, empty.
    assert [] == [entry for entry in runner.work_dir.iterdir() if entry.name != ".uids"]
    assert [] == list((runner.work_dir / ".uids").glob("*")) if (runner.work_dir / ".uids").exists() else True
    assert [deployment_id] == [entry["deployment_id"] for entry in runner.events("deployment claimed")]
    assert 0 == runner.stop()
    assert MANAGED_SECRET not in runner.log.read_text()


# --- 2 -----------------------------------------------------------------------------------------------


def test_five_restarts_with_the_same_name_leave_one_record(
    server: ServerProcess, acme: Stack, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    ids = set()
    for _ in range(5):
        runner = start_runner(server, runners, tmp_path, "pool-restarted")
        ids.add(registered(runner)[0]["runner_id"])
        assert 0 == runner.stop()
    runner = start_runner(server, runners, tmp_path, "pool-restarted")
    last = registered(runner)[0]["runner_id"]

    assert 6 == len(ids | {last})
    assert [last] == [str(record["id"]) for record in records(server, "pool-restarted")]
    assert pool_status(acme)["online"] >= 1


# --- 3 -----------------------------------------------------------------------------------------------


def test_a_runner_whose_record_was_replaced_registers_again_and_keeps_serving(
    server: ServerProcess, acme: Stack, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    runner = start_runner(server, runners, tmp_path, "pool-replaced")
    first = registered(runner)[0]["runner_id"]
    # Another process registers the same name: the runner's record (and token) is gone.
    other = httpx.post(
        f"{server.url}/runner/register",
        json={"managedSecret": MANAGED_SECRET, "name": "pool-replaced", "tags": []},
    )
    assert 201 == other.status_code, other.text
    deployment_id, identity = create(acme, "edge")

    assert_succeeded(acme, deployment_id, identity)
    assert [deployment_id] == [entry["deployment_id"] for entry in runner.events("deployment claimed")]
    again = registered(runner, 2)[1]["runner_id"]
    assert again not in (first, other.json()["runnerId"])
    assert [again] == [str(record["id"]) for record in records(server, "pool-replaced")]
    stale = httpx.post(
        f"{server.url}/runner/heartbeat",
        json={"deploymentId": None},
        headers={"Authorization": f"Bearer {other.json()['token']}"},
    )
    assert 401 == stale.status_code, stale.text


def test_a_pruned_runner_registers_again_and_keeps_serving(
    server: ServerProcess, acme: Stack, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    runner = start_runner(server, runners, tmp_path, "pool-pruned")
    first = registered(runner)[0]["runner_id"]
    assert runner.process is not None
    # The runner stops answering (SIGSTOP) and its record was last seen two days ago (more than
    # PO_MANAGED_PRUNE_AFTER_SECONDS, one day): the server's worker prunes it.
    os.kill(runner.process.pid, signal.SIGSTOP)
    try:
        time.sleep(0.5)  # a heartbeat under way when it stopped is answered first
        backdate(server, "pool-pruned", timedelta(days=2))
        wait_for(lambda: not records(server, "pool-pruned"), 30, "the runner's record to be pruned")
    finally:
        os.kill(runner.process.pid, signal.SIGCONT)
    deployment_id, identity = create(acme, "edge")

    assert_succeeded(acme, deployment_id, identity)
    assert [deployment_id] == [entry["deployment_id"] for entry in runner.events("deployment claimed")]
    again = registered(runner, 2)[1]["runner_id"]
    assert first != again
    assert [again] == [str(record["id"]) for record in records(server, "pool-pruned")]


# --- 4 -----------------------------------------------------------------------------------------------


def test_a_wrong_secret_stops_the_runner_with_the_cause_and_without_the_secret(
    server: ServerProcess, tmp_path: Path
) -> None:
    wrong = "not-the-managed-runner-secret-" + "x" * 40
    runner = RunnerProcess(server.url, "pool-wrong", tmp_path, secret=wrong).start()
    assert runner.process is not None
    try:
        code = runner.process.wait(60)
    finally:
        runner.stop()
    output = runner.log.read_text()

    assert 1 == code, output
    assert "RUNNER_MANAGED_SECRET" in output and "secret is not valid" in output, output
    assert 1 == output.count("HTTP Request: POST"), "a definite answer: not tried again"
    assert wrong not in output
    assert MANAGED_SECRET not in output
    assert [] == records(server, "pool-wrong")


def test_a_server_without_managed_runners_stops_the_runner_with_the_cause(
    database_url: str, tmp_path: Path
) -> None:
    plain = ServerProcess(database_url, tmp_path / "data")  # its own, without MANAGED_RUNNER_SECRET
    plain.start()
    try:
        runner = RunnerProcess(plain.url, "pool-nowhere", tmp_path).start()
        assert runner.process is not None
        try:
            code = runner.process.wait(60)
        finally:
            runner.stop()
    finally:
        plain.stop()
    output = runner.log.read_text()

    assert 1 == code, output
    assert "managed runners are not enabled" in output, output
    assert MANAGED_SECRET not in output


# --- 5 -----------------------------------------------------------------------------------------------


def test_runners_recover_from_an_api_outage_and_run_the_deployments_running_and_queued_meanwhile(
    server: ServerProcess, acme: Stack, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    busy = start_runner(server, runners, tmp_path, "pool-busy")
    registered(busy)
    # Where the run writes: reachable by its uid (as root, a uid of its own; tmp_path is 0700).
    shared = Path(tempfile.mkdtemp(prefix="po-managed-marker-"))
    shared.chmod(0o777)
    marker = shared / "applying"
    manifest = {
        "workloads": {
            "slow": {
                "resources": {"app": {"type": "slow-app", "params": {"marker": str(marker)}}},
                "outputs": {"marker": "${resources.app.outputs.marker}"},
            }
        }
    }
    running_id, running_identity = create(acme, "edge", manifest)
    wait_for(marker.exists, 90, "the deployment's apply to start")
    # Queued for a runner carrying `late`: none does yet.
    queued_id, queued_identity = create(acme, "late")
    assert "queued" == dispatch_state(server, queued_id)
    server.terminate()
    try:
        # A runner that can claim it starts while the API is down: it cannot register yet.
        late = start_runner(server, runners, tmp_path, "pool-late", RUNNER_TAGS="late")
        time.sleep(20)
        assert [] == late.registrations()
        for runner in (busy, late):
            assert runner.process is not None and runner.process.poll() is None, runner.log.read_text()[
                -3000:
            ]
    finally:
        server.start()

    running = acme.wait(running_id, timeout=120)
    assert ("succeeded", "managed") == (running["status"], running["runner_id"]), running
    assert {"marker": str(marker)} == acme.outputs(running, running_identity)["slow"]
    assert [] == busy.events("the claim of the running deployment is lost")
    assert_succeeded(acme, queued_id, queued_identity)
    assert [queued_id] == [entry["deployment_id"] for entry in late.events("deployment claimed")]
    assert [running_id] == [entry["deployment_id"] for entry in busy.events("deployment claimed")]


# --- 6 -----------------------------------------------------------------------------------------------


def test_required_tags_decide_which_runner_claims_and_kubernetes_is_never_detected(
    server: ServerProcess, acme: Stack, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    plain = start_runner(server, runners, tmp_path, "pool-plain", KUBERNETES_SERVICE_HOST="10.0.0.1")
    registered(plain)
    gpu_id, identity = create(acme, "gpu")
    k8s_id, _ = create(acme, "k8s")
    # The plain runner long-polls (1 s fallback) and does not take them.
    time.sleep(4)
    assert ("queued", "queued") == (dispatch_state(server, gpu_id), dispatch_state(server, k8s_id))
    assert [] == plain.events("deployment claimed")

    gpu = start_runner(
        server, runners, tmp_path, "pool-gpu", RUNNER_TAGS="gpu", KUBERNETES_SERVICE_HOST="10.0.0.1"
    )
    tags = registered(gpu)[0]["tags"]
    assert_succeeded(acme, gpu_id, identity)

    assert {"gpu", "linux", "managed"} <= set(tags) and "kubernetes" not in tags, tags
    assert "kubernetes" not in registered(plain)[0]["tags"]
    assert [gpu_id] == [entry["deployment_id"] for entry in gpu.events("deployment claimed")]
    assert "queued" == dispatch_state(server, k8s_id)
    assert "kubernetes" not in pool_status(acme)["tags"]


# --- 7 -----------------------------------------------------------------------------------------------


def test_one_pool_serves_two_organizations_that_cannot_read_each_other(
    server: ServerProcess, acme: Stack, globex: Stack, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    start_runner(server, runners, tmp_path, "pool-shared-0")
    start_runner(server, runners, tmp_path, "pool-shared-1")
    ours, our_identity = create(acme, "edge")
    theirs, their_identity = create(globex, "edge")
    assert_succeeded(acme, ours, our_identity)
    assert_succeeded(globex, theirs, their_identity)

    for reader, owner, deployment_id in ((globex, acme, ours), (acme, globex, theirs)):
        for path in ("", "/encrypted-outputs", "/actions/get-logs"):
            for org in (owner.org, reader.org):
                answer = reader.client.get(f"/orgs/{org}/deployments/{deployment_id}{path}")
                assert answer.status_code in (403, 404), (org, path, answer.status_code, answer.text)

    # A deployment token of globex (what a runner gets in a claim) opens no bundle of acme.
    probe = httpx.post(
        f"{server.url}/runner/register",
        json={"managedSecret": MANAGED_SECRET, "name": "probe", "tags": ["probe"]},
    )
    assert 201 == probe.status_code, probe.text
    bearer = {"Authorization": f"Bearer {probe.json()['token']}"}
    probed, _ = create(globex, "probe")
    claimed = httpx.post(f"{server.url}/runner/claim", json={"waitSeconds": 20}, headers=bearer, timeout=40)
    assert 200 == claimed.status_code, claimed.text
    assert probed == claimed.json()["deployment"]["id"]
    token = claimed.json()["environment"]["TOKEN"]
    gateway = f"{server.url}/runner-gateway/v1/orgs"
    for org in ("acme", "globex"):
        bundle = httpx.get(
            f"{gateway}/{org}/runners/managed/deployments/{ours}/bundle",
            headers={"X-Deployment-Token": token},
        )
        assert 400 <= bundle.status_code < 500, (org, bundle.status_code, bundle.text)
    own = httpx.get(
        f"{gateway}/globex/runners/managed/deployments/{probed}/bundle", headers={"X-Deployment-Token": token}
    )
    assert 200 == own.status_code, own.text  # the token is a real one: it opens its own bundle
    done = httpx.post(
        f"{server.url}/runner/deployments/{probed}/finished", json={"exitCode": 1}, headers=bearer
    )
    assert 200 == done.status_code, done.text


# --- isolation ---------------------------------------------------------------------------------------


def test_a_runs_leftover_process_sees_nothing_of_the_runner_and_is_gone_with_its_run(
    server: ServerProcess, acme: Stack, globex: Stack, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    """A deployment's detached probe looks for the shared secret (in every environment it can read, and in
    the runner's secret file) and at every process of another uid: it finds nothing, its run executes as a
    uid of its own, and it is gone when its run ends, before the next organization's deployment runs."""
    if os.geteuid() != 0:
        pytest.skip("a managed runner gives each run a uid of its own only as root")
    found = Path(tempfile.mkdtemp(prefix="po-managed-probe-"))
    found.chmod(0o777)
    secret_file = tmp_path / "managed-secret"
    secret_file.write_text(MANAGED_SECRET + "\n")
    secret_file.chmod(0o600)
    (found / "probe.py").write_text(run_probe.PROBE)
    (found / "probe.py").chmod(0o644)
    code = (
        'resource "terraform_data" "probe" {\n  provisioner "local-exec" {\n'
        f'    command = "id -u > {found}/uid; grep ^0:: /proc/self/cgroup > {found}/cgroup; '
        f"setsid nohup {sys.executable} {found}/probe.py {found} "
        f'{MANAGED_SECRET} {secret_file} > /dev/null 2>&1 < /dev/null &"\n'
        "  }\n}\n"
        'resource "terraform_data" "wait" {\n  depends_on = [terraform_data.probe]\n'
        '  provisioner "local-exec" {\n'
        f'    command = "for i in $(seq 300); do [ -e {found}/probe.alive ] && sleep 2 && exit 0; '
        'sleep 0.1; done"\n'
        "  }\n}\n"
    )
    base = f"/orgs/{acme.org}"
    for path, body in [
        ("/resource-types", {"id": "probe-app", "output_schema": {"type": "object"}}),
        (
            "/modules",
            {
                "id": "probe-app",
                "resource_type": "probe-app",
                "module_source": "inline",
                "module_source_code": code,
            },
        ),
        ("/module-rules", {"module_id": "probe-app"}),
    ]:
        response = acme.client.post(base + path, json=body)
        assert 201 == response.status_code, (path, response.text)
    runner = RunnerProcess(server.url, "pool-isolated", tmp_path, RUNNER_TAGS="leak")
    del runner.env["RUNNER_MANAGED_SECRET"]
    runner.env["RUNNER_MANAGED_SECRET_FILE"] = str(secret_file)
    runners.append(runner.start())
    registered(runner)
    try:
        manifest = {"workloads": {"probe": {"resources": {"p": {"type": "probe-app"}}}}}
        probing, _ = create(acme, "leak", manifest)
        probed = acme.wait(probing)
        probe_pid = int((found / "probe.pid").read_text())
        gone = run_probe.wait_gone(probe_pid, 30)
        theirs, their_identity = create(globex, "leak")
        assert_succeeded(globex, theirs, their_identity)
        seen = run_probe.findings(found)
        uid = int((found / "uid").read_text())
        cgroup = (found / "cgroup").read_text().strip()
    finally:
        shutil.rmtree(found, ignore_errors=True)

    assert "succeeded" == probed["status"], probed["status_message"]
    assert 2300000 <= uid <= 2300999  # RUNNER_RUN_UIDS' default: not the runner's own (root)
    assert [] == seen  # no environment, file, directory or memory of another uid; the secret nowhere
    assert gone, f"the probe (pid {probe_pid}) outlived its run"
    usable = RunCgroups.from_setting("auto", tmp_path, setting="test")
    if usable is not None:
        usable.close()
        # Where this host lets the runner make cgroups (RUNNER_RUN_CGROUPS=auto), the run had its own.
        assert "/po-runs-" in cgroup, cgroup
