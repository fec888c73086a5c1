"""Runner minutes: what a deployment's run costs within a period, per project and environment, split into
managed and self-hosted (pure: the caller gives the clock).

A deployment's run lasts from ``launched_at`` - the moment a runner held it: its runner was started, a
managed runner claimed it, or an agent created its runner's job (``store.deployments.usage_runs`` reads
that from the ``create-job`` command; a command never picked up leaves it ``None``) - to
its end: the earlier of ``completed_at`` (results recorded, or the deployment failed) and ``exited_at`` (its
runner was seen to exit without results); while it has neither, up to ``now``. That span is clipped to the
period ``[start, end)``: its runner minutes are the seconds of the overlap / 60. A deployment never
launched runs for zero minutes. It ran on managed runners iff its ``runner_id`` is ``managed``.

Rounding: per row (project, environment) the managed and the self-hosted minutes are each summed exactly
(microseconds), then rounded half up to 2 decimals; every other figure is a sum of those rounded parts
(``runnerMinutes`` = managed + self-hosted, totals = the sum of the rows), so the figures add up exactly.

A row's ``deployments`` counts its deployments created within the period, launched or not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from orchestrator.domain.managed import MANAGED_RUNNER_ID
from orchestrator.errors import InvalidInputError

#: The longest period one request may ask for.
MAX_PERIOD = timedelta(days=366)
_CENT = Decimal("0.01")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# RFC 3339 date-time: date, "T" (or "t", or a space as RFC 3339 allows), time, optional fraction, an offset.
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")


def _invalid(name: str, message: str) -> InvalidInputError:
    return InvalidInputError(f"{name}: {message}", details={"errors": [{"field": name, "message": message}]})


def parse_instant(name: str, value: str) -> datetime:
    """An RFC 3339 timestamp (with its offset) or a date (``YYYY-MM-DD``: midnight UTC), as UTC.

    InvalidInputError naming ``name`` for anything else."""
    text = value.strip()
    try:
        if _DATE.fullmatch(text):
            return datetime.combine(date.fromisoformat(text), datetime.min.time(), tzinfo=UTC)
        if _DATE_TIME.fullmatch(text):
            # Python keeps microseconds: a longer fraction is cut to six digits.
            head, dot, rest = text.partition(".")
            if dot:
                digits = re.match(r"\d+", rest)
                assert digits is not None
                text = f"{head}.{digits.group()[:6].ljust(6, '0')}{rest[digits.end() :]}"
            return datetime.fromisoformat(text.replace("z", "Z").replace("t", "T")).astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise _invalid(name, f"'{value[:40]}' is not a valid date or time ({exc})") from exc
    raise _invalid(
        name,
        f"'{value[:40]}' is not an RFC 3339 timestamp with an offset (2026-03-01T00:00:00Z) "
        "or a date (2026-03-01)",
    )


def _month_start(moment: datetime) -> datetime:
    return datetime(moment.year, moment.month, 1, tzinfo=UTC)


def _next_month(month_start: datetime) -> datetime:
    if month_start.month == 12:
        return month_start.replace(year=month_start.year + 1, month=1)
    return month_start.replace(month=month_start.month + 1)


@dataclass(frozen=True)
class Period:
    """``[start, end)`` in UTC."""

    start: datetime
    end: datetime


def period(start: str | None, end: str | None, *, now: datetime) -> Period:
    """The period of ``from`` and ``to``: ``from`` defaults to the start of the current calendar month (UTC),
    ``to`` to the start of the calendar month after ``from``'s. ``to`` is exclusive; it must be after
    ``from`` and at most :data:`MAX_PERIOD` later (InvalidInputError naming ``to`` otherwise)."""
    begins = parse_instant("from", start) if start is not None else _month_start(now.astimezone(UTC))
    if end is not None:
        ends = parse_instant("to", end)
    else:
        try:
            ends = _next_month(_month_start(begins))
        except ValueError as exc:
            raise _invalid("from", f"{_iso(begins)} has no following month: give to") from exc
    if ends <= begins:
        raise _invalid("to", f"must be after from ({_iso(begins)}); it is {_iso(ends)}")
    if ends - begins > MAX_PERIOD:
        raise _invalid("to", f"the period may be at most {MAX_PERIOD.days} days long; it is {ends - begins}")
    return Period(begins, ends)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, kw_only=True)
class Run:
    """What usage reads of a deployment."""

    project_id: str
    env_id: str
    runner_id: str
    created_at: datetime
    launched_at: datetime | None
    completed_at: datetime | None
    exited_at: datetime | None


def run_time(run: Run, within: Period, *, now: datetime) -> timedelta:
    """The part of ``run``'s run within the period (zero if never launched)."""
    if run.launched_at is None:
        return timedelta(0)
    ends = [moment for moment in (run.completed_at, run.exited_at) if moment is not None]
    finished = min(ends) if ends else now
    overlap = min(finished, within.end) - max(run.launched_at, within.start)
    return max(overlap, timedelta(0))


def _minutes(span: timedelta) -> Decimal:
    seconds = Decimal(span.days * 86_400 + span.seconds) + Decimal(span.microseconds) / Decimal(1_000_000)
    return (seconds / Decimal(60)).quantize(_CENT, rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class Figures:
    """Runner minutes (2 decimals) and deployments of a row or of the whole organization."""

    deployments: int = 0
    managed: Decimal = Decimal("0.00")
    self_hosted: Decimal = Decimal("0.00")

    @property
    def total(self) -> Decimal:
        return self.managed + self.self_hosted

    def __add__(self, other: Figures) -> Figures:
        return Figures(
            self.deployments + other.deployments,
            self.managed + other.managed,
            self.self_hosted + other.self_hosted,
        )


@dataclass(frozen=True)
class Row:
    project_id: str
    env_id: str
    figures: Figures


@dataclass(frozen=True)
class Usage:
    period: Period
    #: The clock runs still executing were counted up to.
    as_of: datetime
    rows: list[Row]
    total: Figures = field(default_factory=Figures)


@dataclass
class _Sums:
    deployments: int = 0
    managed: timedelta = timedelta(0)
    self_hosted: timedelta = timedelta(0)


def summarize(runs: Iterable[Run], within: Period, *, now: datetime) -> Usage:
    """Per (project, environment), in that order, every row a deployment was created in or ran in during the
    period; the totals are the sums of the rows."""
    sums: dict[tuple[str, str], _Sums] = {}
    for run in runs:
        spent = run_time(run, within, now=now)
        created = within.start <= run.created_at < within.end
        if not created and not spent:
            continue
        row = sums.setdefault((run.project_id, run.env_id), _Sums())
        row.deployments += int(created)
        if run.runner_id == MANAGED_RUNNER_ID:  # the platform's pool: "ran on managed runners"
            row.managed += spent
        else:
            row.self_hosted += spent
    rows = [
        Row(project_id, env_id, Figures(s.deployments, _minutes(s.managed), _minutes(s.self_hosted)))
        for (project_id, env_id), s in sorted(sums.items())
    ]
    total = sum((row.figures for row in rows), Figures())
    return Usage(period=within, as_of=now, rows=rows, total=total)
