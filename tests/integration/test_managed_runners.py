"""Managed runners on the server (seed 004): registration, the pool in every organization, claims with
tags, leases, finished, pruning. In-process app, on each database of PO_TEST_DATABASES."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from pydantic import SecretStr
from structlog.testing import capture_logs

from orchestrator import deployment_tokens
from orchestrator.dispatch import managed as policy
from orchestrator.protocol import agent_auth
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store.schema import deployments, managed_runners
from tests.support.managed import (
    MANAGED_SECRET,
    bearer,
    claim,
    deploy,
    managed_env,
    register,
    registered,
)
from tests.support.octl import OctlProcess, org_admin_token, serve
from tests.support.orgs import BOOTSTRAP_TOKEN, Org, api_client

_KEY = agent_auth.generate_key_pair()[1]


@pytest.fixture
def settings(settings: ServerSettings) -> ServerSettings:
    return settings.model_copy(update={"managed_runner_secret": SecretStr(MANAGED_SECRET)})


@pytest.fixture
async def runner_client(app: FastAPI) -> Any:
    """A client without credentials: managed runners carry their own."""
    async with api_client(app, None) as client:
        yield client


async def _deployment_row(app: FastAPI, deployment_id: str) -> Any:
    async with app.state.services.engine.connect() as conn:
        return (
            await conn.execute(sa.select(deployments).where(deployments.c.id == uuid.UUID(deployment_id)))
        ).one()


async def _records(app: FastAPI) -> list[Any]:
    async with app.state.services.engine.connect() as conn:
        return list((await conn.execute(sa.select(managed_runners))).all())


def _worker(app: FastAPI, now: datetime, *, prune_after: float = 86400.0) -> policy.ManagedWorker:
    """The managed runners' worker on a controlled clock."""
    return policy.ManagedWorker(
        engine=app.state.services.engine,
        prune_after=timedelta(seconds=prune_after),
        interval_seconds=1.0,
        on_final=app.state.services.notifier.notify,
        on_requeued=lambda: None,
        clock=lambda: now,
    )


# --- registration ---------------------------------------------------------------------------------------


async def test_register__answers_a_token_stored_only_as_its_hash(
    app: FastAPI, runner_client: httpx.AsyncClient
) -> None:
    response = await register(runner_client, "managed-0", ["docker", "gpu.large"])
    records = await _records(app)

    assert 201 == response.status_code, response.text
    body = response.json()
    assert {
        "name": "managed-0",
        "pool": "managed",
        "tags": ["docker", "managed"],
    }.items() <= body.items()
    assert ["gpu.large"] == [d["tag"] for d in body["droppedTags"]]
    assert "PO_MANAGED_SECRET_TAGS: docker, linux" in body["droppedTags"][0]["reason"]
    assert {"leaseSeconds": 60, "heartbeatSeconds": 15}.items() <= body.items()
    assert str(uuid.UUID(body["runnerId"])) == body["runnerId"]
    assert [hashlib.sha256(body["token"].encode()).hexdigest()] == [r.token_hash for r in records]
    assert not any(body["token"] in str(value) for r in records for value in r)


async def test_register__same_name_replaces_and_old_tokens_stop_working(
    app: FastAPI, runner_client: httpx.AsyncClient
) -> None:
    tokens = [await registered(runner_client, "managed-0") for _ in range(5)]
    records = await _records(app)
    answers = [
        await runner_client.post("/runner/heartbeat", json={}, headers=bearer(token)) for token in tokens
    ]

    assert ["managed-0"] == [r.name for r in records]
    assert [401, 401, 401, 401, 200] == [a.status_code for a in answers]
    assert "the managed runner token is not valid: register again" == answers[0].json()["message"]


async def test_register__wrong_secret_and_bad_input_are_refused(runner_client: httpx.AsyncClient) -> None:
    wrong = await register(runner_client, "managed-0", secret="x" * 48)
    bad_name = await register(runner_client, "Managed_0")
    bad_tag = await register(runner_client, "managed-0", ["ok", "Not OK"])

    assert (401, "the managed runner secret is not valid") == (wrong.status_code, wrong.json()["message"])
    assert 400 == bad_name.status_code and bad_name.json()["message"].startswith("name:")
    assert 400 == bad_tag.status_code and bad_tag.json()["message"].startswith("tags[1]:")


