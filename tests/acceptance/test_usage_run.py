"""Usage end to end: real deployments on a local vm runner, and the usage API's figures and CSV for them
(from the deployments' own ``launched_at`` and ``completed_at``, clipped to the period asked)."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import pytest

from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def _minutes(span: timedelta) -> float:
    seconds = Decimal(str(span.total_seconds()))
    return float((seconds / 60).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def _times(deployment: dict[str, Any]) -> tuple[datetime, datetime]:
    return datetime.fromisoformat(deployment["launched_at"]), datetime.fromisoformat(
        deployment["completed_at"]
    )


def test_usage__figures_and_csv_of_deployments_that_ran(stack: Stack) -> None:
    first, second = stack.deploy(), stack.deploy()
    assert ["succeeded"] * 2 == [first["status"], second["status"]], first["status_message"]
    (launched_1, completed_1), (launched_2, completed_2) = _times(first), _times(second)
    whole = {
        "from": (launched_1 - timedelta(minutes=1)).isoformat(),
        "to": (completed_2 + timedelta(minutes=1)).isoformat(),
    }
    # From the middle of the first run to the middle of the second: half of each.
    middle_1 = launched_1 + (completed_1 - launched_1) / 2
    middle_2 = launched_2 + (completed_2 - launched_2) / 2
    clipped = {"from": middle_1.isoformat(), "to": middle_2.isoformat()}

    answer = stack.client.get(f"/orgs/{stack.org}/usage", params=whole)
    part = stack.client.get(f"/orgs/{stack.org}/usage", params=clipped)
    as_csv = stack.client.get(f"/orgs/{stack.org}/usage", params={**whole, "format": "csv"})

    assert 200 == answer.status_code, answer.text
    expected = _minutes(completed_1 - launched_1 + completed_2 - launched_2)
    body = answer.json()
    assert (expected, 0.0, expected, 2) == (
        body["runnerMinutes"],
        body["runnerMinutesManaged"],
        body["runnerMinutesSelfHosted"],
        body["deployments"],
    )
    assert [("shop", "dev")] == [(row["projectId"], row["envId"]) for row in body["rows"]]
    halves = _minutes(completed_1 - middle_1 + middle_2 - launched_2)
    assert (halves, 1) == (part.json()["runnerMinutesSelfHosted"], part.json()["deployments"])
    [line] = list(csv.DictReader(io.StringIO(as_csv.text, newline="")))
    assert (stack.org, "shop", "dev", "2", f"{expected:.2f}", "0.00", f"{expected:.2f}") == (
        line["org_id"],
        line["project_id"],
        line["env_id"],
        line["deployments"],
        line["runner_minutes"],
        line["runner_minutes_managed"],
        line["runner_minutes_self_hosted"],
    )
