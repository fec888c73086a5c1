"""The live log, server side (issue 22): the gateway's chunk upload, the API's page of chunks, and followers
(server-sent events through a real HTTP server in the test's event loop), on both databases.

A deployment of runner ``vm1`` executes (written to the store); the test plays its runner: chunks are
encrypted with ``protocol.log_stream.encrypt_chunk`` to the deployment's logs recipient and ``PUT`` with its
token, as a runner sends them.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from structlog.testing import capture_logs

from orchestrator.dispatch.retention import RetentionWorker
from orchestrator.protocol import age, log_stream
from orchestrator.protocol import results as protocol
from orchestrator.protocol.log_stream import Phase
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store.schema import deployment_log_chunks
from tests.support.deployments import insert_deployment
from tests.support.live_chunks import EVENT_WAIT_SECONDS, Follower, Live
from tests.support.live_server import serve_in_loop
from tests.support.metrics import scrape_registry
from tests.support.orgs import Org
from tests.support.runners import RUNNER


async def _deployment(org: Org, deployment_id: str) -> dict[str, Any]:
    answer = await org.clients["viewer"].get(f"/orgs/{org.id}/deployments/{deployment_id}")
    assert 200 == answer.status_code, answer.text
    result: dict[str, Any] = answer.json()
    return result


@pytest.fixture
async def live(app: FastAPI, org: Org) -> AsyncIterator[Live]:
    base = f"/orgs/{org.id}"
    await org.admin.post(f"{base}/env-types", json={"id": "development"})
    await org.admin.post(f"{base}/projects", json={"id": "shop"})
    env = (
        await org.admin.post(f"{base}/projects/shop/envs", json={"id": "dev", "env_type_id": "development"})
    ).json()
    await org.platform.post(f"{base}/runners", json={"id": "vm1", **RUNNER})
    deployment_id = await insert_deployment(app, org.id, env, status="executing")
    made = Live(app, org, env, deployment_id)
    await made.set_row(encrypted_logs_recipient=made.recipient, logs_key=None)
    yield made
    await made.gateway.aclose()


# --- the gateway's upload -------------------------------------------------------------------------------


async def test_chunk__stored_as_sent_and_read_back_in_order(live: Live) -> None:
    first = await live.put(1, "Initializing...\n", Phase.INIT)
    second = await live.put(2, "Plan: 1 to add\n", Phase.PLAN)
    page = await live.page()
    deployment = await _deployment(live.org, live.deployment_id)

    assert (202, 202) == (first.status_code, second.status_code)
    assert 200 == page.status_code, page.text
    items = page.json()["items"]
    assert [1, 2] == [item["seq"] for item in items]
    assert ["init", "plan"] == [item["phase"] for item in items]
    assert [live.body(1, "x"), live.body(2, "x")] != [item["ciphertext"] for item in items]  # fresh keys
    assert ["Initializing...\n", "Plan: 1 to add\n"] == [live.decrypt(item).text for item in items]
    assert {"last_seq": 2, "complete": False, "status": "executing", "whole_log": False} == {
        key: page.json()[key] for key in ("last_seq", "complete", "status", "whole_log")
    }
    assert ["init", "plan"] == [p["phase"] for p in deployment["phases"]]
    assert "plan" == deployment["phase"]


async def test_chunk__a_retry_is_stored_once_other_bytes_are_refused(live: Live) -> None:
    body = live.body(1, "once\n")
    before = scrape_registry()

    first = await live.put(1, body=body)
    retry = await live.put(1, body=body)
    other = await live.put(1, "other\n")
    page = await live.page()
    after = scrape_registry()

    assert (202, 202, 409) == (first.status_code, retry.status_code, other.status_code)
    assert "log chunk 1 of deployment" in other.json()["message"]
    assert "chunks are written once" in other.json()["message"]
    assert [body] == [item["ciphertext"] for item in page.json()["items"]]
    assert 1 == after.value("po_log_chunks_received_total") - before.value("po_log_chunks_received_total")
    assert len(base64.b64decode(body)) == after.value("po_log_chunk_bytes_received_total") - before.value(
        "po_log_chunk_bytes_received_total"
    )


async def test_chunk__phase_recorded_when_it_changes(live: Live) -> None:
    for seq, phase in enumerate(
        [Phase.INIT, Phase.INIT, Phase.PLAN, Phase.PLAN, Phase.APPLY, Phase.REPORTING]
    ):
        assert 202 == (await live.put(seq + 1, phase=phase)).status_code

    deployment = await _deployment(live.org, live.deployment_id)

    assert ["init", "plan", "apply", "reporting"] == [p["phase"] for p in deployment["phases"]]
    started = [datetime.fromisoformat(p["started_at"]) for p in deployment["phases"]]
    assert started == sorted(started)


async def test_chunk__too_large_not_ciphertext_or_bad_number_refused(live: Live) -> None:
    huge = await live.put(1, body=b"A" * (log_stream.MAX_CHUNK_UPLOAD_BYTES + 1))
    not_base64 = await live.put(1, body=b"not base64!")
    plaintext = await live.put(1, body=base64.b64encode(b"a secret line in clear\n"))
    empty = await live.put(1, body=b"")
    zero = await live.put(0, body=live.body(1, "x\n"), path=live.path(0))
    page = await live.page()

    assert (413, "API-413") == (huge.status_code, huge.json()["error"])
    assert (400, 400, 400) == (not_base64.status_code, plaintext.status_code, empty.status_code)
    assert "body: the log chunk is not standard base64" == not_base64.json()["message"]
    assert plaintext.json()["message"].startswith("body: the log chunk is not age ciphertext")
    assert 400 == zero.status_code
    assert zero.json()["message"].startswith("seq:")
    assert [] == page.json()["items"]


@pytest.mark.parametrize("phase", [None, "", "queued", "launching", "bogus"])
async def test_chunk__phase_header_must_name_a_runner_phase(live: Live, phase: str | None) -> None:
    headers = {} if phase is None else {log_stream.PHASE_HEADER: phase}
    sent = await live.gateway.put(
        live.path(1),
        content=live.body(1, "x\n"),
        headers={protocol.DEPLOYMENT_TOKEN_HEADER: live.token(), **headers},
    )

    assert 400 == sent.status_code
    assert sent.json()["message"].startswith("X-Log-Phase: ")
    assert "apply, destroy, init, plan, reporting" in sent.json()["message"]


async def test_chunk__token_opens_only_its_own_deployment(live: Live, app: FastAPI, org: Org) -> None:
    other = await insert_deployment(app, org.id, live.env, status="succeeded")
    body = live.body(1, "x\n")

    missing = await live.gateway.put(live.path(1), content=body, headers={log_stream.PHASE_HEADER: "plan"})
    others_token = await live.put(1, body=body, headers={protocol.DEPLOYMENT_TOKEN_HEADER: live.token(other)})
    other_runner = await live.put(1, body=body, path=live.path(1, runner="vm2"))
    other_env = await live.put(1, body=body, path=live.path(1, env_uuid=str(uuid.uuid4())))
    page = await live.page()

    # As every gateway route answers (upstream's data plane pins these): 400 naming the header, 400 for a
    # token that is not this deployment's; 404 for a deployment of another runner or environment.
    assert missing.json()["message"].startswith("X-Deployment-Token: the header is required")
    assert (400, 400) == (missing.status_code, others_token.status_code)
    assert "the runner token is not valid" == others_token.json()["message"]
    assert (404, 404) == (other_runner.status_code, other_env.status_code)
    assert [] == page.json()["items"]


async def test_chunk__taken_until_the_grace_after_the_end_then_gone(live: Live) -> None:
    await live.set_row(status="failed", completed_at=datetime.now(UTC) - timedelta(seconds=10))
    within = await live.put(1, "late but in time\n")
    await live.set_row(completed_at=datetime.now(UTC) - timedelta(seconds=log_stream.CHUNK_GRACE_SECONDS + 1))
    after = await live.put(2, "too late\n")
    page = await live.page()

    assert 202 == within.status_code
    assert (410, "API-410") == (after.status_code, after.json()["error"])
    assert "takes chunks until 300 s after it ended" in after.json()["message"]
    assert [1] == [item["seq"] for item in page.json()["items"]]


# --- the API's page -------------------------------------------------------------------------------------


async def test_page__after_and_limit_then_complete_once_ended(live: Live) -> None:
    for seq in range(1, 6):
        await live.put(seq, f"line {seq}\n")

    middle = await live.page(after=2, limit=2)
    rest = await live.page(after=4)
    await live.whole_log("".join(f"line {seq}\n" for seq in range(1, 6)))
    await live.results()
    ended = await live.page(after=5)

    assert [3, 4] == [item["seq"] for item in middle.json()["items"]]
    assert (5, False) == (middle.json()["last_seq"], middle.json()["complete"])
    assert [5] == [item["seq"] for item in rest.json()["items"]]
    assert {"items": [], "last_seq": 5, "complete": True, "status": "succeeded", "whole_log": True} == (
        ended.json()
    )


async def test_page__every_role_reads_another_organization_gets_404(live: Live, other_org: Org) -> None:
    await live.put(1)

    answers = {role: (await live.page(role)).status_code for role in ("admin", "deployer", "viewer")}
    foreign = await other_org.admin.get(live.logs_url(other_org.id))
    foreign_follow = await other_org.admin.get(live.logs_url(other_org.id), params={"follow": "true"})
    unknown = await live.org.admin.get(f"/orgs/{live.org.id}/deployments/{uuid.uuid4()}/logs")

    assert {"admin": 200, "deployer": 200, "viewer": 200} == answers
    assert (404, 404, 404) == (foreign.status_code, foreign_follow.status_code, unknown.status_code)
    assert f"deployment '{live.deployment_id}' not found" == foreign.json()["message"]


@pytest.mark.parametrize(
    ("params", "headers", "field"),
    [
        ({"limit": 0}, {}, "limit"),
        ({"limit": 1001}, {}, "limit"),
        ({"after": -1}, {}, "after"),
        ({}, {"Last-Event-ID": "seven"}, "Last-Event-ID"),
    ],
)
async def test_page__bad_input_names_the_field(
    live: Live, params: dict[str, Any], headers: dict[str, str], field: str
) -> None:
    answer = await live.org.admin.get(live.logs_url(), params=params, headers=headers)

    assert 400 == answer.status_code
    assert answer.json()["message"].startswith(f"{field}:")


async def test_page__removed_with_the_logs_by_the_retention_and_never_before(
    live: Live, app: FastAPI
) -> None:
    # A plan: not the code a destroy of the environment would need (that is kept while the environment is).
    await live.set_row(plan_only=True)
    await live.put(1)
    await live.whole_log("line\n")
    await live.results()
    services = app.state.services
    worker = RetentionWorker(
        engine=services.engine, blobs=services.blobs, retention=timedelta(days=1), interval_seconds=3600
    )

    kept = await worker.run_once()
    before = await live.page()
    removed = await worker.run_once(now=datetime.now(UTC) + timedelta(days=2))
    after = await live.page()
    follow = await live.page(follow="true")
    late = await live.put(2, "a late chunk, within the grace\n")
    async with services.engine.connect() as conn:
        rows = (await conn.execute(sa.select(sa.func.count()).select_from(deployment_log_chunks))).scalar()

    assert [] == kept
    assert (410, "API-410") == (late.status_code, late.json()["error"])
    assert [1] == [item["seq"] for item in before.json()["items"]]
    assert [uuid.UUID(live.deployment_id)] == [item.deployment_id for item in removed]
    assert (410, 410) == (after.status_code, follow.status_code)
    assert "were removed on" in after.json()["message"]
    assert 0 == rows


# --- followers (server-sent events) -----------------------------------------------------------------------


@pytest.fixture
async def served(app: FastAPI) -> AsyncIterator[str]:
    async with serve_in_loop(app) as url:
        yield url


@pytest.fixture
async def follow(served: str, live: Live) -> AsyncIterator[Any]:
    """Start followers of the deployment (with a viewer's token): ``await follow(**params)``."""
    token = live.org.clients["viewer"].headers["Authorization"]
    client = httpx.AsyncClient(base_url=served, headers={"Authorization": token}, timeout=EVENT_WAIT_SECONDS)
    tasks: list[asyncio.Task[None]] = []
    streams: list[Any] = []

    async def start(headers: dict[str, str] | None = None, **params: Any) -> Follower:
        params.setdefault("follow", "true")
        request = client.build_request("GET", live.logs_url(), params=params, headers=headers or {})
        response = await client.send(request, stream=True)
        streams.append(response)
        assert 200 == response.status_code
        assert response.headers["content-type"].startswith("text/event-stream")
        follower = Follower(response)
        tasks.append(asyncio.create_task(follower.read()))
        return follower

    yield start
    for task in tasks:
        task.cancel()
    for response in streams:
        await response.aclose()
    await client.aclose()


async def test_follow__a_chunk_stored_while_following_reaches_the_follower(live: Live, follow: Any) -> None:
    follower = await follow()
    await asyncio.sleep(0.2)  # connected and waiting, with nothing to hand over yet
    before = list(follower.events)
    await live.put(1, "Initializing the backend...\n", Phase.INIT)
    await follower.until(lambda f: f.chunks() == [1])
    await live.put(2, "Plan: 2 to add\n", Phase.PLAN)
    await follower.until(lambda f: f.chunks() == [1, 2])

    assert [] == before
    [first, second] = follower.named(log_stream.SSE_CHUNK)
    assert ("1", "2") == (first.id, second.id)
    assert "Initializing the backend...\n" == live.decrypt(first.data).text
    assert ["init", "plan"] == [e.data["phase"] for e in follower.named(log_stream.SSE_PHASE)]
    # A phase's event comes before the first chunk of it.
    assert ["phase", "chunk", "phase", "chunk"] == [e.name for e in follower.events]
    assert not follower.closed


async def test_follow__a_chunk_stored_by_another_replica_reaches_the_follower(
    live: Live, follow: Any, settings: ServerSettings
) -> None:
    """Replicas share the database only: a follower of one sees what the other stored at its next look."""
    follower = await follow()
    other = create_app(settings)
    async with other.router.lifespan_context(other):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=other), base_url="http://b"
        ) as replica:
            stored = await replica.put(
                live.path(1),
                content=live.body(1, "from the other replica\n"),
                headers={protocol.DEPLOYMENT_TOKEN_HEADER: live.token(), log_stream.PHASE_HEADER: "plan"},
            )
        await follower.until(lambda f: f.chunks() == [1])

    assert 202 == stored.status_code
    assert "from the other replica\n" == live.decrypt(follower.named(log_stream.SSE_CHUNK)[0].data).text


