"""A `vm` runner with `connection: {type: agent}` end to end: `orchestrator serve` and `po-runner remote` as
real processes, the agent launching `po-runner standard` locally; and the faults: an agent started late, an
agent killed between launch and ack, a server restarted under a waiting agent, a command nobody picks up."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orchestrator.launchers.run_cgroups import RunCgroups
from orchestrator.protocol import agent_auth
from orchestrator.store import db
from orchestrator.store.schema import agent_commands
from tests.support import run_probe
from tests.support.agent_process import AgentProcess
from tests.support.demo_modules import make_slow
from tests.support.live_server import serve_in_thread
from tests.support.log_lines import json_lines
from tests.support.outages import ServerProcess
from tests.support.run_user import nobody
from tests.support.stack import Stack, build_stack, demo_manifest, runner_body

pytestmark = [pytest.mark.slow, pytest.mark.spread]

LEASE_SECONDS = 3


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    made = ServerProcess(database_url, tmp_path / "data")
    made.env.update(
        {
            "PO_AGENT_LEASE_SECONDS": str(LEASE_SECONDS),
            "PO_AGENT_FETCH_WAIT_SECONDS": "5",
            # GET runner answers an agent's last poll within a fifth of a second.
            "PO_AGENT_PRESENCE_INTERVAL_SECONDS": "0.2",
        }
    )
    made.start()
    yield made
    made.stop()


@pytest.fixture
def keys() -> tuple[str, str]:
    return agent_auth.generate_key_pair()


@pytest.fixture
def stacks() -> Iterator[list[Stack]]:
    made: list[Stack] = []
    yield made
    for stack in made:
        stack.client.close()


def agent_stack(stacks: list[Stack], server: ServerProcess, tmp_path: Path, public_pem: str) -> Stack:
    """Organization acme ready to deploy through the vm agent runner ``local``."""
    body = runner_body(tmp_path / "terraformrc")
    body["runner_configuration"]["connection"] = {"type": "agent", "key": public_pem}
    stack = build_stack(server.url, tmp_path, runner=body)
    stacks.append(stack)
    return stack


def commands(database_url: str) -> list[dict[str, Any]]:
    async def read() -> list[dict[str, Any]]:
        engine = db.create_engine(database_url)
        try:
            async with engine.connect() as conn:
                rows = (await conn.execute(agent_commands.select())).mappings().all()
        finally:
            await engine.dispose()
        return [dict(r) for r in rows]

    return asyncio.run(read())


def wait_for(condition: Any, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def start_deploy(stack: Stack) -> str:
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": demo_manifest()},
    )
    assert 201 == created.status_code, created.text
    deployment_id: str = created.json()["id"]
    return deployment_id


def test_vm_agent__deploys_end_to_end(
    stacks: list[Stack], server: ServerProcess, database_url: str, tmp_path: Path, keys: tuple[str, str]
) -> None:
    stack = agent_stack(stacks, server, tmp_path, keys[1])
    agent = AgentProcess(server.url, keys[0], tmp_path).start()
    try:
        deployment = stack.deploy()
        url = f"/orgs/{stack.org}/deployments/{deployment['id']}/actions/get-logs"
        logs = stack.client.get(url, headers={"DecryptKey": deployment["_identity"]})
    finally:
        code = agent.stop()
    [command] = commands(database_url)

    assert "succeeded" == deployment["status"], deployment["status_message"]
    assert "bucket-shop" == stack.outputs(deployment)["shop"]["bucket"]
    assert "terraform_data" in logs.text
    assert (f"create-job:{deployment['id']}:1", "acked", 1) == (
        command["id"],
        command["state"],
        command["attempt"],
    )
    assert command["job_created_at"] is not None
    # SIGTERM stops the agent cleanly.
    assert 0 == code, agent.output()[-2000:]


def test_vm_agent__started_after_the_command_exists_gets_it(
    stacks: list[Stack], server: ServerProcess, database_url: str, tmp_path: Path, keys: tuple[str, str]
) -> None:
    stack = agent_stack(stacks, server, tmp_path, keys[1])
    deployment_id = start_deploy(stack)
    # Nobody polls: the command waits in the database, never delivered (an hour's wait, on a simulated
    # clock: test_late_agent__started_an_hour_later_gets_the_command in integration/test_agent_gateway.py).
    [queued] = wait_for(lambda: commands(database_url), "the command")
    waiting = stack.client.get(f"/orgs/{stack.org}/deployments/{deployment_id}").json()

    agent = AgentProcess(server.url, keys[0], tmp_path).start()
    try:
        finished = stack.wait(deployment_id)
    finally:
        agent.stop()

    assert ("pending", 0) == (queued["state"], queued["attempt"])
    assert "executing" == waiting["status"]
    assert "succeeded" == finished["status"], finished["status_message"]


def _blocking_proxy(upstream: str, blocked: tuple[str, ...], released: threading.Event) -> Starlette:
    """Forwards every request to ``upstream``, except that requests whose path ends in one of ``blocked``
    hang (until ``released``, or their client is gone)."""

    async def forward(request: Request) -> Response:
        if request.url.path.endswith(blocked):
            while not released.is_set():
                if await request.is_disconnected():
                    return Response(status_code=499)
                await asyncio.sleep(0.1)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with httpx.AsyncClient(base_url=upstream, timeout=60) as client:
            answer = await client.request(
                request.method,
                request.url.path,
                params=request.query_params,
                content=await request.body(),
                headers=headers,
            )
        kept = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type", "cache-control")}
        return Response(answer.content, status_code=answer.status_code, headers=kept)

    methods = ["GET", "POST", "PUT", "DELETE", "LOCK", "UNLOCK"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


def test_vm_agent__killed_between_launch_and_ack__redelivered_after_the_lease_and_launched_once(
    stacks: list[Stack], server: ServerProcess, database_url: str, tmp_path: Path, keys: tuple[str, str]
) -> None:
    stack = agent_stack(stacks, server, tmp_path, keys[1])
    make_slow(stack, seconds=12)
    released = threading.Event()
    proxy_app = _blocking_proxy(server.url, ("/events", "/ack"), released)
    with serve_in_thread(proxy_app) as proxy:
        # The first agent reaches the gateway through a proxy that swallows its events and acks: it
        # launches the run, then hangs reporting it; it is killed there.
        first = AgentProcess(proxy, keys[0], tmp_path, name="first").start()
        deployment_id = start_deploy(stack)
        pid_file = first.runs_dir / deployment_id / "runner.pid"
        launched = wait_for(lambda: pid_file.exists() and pid_file.read_text(), "the first launch")
        # The pid file is written before the agent logs the launch: kill it only once it has said so.
        wait_for(lambda: "job launched" in first.output(), "the first agent's launch log")
        first.kill()
        second = AgentProcess(server.url, keys[0], tmp_path, name="second").start()
        try:
            redelivered = wait_for(
                lambda: [c for c in commands(database_url) if c["state"] == "acked"], "the ack", timeout=60
            )
            finished = stack.wait(deployment_id)
        finally:
            second.stop()
            released.set()

    [command] = redelivered
    assert "succeeded" == finished["status"], finished["status_message"]
    assert 2 == command["attempt"]
    # The second agent adopted the run the first one started: no second runner process.
    assert "job launched" in first.output() and "command acked" not in first.output()
    assert launched in [line.get("handle") for line in json_lines(second.output())[0]], second.output()[
        -3000:
    ]


def test_vm_agent__server_restarted_while_the_agent_waits(
    stacks: list[Stack], server: ServerProcess, tmp_path: Path, keys: tuple[str, str]
) -> None:
    stack = agent_stack(stacks, server, tmp_path, keys[1])
    agent = AgentProcess(server.url, keys[0], tmp_path).start()
    runner = f"/orgs/{stack.org}/runners/local"
    try:
        # The agent has polled (the server saw it), then finds the server gone, then it is back.
        wait_for(lambda: stack.client.get(runner).json()["status"]["last_seen_at"], "the agent's poll")
        server.kill()
        wait_for(lambda: "runner gateway unreachable" in agent.output(), "the agent to miss the server")
        server.start()
        deployment = stack.deploy()
    finally:
        agent.stop()

    assert "succeeded" == deployment["status"], deployment["status_message"]


def test_vm_agent__a_command_nobody_picks_up_expires(
    stacks: list[Stack], database_url: str, tmp_path: Path
) -> None:
    server = ServerProcess(database_url, tmp_path / "data")
    server.env["PO_AGENT_COMMAND_TTL_SECONDS"] = "2"
    server.start()
    try:
        stack = agent_stack(stacks, server, tmp_path, agent_auth.generate_key_pair()[1])
        finished = stack.wait(start_deploy(stack))
    finally:
        server.stop()

    assert ("failed", "COMMAND_EXPIRED") == (finished["status"], finished["error"]["error"])
    assert "did not pick up" in finished["status_message"]


def test_vm_agent__a_run_sees_nothing_of_another_organizations_run_and_nothing_of_it_outlives_it(
    stacks: list[Stack], server: ServerProcess, keys: tuple[str, str]
) -> None:
    """Two agents on one host with their defaults as root (AGENT_RUN_USER, a uid of their own per run):
    acme's with AGENT_RUN_UIDS' default range, globex's with another (README: one range per launcher of a
    host). A detached probe from acme's run (``setsid nohup``) scans /proc for globex's later run (its
    runner's secret as the marker) and the agents, tries their memory, and is gone when its own run ends."""
    if os.geteuid() != 0:
        pytest.skip("an agent switches runs to other uids only as root")
    nobody()  # the run's Python must be reachable by other users (scripts/grant-run-user-access)
    shared = Path(tempfile.mkdtemp(prefix="po-agent-isolation-"))
    shared.chmod(0o755)
    found = shared / "found"
    found.mkdir()
    found.chmod(0o777)
    (found / "probe.py").write_text(run_probe.PROBE)
    (found / "probe.py").chmod(0o644)
    marker = f"marker-{secrets.token_hex(12)}"
    other_keys = agent_auth.generate_key_pair()
    agents: list[AgentProcess] = []
    try:
        (shared / "acme").mkdir()
        (shared / "globex").mkdir()
        stack = agent_stack(stacks, server, shared / "acme", keys[1])
        body = runner_body(shared / "globex" / "terraformrc")
        body["runner_configuration"]["connection"] = {"type": "agent", "key": other_keys[1]}
        # In its job environment: an agent is never sent a runner's job.secrets.
        body["runner_configuration"]["job"]["environment"]["MY_RUNNER_SECRET"] = marker
        other = build_stack(server.url, shared / "globex", org="globex", runner=body)
        stacks.append(other)
        for made in (stack, other):
            made.tf_config.chmod(0o644)
        code = (
            'resource "terraform_data" "probe" {\n  provisioner "local-exec" {\n'
            f'    command = "id -u > {found}/uid; setsid nohup {sys.executable} {found}/probe.py {found} '
            f'{marker} > /dev/null 2>&1 < /dev/null &"\n  }}\n}}\n'
            'resource "terraform_data" "wait" {\n  depends_on = [terraform_data.probe]\n'
            '  provisioner "local-exec" {\n'
            f'    command = "for i in $(seq 600); do [ -e {found}/other-done ] && exit 0; sleep 0.2; done"\n'
            "  }\n}\n"
        )
        for path, payload in [
            ("/resource-types", {"id": "probe", "output_schema": {"type": "object"}}),
            (
                "/modules",
                {
                    "id": "probe",
                    "resource_type": "probe",
                    "module_source": "inline",
                    "module_source_code": code,
                },
            ),
            ("/module-rules", {"module_id": "probe"}),
        ]:
            response = stack.client.post(f"/orgs/{stack.org}{path}", json=payload)
            assert 201 == response.status_code, (path, response.text)
        for name, pem, work, extra in [
            ("acme", keys[0], shared / "acme", {}),
            (
                "globex",
                other_keys[0],
                shared / "globex",
                {"ORG_ID": "globex", "AGENT_RUN_UIDS": "2210000-2210999"},
            ),
        ]:
            agent = AgentProcess(server.url, pem, work, name=f"agent-{name}")
            del agent.env["AGENT_RUN_USER"]  # the default: nobody, and a uid of its own per run
            agent.env.update(extra)
            agents.append(agent.start())
        probing = stack.client.post(
            f"/orgs/{stack.org}/deployments",
            json={
                "project_id": "shop",
                "env_id": "dev",
                "mode": "deploy",
                "manifest": {"workloads": {"work": {"resources": {"p": {"type": "probe"}}}}},
            },
        )
        assert 201 == probing.status_code, probing.text
        run_probe.wait_for(found / "probe.alive", 60)
        victim = other.deploy(demo_manifest())
        time.sleep(1.0)  # a few more rounds of the probe over what globex's run left (nothing: it is over)
        (found / "other-done").touch()
        prober = stack.wait(probing.json()["id"])
        probe_pid = int((found / "probe.pid").read_text())
        gone = run_probe.wait_gone(probe_pid, 30)
        findings = run_probe.findings(found)
        looked_at = run_probe.uids_seen(found)
        uid = int((found / "uid").read_text())
    finally:
        for agent in agents:
            agent.stop()
        shutil.rmtree(shared, ignore_errors=True)

    assert "succeeded" == victim["status"], victim["status_message"]
    assert "succeeded" == prober["status"], prober["status_message"]
    # Nothing of another uid: no environment (no deployment token, no runner secret, no agent key), no
    # working directory, no open file, no memory of globex's run or of either agent.
    assert [] == findings
    assert 2200000 <= uid <= 2200999  # AGENT_RUN_UIDS' default
    # It saw globex's run, as a uid of globex's agent's range: it looked, and could read nothing of it.
    assert [] != [seen for seen in looked_at if 2210000 <= seen <= 2210999], looked_at
    assert gone, f"the probe (pid {probe_pid}) outlived its run"


def test_vm_agent__a_runs_detached_probe_sees_nothing_of_the_next_run_and_is_gone_with_its_run(
    stacks: list[Stack], server: ServerProcess, keys: tuple[str, str]
) -> None:
    """Issue 26's probe through the agent's local runs: one run's detached process scans /proc while the
    agent runs another deployment with a marker secret, and tries every other process's mem; it finds
    nothing, and is gone when its own run ends. Each run is a uid of the agent's range, in a cgroup of its
    own where the host allows."""
    if os.geteuid() != 0:
        pytest.skip("an agent switches runs to other uids only as root")
    nobody()  # the run's Python must be reachable by other users (scripts/grant-run-user-access)
    shared = Path(tempfile.mkdtemp(prefix="po-agent-probe-"))
    shared.chmod(0o755)
    found = shared / "found"
    found.mkdir()
    found.chmod(0o777)
    (found / "probe.py").write_text(run_probe.PROBE)
    (found / "probe.py").chmod(0o644)
    marker = f"marker-{secrets.token_hex(12)}"
    try:
        stack = agent_stack(stacks, server, shared, keys[1])
        (shared / "terraformrc").chmod(0o644)
        code = (
            'resource "terraform_data" "probe" {\n  provisioner "local-exec" {\n'
            f'    command = "id -u > {found}/uid; grep ^0:: /proc/self/cgroup > {found}/cgroup; '
            f"setsid nohup {sys.executable} {found}/probe.py {found} {marker} "
            '> /dev/null 2>&1 < /dev/null &"\n  }\n}\n'
            'resource "terraform_data" "wait" {\n  depends_on = [terraform_data.probe]\n'
            '  provisioner "local-exec" {\n'
            f'    command = "for i in $(seq 600); do [ -e {found}/other-done ] && exit 0; sleep 0.2; done"\n'
            "  }\n}\n"
        )
        base = f"/orgs/{stack.org}"
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
            ("/projects/shop/envs", {"id": "prod", "env_type_id": "development"}),
        ]:
            response = stack.client.post(base + path, json=body)
            assert 201 == response.status_code, (path, response.text)
        agent = AgentProcess(server.url, keys[0], shared)
        del agent.env["AGENT_RUN_USER"]  # the default: nobody, and a uid of its own per run
        agent.start()
        try:
            probing = stack.client.post(
                f"{base}/deployments",
                json={
                    "project_id": "shop",
                    "env_id": "dev",
                    "mode": "deploy",
                    "manifest": {"workloads": {"probe": {"resources": {"p": {"type": "probe-app"}}}}},
                },
            )
            assert 201 == probing.status_code, probing.text
            run_probe.wait_for(found / "probe.alive", 60)
            # The next deployment gets a value the probing run never had (in its job environment: an agent
            # is never sent the runner's job.secrets).
            runner = stack.client.get(f"{base}/runners/local").json()
            configuration = runner["runner_configuration"]
            configuration["job"]["environment"]["MY_RUNNER_SECRET"] = marker
            patched = stack.client.patch(
                f"{base}/runners/local", json={"runner_configuration": configuration}
            )
            assert 200 == patched.status_code, patched.text
            victim = stack.deploy(demo_manifest(), env_id="prod")
            time.sleep(1.0)  # a few more rounds of the probe over what that run left (nothing: it is over)
            (found / "other-done").touch()
            prober = stack.wait(probing.json()["id"])
            probe_pid = int((found / "probe.pid").read_text())
            gone = run_probe.wait_gone(probe_pid, 30)
            seen = run_probe.findings(found)
            uid = int((found / "uid").read_text())
            cgroup = (found / "cgroup").read_text().strip()
        finally:
            agent.stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)

    assert "succeeded" == victim["status"], victim["status_message"]
    assert "succeeded" == prober["status"], prober["status_message"]
    assert 2200000 <= uid <= 2200999  # AGENT_RUN_UIDS' default
    # No environment (so neither the marker nor the token), directory, file or memory of another uid.
    assert [] == seen
    assert gone, f"the probe (pid {probe_pid}) outlived its run"
    usable = RunCgroups.from_setting("auto", shared, setting="test")
    if usable is not None:
        usable.close()
        assert "/po-runs-" in cgroup, cgroup
