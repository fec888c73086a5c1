"""What every ``octl`` command needs: the API URL, token and organization, resolved once; the client.

Precedence for each setting: flag, then environment variable (both through click), then the config file.
Errors leave ``octl`` as one line with a distinct exit code (see :data:`EXIT_CODES_HELP`).
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import update_wrapper
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx

from orchestrator.cli.octl import config as config_file
from orchestrator.cli.octl import inputs
from orchestrator.client.api import ApiClient, ApiConnectionError, ApiError
from orchestrator.client.tls import read_ca_file

#: Where ``orchestrator serve`` listens by default.
DEFAULT_API_URL = "http://127.0.0.1:8080"

EXIT_CODES_HELP = (
    "Exit codes: 0 success, 1 the API refused the request or the deployment failed, 2 usage or input "
    "error, 3 API unreachable."
)

F = TypeVar("F", bound=Callable[..., Any])

#: What a web page's e-mail address protection shows in place of anything that looks like an address, such
#: as ``--set-yaml=@runner-config.yaml`` in seed 001's ``hctl create runner`` (with a no-break space).
_EMAIL_PROTECTED = re.compile(r"\[email\s*protected\]")


class ApiFailure(click.ClickException):
    """The API answered with an error."""

    exit_code = 1


class OperationFailure(click.ClickException):
    """What was asked for did not work out: a deployment failed, a key does not decrypt."""

    exit_code = 1


class UnexpectedFailure(click.ClickException):
    """A bug or an answer octl does not understand (the traceback shows with --debug)."""

    exit_code = 1


class UsageFailure(click.ClickException):
    """Bad flags, input files or configuration (reported without click's usage text)."""

    exit_code = 2


class UnreachableFailure(click.ClickException):
    """The API could not be reached."""

    exit_code = 3


def check_url(url: str, source: str) -> str:
    parsed = httpx.URL(url) if "://" in url else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise UsageFailure(f"invalid API URL '{url}' (from {source}): expected http(s)://host[:port]")
    return url.rstrip("/")


@dataclass
class Session:
    """The resolved global options of one ``octl`` run (``ctx.obj``)."""

    api_url_flag: str | None = None
    token_flag: str | None = None
    ca_file_flag: str | None = None
    org_flag: str | None = None
    debug: bool = False
    #: ``--profile`` or ``OCTL_PROFILE``: the config file's profile for this run (else its current one).
    profile: str | None = None
    config_path: Path = field(default_factory=lambda: config_file.path_from(os.environ))
    _config: config_file.Config | None = None
    _client: ApiClient | None = None

    def config(self) -> config_file.Config:
        if self._config is None:
            try:
                self._config = config_file.load(self.config_path, self.profile)
            except config_file.ConfigFileError as exc:
                raise UsageFailure(str(exc)) from exc
        return self._config

    def api_url(self) -> str:
        if self.api_url_flag:
            return check_url(self.api_url_flag, "--api-url or PO_API_URL")
        if self.config().api_url:
            return check_url(self.config().api_url or "", f"api_url in {self.config_path}")
        return DEFAULT_API_URL

    def token(self) -> str | None:
        return self.token_flag or self.config().token

    def ca_pem(self) -> str | None:
        """The PEM text of ``--ca-file``/PO_CA_FILE or the profile's ``ca_file``, checked; None without."""
        if self.ca_file_flag:
            path, source = self.ca_file_flag, "--ca-file or PO_CA_FILE"
        elif self.config().ca_file:
            path, source = self.config().ca_file or "", f"ca_file in {self.config_path}"
        else:
            return None
        try:
            return read_ca_file(Path(path).expanduser())
        except ValueError as exc:
            raise UsageFailure(f"{exc} (from {source})") from exc

    def org(self) -> str:
        org = self.org_flag or self.config().default_org_id
        if not org:
            raise UsageFailure(
                "no organization given: pass --org, set PO_ORG_ID, or run `octl config set-org ORG`"
            )
        return org

    def client(self) -> ApiClient:
        if self._client is None:
            self._client = ApiClient(
                self.api_url(),
                self.token(),
                ca_pem=self.ca_pem(),
                on_request=self._log_request if self.debug else None,
                on_response=self._log_response if self.debug else None,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @staticmethod
    def _log_request(request: httpx.Request) -> None:
        click.echo(f"> {request.method} {request.url}", err=True)

    @staticmethod
    def _log_response(response: httpx.Response) -> None:
        click.echo(f"< {response.status_code} {response.reason_phrase}", err=True)

    def failure(self, exc: Exception) -> click.ClickException:
        """The one-line error ``exc`` becomes; with --debug the traceback goes to stderr first."""
        if self.debug:
            traceback.print_exception(exc, file=sys.stderr)
        if isinstance(exc, ApiError):
            return ApiFailure(self._api_message(exc))
        if isinstance(exc, ApiConnectionError) and exc.certificate:
            return UnreachableFailure(
                f"{exc.message} (use --ca-file, PO_CA_FILE or ca_file in the config file to trust the "
                "server's CA or its own certificate)"
            )
        if isinstance(exc, ApiConnectionError):
            return UnreachableFailure(
                f"{exc.message}: is `orchestrator serve` running there? Start it, or point octl at it with "
                "--api-url, PO_API_URL or `octl config set-url URL`"
            )
        if isinstance(exc, inputs.InputError):
            return UsageFailure(str(exc))
        hint = "" if self.debug else " (run with --debug for details)"
        return UnexpectedFailure(f"unexpected error: {type(exc).__name__}: {exc}{hint}")

    def _api_message(self, exc: ApiError) -> str:
        """The API's error, with what to do next where the cause is the token or the organization."""
        message = str(exc)
        errors = (exc.details or {}).get("errors")
        if isinstance(errors, list) and len(errors) > 1:
            message += "".join(
                f"\n  also: {e.get('field')}: {e.get('message')}" for e in errors[1:] if isinstance(e, dict)
            )
        if exc.status == 401:
            given = "no token given" if not self.token() else "the token was refused"
            message += (
                f" ({given}: pass one with --token, PO_AUTH_TOKEN or `octl config set-token`; "
                "`orchestrator token create` on the server mints one)"
            )
        elif exc.status == 403 and exc.message.startswith("only a platform admin"):
            message += " (use a platform-admin token: `orchestrator token create` on the server prints one)"
        elif exc.status == 403:
            message += " (ask an admin of the organization for a token with a role that may do this)"
        elif exc.status == 404 and exc.message.startswith("organization '"):
            message += (
                " (check the organization: --org, PO_ORG_ID or `octl config set-org ORG`; a token works only "
                "in the organization it was made in)"
            )
        return message


class OctlGroup(click.Group):
    """A group with aliases and the error boundary: no traceback leaves octl unless --debug is on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.alias_of: dict[str, str] = {}

    def add_alias(self, alias: str, name: str) -> None:
        self.alias_of[alias] = name

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.alias_of.get(cmd_name, cmd_name))

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        _, command, rest = super().resolve_command(ctx, args)
        return (command.name if command else None), command, rest

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if ctx.parent is None:
            check_mangled_args(ctx.info_name or "octl", args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.parent is not None:
            return super().invoke(ctx)
        session = ctx.ensure_object(Session)
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            raise session.failure(exc) from exc
        finally:
            session.close()


def check_mangled_args(program: str, args: list[str]) -> None:
    """Refuse, saying what to write instead, a command line copied from a web page that replaced an option
    by ``[email protected]`` (seed 001: ``hctl create runner ${RUNNER_ID} [email protected]``)."""
    found = _EMAIL_PROTECTED.search(" ".join(args))
    if found is None:
        return
    mangled = " ".join(found.group(0).split())
    raise UsageFailure(
        f"'{mangled}' is not an argument of {program}: the web page you copied the command from put it in "
        "place of an option it took for an e-mail address, such as --set-yaml=@runner-config.yaml. Write "
        "that option, naming your file: --set-yaml=@runner-config.yaml"
    )


def pass_session(func: F) -> F:
    """Pass the :class:`Session` as the first argument."""

    @click.pass_context
    def wrapper(ctx: click.Context, /, *args: Any, **kwargs: Any) -> Any:
        return func(ctx.ensure_object(Session), *args, **kwargs)

    return update_wrapper(wrapper, func)  # type: ignore[return-value]


def _set_org(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.ensure_object(Session).org_flag = value


#: ``--org`` on a leaf command as well, so ``octl get runners --org O`` works as upstream.
org_option = click.option(
    "--org",
    expose_value=False,
    callback=_set_org,
    metavar="ORG",
    help="Organization id (overrides the global --org).",
)


def input_options(func: F) -> F:
    """``--set``, ``--set-json``, ``--set-yaml`` (see ``octl create --help``); the command gets the body they
    give as ``body`` (read before the command runs; bad input exits 2 with the reason)."""

    def command(
        *args: Any, sets: tuple[str, ...], set_json: str | None, set_yaml: str | None, **kwargs: Any
    ) -> Any:
        return func(*args, body=read_body(sets, set_json, set_yaml), **kwargs)

    wrapped: Any = update_wrapper(command, func)
    wrapped = click.option(
        "--set-yaml",
        "set_yaml",
        metavar="YAML|@FILE|-",
        help="The body as YAML: a document, @file, or - for stdin.",
    )(wrapped)
    wrapped = click.option(
        "--set-json",
        "set_json",
        metavar="JSON|@FILE|-",
        help="The body as JSON: a document, @file, or - for stdin.",
    )(wrapped)
    return click.option(  # type: ignore[no-any-return]
        "--set",
        "sets",
        multiple=True,
        metavar="KEY=VALUE",
        help="Set a top-level key (repeatable; applied last, wins). Values starting with [ or {, "
        "true/false/null or all digits are JSON.",
    )(wrapped)


def read_body(sets: tuple[str, ...], set_json: str | None, set_yaml: str | None) -> dict[str, Any]:
    """The body the input flags give, or exit 2 with the reason."""
    try:
        return inputs.build_body(sets=sets, set_json=set_json, set_yaml=set_yaml, stdin=sys.stdin)
    except inputs.InputError as exc:
        raise UsageFailure(str(exc)) from exc
