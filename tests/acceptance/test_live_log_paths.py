"""The live log through every remote launch path (issue 22, "Must show": the same follow works for a run
through the agent, a managed runner and the ssh launcher), on both databases.

Each test runs a real ``orchestrator serve`` and a real deployment of the demo module whose
``terraform_data.app`` prints a marker (tests/support/live_follow.py) and then waits until the test
releases it, through:

- (a) a ``vm`` runner with ``connection: {type: agent}``: ``po-runner remote`` as a process, launching
  ``po-runner standard`` locally (as tests/acceptance/test_agent_runner.py); and a ``kubernetes-agent``
  runner, whose Job the stand-in Kubernetes API's kubelet runs as a local process (as
  test_kubernetes_agent_runner.py: a stand-in, not a cluster);
- (b) the managed pool: ``po-runner managed`` as a process, claiming the deployment and running
  ``po-runner standard`` with the claim's environment (as tests/acceptance/test_managed_runners_e2e.py);
- (c) a ``vm`` runner over SSH against a real ``sshd`` on loopback (as test_vm_ssh_runner.py).

A raw SSE client follows ``GET .../logs?follow=true`` from the deployment's creation and decrypts each
chunk with the deployment's logs identity. The marker reaches it while the deployment is executing (the
run cannot end before the test saw it: it waits for the release), the chunks are numbered 1..n without
gap or repeat, the phases come in order, and the stream ends with ``end`` and the deployment's status.
Then the database's bytes (the SQLite files; every PostgreSQL table's rows as text) and every file of the
data directory (the object store) are searched for the marker: it is nowhere; the same grep finds a
chunk's ciphertext in the database and the whole log's in the data directory, so it looks where they are.
Each test runs its own server on a fresh database (the ``database_url`` fixture): about 7 s each.
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.launchers.kubernetes_job import DEFAULT_RUNNER_IMAGE
from orchestrator.protocol import age, agent_auth, log_stream
from orchestrator.protocol.log_stream import ChunkPlaintext, Phase
from tests.support.agent_process import AgentProcess
from tests.support.kube_agent import NAMESPACE, agent_stack, start_agent
from tests.support.kube_api import KubeApiServer, runner_image
from tests.support.live_follow import MarkerModule, SseEvent, StoredBytes, decrypt, follow
from tests.support.managed import MANAGED_SECRET, RunnerProcess
from tests.support.outages import ServerProcess, wait_for
from tests.support.sshd import running_sshd, vm_runner_body
from tests.support.stack import Stack, build_stack, demo_manifest, runner_body

pytestmark = pytest.mark.slow

#: Every phase of a deployment, in order.
PHASES = [Phase.QUEUED, Phase.LAUNCHING, Phase.INIT, Phase.PLAN, Phase.APPLY, Phase.REPORTING]


@pytest.fixture
def marker() -> Iterator[MarkerModule]:
    made = MarkerModule.new()
    yield made
    made.remove()


@pytest.fixture
def stacks() -> Iterator[list[Stack]]:
    made: list[Stack] = []
    yield made
    for stack in made:
        stack.client.close()


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.stop()


def start_server(
    servers: list[ServerProcess], database_url: str, tmp_path: Path, **env: str
) -> ServerProcess:
    server = ServerProcess(database_url, tmp_path / "data", **env)
    servers.append(server)
    server.start()
    return server


@dataclass
class Followed:
    """What the follower saw of one deployment, and what the API and the storage said after."""

    deployment_id: str
    events: list[SseEvent]
    chunks: list[ChunkPlaintext]
    #: The deployment as the API answered right after the marker arrived.
    when_marker_arrived: dict[str, Any]
    finished: dict[str, Any]
    page: dict[str, Any]
    #: The whole log the runner put at the end: as stored (base64 age ciphertext), and decrypted.
    whole_log: str
    whole_log_plain: str
    stored: StoredBytes
    #: The server's data directory (its object store under it) and its log.
    data_dir: Path
    server_log: str


def follow_marker_run(
    stack: Stack, server: ServerProcess, marker: MarkerModule, *, env_id: str = "dev"
) -> Followed:
    """Deploy the marker module on ``shop/<env_id>``, follow its logs from the start, release the run once
    the marker arrived, and collect everything."""
    marker.install(stack)
    identity, recipient = age.generate_identity()
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={
            "project_id": "shop",
            "env_id": env_id,
            "mode": "deploy",
            "manifest": demo_manifest(),
            "encrypted_outputs_recipient": recipient,
            "encrypted_logs_recipient": recipient,
        },
    )
    assert 201 == created.status_code, created.text
    deployment_id: str = created.json()["id"]
    follower = follow(stack, deployment_id)

    def marker_in(events: list[SseEvent]) -> bool:
        return any(
            marker.marker in decrypt(event, identity, deployment_id).text
            for event in events
            if event.name == log_stream.SSE_CHUNK
        )

    try:
        follower.wait_for(marker_in, f"chunk with the marker (server log: {server.log})")
        then = stack.client.get(f"/orgs/{stack.org}/deployments/{deployment_id}")
        assert 200 == then.status_code, then.text
    finally:
        marker.release()
    events = follower.wait_done()
    finished = stack.wait(deployment_id)
    page = stack.client.get(f"/orgs/{stack.org}/deployments/{deployment_id}/logs", params={"limit": 1000})
    assert 200 == page.status_code, page.text
    get_logs = f"/orgs/{stack.org}/deployments/{deployment_id}/actions/get-logs"
    whole_log, whole_log_plain = (
        stack.client.get(get_logs),
        stack.client.get(get_logs, headers={"DecryptKey": identity}),
    )
    assert (200, 200) == (whole_log.status_code, whole_log_plain.status_code), whole_log.text
    return Followed(
        deployment_id=deployment_id,
        events=events,
        chunks=[decrypt(e, identity, deployment_id) for e in events if e.name == log_stream.SSE_CHUNK],
        when_marker_arrived=then.json(),
        finished=finished,
        page=page.json(),
        whole_log=whole_log.text,
        whole_log_plain=whole_log_plain.text,
        stored=StoredBytes.read(server.database_url, server.data_dir),
        data_dir=server.data_dir,
        server_log=server.log.read_text(errors="replace"),
    )


def assert_followed_live(run: Followed, marker: MarkerModule) -> None:
    assert "succeeded" == run.finished["status"], run.finished["status_message"]
    # The marker came while the run was executing, in its apply.
    assert "executing" == run.when_marker_arrived["status"]
    [marker_chunk] = [chunk for chunk in run.chunks if marker.marker in chunk.text]
    assert Phase.APPLY == marker_chunk.phase
    # Chunks 1..n, each once, in order; the stored page says the same.
    seqs = [chunk.seq for chunk in run.chunks]
    assert list(range(1, len(seqs) + 1)) == seqs
    assert [str(seq) for seq in seqs] == [e.id for e in run.events if e.name == log_stream.SSE_CHUNK]
    assert seqs == [item["seq"] for item in run.page["items"]]
    assert (len(seqs), True) == (run.page["last_seq"], run.page["complete"])
    # The phases, in order: as events, in the chunks, and in the deployment.
    assert PHASES == [e.data["phase"] for e in run.events if e.name == log_stream.SSE_PHASE]
    chunk_phases = [chunk.phase for chunk in run.chunks]
    assert chunk_phases == sorted(chunk_phases, key=PHASES.index)
    assert {Phase.INIT, Phase.PLAN, Phase.APPLY} <= set(chunk_phases)
    assert PHASES == [p["phase"] for p in run.finished["phases"]]
    # The stream ends with `end` and the deployment's status.
    end = run.events[-1]
    assert log_stream.SSE_END == end.name, run.events[-3:]
    assert ("succeeded", len(seqs)) == (end.data["status"], end.data["last_seq"])
    assert 1 == len([e for e in run.events if e.name == log_stream.SSE_END])
    # Nothing stored holds the marker; the grep does find where the chunks and the whole log (which holds
    # the marker once decrypted) are: the database and the object store under the data directory.
    assert [] == run.stored.where(marker.marker.encode())
    ciphertext = base64.b64decode(run.page["items"][0]["ciphertext"])
    assert ciphertext.startswith(b"age-encryption.org/v1\n")
    assert [] != run.stored.where(ciphertext[:96])
    assert marker.marker in run.whole_log_plain
    assert [] != [
        place
        for place in run.stored.where(run.whole_log[:96].encode())
        if place.startswith(str(run.data_dir))
    ]
    assert marker.marker not in run.server_log


# --- (a) the agent --------------------------------------------------------------------------------------


def test_follow__a_run_through_the_agent(
    database_url: str, tmp_path: Path, servers: list[ServerProcess], stacks: list[Stack], marker: MarkerModule
) -> None:
    server = start_server(
        servers, database_url, tmp_path, PO_AGENT_FETCH_WAIT_SECONDS="5", PO_AGENT_LEASE_SECONDS="10"
    )
    private_pem, public_pem = agent_auth.generate_key_pair()
    body = runner_body(tmp_path / "terraformrc")
    body["runner_configuration"]["connection"] = {"type": "agent", "key": public_pem}
    stack = build_stack(server.url, tmp_path, runner=body)
    stacks.append(stack)
    agent = AgentProcess(server.url, private_pem, tmp_path).start()
    try:
        run = follow_marker_run(stack, server, marker)
    finally:
        agent.stop()

    assert_followed_live(run, marker)
    assert "local" == run.finished["runner_id"]


def test_follow__a_run_through_the_kubernetes_agent(
    database_url: str, tmp_path: Path, servers: list[ServerProcess], stacks: list[Stack], marker: MarkerModule
) -> None:
    """The same through a ``kubernetes-agent`` runner: the agent creates a Job on the stand-in Kubernetes
    API (tests/support/kube_api.py, whose kubelet runs the pod's runner as a local process)."""
    server = start_server(servers, database_url, tmp_path)
    private_pem, public_pem = agent_auth.generate_key_pair()
    images = {DEFAULT_RUNNER_IMAGE: runner_image()}
    with KubeApiServer(tmp_path / "kube", namespaces=("default", NAMESPACE), images=images) as api:
        stack = agent_stack(server.url, tmp_path, public_pem)
        stacks.append(stack)
        agent = start_agent(server.url, private_pem, api, tmp_path)
        try:
            run = follow_marker_run(stack, server, marker)
        finally:
            agent.stop()

    assert_followed_live(run, marker)
    assert "local" == run.finished["runner_id"]


# --- (b) a managed runner -------------------------------------------------------------------------------


def test_follow__a_run_through_a_managed_runner(
    database_url: str, tmp_path: Path, servers: list[ServerProcess], stacks: list[Stack], marker: MarkerModule
) -> None:
    server = start_server(servers, database_url, tmp_path, MANAGED_RUNNER_SECRET=MANAGED_SECRET)
    stack = build_stack(server.url, tmp_path)
    stacks.append(stack)
    for path, payload in [
        ("/env-types", {"id": "edge"}),
        ("/projects/shop/envs", {"id": "edge", "env_type_id": "edge"}),
        ("/runner-rules", {"runner_id": "managed", "env_type_id": "edge"}),
    ]:
        response = stack.client.post(f"/orgs/{stack.org}{path}", json=payload)
        assert 201 == response.status_code, (path, response.text)
    runner = RunnerProcess(server.url, "pool-live", tmp_path).start()
    try:
        wait_for(runner.registrations, 60, "the managed runner to register")
        run = follow_marker_run(stack, server, marker, env_id="edge")
    finally:
        runner.stop()
        if os.geteuid() == 0:  # its work directory is one of its own under the system's temporary directory
            shutil.rmtree(runner.work_dir.parent, ignore_errors=True)

    assert_followed_live(run, marker)
    assert "managed" == run.finished["runner_id"]


# --- (c) the ssh launcher -------------------------------------------------------------------------------


def test_follow__a_run_through_the_ssh_launcher(
    database_url: str, tmp_path: Path, servers: list[ServerProcess], stacks: list[Stack], marker: MarkerModule
) -> None:
    with running_sshd(tmp_path / "sshd") as sshd:
        # The SSH server listens on 127.0.0.1, which the server refuses by default: allowed here.
        server = start_server(servers, database_url, tmp_path, PO_RUNNER_DENIED_NETWORKS="")
        stack = build_stack(server.url, tmp_path, runner=vm_runner_body(sshd, tmp_path))
        stacks.append(stack)
        run = follow_marker_run(stack, server, marker)

    assert_followed_live(run, marker)
    assert "local" == run.finished["runner_id"]
