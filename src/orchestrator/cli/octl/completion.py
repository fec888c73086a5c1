"""Shell completion of ids (click's ``shell_complete``): runners, projects, environments, deployments.

Each completer asks the API with the settings the command line has so far (``--org``, ``--api-url``,
``--token``, their ``PO_*`` variables, the config file), exactly as the command would, with a short
timeout and one page at most. Completion must never get in the way: on any error (no server, a refused
token, no organization, a slow answer) it completes nothing, silently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from click.shell_completion import CompletionItem

from orchestrator.cli.octl.session import Session
from orchestrator.client.api import ApiClient, JsonObject

#: Seconds a completion may wait for the API (a shell waits for it on every Tab).
COMPLETION_TIMEOUT_SECONDS = 2.0
#: At most this many objects are asked for (the newest deployments first).
COMPLETION_LIMIT = 100

Completer = Callable[[click.Context, click.Parameter, str], list[CompletionItem]]


def session_of(ctx: click.Context) -> Session:
    """The session the command line so far describes: while completing, ``octl``'s own callback does not
    run, so the global options are read from the root context's parameters (flags and variables)."""
    params = ctx.find_root().params
    session = Session(
        org_flag=params.get("org") or None,
        api_url_flag=params.get("api_url") or None,
        token_flag=params.get("token") or None,
        ca_file_flag=params.get("ca_file") or None,
        profile=params.get("profile") or None,
    )
    # A leaf command's --org (its callback runs while parsing) is on the leaf's own object.
    leaf = ctx.find_object(Session)
    if leaf is not None and leaf.org_flag:
        session.org_flag = leaf.org_flag
    return session


def _completer(
    fetch: Callable[[ApiClient, str, click.Context], list[JsonObject]],
    describe: Callable[[JsonObject], str],
) -> Completer:
    def complete(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        try:
            session = session_of(ctx)
            with ApiClient(
                session.api_url(),
                session.token(),
                ca_pem=session.ca_pem(),
                timeout=COMPLETION_TIMEOUT_SECONDS,
                page_size=COMPLETION_LIMIT,
            ) as client:
                found = fetch(client, session.org(), ctx)
        except Exception:  # completion says nothing rather than break the shell's Tab
            return []
        return [
            CompletionItem(str(item["id"]), help=describe(item) or None)
            for item in found
            if isinstance(item.get("id"), str) and str(item["id"]).startswith(incomplete)
        ]

    return complete


def _text(*values: Any) -> str:
    return " ".join(str(value) for value in values if value)


runners = _completer(
    lambda client, org, _ctx: client.list_runners(org, limit=COMPLETION_LIMIT),
    lambda runner: _text((runner.get("runner_configuration") or {}).get("type"), runner.get("description")),
)
projects = _completer(
    lambda client, org, _ctx: client.list_projects(org, limit=COMPLETION_LIMIT),
    lambda project: _text(project.get("display_name")),
)


def _envs(client: ApiClient, org: str, ctx: click.Context) -> list[JsonObject]:
    # The project given before the environment (an argument or --project), else every project's.
    project = ctx.params.get("project_id")
    return client.list_envs(org, project if isinstance(project, str) else None, limit=COMPLETION_LIMIT)


envs = _completer(_envs, lambda env: _text(env.get("project_id"), env.get("env_type_id")))


def _deployments(client: ApiClient, org: str, ctx: click.Context) -> list[JsonObject]:
    # `octl rollback PROJECT ENV <Tab>`: the deployments of that environment.
    project, env = ctx.params.get("project_id"), ctx.params.get("env_id")
    return client.list_deployments(
        org,
        project_id=project if isinstance(project, str) else None,
        env_id=env if isinstance(env, str) else None,
        limit=COMPLETION_LIMIT,
    )


deployments = _completer(
    _deployments,
    lambda dep: _text(
        f"{dep.get('project_id')}/{dep.get('env_id')}",
        dep.get("mode"),
        dep.get("status"),
        dep.get("created_at"),
    ),
)
