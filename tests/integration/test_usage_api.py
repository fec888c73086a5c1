"""``GET /orgs/{org}/usage``: runner minutes per project and environment over a period, managed and
self-hosted, from deployments written through the store with known times; JSON and CSV; scoped to the
token's organization; bad periods answered 400 naming the parameter."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from fastapi import FastAPI

from tests.support.deployments import insert_run
from tests.support.docs import docs_example
from tests.support.orgs import Org
from tests.support.usage import figures as _figures
from tests.support.usage import make_env as _env

MARCH = {"from": "2026-03-01", "to": "2026-04-01"}


def at(day: int, hour: int = 0, minute: int = 0, second: int = 0, month: int = 3) -> datetime:
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


async def _seed_march(app: FastAPI, org: Org) -> None:
    """shop/dev: 2 created in March; self-hosted 5 + 10 (clipped at March's start), managed 2.25.
    shop/prod: 3 created in March; managed 20 (clipped at its end), self-hosted 0 (never launched) + 1
    (exited, failed later). Outside March: one deployment in shop/prod, one in web/dev."""
    dev = await _env(org, "shop", "dev")
    prod = await _env(org, "shop", "prod")
    web = await _env(org, "web", "dev")
    runs: list[tuple[dict[str, Any], dict[str, Any]]] = [
        (dev, {"runner_id": "vm1", "created_at": at(10, 10), "launched_at": at(10, 10, 0, 30)}),
        (dev, {"runner_id": "managed", "created_at": at(11, 12), "launched_at": at(11, 12)}),
        (
            dev,
            {
                "runner_id": "vm1",
                "created_at": at(28, 23, 50, month=2),
                "launched_at": at(28, 23, 55, month=2),
            },
        ),
        (prod, {"runner_id": "managed", "created_at": at(31, 23), "launched_at": at(31, 23, 40)}),
        (prod, {"runner_id": "vm1", "created_at": at(15, 9), "launched_at": None}),
        (
            prod,
            {
                "runner_id": "vm1",
                "created_at": at(20, 8),
                "launched_at": at(20, 8),
                "exited_at": at(20, 8, 1),
            },
        ),
        (prod, {"runner_id": "vm1", "created_at": at(1, 0, month=4), "launched_at": at(1, 0, 1, month=4)}),
        (web, {"runner_id": "managed", "created_at": at(1, 1, month=2), "launched_at": at(1, 1, month=2)}),
    ]
    ends = [
        at(10, 10, 5, 30),
        at(11, 12, 2, 15),
        at(1, 0, 10),
        at(1, 0, 30, month=4),
        at(15, 9, 0, 5),
        at(20, 8, 6),
        at(1, 0, 30, month=4),
        at(1, 2, month=2),
    ]
    async with app.state.services.engine.begin() as conn:
        for (env, times), completed_at in zip(runs, ends, strict=True):
            await insert_run(conn, org.id, env, completed_at=completed_at, **times)


async def test_usage__figures_per_environment_clipped_to_the_period_managed_apart(
    app: FastAPI, org: Org
) -> None:
    await _seed_march(app, org)

    answer = await org.clients["viewer"].get(f"/orgs/{org.id}/usage", params=MARCH)

    assert 200 == answer.status_code, answer.text
    body = answer.json()
    assert (org.id, "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z") == (
        body["orgId"],
        body["from"],
        body["to"],
    )
    assert [("shop", "dev"), ("shop", "prod")] == [(row["projectId"], row["envId"]) for row in body["rows"]]
    assert [(17.25, 2.25, 15.0, 2), (21.0, 20.0, 1.0, 3)] == [_figures(row) for row in body["rows"]]
    assert (38.25, 22.25, 16.0, 5) == _figures(body)


async def test_usage__the_docs_answer_is_this_seeds(app: FastAPI, org: Org) -> None:
    """docs/guides/usage.md prints the answer for this seed: the same, but for the organization's id and
    the time of the answer."""
    await _seed_march(app, org)

    answer = (await org.clients["viewer"].get(f"/orgs/{org.id}/usage", params=MARCH)).json()

    shown = json.loads(docs_example("guides/usage-answer"))
    assert {**shown, "orgId": org.id, "asOf": answer["asOf"]} == answer


async def test_usage__a_period_within_runs_clips_both_ends(app: FastAPI, org: Org) -> None:
    """From 10:02 to 10:04:30 on the 10th: 2.5 minutes of the 5-minute run, nothing of the others (their
    environments are not listed); the deployment was created before the period, so it is not counted."""
    await _seed_march(app, org)

    answer = await org.admin.get(
        f"/orgs/{org.id}/usage", params={"from": "2026-03-10T10:02:00Z", "to": "2026-03-10T11:04:30+01:00"}
    )

    assert 200 == answer.status_code, answer.text
    body = answer.json()
    assert [("shop", "dev", 2.5, 0.0, 2.5, 0)] == [
        (row["projectId"], row["envId"], *_figures(row)) for row in body["rows"]
    ]
    assert (2.5, 0.0, 2.5, 0) == _figures(body)


async def test_usage__an_executing_run_counts_up_to_now_clipped(app: FastAPI, org: Org) -> None:
    env = await _env(org, "shop", "dev")
    launched = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
    async with app.state.services.engine.begin() as conn:
        await insert_run(conn, org.id, env, runner_id="managed", created_at=launched, launched_at=launched)
    start = launched + timedelta(minutes=2)

    to_now = await org.admin.get(
        f"/orgs/{org.id}/usage",
        params={"from": start.isoformat(), "to": (launched + timedelta(days=1)).isoformat()},
    )
    clipped = await org.admin.get(
        f"/orgs/{org.id}/usage",
        params={"from": start.isoformat(), "to": (launched + timedelta(minutes=5)).isoformat()},
    )

    assert 200 == to_now.status_code, to_now.text
    body = to_now.json()
    as_of = datetime.fromisoformat(body["asOf"])
    expected = round((as_of - start).total_seconds() / 60, 2)
    assert (expected, expected, 0.0, 0) == _figures(body)
    assert (3.0, 3.0, 0.0, 0) == _figures(clipped.json())


async def test_usage__another_organization_is_never_counted_and_its_token_refused(
    app: FastAPI, org: Org, other_org: Org
) -> None:
    await _seed_march(app, org)
    theirs = await _env(other_org, "shop", "dev")
    async with app.state.services.engine.begin() as conn:
        await insert_run(
            conn,
            other_org.id,
            theirs,
            runner_id="managed",
            created_at=at(12),
            launched_at=at(12),
            completed_at=at(12, 1),
        )

    ours = await org.admin.get(f"/orgs/{org.id}/usage", params=MARCH)
    their_own = await other_org.admin.get(f"/orgs/{other_org.id}/usage", params=MARCH)
    refused = await other_org.admin.get(f"/orgs/{org.id}/usage", params=MARCH)
    anonymous = await httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://po.test"
    ).get(f"/orgs/{org.id}/usage")

    assert (38.25, 22.25, 16.0, 5) == _figures(ours.json())
    assert [(60.0, 60.0, 0.0, 1)] == [_figures(row) for row in their_own.json()["rows"]]
    assert (404, f"organization '{org.id}' not found") == (refused.status_code, refused.json()["message"])
    assert 401 == anonymous.status_code


async def test_usage__csv_parses_back_to_the_json(app: FastAPI, org: Org) -> None:
    await _seed_march(app, org)

    as_json = (await org.admin.get(f"/orgs/{org.id}/usage", params=MARCH)).json()
    by_accept = await org.admin.get(f"/orgs/{org.id}/usage", params=MARCH, headers={"Accept": "text/csv"})
    by_format = await org.admin.get(f"/orgs/{org.id}/usage", params={**MARCH, "format": "csv"})
    preferred = await org.admin.get(
        f"/orgs/{org.id}/usage", params=MARCH, headers={"Accept": "application/json;q=0.5, text/csv"}
    )

    assert 200 == by_accept.status_code, by_accept.text
    assert "text/csv; charset=utf-8" == by_accept.headers["content-type"]
    assert by_accept.text == by_format.text == preferred.text
    lines = by_accept.text.split("\r\n")
    assert (
        "org_id,project_id,env_id,deployments,runner_minutes,runner_minutes_managed,"
        "runner_minutes_self_hosted,period_from,period_to"
    ) == lines[0]
    assert "acme,shop,dev,2,17.25,2.25,15.00,2026-03-01T00:00:00Z,2026-04-01T00:00:00Z" == lines[1]
    assert ["acme,shop,prod,3,21.00,20.00,1.00", ""] == [line.rsplit(",", 2)[0] for line in lines[2:]]
    parsed = list(csv.DictReader(io.StringIO(by_accept.text, newline="")))
    assert [
        {
            "org_id": as_json["orgId"],
            "project_id": row["projectId"],
            "env_id": row["envId"],
            "deployments": int(row["deployments"]),
            "runner_minutes": row["runnerMinutes"],
            "runner_minutes_managed": row["runnerMinutesManaged"],
            "runner_minutes_self_hosted": row["runnerMinutesSelfHosted"],
            "period_from": as_json["from"],
            "period_to": as_json["to"],
        }
        for row in as_json["rows"]
    ] == [
        {
            **line,
            "deployments": int(line["deployments"]),
            "runner_minutes": float(line["runner_minutes"]),
            "runner_minutes_managed": float(line["runner_minutes_managed"]),
            "runner_minutes_self_hosted": float(line["runner_minutes_self_hosted"]),
        }
        for line in parsed
    ]
    assert "15.00" == parsed[0]["runner_minutes_self_hosted"]


async def test_usage__defaults_to_the_current_calendar_month(org: Org) -> None:
    answer = await org.admin.get(f"/orgs/{org.id}/usage")

    assert 200 == answer.status_code, answer.text
    body = answer.json()
    as_of = datetime.fromisoformat(body["asOf"])
    month = datetime(as_of.year, as_of.month, 1, tzinfo=UTC)
    following = datetime(as_of.year + as_of.month // 12, as_of.month % 12 + 1, 1, tzinfo=UTC)
    assert (month, following) == (datetime.fromisoformat(body["from"]), datetime.fromisoformat(body["to"]))
    assert ([], 0.0, 0) == (body["rows"], body["runnerMinutes"], body["deployments"])


async def test_usage__bad_periods_are_400_naming_the_parameter(org: Org) -> None:
    cases = [
        ({"from": "yesterday"}, "from: 'yesterday' is not an RFC 3339 timestamp"),
        ({"from": "2026-03-01T00:00:00"}, "from: '2026-03-01T00:00:00' is not an RFC 3339 timestamp"),
        ({"to": "2026-02-30"}, "to: '2026-02-30' is not a valid date or time"),
        ({"from": "2026-03-01", "to": "2026-03-01"}, "to: must be after from (2026-03-01T00:00:00Z)"),
        ({"from": "2026-03-02", "to": "2026-03-01T12:00:00Z"}, "to: must be after from"),
        ({"from": "2025-01-01", "to": "2026-01-03"}, "to: the period may be at most 366 days long"),
        ({"format": "xml"}, "format"),
    ]
    for params, message in cases:
        answer = await org.admin.get(f"/orgs/{org.id}/usage", params=params)
        assert 400 == answer.status_code, (params, answer.text)
        assert answer.json()["message"].startswith(message), (params, answer.json())
    leap_year = await org.admin.get(
        f"/orgs/{org.id}/usage", params={"from": "2028-01-01", "to": "2029-01-01"}
    )
    assert 200 == leap_year.status_code, leap_year.text


async def test_usage__the_openapi_document_defines_a_runner_minute_and_the_csv(
    admin: httpx.AsyncClient,
) -> None:
    operation = (await admin.get("/openapi.json")).json()["paths"]["/orgs/{org_id}/usage"]["get"]

    assert "from `launched_at`" in operation["description"]
    assert "rounded half up to 2 decimals" in operation["description"]
    assert {"application/json", "text/csv"} == set(operation["responses"]["200"]["content"])
    assert {"from", "to", "format"} <= {parameter["name"] for parameter in operation["parameters"]}
    assert {"400", "401", "404"} <= set(operation["responses"])