async def test_follow__a_reconnecting_follower_gets_only_later_chunks(live: Live, follow: Any) -> None:
    for seq in (1, 2, 3):
        await live.put(seq, f"line {seq}\n")

    by_header = await follow(headers={"Last-Event-ID": "2"})
    by_query = await follow(after=3)
    await by_header.until(lambda f: f.chunks() == [3])
    await live.put(4, "line 4\n")
    await by_header.until(lambda f: f.chunks() == [3, 4])
    await by_query.until(lambda f: f.chunks() == [4])

    assert [3, 4] == by_header.chunks()
    assert [4] == by_query.chunks()


async def test_follow__ends_after_the_last_chunk_of_an_ended_deployment(live: Live, follow: Any) -> None:
    await live.put(1, "line 1\n", Phase.APPLY)
    follower = await follow()
    await follower.until(lambda f: f.chunks() == [1])
    await live.put(2, "line 2\n", Phase.REPORTING)
    await live.whole_log("line 1\nline 2\n")
    await live.results()
    await follower.until(lambda f: f.closed)

    assert [1, 2] == follower.chunks()
    assert [] == follower.named(log_stream.SSE_WHOLE_LOG)
    assert log_stream.SSE_END == follower.events[-1].name
    end = follower.events[-1].data
    assert {"status": "succeeded", "last_seq": 2} == {k: end[k] for k in ("status", "last_seq")}
    assert "deployment succeeded" in end["status_message"]


