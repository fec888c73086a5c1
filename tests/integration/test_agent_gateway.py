"""The gateway's command protocol, in process: agent auth, the long poll, leases and receipts,
ack/retry/reject, order and exclusivity, TTL expiry, events applied once, and the dispatcher's side."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import jwt
import pytest
import sqlalchemy as sa
import time_machine
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI

from orchestrator import deployment_tokens
from orchestrator.gateway.agent_authentication import UNAUTHENTICATED
from orchestrator.protocol import agent_auth
from orchestrator.protocol import commands as protocol
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import agent_commands as command_store
from orchestrator.store import agent_tokens as token_store
from orchestrator.store.schema import agent_commands, agent_token_uses, deployments
from tests.support.agent_gateway import AgentHarness, gateway_settings
from tests.support.deployments import insert_deployment
from tests.support.orgs import Org


@pytest.fixture
def agent_settings(request: pytest.FixtureRequest, settings: ServerSettings) -> ServerSettings:
    """Short agent waits and leases; a test changes them with ``@pytest.mark.parametrize(...,
    indirect=True)`` (names of the ``agent_*`` settings without their prefix)."""
    return gateway_settings(settings, **getattr(request, "param", {}))


@pytest.fixture
async def app(agent_settings: ServerSettings) -> AsyncIterator[FastAPI]:
    application = create_app(agent_settings)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def agent(app: FastAPI, org: Org) -> AsyncIterator[AgentHarness]:
    made = await AgentHarness.create(app, org)
    yield made
    await made.aclose()


async def test_dispatch__agent_deployment_launched_by_enqueueing_its_command(agent: AgentHarness) -> None:
    deployment_id = await agent.deployment()
    [command] = await agent.commands(deployment_id)
    row = await agent.row(deployment_id)

    assert f"create-job:{deployment_id}:1" == command.id
    assert ("pending", 0) == (command.state, command.attempt)
    assert ("launched", f"agent:{command.id}") == (row.dispatch_state, row.handle)
    # Event-driven: the only check due is the deployment timeout.
    assert row.timeout_at == row.next_check_at
    assert "token" not in command.envelope["payload"]["spec"]
    assert "executing" == (await agent.get(deployment_id))["status"]


async def test_next__delivers_the_command_with_its_token_lease_and_receipt(
    agent: AgentHarness, app: FastAPI
) -> None:
    deployment_id = await agent.deployment()
    before = datetime.now(UTC)

    response = await agent.next()
    delivered = protocol.NextCommand.model_validate_json(response.content)
    payload = protocol.check_envelope(
        delivered.command, org_id="acme", runner_id="agent1", now=datetime.now(UTC)
    )

    assert 200 == response.status_code
    assert (f"create-job:{deployment_id}:1", "create-job", "v1") == (
        delivered.command.command_id,
        delivered.command.type,
        delivered.command.protocol_version,
    )
    assert 1 == delivered.attempt
    assert (
        before + timedelta(seconds=1.5)
        < delivered.lease_expires_at
        <= datetime.now(UTC) + timedelta(seconds=2)
    )
    assert timedelta(hours=24) == delivered.command.expires_at - delivered.command.created_at
    assert payload.spec.token is not None
    expected_token = deployment_tokens.deployment_token(app.state.services.token_key, "acme", deployment_id)
    assert expected_token == payload.spec.token.get_secret_value()
    assert (deployment_id, "vm", "deploy") == (payload.job_id, payload.spec.runner_type, payload.spec.mode)
    assert set(response.json()) == {"command", "receipt", "attempt", "lease_expires_at"}


@pytest.mark.parametrize("agent_settings", [{"fetch_wait_seconds": 3.0}], indirect=True)
async def test_next__kubernetes_agent_command_carries_the_job_spec_with_token_only_on_delivery(
    agent: AgentHarness, app: FastAPI
) -> None:
    """For upstream's agent: ``configuration`` is the runner's JobSpec, its container ``main`` with the
    runner's environment; TOKEN is added on delivery (the stored command has none), the agent's key never."""
    template = {
        "spec": {"containers": [{"name": "main", "env": [{"name": "IAC_BACKEND", "value": "embedded"}]}]}
    }
    await agent.add_runner(
        "k8s1",
        {
            "type": "kubernetes-agent",
            "key": agent.public_pem,
            "job": {"namespace": "runners", "service_account": "runner", "pod_template": template},
        },
    )
    deployment_id = await agent.deployment(runner="k8s1")
    [stored] = await agent.commands(deployment_id)
    token = deployment_tokens.deployment_token(app.state.services.token_key, "acme", deployment_id)

    response = await agent.next(runner="k8s1")
    payload = response.json()["command"]["payload"]
    job_spec = payload["configuration"]
    [main] = job_spec["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in main["env"]}

    assert 200 == response.status_code
    assert token not in str(stored.envelope)
    assert "TOKEN" not in str(stored.envelope["payload"]["configuration"])
    assert (deployment_id, "runners") == (payload["job_id"], payload["namespace"])
    assert token == env["TOKEN"] == payload["spec"]["token"]
    assert (deployment_id, "acme", "k8s1", "deploy", "embedded") == (
        env["DEPLOYMENT_ID"],
        env["ORG_ID"],
        env["RUNNER_ID"],
        env["MODE"],
        env["IAC_BACKEND"],
    )
    assert {"DEPLOYMENT_ENV_UUID", "LOG_LEVEL", "METADATA_KEY", "RUNNER_GATEWAY_URL"} <= set(env)
    assert (["standard"], "Never", "runner") == (
        main["args"],
        job_spec["template"]["spec"]["restartPolicy"],
        job_spec["template"]["spec"]["serviceAccountName"],
    )
    assert "PUBLIC KEY" not in str(payload) and "PRIVATE KEY" not in str(payload)


async def test_next__kubernetes_agent_command_stored_before_job_specs_is_delivered_as_before(
    agent: AgentHarness, app: FastAPI
) -> None:
    """A command stored by an earlier version (only ``spec``) still reaches our agent, token and all."""
    job = {"namespace": "runners", "service_account": "runner"}
    await agent.add_runner("k8s1", {"type": "kubernetes-agent", "key": agent.public_pem, "job": job})
    deployment_id = await agent.deployment(runner="k8s1")
    [stored] = await agent.commands(deployment_id)
    envelope = {**stored.envelope}
    envelope["payload"] = {k: v for k, v in envelope["payload"].items() if k != "configuration"}
    async with app.state.services.engine.begin() as conn:
        await conn.execute(
            agent_commands.update().where(agent_commands.c.id == stored.id).values(envelope=envelope)
        )

    response = await agent.next(runner="k8s1")
    delivered = protocol.NextCommand.model_validate_json(response.content)
    payload = protocol.check_envelope(
        delivered.command, org_id="acme", runner_id="k8s1", now=datetime.now(UTC)
    )

    assert 200 == response.status_code
    assert "configuration" not in response.json()["command"]["payload"]
    assert payload.spec.token is not None
    expected = deployment_tokens.deployment_token(app.state.services.token_key, "acme", deployment_id)
    assert expected == payload.spec.token.get_secret_value()
    assert ("kubernetes-agent", job) == (payload.spec.runner_type, payload.spec.job)


async def test_next__204_after_the_wait_when_there_is_nothing(agent: AgentHarness) -> None:
    waiting = asyncio.create_task(agent.next())
    await asyncio.sleep(0.5)
    still_waiting = not waiting.done()
    response = await waiting

    assert 204 == response.status_code
    assert still_waiting


# The background loop would flush presence too (every 0 s in these tests): the tests flush themselves.
@pytest.mark.parametrize("agent_settings", [{"presence_interval_seconds": 3600}], indirect=True)
async def test_presence__get_runner_answers_when_the_agent_last_polled(
    agent: AgentHarness, app: FastAPI, org: Org
) -> None:
    runner_path = f"/orgs/{org.id}/runners/{agent.runner}"
    never = (await org.clients["viewer"].get(runner_path)).json()
    before = datetime.now(UTC)
    await agent.next()
    await app.state.agent_gateway.presence.flush(app.state.services)
    seen = (await org.clients["viewer"].get(runner_path)).json()
    direct = (await org.clients["viewer"].get(f"/orgs/{org.id}/runners/local1")).json()

    assert {"last_seen_at": None} == never["status"]
    assert before <= datetime.fromisoformat(seen["status"]["last_seen_at"]) <= datetime.now(UTC)
    # A runner the orchestrator launches: no presence, whether it can launch (its Docker may be absent here).
    assert {"launchable"} == set(direct["status"]) - {"message"}


@pytest.mark.parametrize("agent_settings", [{"presence_interval_seconds": 3600}], indirect=True)
async def test_presence__written_in_one_batch_skipping_runners_deleted_meanwhile(
    agent: AgentHarness, app: FastAPI, org: Org
) -> None:
    await agent.add_runner("agent2", {"type": "vm", "connection": {"type": "agent", "key": agent.public_pem}})
    gateway = app.state.agent_gateway
    gateway.presence.seen(org.id, "agent1")
    gateway.presence.seen(org.id, "agent2")
    assert 204 == (await org.admin.delete(f"/orgs/{org.id}/runners/agent2")).status_code
    await gateway.presence.flush(app.state.services)
    async with app.state.services.engine.connect() as conn:
        first = await command_store.last_seen(conn, org.id, "agent1")
        second = await command_store.last_seen(conn, org.id, "agent2")

    assert first is not None
    assert second is None


@pytest.mark.parametrize(
    "agent_settings", [{"fetch_wait_seconds": 10.0, "poll_fallback_seconds": 30.0}], indirect=True
)
async def test_next__a_waiting_poll_is_answered_as_soon_as_the_command_is_committed(
    agent: AgentHarness,
) -> None:
    """With the polling fallback at 30 s, only the in-process notification can answer within the wait."""
    waiting = asyncio.create_task(agent.next())
    await asyncio.sleep(0.3)
    was_waiting = not waiting.done()
    deployment_id = await agent.deployment(wait=False)
    response = await waiting

    assert was_waiting
    assert 200 == response.status_code
    assert deployment_id == response.json()["command"]["deployment_id"]


async def test_presence__a_runner_deleted_between_lookup_and_upsert_is_skipped(
    agent: AgentHarness, app: FastAPI, org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the batch write must survive: the runners were looked up before one was deleted."""
    await agent.add_runner("agent2", {"type": "vm", "connection": {"type": "agent", "key": agent.public_pem}})
    assert 204 == (await org.admin.delete(f"/orgs/{org.id}/runners/agent2")).status_code
    real = command_store._existing_presences
    lookups: list[int] = []

    async def looked_up_before_the_delete(conn: Any, seen: dict[tuple[str, str], datetime]) -> Any:
        lookups.append(len(seen))
        if len(lookups) == 1:
            return [{"org_id": o, "runner_id": r, "last_seen_at": at} for (o, r), at in seen.items()]
        return await real(conn, seen)

    monkeypatch.setattr(command_store, "_existing_presences", looked_up_before_the_delete)
    now = datetime.now(UTC)
    async with app.state.services.engine.begin() as conn:
        written = await command_store.touch_presences(
            conn, {(org.id, "agent1"): now, (org.id, "agent2"): now}
        )
    async with app.state.services.engine.connect() as conn:
        first = await command_store.last_seen(conn, org.id, "agent1")

    assert (1, [2, 2]) == (written, lookups)
    assert first is not None