async def test_runner_calls__take_no_secret_and_no_unknown_token(runner_client: httpx.AsyncClient) -> None:
    await registered(runner_client, "managed-0")
    with_secret = await runner_client.post("/runner/heartbeat", json={}, headers=bearer(MANAGED_SECRET))
    without = await runner_client.post("/runner/claim", json={"waitSeconds": 0})

    assert 401 == with_secret.status_code
    assert 401 == without.status_code


async def test_managed_runners_off__routes_404_and_pool_hidden(
    settings: ServerSettings, runner_client: httpx.AsyncClient
) -> None:
    off = create_app(settings.model_copy(update={"managed_runner_secret": None}))
    async with (
        off.router.lifespan_context(off),
        api_client(off, None) as client,
        api_client(off, BOOTSTRAP_TOKEN) as platform,
    ):
        await platform.post("/orgs", json={"id": "acme"})
        answer = await register(client, "managed-0")
        listed = await platform.get("/orgs/acme/runners?include_managed=true")
        got = await platform.get("/orgs/acme/runners/managed")

    assert 404 == answer.status_code
    assert "managed runners are not enabled on this server" in answer.json()["message"]
    assert [] == [r["id"] for r in listed.json()["items"]]
    assert 404 == got.status_code


# --- the pool in every organization ---------------------------------------------------------------------


async def test_pool__listed_in_every_organization_and_read_only(
    org: Org, other_org: Org, runner_client: httpx.AsyncClient
) -> None:
    await registered(runner_client, "managed-0", ["docker"])
    listed = [
        await o.clients["viewer"].get(f"/orgs/{o.id}/runners?include_managed=true") for o in (org, other_org)
    ]
    got = await org.clients["viewer"].get(f"/orgs/{org.id}/runners/managed")
    refused = [
        await client.patch(f"/orgs/{org.id}/runners/managed", json={"description": "mine"})
        for client in (org.admin, org.platform)
    ] + [
        await org.admin.delete(f"/orgs/{org.id}/runners/managed"),
        await org.platform.delete(f"/orgs/{org.id}/runners/managed"),
        await org.admin.post(
            f"/orgs/{org.id}/runners",
            json={
                "id": "managed",
                "runner_configuration": {
                    "type": "kubernetes-agent",
                    "key": _KEY,
                    "job": {"namespace": "n", "service_account": "sa"},
                },
                "state_storage_configuration": {"type": "kubernetes", "namespace": "n"},
            },
        ),
    ]
    still = await org.admin.get(f"/orgs/{org.id}/runners/managed")

    assert [["managed"], ["managed"]] == [[r["id"] for r in answer.json()["items"]] for answer in listed]
    assert {
        "id": "managed",
        "description": "managed by the platform",
        "runner_configuration": {"type": "managed"},
        "state_storage_configuration": {"type": "orchestrator"},
        "launched_by": "platform",
        "status": {"online": 1, "tags": ["docker", "managed"]},
    }.items() <= got.json().items()
    assert [403] * 5 == [r.status_code for r in refused]
    assert {"runner 'managed' is managed by the platform: it cannot be created, changed or deleted"} == {
        r.json()["message"] for r in refused if r.status_code == 403
    }
    assert "managed by the platform" == still.json()["description"]


async def test_rules__required_tags_only_for_managed_and_checked(org: Org) -> None:
    await managed_env(org, "dev")
    runner = {
        "id": "agent1",
        "runner_configuration": {
            "type": "kubernetes-agent",
            "key": _KEY,
            "job": {"namespace": "n", "service_account": "sa"},
        },
        "state_storage_configuration": {"type": "kubernetes", "namespace": "n"},
    }
    await org.admin.post(f"/orgs/{org.id}/runners", json=runner)
    base = f"/orgs/{org.id}/runner-rules"
    not_managed = await org.admin.post(base, json={"runner_id": "agent1", "required_tags": ["docker"]})
    bad_tag = await org.admin.post(base, json={"runner_id": "managed", "required_tags": ["ok", "-no"]})
    good = await org.admin.post(
        base, json={"runner_id": "managed", "project_id": "shop", "required_tags": ["docker", "linux"]}
    )
    untagged = (await org.admin.get(base, params={"byRunnerId": "managed"})).json()["items"]

    assert 400 == not_managed.status_code
    assert not_managed.json()["message"].startswith("required_tags:")
    assert 400 == bad_tag.status_code and bad_tag.json()["message"].startswith("required_tags[1]:")
    assert 201 == good.status_code, good.text
    assert ["docker", "linux"] == good.json()["required_tags"]
    assert [None, ["docker", "linux"]] == sorted(
        (rule.get("required_tags") for rule in untagged), key=lambda tags: tags or []
    )