async def test_follow__a_runner_that_put_only_the_whole_log_gives_it_at_the_end(
    live: Live, follow: Any
) -> None:
    """An upstream runner streams nothing and puts its whole log at the end: followers get it (``log``)."""
    follower = await follow(headers={"Accept": "text/event-stream"}, follow="false")
    body = await live.whole_log("the whole log\n")
    await live.results(status="failure")
    await follower.until(lambda f: f.closed)

    assert [log_stream.SSE_WHOLE_LOG, log_stream.SSE_END] == [e.name for e in follower.events]
    assert body == follower.events[0].data["ciphertext"]
    assert b"the whole log\n" == age.decrypt_b64(follower.events[0].data["ciphertext"], live.identity)
    assert {"status": "failed", "last_seq": 0} == {
        k: follower.events[1].data[k] for k in ("status", "last_seq")
    }


async def test_follow__of_an_ended_deployment_hands_everything_over_and_ends(live: Live, follow: Any) -> None:
    for seq in range(1, 41):  # more than a follow page
        await live.put(seq, f"line {seq}\n")
    await live.whole_log("...")
    await live.results()

    follower = await follow(after=5)
    await follower.until(lambda f: f.closed)

    assert list(range(6, 41)) == follower.chunks()
    assert log_stream.SSE_END == follower.events[-1].name