async def test_late_agent__started_an_hour_later_gets_the_command(agent: AgentHarness) -> None:
    """Simulated clock: nobody polls for an hour (of the 24 h TTL); the command then goes out as the first
    delivery and the deployment finishes by the agent's events."""
    deployment_id = await agent.deployment()
    later = datetime.now(UTC) + timedelta(hours=1, minutes=1)
    with time_machine.travel(later, tick=True):
        response = await agent.next()
        delivered = protocol.NextCommand.model_validate_json(response.content)
        payload = protocol.check_envelope(
            delivered.command, org_id="acme", runner_id="agent1", now=datetime.now(UTC)
        )
        created = await agent.event("job-created", deployment_id, {"job_id": payload.job_id})
        acked = await agent.answer("ack", delivered.command.command_id, {"receipt": delivered.receipt})
        result = await agent.event("deployment-result", deployment_id, {"status": "success"})
        finished = await agent.get(deployment_id)
        [command] = await agent.commands(deployment_id)

    assert 200 == response.status_code
    assert (1, deployment_id) == (delivered.attempt, payload.job_id)
    assert later < delivered.lease_expires_at < later + timedelta(minutes=5)
    # Created before the hour passed; still far from its expiry when delivered.
    assert delivered.command.created_at < later - timedelta(hours=1)
    assert delivered.command.expires_at - later > timedelta(hours=22)
    assert (202, 204, 202) == (created.status_code, acked.status_code, result.status_code)
    assert ("acked", "succeeded") == (command.state, finished["status"])


