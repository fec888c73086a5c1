"""Usage (ours, seed 004): an organization's runner minutes over a period, per project and environment,
split into managed and self-hosted; JSON, or CSV (``Accept: text/csv`` or ``?format=csv``)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from orchestrator.api.context import READ, Principal
from orchestrator.domain import usage
from orchestrator.store import deployments as store
from orchestrator.web.services import Services, services

router = APIRouter(tags=["Usage"])

#: The CSV export's columns, in order (one row per project and environment, after a header row).
CSV_COLUMNS = (
    "org_id",
    "project_id",
    "env_id",
    "deployments",
    "runner_minutes",
    "runner_minutes_managed",
    "runner_minutes_self_hosted",
    "period_from",
    "period_to",
)
CSV_MEDIA_TYPE = "text/csv"

DEFINITION = (
    "A deployment's run lasts from `launched_at` (its runner was started, or a managed runner claimed "
    "it; for a deployment handed to an agent, from the moment the agent created its runner's job: a "
    "command no agent ever picked up counts zero) to the earlier of `completed_at` and `exited_at` (its "
    "runner was seen to exit without results); a run still executing counts up to now. Its runner "
    "minutes are the seconds of that run within [from, to), divided by 60; a deployment never launched "
    "counts zero. It ran on managed runners iff its `runner_id` is `managed`, else on self-hosted ones. "
    "Per row, the managed and the self-hosted minutes are each summed exactly and rounded half up to 2 "
    "decimals; `runnerMinutes` is their sum and the totals are the sums of the rows, so the figures add "
    "up exactly. `deployments` counts the deployments created within the period. A row is listed when "
    "one of its deployments was created or ran within the period."
)


class _Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class UsageFigures(_Camel):
    #: runner_minutes_managed + runner_minutes_self_hosted.
    runner_minutes: float = Field(description="Runner minutes (2 decimals): managed + self-hosted.")
    runner_minutes_managed: float = Field(description="Minutes run on managed runners (runner `managed`).")
    runner_minutes_self_hosted: float = Field(description="Minutes run on the organization's own runners.")
    deployments: int = Field(description="Deployments created within the period.")

    @staticmethod
    def of(figures: usage.Figures) -> dict[str, float | int]:
        return {
            "runner_minutes": float(figures.total),
            "runner_minutes_managed": float(figures.managed),
            "runner_minutes_self_hosted": float(figures.self_hosted),
            "deployments": figures.deployments,
        }


class UsageRowOut(UsageFigures):
    project_id: str
    env_id: str


class UsageOut(UsageFigures):
    org_id: str
    from_: datetime = Field(alias="from", description="Start of the period (inclusive).")
    to: datetime = Field(description="End of the period (exclusive).")
    as_of: datetime = Field(description="The time runs still executing were counted up to.")
    rows: list[UsageRowOut] = Field(description="One row per project and environment.")


def _wants_csv(format_: str | None, accept: str) -> bool:
    """``?format=`` decides; else the Accept header, by quality: CSV if it prefers text/csv to JSON."""
    if format_ is not None:
        return format_ == "csv"
    best: dict[str, float] = {}
    for part in accept.split(","):
        media, *params = (item.strip() for item in part.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        media = media.lower()
        if media in (CSV_MEDIA_TYPE, "application/json", "*/*", "application/*"):
            best[media] = max(best.get(media, 0.0), quality)
    csv_q = best.get(CSV_MEDIA_TYPE, 0.0)
    json_q = max(best.get("application/json", 0.0), best.get("application/*", 0.0), best.get("*/*", 0.0))
    return csv_q > 0 and csv_q > json_q


def _minutes(value: object) -> str:
    return f"{value:.2f}"


def to_csv(org_id: str, summary: usage.Usage) -> str:
    """RFC 4180: a header row, CRLF line ends, fields quoted when they need it."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow(CSV_COLUMNS)
    start, end = _iso(summary.period.start), _iso(summary.period.end)
    for row in summary.rows:
        figures = row.figures
        writer.writerow(
            (
                org_id,
                row.project_id,
                row.env_id,
                figures.deployments,
                _minutes(figures.total),
                _minutes(figures.managed),
                _minutes(figures.self_hosted),
                start,
                end,
            )
        )
    return buffer.getvalue()


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


@router.get(
    "/orgs/{org_id}/usage",
    response_model=UsageOut,
    description=DEFINITION,
    responses={
        200: {
            "description": "The usage, as JSON, or as CSV (`Accept: text/csv` or `format=csv`): a header row "
            f"({', '.join(CSV_COLUMNS)}) and one row per project and environment (RFC 4180).",
            "content": {CSV_MEDIA_TYPE: {"schema": {"type": "string"}}},
        }
    },
)
async def get_usage(
    org_id: str,
    request: Request,
    from_: Annotated[
        str | None,
        Query(
            alias="from",
            max_length=64,
            description="Start (inclusive): an RFC 3339 timestamp with its offset, or a date (midnight UTC). "
            "Default: the start of the current calendar month (UTC).",
        ),
    ] = None,
    to: Annotated[
        str | None,
        Query(
            max_length=64,
            description="End (exclusive), as `from`; at most 366 days after it. Default: the start of the "
            "calendar month after `from`'s.",
        ),
    ] = None,
    format_: Annotated[
        Literal["json", "csv"] | None,
        Query(alias="format", description="`csv` for the CSV export (as `Accept: text/csv`)."),
    ] = None,
    _: Principal = READ,
    svc: Services = Depends(services),
) -> Response:
    """Runner minutes of the organization over a period, per project and environment, managed and
    self-hosted."""
    now = datetime.now(UTC)
    within = usage.period(from_, to, now=now)
    async with svc.reader.connect() as conn:
        runs = await store.usage_runs(conn, org_id, within.start, within.end)
    summary = usage.summarize(runs, within, now=now)
    if _wants_csv(format_, request.headers.get("accept", "")):
        name = f"usage-{org_id}-{within.start:%Y%m%dT%H%M%SZ}-{within.end:%Y%m%dT%H%M%SZ}.csv"
        return Response(
            to_csv(org_id, summary),
            media_type=f"{CSV_MEDIA_TYPE}; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    out = UsageOut(
        org_id=org_id,
        from_=within.start,
        to=within.end,
        as_of=now,
        rows=[
            UsageRowOut(project_id=row.project_id, env_id=row.env_id, **UsageFigures.of(row.figures))
            for row in summary.rows
        ],
        **UsageFigures.of(summary.total),
    )
    return JSONResponse(out.model_dump(mode="json", by_alias=True))
