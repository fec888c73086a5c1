"""``octl get usage`` against the real server, with deployments written through the store (a second engine
on the server's database): the table (ids whole, totals last), JSON as the API answers it, and the API's
CSV; a bad period is the API's 400."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.settings import ServerSettings
from orchestrator.store import db
from tests.support.deployments import insert_run
from tests.support.octl import ORG, Octl, org_admin_token, serve

#: Longer than any column header: the table must show it whole.
LONG_ENV = "a-rather-long-environment-name-of-forty-chars"
PERIOD = ("--from", "2026-03-01", "--to", "2026-04-01T00:00:00Z")


@pytest.fixture
def octl(settings: ServerSettings, tmp_path: Path) -> Iterator[Octl]:
    with serve(settings) as base_url:
        yield Octl(base_url=base_url, token=org_admin_token(base_url), config_path=tmp_path / "octl.yaml")


def _seed(octl: Octl, database_url: str) -> None:
    """shop/<LONG_ENV>: 1.5 managed minutes and 0.75 self-hosted (two deployments in March)."""
    for args in (
        ("create", "env-type", "development"),
        ("create", "project", "shop"),
        ("create", "env", "shop", LONG_ENV, "--set", "env_type_id=development"),
    ):
        assert 0 == octl(*args).exit_code
    env = json.loads(octl("get", "env", "shop", LONG_ENV, "-o", "json").stdout)

    async def insert() -> None:
        engine = db.create_engine(database_url)
        try:
            async with engine.begin() as conn:
                for runner_id, second in (("managed", 90), ("vm1", 45)):
                    begin = datetime(2026, 3, 5, 10, tzinfo=UTC)
                    await insert_run(
                        conn,
                        ORG,
                        env,
                        runner_id=runner_id,
                        created_at=begin,
                        launched_at=begin,
                        completed_at=begin.replace(minute=second // 60, second=second % 60),
                    )
        finally:
            await engine.dispose()

    asyncio.run(insert())


def test_get_usage__table_json_and_csv(octl: Octl, settings: ServerSettings) -> None:
    assert settings.database_url is not None
    _seed(octl, settings.database_url)

    table = octl("get", "usage", *PERIOD)
    as_json = octl("get", "usage", *PERIOD, "-o", "json")
    as_csv = octl("get", "usage", *PERIOD, "-o", "csv")

    assert 0 == table.exit_code, table.output
    assert [
        ["ProjectId", "EnvId", "Deployments", "RunnerMinutes", "Managed", "SelfHosted"],
        ["shop", LONG_ENV, "2", "2.25", "1.50", "0.75"],
        ["TOTAL", "2", "2.25", "1.50", "0.75"],
    ] == [line.split() for line in table.stdout.splitlines()]
    assert "from 2026-03-01T00:00:00Z to 2026-04-01T00:00:00Z" in table.stderr
    api = httpx.get(
        f"{octl.base_url}/orgs/{ORG}/usage",
        params={"from": "2026-03-01", "to": "2026-04-01T00:00:00Z"},
        headers={"Authorization": f"Bearer {octl.token}"},
    ).json()
    answered: dict[str, Any] = json.loads(as_json.stdout)
    assert {**api, "asOf": None} == {**answered, "asOf": None}
    assert (2.25, 1.5, 0.75, 2) == (
        answered["runnerMinutes"],
        answered["runnerMinutesManaged"],
        answered["runnerMinutesSelfHosted"],
        answered["deployments"],
    )
    assert 0 == as_csv.exit_code, as_csv.output
    assert [
        {
            "org_id": ORG,
            "project_id": "shop",
            "env_id": LONG_ENV,
            "deployments": "2",
            "runner_minutes": "2.25",
            "runner_minutes_managed": "1.50",
            "runner_minutes_self_hosted": "0.75",
            "period_from": "2026-03-01T00:00:00Z",
            "period_to": "2026-04-01T00:00:00Z",
        }
    ] == list(csv.DictReader(io.StringIO(as_csv.stdout, newline="")))


def test_get_usage__a_bad_period_is_the_apis_400(octl: Octl) -> None:
    result = octl("get", "usage", "--from", "2026-04-01", "--to", "2026-03-01")

    assert 1 == result.exit_code
    assert "to: must be after from (2026-04-01T00:00:00Z)" in result.stderr
    assert "" == result.stdout
