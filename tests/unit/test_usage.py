"""``domain.usage``: periods and their defaults, a run's minutes clipped to the period, rounding, the rows'
sums; and the CSV export's RFC 4180 quoting (``api.usage.to_csv``)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from orchestrator.api.usage import to_csv
from orchestrator.domain import usage
from orchestrator.errors import InvalidInputError

NOW = datetime(2026, 12, 17, 15, 30, tzinfo=UTC)
MARCH = usage.Period(datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))


def t(day: int, hour: int = 0, minute: int = 0, second: float = 0, month: int = 3) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC) + timedelta(seconds=second)


def run(
    launched: datetime | None,
    completed: datetime | None = None,
    exited: datetime | None = None,
    *,
    runner: str = "vm1",
    created: datetime | None = None,
    env: str = "dev",
) -> usage.Run:
    return usage.Run(
        project_id="shop",
        env_id=env,
        runner_id=runner,
        created_at=created or launched or t(10),
        launched_at=launched,
        completed_at=completed,
        exited_at=exited,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-01", datetime(2026, 3, 1, tzinfo=UTC)),
        ("2026-03-01T10:00:00Z", datetime(2026, 3, 1, 10, tzinfo=UTC)),
        ("2026-03-01t10:00:00z", datetime(2026, 3, 1, 10, tzinfo=UTC)),
        ("2026-03-01 10:00:00+02:00", datetime(2026, 3, 1, 8, tzinfo=UTC)),
        ("2026-03-01T10:00:00.123456789-01:30", datetime(2026, 3, 1, 11, 30, 0, 123456, tzinfo=UTC)),
    ],
)
def test_parse_instant__rfc3339_and_dates_as_utc(text: str, expected: datetime) -> None:
    assert expected == usage.parse_instant("from", text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "2026-03",
        "2026-03-01T10:00:00",
        "2026-03-01T10:00Z",
        "20260301",
        "2026-13-01",
        "9999-12-31T23:00:00-05:00",
    ],
)
def test_parse_instant__anything_else_is_invalid_input_naming_the_parameter(text: str) -> None:
    with pytest.raises(InvalidInputError) as raised:
        usage.parse_instant("to", text)

    assert raised.value.message.startswith("to: ")
    assert [{"field": "to", "message": raised.value.message.removeprefix("to: ")}] == (
        raised.value.details or {}
    )["errors"]


def test_period__defaults_to_the_calendar_month_and_the_month_after_from() -> None:
    assert usage.Period(datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)) == usage.period(
        None, None, now=NOW
    )
    assert usage.Period(datetime(2026, 2, 10, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)) == usage.period(
        "2026-02-10", None, now=NOW
    )
    assert usage.Period(datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, tzinfo=UTC)) == usage.period(
        None, "2026-12-02", now=NOW
    )


def test_period__to_must_follow_from_within_366_days() -> None:
    assert usage.period("2024-01-01", "2025-01-01", now=NOW).end == datetime(
        2025, 1, 1, tzinfo=UTC
    )  # 366 days
    for start, end, message in [
        (
            "2026-03-01",
            "2026-03-01",
            "to: must be after from (2026-03-01T00:00:00Z); it is 2026-03-01T00:00:00Z",
        ),
        (
            "2025-01-01",
            "2026-01-02T00:00:01Z",
            "to: the period may be at most 366 days long; it is 366 days, 0:00:01",
        ),
        (None, "2026-11-30", "to: must be after from (2026-12-01T00:00:00Z)"),
    ]:
        with pytest.raises(InvalidInputError) as raised:
            usage.period(start, end, now=NOW)
        assert raised.value.message.startswith(message)
    with pytest.raises(InvalidInputError, match=r"^from: 9999-12-01T00:00:00Z has no following month"):
        usage.period("9999-12-01", None, now=NOW)


@pytest.mark.parametrize(
    ("the_run", "minutes"),
    [
        (run(t(10, 10), t(10, 10, 5)), 5),
        (run(None, t(10, 10, 5)), 0),  # never launched
        (run(t(28, 23, 50, month=2), t(1, 0, 10)), 10),  # clipped at the start
        (run(t(31, 23, 40), t(1, 0, 30, month=4)), 20),  # clipped at the end
        (run(t(28, month=2), t(1, 0, 30, month=4)), 31 * 24 * 60),  # over the whole period
        (run(t(10, 10), None, t(10, 10, 1)), 1),  # exited, not yet failed: until it exited
        (run(t(10, 10), t(10, 10, 6), t(10, 10, 1)), 1),  # exited, failed later: until it exited
        (run(t(10, 10), t(10, 10, 2), t(10, 10, 3)), 2),  # results, then seen exiting: until the results
        (run(t(1, 0, month=4), t(1, 1, month=4)), 0),  # after the period
        (run(t(1, 0, month=2), t(1, 1, month=2)), 0),  # before it
        (run(t(10, 10), t(10, 9)), 0),  # an end before its launch counts nothing
    ],
)
def test_run_time__the_launch_to_the_end_within_the_period(the_run: usage.Run, minutes: int) -> None:
    assert timedelta(minutes=minutes) == usage.run_time(the_run, MARCH, now=NOW)


def test_run_time__an_executing_run_counts_up_to_now_clipped() -> None:
    executing = run(t(10, 10), None)

    assert timedelta(minutes=7) == usage.run_time(executing, MARCH, now=t(10, 10, 7))
    assert MARCH.end - t(10, 10) == usage.run_time(executing, MARCH, now=NOW)
    assert timedelta(0) == usage.run_time(executing, MARCH, now=t(10, 9))


def test_summarize__rows_managed_apart_rounded_half_up_and_summed_exactly() -> None:
    runs = [
        run(t(10, 10), t(10, 10, 0, 0.3)),  # 0.005 minute: rounds up to 0.01
        run(t(10, 11), t(10, 11, 0, 0.3)),  # another 0.005: the row is 0.01 (exact sum 0.01)
        run(t(10, 12), t(10, 12, 0, 10), runner="managed"),  # 0.1666...: 0.17
        run(t(11, 1), t(11, 1, 0, 10), runner="managed", env="prod"),  # 0.17
        run(t(11, 2), t(11, 2, 0, 10), runner="managed", env="prod"),  # exactly 0.33 in total, not 0.34
        run(None, t(12, 1), env="prod", created=t(12, 1)),  # counted, no minutes
        run(t(28, month=2), t(1, 0, 1), created=t(28, month=2), env="stage"),  # minutes, not counted
        run(t(1, month=2), t(1, 1, month=2), env="old"),  # neither: no row
    ]

    summary = usage.summarize(runs, MARCH, now=NOW)

    assert [
        ("dev", usage.Figures(3, Decimal("0.17"), Decimal("0.01"))),
        ("prod", usage.Figures(3, Decimal("0.33"), Decimal("0.00"))),
        ("stage", usage.Figures(0, Decimal("0.00"), Decimal("1.00"))),
    ] == [(row.env_id, row.figures) for row in summary.rows]
    assert usage.Figures(6, Decimal("0.50"), Decimal("1.01")) == summary.total
    assert Decimal("1.51") == summary.total.total
    assert Decimal("0.18") == summary.rows[0].figures.total


def test_to_csv__rfc_4180_quoting_and_crlf() -> None:
    summary = usage.Usage(
        period=MARCH,
        as_of=NOW,
        rows=[usage.Row('we,ird "project"', "dev", usage.Figures(1, Decimal("1.50"), Decimal("0")))],
    )

    text = to_csv("acme", summary)

    assert text.endswith(
        'acme,"we,ird ""project""",dev,1,1.50,1.50,0.00,2026-03-01T00:00:00Z,2026-04-01T00:00:00Z\r\n'
    )
    assert 'we,ird "project"' == next(iter(csv.DictReader(io.StringIO(text, newline=""))))["project_id"]
