"""``octl``: the user command line of the Platform Orchestrator (console script ``octl``).

Every command goes through :class:`orchestrator.client.api.ApiClient`; nothing here imports server code.
"""

from __future__ import annotations

import click

from orchestrator.cli.octl import examples
from orchestrator.cli.octl.commands import config, deploy, deployments, envs, logs, states, terraform, verbs
from orchestrator.cli.octl.session import EXIT_CODES_HELP, OctlGroup, Session

__all__ = ["main"]


@click.group(
    cls=OctlGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    epilog=EXIT_CODES_HELP,
)
@click.option("--org", envvar="PO_ORG_ID", show_envvar=True, metavar="ORG", help="Organization id.")
@click.option("--api-url", envvar="PO_API_URL", show_envvar=True, metavar="URL", help="Orchestrator API URL.")
@click.option(
    "--token", envvar="PO_AUTH_TOKEN", show_envvar=True, metavar="TOKEN", help="API token (Bearer)."
)
@click.option(
    "--ca-file",
    envvar="PO_CA_FILE",
    show_envvar=True,
    metavar="FILE",
    help="PEM file of the CA (or the certificate) to verify the API's HTTPS certificate with, besides the "
    "system CAs (e.g. a server on its own self-signed certificate).",
)
@click.option(
    "--profile",
    envvar="OCTL_PROFILE",
    show_envvar=True,
    metavar="PROFILE",
    help="Config file profile for this command (default: the one `octl config use` chose).",
)
@click.option(
    "-d",
    "--debug",
    is_flag=True,
    envvar="PO_CLI_DEBUG",
    show_envvar=True,
    help="Print HTTP requests, and tracebacks on errors.",
)
@click.pass_context
@click.version_option(package_name="platform-orchestrator", prog_name="octl")
def main(
    ctx: click.Context,
    org: str | None,
    api_url: str | None,
    token: str | None,
    ca_file: str | None,
    profile: str | None,
    debug: bool,
) -> None:
    """Deploy to, and manage the runners, module catalogue, projects and environments of a Platform
    Orchestrator.

    Settings come from flags, then PO_* environment variables, then the config file
    (see `octl config --help`).
    """
    session = ctx.ensure_object(Session)
    session.org_flag = org or None
    session.api_url_flag = api_url or None
    session.token_flag = token or None
    session.ca_file_flag = ca_file or None
    session.profile = profile or None
    session.debug = debug


main.add_command(config.config)
main.add_command(terraform.terraform)
main.add_command(verbs.create)
main.add_command(verbs.get)
main.add_command(verbs.update)
main.add_command(verbs.delete)
main.add_command(envs.refresh_runner)
main.add_command(deploy.deploy)
main.add_command(deploy.rollback)
main.add_command(deploy.outputs)
main.add_command(logs.logs)
main.add_command(deployments.tf)
main.add_command(deployments.cancel)
main.add_command(states.state)
examples.attach(main)
