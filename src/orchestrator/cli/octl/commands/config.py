"""``octl config set-url|set-org|set-token|show``: the config file (see ``octl.config``)."""

from __future__ import annotations

import click

from orchestrator.cli.octl import config as config_file
from orchestrator.cli.octl import output
from orchestrator.cli.octl.session import OctlGroup, Session, UsageFailure, check_url, pass_session


@click.group("config", cls=OctlGroup)
def config() -> None:
    """Show or change the config file ($OCTL_CONFIG, or ~/.config/octl/config.yaml).

    The file holds profiles: `default` (its top-level keys) and named ones; `config use PROFILE` chooses
    the one octl uses, `--profile`/OCTL_PROFILE one for a single command. set-url, set-org and set-token
    change the profile in use.

    \b
    Example:
      octl config set-url http://127.0.0.1:8080 && octl config set-org acme && octl config set-token
      octl config use prod && octl config set-url https://po.example.com
      octl --profile default get runners
    """


def _update(session: Session, **values: str) -> None:
    current = session.config()
    for key, value in values.items():
        setattr(current, key, value)
    try:
        config_file.save(session.config_path, current)
    except config_file.ConfigFileError as exc:
        raise UsageFailure(str(exc)) from exc


@config.command("set-url")
@click.argument("url")
@pass_session
def set_url(session: Session, url: str) -> None:
    """Set the API URL, e.g. https://orchestrator.example.com."""
    _update(session, api_url=check_url(url, "the argument"))
    output.success(f"API URL set to {url} in {session.config_path}.")


@config.command("set-org")
@click.argument("org")
@pass_session
def set_org(session: Session, org: str) -> None:
    """Set the default organization."""
    _update(session, default_org_id=org)
    output.success(f"Default organization set to {org} in {session.config_path}.")


@config.command("set-token")
@click.argument("token", required=False)
@pass_session
def set_token(session: Session, token: str | None) -> None:
    """Set the API token; without TOKEN it is read from a hidden prompt (or stdin), not the shell history."""
    if token is None:
        token = click.prompt("Token", hide_input=True, err=True)
    token = (token or "").strip()
    if not token:
        raise UsageFailure("the token is empty")
    _update(session, token=token)
    output.success(f"Token set in {session.config_path}.")


@config.command("show")
@pass_session
def show(session: Session) -> None:
    """Print the profile in use, with the token masked."""
    current = session.config()
    values = current.as_dict()
    if values.get("token"):
        values["token"] = config_file.mask(str(values["token"]))
    output.note(
        f"# {session.config_path}, profile {current.profile} (profiles: {', '.join(current.names())})"
    )
    click.echo(output.to_yaml(values) if values else "{}\n", nl=False)


@config.command("use")
@click.argument("profile", metavar="PROFILE")
@pass_session
def use(session: Session, profile: str) -> None:
    """Use PROFILE from now on (a new name starts an empty profile; `default` is the top-level keys)."""
    if not profile.strip() or profile in (config_file.CURRENT_KEY, config_file.PROFILES_KEY):
        raise UsageFailure(f"'{profile}' cannot name a profile")
    current = session.config()
    new = profile != config_file.DEFAULT_PROFILE and profile not in current.profiles
    current.current_profile = profile
    if new:
        current.profiles[profile] = {}
    try:
        config_file.save(session.config_path, current)
    except config_file.ConfigFileError as exc:
        raise UsageFailure(str(exc)) from exc
    then = " (new and empty: set it with `octl config set-url`, `set-org`, `set-token`)" if new else ""
    output.success(f"Using profile {profile}{then}.")