# --- claims ---------------------------------------------------------------------------------------------


async def test_claim__serves_every_organization_by_tags(
    app: FastAPI, org: Org, other_org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev", ["docker"])
    await managed_env(other_org, "dev")
    needs_docker = await deploy(org, "dev")
    plain = await deploy(other_org, "dev")
    await app.state.dispatcher.run_once()  # the dispatcher leaves them queued
    queued = [(await _deployment_row(app, d)).dispatch_state for d in (needs_docker, plain)]
    linux = await registered(runner_client, "linux-0", ["linux"])
    docker = await registered(runner_client, "docker-0", ["linux", "docker"])

    first = await claim(runner_client, linux)
    again = await claim(runner_client, linux)
    second = await claim(runner_client, docker)
    nothing = await registered(runner_client, "late-0", ["docker"])
    none_left = await claim(runner_client, nothing)

    assert ["queued", "queued"] == queued
    assert 200 == first.status_code, first.text
    assert {"id": plain, "orgId": "globex", "projectId": "shop", "envId": "dev"} == first.json()["deployment"]
    assert 409 == again.status_code and plain in again.json()["message"]
    assert needs_docker == second.json()["deployment"]["id"]
    assert 204 == none_left.status_code
    environment = second.json()["environment"]
    token_key = app.state.services.token_key
    assert {
        "ORG_ID": "acme",
        "RUNNER_ID": "managed",
        "DEPLOYMENT_ID": needs_docker,
        "MODE": "deploy",
        "TOKEN": deployment_tokens.deployment_token(token_key, "acme", needs_docker),
        "LOG_LEVEL": "info",
        "METADATA_KEY": "platform_orchestrator_metadata",
    }.items() <= environment.items()
    assert "DEPLOYMENT_ENV_UUID" in environment
    assert "RUNNER_GATEWAY_URL" not in environment
    assert 60 == second.json()["leaseSeconds"]


async def test_claim__exactly_one_of_two_claimers_gets_a_deployment(
    org: Org, runner_client: httpx.AsyncClient, app: FastAPI
) -> None:
    await managed_env(org, "dev")
    tokens = [await registered(runner_client, f"managed-{i}") for i in range(2)]
    deployment_id = await deploy(org, "dev")

    answers = await asyncio.gather(*(claim(runner_client, token) for token in tokens))

    assert [200, 204] == sorted(a.status_code for a in answers)
    assert [deployment_id] == [a.json()["deployment"]["id"] for a in answers if a.status_code == 200]
    assert 1 == sum(1 for r in await _records(app) if r.claim_deployment_id is not None)


async def test_claim__a_waiting_claim_gets_a_deployment_created_meanwhile(
    org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev")
    token = await registered(runner_client, "managed-0")
    waiting = asyncio.create_task(claim(runner_client, token, wait=20))
    await asyncio.sleep(0.2)
    deployment_id = await deploy(org, "dev")

    answer = await waiting

    assert 200 == answer.status_code
    assert deployment_id == answer.json()["deployment"]["id"]


async def test_heartbeat__renews_only_its_own_claim(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev")
    token = await registered(runner_client, "managed-0")
    deployment_id = await deploy(org, "dev")
    await claim(runner_client, token)
    before = (await _records(app))[0].claim_lease_until
    await asyncio.sleep(0.05)
    renewed = await runner_client.post(
        "/runner/heartbeat", json={"deploymentId": deployment_id}, headers=bearer(token)
    )
    other = await runner_client.post(
        "/runner/heartbeat", json={"deploymentId": str(uuid.uuid4())}, headers=bearer(token)
    )

    assert 200 == renewed.status_code
    assert {"leaseSeconds": 60, "heartbeatSeconds": 15} == renewed.json()
    assert (await _records(app))[0].claim_lease_until > before
    assert 409 == other.status_code and other.json()["message"].startswith("deploymentId:")


# --- leases, finished -----------------------------------------------------------------------------------


async def test_lease__runs_out_before_the_bundle_was_fetched_the_deployment_is_queued_again(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev")
    lost = await registered(runner_client, "managed-0")
    deployment_id = await deploy(org, "dev")
    await claim(runner_client, lost)

    await _worker(app, datetime.now(UTC) + timedelta(seconds=61)).run_once()
    row = await _deployment_row(app, deployment_id)
    other = await claim(runner_client, await registered(runner_client, "managed-1"))

    assert ("executing", "queued") == (row.status, row.dispatch_state)
    assert deployment_id == other.json()["deployment"]["id"]
    assert (
        409
        == (
            await runner_client.post(
                f"/runner/deployments/{deployment_id}/finished", json={"exitCode": 1}, headers=bearer(lost)
            )
        ).status_code
    )


async def _claimed_and_fetched(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> tuple[str, httpx.Response, datetime]:
    """A deployment claimed by runner ``managed-0`` whose bundle it fetched (so its token was used): its
    id, the bundle's answer and the claim's lease end."""
    await managed_env(org, "dev")
    token = await registered(runner_client, "managed-0")
    deployment_id = await deploy(org, "dev")
    environment = (await claim(runner_client, token)).json()["environment"]
    bundle = await runner_client.get(
        f"/runner-gateway/v1/orgs/{org.id}/runners/managed/deployments/{deployment_id}/bundle",
        headers={"X-Deployment-Token": environment["TOKEN"]},
    )
    lease_until = (await _records(app))[0].claim_lease_until
    assert lease_until is not None
    return deployment_id, bundle, lease_until


async def test_lease__runs_out_after_the_bundle_was_fetched_the_deployment_fails(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    deployment_id, bundle, lease_until = await _claimed_and_fetched(app, org, runner_client)

    await _worker(app, lease_until + timedelta(seconds=1)).run_once()
    got = (await org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}")).json()

    assert 200 == bundle.status_code
    assert "failed" == got["status"]
    assert (
        "managed runner 'managed-0' stopped answering during the deployment; its lease ran out at "
        f"{lease_until.isoformat(timespec='seconds')}"
    ) in got["status_message"]
    assert [None] == [r.claim_deployment_id for r in await _records(app)]


async def test_lease__that_ran_out_while_the_api_was_down_gets_a_lease_after_the_server_starts(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    """A server that starts after an outage gives runners one lease to renew theirs before ending any: the
    lease ran out while nobody could take a heartbeat. After that grace the lapsed lease ends as usual."""
    deployment_id, bundle, lease_until = await _claimed_and_fetched(app, org, runner_client)
    started = lease_until + timedelta(seconds=30)  # the server came back after the lease ran out
    now = started + timedelta(seconds=59)
    worker = policy.ManagedWorker(
        engine=app.state.services.engine,
        prune_after=timedelta(seconds=1),
        interval_seconds=1.0,
        on_final=app.state.services.notifier.notify,
        on_requeued=lambda: None,
        clock=lambda: now,
        online_within=timedelta(seconds=60),
        started_at=started,
    )

    during = await worker.run_once()
    status_during = (await org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}")).json()["status"]
    records_during = [(r.name, r.claim_deployment_id) for r in await _records(app)]
    now = started + timedelta(seconds=61)
    after = await worker.run_once()
    got = (await org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}")).json()

    assert 200 == bundle.status_code
    assert ([], []) == (during.failed, during.requeued)
    assert "failed" != status_during
    assert [("managed-0", uuid.UUID(deployment_id))] == records_during  # neither ended nor pruned
    assert [deployment_id] == after.failed
    assert "failed" == got["status"]
    assert "its lease ran out at" in got["status_message"]


async def test_lease__a_replaced_record_loses_its_claim_at_once(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev")
    deployment_id = await deploy(org, "dev")
    await claim(runner_client, await registered(runner_client, "managed-0"))

    restarted = await registered(runner_client, "managed-0")
    again = await claim(runner_client, restarted)

    assert deployment_id == again.json()["deployment"]["id"]


async def test_finished__without_results_fails_the_deployment(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev")
    token = await registered(runner_client, "managed-0")
    deployment_id = await deploy(org, "dev")
    await claim(runner_client, token)

    done = await runner_client.post(
        f"/runner/deployments/{deployment_id}/finished", json={"exitCode": 3}, headers=bearer(token)
    )
    twice = await runner_client.post(
        f"/runner/deployments/{deployment_id}/finished", json={"exitCode": 3}, headers=bearer(token)
    )
    got = (await org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}")).json()
    next_claim = await claim(runner_client, token)

    assert (200, {}) == (done.status_code, done.json())
    assert 409 == twice.status_code
    assert "failed" == got["status"]
    assert (
        "managed runner 'managed-0': po-runner exited with code 3 without reporting results"
        in got["status_message"]
    )
    assert 204 == next_claim.status_code


# --- pruning --------------------------------------------------------------------------------------------


async def test_prune__removes_runners_not_seen_but_never_a_busy_one(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient, capfd: pytest.CaptureFixture[str]
) -> None:
    await managed_env(org, "dev")
    idle = await registered(runner_client, "idle-0")
    busy = await registered(runner_client, "busy-0")
    await deploy(org, "dev")
    await claim(runner_client, busy)
    later = datetime.now(UTC) + timedelta(days=2)

    async with app.state.services.engine.begin() as conn:
        pruned = await policy.prune(conn, now=later, after=timedelta(days=1))
    await _worker(app, later - timedelta(days=1, seconds=1)).run_once()  # nothing stale yet
    names = sorted(r.name for r in await _records(app))
    gone = await runner_client.post("/runner/heartbeat", json={}, headers=bearer(idle))
    logged = capfd.readouterr()

    assert ["idle-0"] == [r.name for r in pruned]
    assert ["busy-0"] == names
    assert 401 == gone.status_code
    assert "managed runner pruned" in logged.out + logged.err
    assert "idle-0" in logged.out + logged.err
    # Nothing logs the secret or a token.
    assert MANAGED_SECRET not in logged.out + logged.err
    assert busy not in logged.out + logged.err and idle not in logged.out + logged.err


async def test_queued__times_out_without_a_claim(app: FastAPI, org: Org) -> None:
    await managed_env(org, "dev")
    deployment_id = await deploy(org, "dev")

    await _worker(app, datetime.now(UTC) + timedelta(hours=2)).run_once()
    got = (await org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}")).json()

    assert "failed" == got["status"]
    assert "deployment timeout" in got["status_message"]


async def test_claim__a_deployment_token_opens_only_its_own_deployment(
    org: Org, other_org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev")
    await managed_env(other_org, "dev")
    mine = await deploy(org, "dev")
    theirs = await deploy(other_org, "dev")
    token = await registered(runner_client, "managed-0")
    environment = (await claim(runner_client, token)).json()["environment"]

    def bundle(org_id: str, deployment_id: str) -> str:
        return f"/runner-gateway/v1/orgs/{org_id}/runners/managed/deployments/{deployment_id}/bundle"

    own = await runner_client.get(bundle(org.id, mine), headers={"X-Deployment-Token": environment["TOKEN"]})
    other = await runner_client.get(
        bundle(other_org.id, theirs), headers={"X-Deployment-Token": environment["TOKEN"]}
    )

    assert mine == environment["DEPLOYMENT_ID"]
    assert 200 == own.status_code
    assert (400, "the runner token is not valid") == (other.status_code, other.json()["message"])


async def test_refresh_runner__links_to_the_pool_with_the_rules_tags(app: FastAPI, org: Org) -> None:
    await managed_env(org, "dev", ["docker"])
    url = f"/orgs/{org.id}/projects/shop/envs/dev/actions/refresh_runner"

    dry = await org.admin.post(url, json={"dry_run": True})
    linked = await org.admin.post(url, json={"dry_run": False})
    again = await org.admin.post(url, json={"dry_run": False})
    deployment_id = await deploy(org, "dev")

    assert {"runner_id": "managed", "updated": True} == dry.json()
    assert {"runner_id": "managed", "updated": True} == linked.json()
    assert {"runner_id": "managed", "updated": False} == again.json()
    row = await _deployment_row(app, deployment_id)
    assert (["docker"], "queued") == (row.required_tags, row.dispatch_state)


def test_octl__lists_the_pool_and_cannot_delete_it(settings: ServerSettings, tmp_path: Path) -> None:
    with serve(settings) as base_url:
        octl = OctlProcess(
            base_url=base_url, token=org_admin_token(base_url), config_path=tmp_path / "octl.yaml"
        )
        listed = octl("get", "runners")
        deleted = octl("delete", "runner", "managed")

    assert 0 == listed.exit_code, listed.output
    assert any("managed" in line and "managed by the platform" in line for line in listed.output.splitlines())
    assert 0 != deleted.exit_code
    assert "runner 'managed' is managed by the platform" in deleted.output


async def test_pool__organizations_from_before_get_it_when_the_server_starts_with_the_secret(
    settings: ServerSettings,
) -> None:
    off = create_app(settings.model_copy(update={"managed_runner_secret": None}))
    async with off.router.lifespan_context(off), api_client(off, BOOTSTRAP_TOKEN) as platform:
        assert 201 == (await platform.post("/orgs", json={"id": "early"})).status_code
    on = create_app(settings)
    async with on.router.lifespan_context(on), api_client(on, BOOTSTRAP_TOKEN) as platform:
        listed = await platform.get("/orgs/early/runners?include_managed=true")

    assert ["managed"] == [r["id"] for r in listed.json()["items"]]


# --- the agent protocol is not the pool's (issue 26) ---------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["events", "commands/next", "commands/c-1/ack", "commands/c-1/retry", "commands/c-1/reject"],
)
async def test_agent_gateway__the_pool_answers_a_clear_4xx_without_a_traceback(
    org: Org, runner_client: httpx.AsyncClient, path: str
) -> None:
    url = f"/runner-gateway/v1/orgs/{org.id}/runners/managed/{path}"

    with capture_logs() as logs:
        answer = await runner_client.post(url, json={}, headers=bearer("anything"))

    assert 403 == answer.status_code, answer.text
    assert answer.json()["message"].startswith("runner 'managed' is the platform's managed pool")
    assert "does not use the agent protocol" in answer.json()["message"]
    assert [] == [e for e in logs if e["log_level"] in ("error", "critical") or "exc_info" in e]


# --- tags decided by the platform (issue 26) -----------------------------------------------------------


async def test_tags__a_shared_secret_runner_declaring_gpu_cannot_claim_a_gpu_deployment(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev", ["gpu"])
    deployment_id = await deploy(org, "dev")
    self_declared = await register(runner_client, "tenant-0", ["linux", "gpu"])

    refused = await claim(runner_client, self_declared.json()["token"])

    assert ["linux", "managed"] == self_declared.json()["tags"]
    assert ["gpu"] == [d["tag"] for d in self_declared.json()["droppedTags"]]
    assert 204 == refused.status_code
    assert "queued" == (await _deployment_row(app, deployment_id)).dispatch_state


async def test_tags__a_runner_registered_with_a_gpu_credential_claims_the_gpu_deployment(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev", ["gpu"])
    deployment_id = await deploy(org, "dev")
    async with api_client(app, BOOTSTRAP_TOKEN) as platform:
        created = await platform.post(
            "/managed-runner-registrations", json={"tags": ["gpu"], "description": "gpu pool"}
        )
        listed = await platform.get("/managed-runner-registrations")
    secret = created.json()["secret"]

    answer = await register(runner_client, "gpu-0", ["gpu", "linux", "kubernetes"], secret=secret)
    claimed = await claim(runner_client, answer.json()["token"])

    assert 201 == created.status_code, created.text
    assert [{"id": created.json()["id"], "tags": ["gpu"], "description": "gpu pool"}] == [
        {k: r[k] for k in ("id", "tags", "description")} for r in listed.json()["items"]
    ]
    assert secret not in listed.text
    assert 201 == answer.status_code, answer.text
    assert ["gpu", "managed"] == answer.json()["tags"]
    assert ["kubernetes", "linux"] == [d["tag"] for d in answer.json()["droppedTags"]]
    assert 200 == claimed.status_code, claimed.text
    assert deployment_id == claimed.json()["deployment"]["id"]


async def test_tags__registration_credentials_are_the_platform_admins_and_deletable(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    async with api_client(app, BOOTSTRAP_TOKEN) as platform:
        created = (await platform.post("/managed-runner-registrations", json={"tags": ["gpu"]})).json()
        by_org_admin = await org.admin.post("/managed-runner-registrations", json={"tags": ["gpu"]})
        listed_by_org_admin = await org.admin.get("/managed-runner-registrations")
        bad_tag = await platform.post("/managed-runner-registrations", json={"tags": ["GPU"]})
        deleted = await platform.delete(f"/managed-runner-registrations/{created['id']}")
        again = await platform.delete(f"/managed-runner-registrations/{created['id']}")
    after = await register(runner_client, "gpu-0", ["gpu"], secret=created["secret"])

    assert 403 == by_org_admin.status_code and 403 == listed_by_org_admin.status_code
    assert 400 == bad_tag.status_code and bad_tag.json()["message"].startswith("tags[0]:")
    assert (204, 404) == (deleted.status_code, again.status_code)
    assert 401 == after.status_code


async def test_tags__the_server_setting_allows_more_tags_to_the_shared_secret(
    settings: ServerSettings, runner_client: httpx.AsyncClient
) -> None:
    wider = create_app(settings.model_copy(update={"managed_secret_tags": "linux,docker,gpu"}))
    async with wider.router.lifespan_context(wider), api_client(wider, None) as client:
        answer = await register(client, "gpu-0", ["gpu", "arm64"])

    assert ["gpu", "managed"] == answer.json()["tags"]
    assert ["arm64"] == [d["tag"] for d in answer.json()["droppedTags"]]


def test_octl__platform_admin_creates_lists_and_deletes_registration_credentials(
    settings: ServerSettings, tmp_path: Path
) -> None:
    with serve(settings) as base_url:
        octl = OctlProcess(base_url=base_url, token=BOOTSTRAP_TOKEN, config_path=tmp_path / "octl.yaml")
        created = octl(
            "create", "managed-runner-registration", "--tag", "gpu", "--description", "gpus", "-o", "json"
        )
        registration = json.loads(created.stdout)
        listed = octl("get", "managed-runner-registrations")
        deleted = octl("delete", "managed-runner-registration", registration["id"])
        after = octl("get", "managed-runner-registrations")

    assert 0 == created.exit_code, created.output
    assert ["gpu"] == registration["tags"] and registration["secret"]
    assert 0 == listed.exit_code, listed.output
    assert any(registration["id"] in line and "gpu" in line for line in listed.output.splitlines())
    assert registration["secret"] not in listed.output
    assert 0 == deleted.exit_code, deleted.output
    assert registration["id"] not in after.output


# --- upstream clients can parse the runner list (issue 26) ---------------------------------------------


def _upstream_runner_page_validator() -> Any:
    import jsonschema  # type: ignore[import-untyped]
    import referencing
    import yaml
    from referencing.jsonschema import DRAFT202012

    from tests.support.upstream import UPSTREAM

    document = yaml.safe_load((UPSTREAM / "control-plane.yaml").read_text())
    resource = referencing.Resource.from_contents(document, default_specification=DRAFT202012)
    registry = referencing.Registry().with_resource("urn:control-plane", resource)
    return jsonschema.Draft202012Validator(
        {"$ref": "urn:control-plane#/components/schemas/RunnerPage"}, registry=registry
    )


async def test_list__upstream_clients_parse_it_and_the_pool_only_when_asked_for(org: Org) -> None:
    plain = await org.admin.get(f"/orgs/{org.id}/runners")
    with_pool = await org.admin.get(f"/orgs/{org.id}/runners", params={"include_managed": "true"})
    pool = await org.admin.get(f"/orgs/{org.id}/runners/managed")

    errors = [e.message for e in _upstream_runner_page_validator().iter_errors(plain.json())]
    assert [] == errors
    assert "managed" not in [r["id"] for r in plain.json()["items"]]
    assert "managed" in [r["id"] for r in with_pool.json()["items"]]
    assert 200 == pool.status_code


# --- a queued deployment says what it waits for (issue 26) ---------------------------------------------


async def test_waiting__the_status_message_says_what_a_queued_deployment_waits_for(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev", ["gpu"])
    deployment_id = await deploy(org, "dev")

    async def round_() -> tuple[str, int]:
        now = datetime.now(UTC)
        async with app.state.services.engine.begin() as conn:
            written = await policy.note_waiting(conn, now=now, online_within=timedelta(seconds=60))
        return (await _deployment_row(app, deployment_id)).status_message, written

    none_online = await round_()
    unchanged = await round_()
    await registered(runner_client, "linux-0", ["linux"])
    no_gpu = await round_()
    async with api_client(app, BOOTSTRAP_TOKEN) as platform:
        secret = (await platform.post("/managed-runner-registrations", json={"tags": ["gpu"]})).json()[
            "secret"
        ]
    gpu_token = (await register(runner_client, "gpu-0", ["gpu"], secret=secret)).json()["token"]
    can_take = await round_()
    claimed = await claim(runner_client, gpu_token)

    assert ("waiting for a managed runner: none is online", 1) == none_online
    assert ("waiting for a managed runner: none is online", 0) == unchanged  # no write per round
    assert ("waiting for a managed runner: no online managed runner has the tags gpu", 1) == no_gpu
    assert ("Deploying...", 1) == can_take
    assert 200 == claimed.status_code
    assert "Deploying..." == (await _deployment_row(app, deployment_id)).status_message


async def test_waiting__the_worker_round_notes_it(app: FastAPI, org: Org) -> None:
    await managed_env(org, "dev")
    deployment_id = await deploy(org, "dev")

    await _worker(app, datetime.now(UTC)).run_once()

    row = await _deployment_row(app, deployment_id)
    assert ("queued", "waiting for a managed runner: none is online") == (
        row.dispatch_state,
        row.status_message,
    )


# --- wake-ups (issue 26) -------------------------------------------------------------------------------


async def _until_waiting(app: FastAPI, count: int) -> None:
    """Until ``count`` claims wait on the server's waker."""
    for _ in range(400):
        if len(app.state.managed_gateway.waker._waiters) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{count} claims never waited")


async def test_wakeups__one_new_deployment_wakes_one_of_many_waiting_claims(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev")
    tokens = [await registered(runner_client, f"managed-{i}") for i in range(10)]
    gateway = app.state.managed_gateway
    waiting = [asyncio.create_task(claim(runner_client, token, wait=4)) for token in tokens]
    await _until_waiting(app, len(tokens))
    before = (gateway.waker.wakeups, gateway.claim_looks)
    deployment_id = await deploy(org, "dev")

    answers = await asyncio.gather(*waiting)

    assert [deployment_id] == [a.json()["deployment"]["id"] for a in answers if a.status_code == 200]
    assert [204] * 9 == [a.status_code for a in answers if a.status_code != 200]
    assert (1, 1) == (gateway.waker.wakeups - before[0], gateway.claim_looks - before[1])


async def test_wakeups__a_woken_claim_that_cannot_take_it_passes_the_wake_up_on(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    await managed_env(org, "dev", ["docker"])
    linux = await registered(runner_client, "linux-0", ["linux"])
    docker = await registered(runner_client, "docker-0", ["docker"])
    first = asyncio.create_task(claim(runner_client, linux, wait=4))
    await _until_waiting(app, 1)
    second = asyncio.create_task(claim(runner_client, docker, wait=4))
    await _until_waiting(app, 2)
    deployment_id = await deploy(org, "dev")

    answers = await asyncio.gather(first, second)

    assert [204, 200] == [a.status_code for a in answers]
    assert deployment_id == answers[1].json()["deployment"]["id"]


async def test_wakeups__a_replaced_runners_waiting_claim_answers_register_again_at_once(
    app: FastAPI, runner_client: httpx.AsyncClient
) -> None:
    token = await registered(runner_client, "managed-0")
    waiting = asyncio.create_task(claim(runner_client, token, wait=25))
    await _until_waiting(app, 1)

    await registered(runner_client, "managed-0")
    answer = await asyncio.wait_for(waiting, 10)  # well before its 25 s wait

    assert (401, "the managed runner token is not valid: register again") == (
        answer.status_code,
        answer.json()["message"],
    )


async def test_phases__claimed_launching_queued_again_when_the_lease_ran_out_before_it_began(
    app: FastAPI, org: Org, runner_client: httpx.AsyncClient
) -> None:
    """Issue 22: a claim records ``launching``; a claim lost before the runner began queues it again."""
    await managed_env(org, "dev")
    deployment_id = await deploy(org, "dev")
    queued = (await org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}")).json()
    await claim(runner_client, await registered(runner_client, "managed-0"))
    claimed = (await org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}")).json()
    await _worker(app, datetime.now(UTC) + timedelta(seconds=61)).run_once()
    await claim(runner_client, await registered(runner_client, "managed-1"))
    again = (await org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}")).json()

    assert ["queued"] == [p["phase"] for p in queued["phases"]]
    assert ["queued", "launching"] == [p["phase"] for p in claimed["phases"]]
    assert ["queued", "launching", "queued", "launching"] == [p["phase"] for p in again["phases"]]


async def test_phases__a_deployment_no_managed_runner_claimed_failed_before_its_runner_started(
    app: FastAPI, org: Org
) -> None:
    await managed_env(org, "dev")
    deployment_id = await deploy(org, "dev")

    await _worker(app, datetime.now(UTC) + timedelta(hours=2)).run_once()
    got = (await org.admin.get(f"/orgs/{org.id}/deployments/{deployment_id}")).json()

    assert ("failed", ["queued"]) == (got["status"], [p["phase"] for p in got["phases"]])
    assert got["status_message"].endswith("(it failed before its runner started, while queued)")