async def test_follow__stopped_when_the_server_stops(live: Live, follow: Any, app: FastAPI) -> None:
    await live.put(1)
    follower = await follow()
    await follower.until(lambda f: f.chunks() == [1])
    before = scrape_registry().value("po_log_followers")

    app.state.services.notifier.close()  # what `orchestrator serve` does first when it is told to stop
    await follower.until(lambda f: f.closed)
    await asyncio.sleep(0.1)

    assert [] == follower.named(log_stream.SSE_END)  # not ended: the follower reconnects elsewhere
    assert 1 <= before
    assert before - 1 == scrape_registry().value("po_log_followers")


# --- plaintext is never stored --------------------------------------------------------------------------


async def test_plaintext__never_in_the_database_the_object_store_or_the_server_log(
    live: Live, settings: ServerSettings, app: FastAPI
) -> None:
    marker = f"MARKER-{uuid.uuid4().hex}"
    with capture_logs() as logs:
        stored = await live.put(1, f"terraform_data.slow: Creating... {marker}\n", Phase.APPLY)
        await live.whole_log(f"{marker}\n")
        await live.page()
    async with app.state.services.engine.connect() as conn:
        rows = (await conn.execute(sa.select(deployment_log_chunks.c.ciphertext))).scalars().all()
        phases = (await conn.execute(sa.text("SELECT phase FROM deployment_phases"))).scalars().all()

    assert 202 == stored.status_code
    [ciphertext] = [bytes(row) for row in rows]
    assert ciphertext.startswith(b"age-encryption.org/v1\n")
    assert marker.encode() not in ciphertext
    assert all(marker not in phase for phase in phases)
    assert marker not in str(logs)
    stored_files = [p for p in (settings.data_dir).rglob("*") if p.is_file()]
    if settings.resolved_database_url.startswith("sqlite"):
        database = Path(settings.resolved_database_url.split("///", 1)[1])
        stored_files += [p for p in database.parent.glob(database.name + "*")]
        # The grep can find what is there: the ciphertext itself is in the database's files.
        assert any(ciphertext in p.read_bytes() for p in stored_files)
    for path in stored_files:
        data = path.read_bytes()
        assert marker.encode() not in data, path
        assert base64.b64encode(marker.encode()) not in data, path