@pytest.mark.parametrize(
    "agent_settings", [{"fetch_wait_seconds": 10.0, "poll_fallback_seconds": 60.0}], indirect=True
)
async def test_replicas__a_poll_on_another_replica_is_woken_by_postgresql_notify(
    agent: AgentHarness, agent_settings: ServerSettings, database_url: str
) -> None:
    """Two server processes on one database: the command committed by the first one's dispatcher answers
    the long poll waiting on the second at once (its polling fallback is at 60 s, beyond the wait)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("cross-replica wake-ups are PostgreSQL's LISTEN/NOTIFY; SQLite has one server process")
    replica = create_app(agent_settings, run_migrations=False, run_dispatcher=False)
    async with replica.router.lifespan_context(replica):
        await asyncio.wait_for(replica.state.agent_gateway.listening.wait(), 10)
        transport = httpx.ASGITransport(app=replica)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica.test") as client:
            waiting = asyncio.create_task(
                client.post(protocol.next_command_path("acme", "agent1"), headers=agent.headers(), timeout=30)
            )
            await asyncio.sleep(0.3)
            was_waiting = not waiting.done()
            deployment_id = await agent.deployment(wait=False)
            response = await waiting

    assert was_waiting
    assert 200 == response.status_code, response.text
    assert deployment_id == response.json()["command"]["deployment_id"]


async def test_ack__closes_the_command_and_the_next_one_follows_in_order(agent: AgentHarness) -> None:
    first = await agent.deployment()
    second = await agent.deployment()

    one = await agent.next()
    while_first_is_out = await agent.next()
    acked = await agent.answer("ack", one.json()["command"]["command_id"], {"receipt": one.json()["receipt"]})
    again = await agent.answer("ack", one.json()["command"]["command_id"], {"receipt": one.json()["receipt"]})
    two = await agent.next()
    [command] = await agent.commands(first)

    assert first == one.json()["command"]["deployment_id"]
    assert 204 == while_first_is_out.status_code
    assert (204, 204) == (acked.status_code, again.status_code)
    assert "acked" == command.state
    assert second == two.json()["command"]["deployment_id"]


async def test_next__concurrent_agents_never_get_the_same_command(agent: AgentHarness) -> None:
    await agent.deployment()
    await agent.deployment()

    answers = await asyncio.gather(*(agent.next() for _ in range(6)))

    assert 1 == sum(1 for a in answers if a.status_code == 200)
    assert 5 == sum(1 for a in answers if a.status_code == 204)


async def test_lease__runs_out_and_the_command_is_redelivered_with_a_new_receipt(agent: AgentHarness) -> None:
    """Simulated clock, stopped: half a second before the lease ends the command stays out (the long poll
    waits its whole second for nothing); just after, it goes out again."""
    await agent.deployment()
    first = (await agent.next()).json()
    lease_ends = datetime.fromisoformat(first["lease_expires_at"])
    with time_machine.travel(lease_ends - timedelta(seconds=0.5), tick=False):
        during_lease = await agent.next()
    with time_machine.travel(lease_ends + timedelta(seconds=0.1), tick=False):
        second = (await agent.next()).json()
        command_id = first["command"]["command_id"]
        stale = await agent.answer("ack", command_id, {"receipt": first["receipt"]})
        fresh = await agent.answer("ack", command_id, {"receipt": second["receipt"]})

    assert 204 == during_lease.status_code
    assert command_id == second["command"]["command_id"]
    assert (1, 2) == (first["attempt"], second["attempt"])
    assert 409 == stale.status_code
    assert 204 == fresh.status_code


async def test_retry__redelivered_after_the_delay(agent: AgentHarness) -> None:
    await agent.deployment()
    first = (await agent.next()).json()
    command_id = first["command"]["command_id"]

    retried = await agent.answer("retry", command_id, {"receipt": first["receipt"], "delay_seconds": 2})
    during_delay = await agent.next()
    [command] = await agent.commands(first["command"]["deployment_id"])
    # Simulated clock, stopped: half a second before the delay ends, then just after it.
    with time_machine.travel(command.available_at - timedelta(seconds=0.5), tick=False):
        late_in_the_delay = await agent.next()
    with time_machine.travel(command.available_at + timedelta(seconds=0.1), tick=False):
        after_delay = await agent.next()
    too_long = await agent.answer("retry", command_id, {"receipt": first["receipt"], "delay_seconds": 61})

    assert 204 == retried.status_code
    assert (204, 204) == (during_delay.status_code, late_in_the_delay.status_code)
    assert timedelta(seconds=2) == command.available_at - command.updated_at
    assert (200, 2) == (after_delay.status_code, after_delay.json()["attempt"])
    assert 400 == too_long.status_code


async def test_reject__dead_letters_the_command_and_fails_the_deployment(agent: AgentHarness) -> None:
    deployment_id = await agent.deployment()
    first = (await agent.next()).json()

    rejected = await agent.answer(
        "reject", first["command"]["command_id"], {"receipt": first["receipt"], "reason": "no such image"}
    )
    deployment = await agent.get(deployment_id)
    [command] = await agent.commands(deployment_id)
    after = await agent.next()

    assert 204 == rejected.status_code
    assert ("failed", "COMMAND_REJECTED") == (deployment["status"], deployment["error"]["error"])
    assert "no such image" in deployment["status_message"]
    # No runner was started (issue 22): its phases end with launching (the command's creation).
    assert deployment["status_message"].endswith("(it failed before its runner started, while launching)")
    assert ("rejected", "no such image") == (command.state, command.reason)
    assert 204 == after.status_code


async def test_receipts__forged_or_of_another_command_refused(agent: AgentHarness) -> None:
    first_id = await agent.deployment()
    await agent.deployment()
    first = (await agent.next()).json()
    other_command = protocol.command_id(str(uuid.uuid4()))

    forged = await agent.answer("ack", first["command"]["command_id"], {"receipt": "x" * 60})
    other = await agent.answer("ack", other_command, {"receipt": first["receipt"]})
    missing = await agent.answer("ack", first["command"]["command_id"], {})
    [command] = await agent.commands(first_id)

    assert (400, 400, 400) == (forged.status_code, other.status_code, missing.status_code)
    assert "leased" == command.state


@pytest.mark.parametrize("agent_settings", [{"command_ttl_seconds": 0.5}], indirect=True)
async def test_expiry__a_command_nobody_picked_up_fails_its_deployment(agent: AgentHarness) -> None:
    deployment_id = await agent.deployment()
    deployment = await agent.final(deployment_id)
    [command] = await agent.commands(deployment_id)
    after = await agent.next()

    assert ("failed", "COMMAND_EXPIRED") == (deployment["status"], deployment["error"]["error"])
    assert "did not pick up" in deployment["status_message"]
    assert deployment["status_message"].endswith("(it failed before its runner started, while launching)")
    assert "expired" == command.state
    assert 204 == after.status_code


async def test_timeout__an_agent_deployment_times_out_and_its_command_is_cancelled(
    agent: AgentHarness, app: FastAPI
) -> None:
    deployment_id = await agent.deployment()
    async with app.state.services.engine.begin() as conn:
        past = datetime.now(UTC) - timedelta(seconds=1)
        await conn.execute(
            deployments.update()
            .where(deployments.c.id == uuid.UUID(deployment_id))
            .values(timeout_at=past, next_check_at=past)
        )
    app.state.dispatcher.wake()
    deployment = await agent.final(deployment_id)
    [command] = await agent.commands(deployment_id)

    assert ("failed", "TIMEOUT") == (deployment["status"], deployment["error"]["error"])
    assert "cancelled" == command.state
    assert 204 == (await agent.next()).status_code


# --- events -----------------------------------------------------------------------------------------------


async def test_events__the_same_event_three_times_is_applied_once(agent: AgentHarness, app: FastAPI) -> None:
    deployment_id = await agent.deployment()
    payload = {"job_id": deployment_id}

    answers = [await agent.event("job-created", deployment_id, payload) for _ in range(3)]
    [recorded] = await agent.commands(deployment_id)
    # A minute later (simulated clock): applied again, the repeat would move job_created_at.
    with time_machine.travel(datetime.now(UTC) + timedelta(minutes=1), tick=True):
        repeat = await agent.event("job-created", deployment_id, {"job_id": "another-job"})
    [after_repeat] = await agent.commands(deployment_id)
    async with app.state.services.engine.connect() as conn:
        inbox = await command_store.count_events(conn, "acme", "agent1")

    assert [202, 202, 202] == [a.status_code for a in answers]
    assert 202 == repeat.status_code
    assert 1 == inbox
    assert (deployment_id, recorded.job_created_at) == (after_repeat.job_id, after_repeat.job_created_at)


async def test_events__terminal_runner_error_fails_the_deployment_once(agent: AgentHarness) -> None:
    deployment_id = await agent.deployment()
    error = {"job_id": deployment_id, "code": "REMOTE_RUNNER", "message": "forbidden", "retryable": False}
    event_id = f"{protocol.command_id(deployment_id)}:runner-error-terminal"

    answers = [await agent.event("runner-error", deployment_id, error, event_id=event_id) for _ in range(3)]
    failed = await agent.get(deployment_id)
    after = await agent.next()
    [command] = await agent.commands(deployment_id)

    assert [202, 202, 202] == [a.status_code for a in answers]
    assert ("failed", "REMOTE_RUNNER") == (failed["status"], failed["error"]["error"])
    assert "forbidden" in failed["status_message"]
    # Never delivered: its deployment is final.
    assert (204, "cancelled") == (after.status_code, command.state)


async def test_events__retryable_runner_error_is_only_logged(agent: AgentHarness) -> None:
    deployment_id = await agent.deployment()
    error = {"code": "REMOTE_RUNNER", "message": "apiserver busy", "retryable": True}

    answer = await agent.event("runner-error", deployment_id, error)

    assert 202 == answer.status_code
    assert "executing" == (await agent.get(deployment_id))["status"]


async def test_events__deployment_result_applies_results(agent: AgentHarness) -> None:
    deployment_id = await agent.deployment()

    answer = await agent.event(
        "deployment-result",
        deployment_id,
        {"status": "success"},
        event_id=f"{deployment_id}:deployment-result",
    )

    assert 202 == answer.status_code
    assert "succeeded" == (await agent.get(deployment_id))["status"]


async def test_events__upstream_envelope_accepted_and_an_unknown_protocol_version_refused(
    agent: AgentHarness,
) -> None:
    deployment_id = await agent.deployment()
    created_at = datetime.now(UTC).isoformat()

    newer = await agent.event(
        "job-created", deployment_id, {"job_id": deployment_id}, protocol_version="v2", created_at=created_at
    )
    upstream = await agent.event(
        "job-created", deployment_id, {"job_id": deployment_id}, protocol_version="v1", created_at=created_at
    )
    [command] = await agent.commands(deployment_id)

    assert 400 == newer.status_code
    assert (
        "protocol_version: protocol version 'v2' is not supported: this gateway speaks 'v1'"
        in (newer.json()["message"])
    )
    assert [{"field": "protocol_version"}] == [
        {"field": e["field"]} for e in newer.json()["details"]["errors"]
    ]
    assert 202 == upstream.status_code
    assert deployment_id == command.job_id


async def test_events__refused_when_not_this_runners(agent: AgentHarness, app: FastAPI, org: Org) -> None:
    deployment_id = await agent.deployment()
    env = (await org.admin.get(f"/orgs/{org.id}/projects/shop/envs/e1")).json()
    others = await insert_deployment(app, org.id, env, status="succeeded", runner_id="local1")

    wrong_org = await agent.event("job-created", deployment_id, {"job_id": "j"}, organization_id="globex")
    wrong_runner = await agent.event("job-created", deployment_id, {"job_id": "j"}, runner_id="local1")
    other_runners = await agent.event("job-created", others, {"job_id": "j"})
    unknown = await agent.event("job-created", str(uuid.uuid4()), {"job_id": "j"})
    bad_payload = await agent.event("runner-error", deployment_id, {"code": "X"})
    bad_type = await agent.event("job-deleted", deployment_id, {})
    async with app.state.services.engine.connect() as conn:
        inbox = await command_store.count_events(conn, "acme", "agent1")

    assert (400, 400) == (wrong_org.status_code, wrong_runner.status_code)
    assert (404, 404) == (other_runners.status_code, unknown.status_code)
    assert (400, 400) == (bad_payload.status_code, bad_type.status_code)
    assert 0 == inbox


# --- authentication ---------------------------------------------------------------------------------------


async def test_auth__every_bad_token_is_the_same_401(agent: AgentHarness) -> None:
    other_key = Ed25519PrivateKey.generate()
    now = time.time()
    path = protocol.next_command_path("acme", "agent1")

    answers = {
        "wrong key": await agent.next(key=other_key),
        "wrong org": await agent.client.post(path, headers=agent.headers(org="globex")),
        "wrong runner": await agent.client.post(path, headers=agent.headers(runner="local1")),
        "expired": await agent.next(now=now - 300 - 31),
        "future": await agent.next(now=now + 40),
        "no token": await agent.client.post(path),
        "garbage": await agent.client.post(path, headers={"Authorization": "Bearer garbage"}),
        "basic": await agent.client.post(path, headers={"Authorization": "Basic YTpi"}),
        "not an agent runner": await agent.next(runner="local1"),
        "no such runner": await agent.next(runner="nobody"),
    }
    events = await agent.client.post(
        protocol.events_path("acme", "agent1"), json={}, headers=agent.headers(key=other_key)
    )
    ack = await agent.client.post(
        protocol.command_action_path("acme", "agent1", "create-job:x:1", "ack"),
        json={"receipt": "r"},
        headers=agent.headers(key=other_key),
    )

    for name, answer in {**answers, "events": events, "ack": ack}.items():
        assert (401, {"error": "API-401", "message": UNAUTHENTICATED}) == (
            answer.status_code,
            answer.json(),
        ), name


async def test_auth__tokens_within_the_skew_are_accepted(agent: AgentHarness) -> None:
    now = time.time()

    ahead = await agent.next(now=now + 25)
    behind = await agent.next(now=now - 300 - 25)

    assert (204, 204) == (ahead.status_code, behind.status_code)


async def test_auth__a_replayed_token_is_refused(agent: AgentHarness) -> None:
    """Each of our agent's tokens (with jti) opens one request: the same token again is 401, at once,
    on the long poll (served by the middleware) and on the routes alike."""
    headers = agent.headers()
    path = protocol.next_command_path("acme", "agent1")
    events = protocol.events_path("acme", "agent1")

    first = await agent.client.post(path, headers=headers)
    replayed = await agent.client.post(path, headers=headers)
    replayed_elsewhere = await agent.client.post(events, headers=headers, json={})
    fresh = await agent.next()

    assert (204, 401, 401, 204) == (
        first.status_code,
        replayed.status_code,
        replayed_elsewhere.status_code,
        fresh.status_code,
    )
    assert UNAUTHENTICATED == replayed.json()["message"]


async def test_auth__upstream_token_without_jti_reused_only_within_seconds(
    agent: AgentHarness, app: FastAPI
) -> None:
    """An upstream agent's token has no jti: two of its requests in one second carry the same token, so
    the same token is accepted again for REUSE_WITHOUT_JTI_SECONDS after its first use, then never."""
    now = time.time()
    claims = {
        "aud": agent_auth.AUDIENCE,
        "org_id": "acme",
        "runner_id": "agent1",
        "iat": int(now),
        "exp": int(now) + agent_auth.TOKEN_LIFETIME_SECONDS,
    }
    token = jwt.encode(claims, agent.key, algorithm="EdDSA", headers={"typ": "JWT"})
    headers = {"Authorization": f"Bearer {token}"}
    path = protocol.next_command_path("acme", "agent1")
    uses = app.state.agent_gateway.token_uses
    # The uses' clock stands still between the first two requests (each a poll that may wait: on a loaded
    # machine they could be further apart than the window), then moves past the window.
    start = uses.clock()
    uses.clock = lambda: start

    first = await agent.client.post(path, headers=headers)
    again = await agent.client.post(path, headers=headers)
    uses.clock = lambda: start + timedelta(seconds=agent_auth.REUSE_WITHOUT_JTI_SECONDS + 1)
    later = await agent.client.post(path, headers=headers)

    assert (204, 204, 401) == (first.status_code, again.status_code, later.status_code)


async def test_auth__a_token_replayed_to_another_replica_or_after_a_restart_is_refused(
    agent: AgentHarness, app: FastAPI, agent_settings: ServerSettings
) -> None:
    """Each replica writes the uses it accepted and reads the others' (``TokenUses.sync``, every
    PO_AGENT_POLL_FALLBACK_SECONDS): once that ran, a second server on the database, or this one
    restarted, refuses the token too."""
    headers = agent.headers()
    path = protocol.next_command_path("acme", "agent1")
    first = await agent.client.post(path, headers=headers)
    await app.state.agent_gateway.token_uses.sync(app.state.services.engine, app.state.services.reader)
    replica = create_app(agent_settings)

    async with replica.router.lifespan_context(replica):
        await replica.state.agent_gateway.token_uses.sync(
            replica.state.services.engine, replica.state.services.reader
        )
        transport = httpx.ASGITransport(app=replica)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica.test") as client:
            replayed = await client.post(path, headers=headers)
            fresh = await client.post(path, headers=agent.headers())

    assert (204, 401, 204) == (first.status_code, replayed.status_code, fresh.status_code)


async def test_auth__expired_token_uses_are_forgotten_and_deleted(agent: AgentHarness, app: FastAPI) -> None:
    uses = app.state.agent_gateway.token_uses
    await agent.next()
    await uses.sync(app.state.services.engine, app.state.services.reader)
    later = datetime.now(UTC) + timedelta(seconds=agent_auth.TOKEN_LIFETIME_SECONDS + 60)
    async with app.state.services.engine.begin() as conn:
        stored = (await conn.execute(sa.select(sa.func.count()).select_from(agent_token_uses))).scalar_one()
        deleted = await token_store.prune(conn, now=later)

    assert (1, 1) == (len(uses), stored)
    assert 1 == deleted
    assert 1 == uses.forget_expired(later)
    assert 0 == len(uses)


async def test_auth__kubernetes_agent_runner_key_is_used(app: FastAPI, org: Org) -> None:
    private_pem, public_pem = agent_auth.generate_key_pair()
    body = {
        "id": "k8s-agent",
        "runner_configuration": {
            "type": "kubernetes-agent",
            "key": public_pem,
            "job": {"namespace": "default", "service_account": "runner"},
        },
        "state_storage_configuration": {"type": "kubernetes", "namespace": "default"},
    }
    assert 201 == (await org.admin.post(f"/orgs/{org.id}/runners", json=body)).status_code
    key = agent_auth.load_private_key(private_pem)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test") as client:
        ok = await client.post(
            protocol.next_command_path("acme", "k8s-agent"),
            headers={"Authorization": f"Bearer {agent_auth.sign(key, 'acme', 'k8s-agent')}"},
        )
        stranger = agent_auth.sign(Ed25519PrivateKey.generate(), "acme", "k8s-agent")
        other = await client.post(
            protocol.next_command_path("acme", "k8s-agent"), headers={"Authorization": f"Bearer {stranger}"}
        )

    assert (204, 401) == (ok.status_code, other.status_code)


async def test_schema__open_commands_of_a_deleted_deployment_go_with_it(
    agent: AgentHarness, app: FastAPI
) -> None:
    deployment_id = await agent.deployment()
    async with app.state.services.engine.begin() as conn:
        await conn.execute(sa.delete(deployments).where(deployments.c.id == uuid.UUID(deployment_id)))
    async with app.state.services.engine.connect() as conn:
        left = (await conn.execute(sa.select(sa.func.count()).select_from(agent_commands))).scalar_one()

    assert 0 == left
