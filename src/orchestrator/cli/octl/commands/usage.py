"""``octl get usage``: runner minutes of the organization over a period, per project and environment."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.octl import output
from orchestrator.cli.octl.commands import verbs
from orchestrator.cli.octl.output import Column, field
from orchestrator.cli.octl.session import Session, org_option, pass_session


def _minutes(path: str, header: str) -> Column:
    def get(row: dict[str, Any]) -> str:
        value = row.get(path)
        return f"{value:.2f}" if isinstance(value, int | float) else ""

    return Column(header, get)


USAGE = (
    field("ProjectId", "projectId"),
    field("EnvId", "envId"),
    field("Deployments", "deployments"),
    _minutes("runnerMinutes", "RunnerMinutes"),
    _minutes("runnerMinutesManaged", "Managed"),
    _minutes("runnerMinutesSelfHosted", "SelfHosted"),
)


@verbs.get.command("usage")
@click.option(
    "--from",
    "start",
    metavar="TIME",
    help="Start (inclusive): an RFC 3339 timestamp or a date (midnight UTC). Default: this month's start.",
)
@click.option(
    "--to",
    "end",
    metavar="TIME",
    help="End (exclusive), as --from; at most 366 days later. Default: the next month's start after --from.",
)
@click.option(
    "-o",
    "--out",
    "out",
    type=click.Choice((*output.FORMATS, "csv")),
    default="table",
    show_default=True,
    help="Output format.",
)
@org_option
@pass_session
def get_usage(session: Session, start: str | None, end: str | None, out: str) -> None:
    """Runner minutes of the organization per project and environment, managed and self-hosted.

    A run counts from its launch to its end (now while it executes), within the period; minutes have
    2 decimals. The table ends with the organization's totals; csv is the API's CSV export.
    """
    org = session.org()
    client = session.client()
    if out == "csv":
        click.echo(client.get_usage_csv(org, start=start, end=end), nl=False)
        return
    usage = client.get_usage(org, start=start, end=end)
    if out in ("json", "yaml"):
        output.emit(usage, out, USAGE)
        return
    rows = usage.get("rows")
    total = {key: value for key, value in usage.items() if key != "rows"}
    output.table(
        [*(rows if isinstance(rows, list) else []), {**total, "projectId": "TOTAL"}],
        USAGE,
        wide=out == "wide",
    )
    output.note(
        f"Usage of organization {org} from {usage.get('from')} to {usage.get('to')} "
        f"(runs still executing counted up to {usage.get('asOf')})."
    )
