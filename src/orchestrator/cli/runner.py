"""``po-runner``: the entrypoint of the runner image.

``po-runner`` (no argument) and ``po-runner standard`` run one deployment from the environment (see
``orchestrator.runner.settings.RunnerSettings``). ``po-runner remote`` is the runner agent (see
``orchestrator.agent``): it runs until stopped, polling the runner gateway for commands. ``po-runner managed``
is a runner of the platform's Managed pool (see ``orchestrator.managed``): it registers with the managed
runner secret and runs ``po-runner standard`` for each deployment it claims, until stopped.

Exit codes: 0 the deployment succeeded and its results were delivered; 1 it failed or its results
could not be delivered; 2 the runner is configured wrongly (nothing was reported). ``managed``: 0 stopped
by a signal; 1 the orchestrator refused it (wrong secret, managed runners not enabled); 2 configured wrongly.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from functools import partial

import click
from pydantic import ValidationError

from orchestrator import errors
from orchestrator.protocol.launch import WarmOrder
from orchestrator.runner import standard as standard_mode
from orchestrator.runner.settings import RunnerSettings


class RunnerConfigurationError(click.ClickException):
    """The runner's environment is incomplete or invalid."""

    exit_code = 2


EXIT_CODES_HELP = (
    "Exit codes: 0 the deployment succeeded and was reported, 1 it failed or was not reported, 2 configured "
    "wrongly (managed: 0 stopped by a signal, 1 refused by the orchestrator, 2 configured wrongly)."
)


@click.group(
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=EXIT_CODES_HELP,
)
@click.version_option(package_name="platform-orchestrator", prog_name="po-runner")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Platform Orchestrator runner: executes deployments with OpenTofu/Terraform.

    Started by the orchestrator (or its agent) for each deployment, with its settings in the environment;
    without a command it runs `standard`.

    \b
    Example:
      po-runner standard        # one deployment, as the orchestrator starts it
      RUNNER_GATEWAY_URL=https://po.example.com ORG_ID=acme RUNNER_ID=my-runner \\
        PRIVATE_KEY="$(cat agent.pem)" po-runner remote
    """
    not_dumpable()
    if ctx.invoked_subcommand is None:
        ctx.invoke(standard)


#: ``prctl`` option that sets whether the process may be dumped and traced (``linux/prctl.h``).
PR_SET_DUMPABLE = 4


def not_dumpable() -> None:
    """Make this process non-dumpable: its ``/proc/<pid>/environ``, ``mem``, ``fd`` and ``maps`` become
    root's, so not even a process of the same uid (what a run starts: its engine, a provisioner, a process
    it left behind) can read its deployment token, its secrets or a warm runner's pipe, nor trace it. The
    processes it starts are dumpable again (``execve`` resets the flag): they are the run's own. Linux
    only; elsewhere nothing happens."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


@main.command()
def standard() -> None:
    """Run one deployment: MODE, DEPLOYMENT_ID, TOKEN, RUNNER_GATEWAY_URL, ... come from the environment.

    \b
    Example:
      MODE=deploy DEPLOYMENT_ID=... TOKEN=... RUNNER_GATEWAY_URL=https://po.example.com po-runner standard
    """
    try:
        settings = RunnerSettings()
    except ValidationError as exc:
        raise RunnerConfigurationError(_describe(exc)) from exc
    stop = standard_mode.STOP_SIGNALS
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop.handler)
    try:
        outcome = standard_mode.run_standard(settings, environ=dict(os.environ), echo=sys.stdout, stop=stop)
    except errors.ConfigurationError as exc:
        raise RunnerConfigurationError(exc.message) from exc
    if outcome.problem is not None:
        click.echo(f"po-runner: {outcome.problem}", err=True)
    error = outcome.results.error
    if error is not None:
        click.echo(f"po-runner: deployment failed: [{error.error}] {error.message}", err=True)
    sys.exit(outcome.exit_code)


@main.command(hidden=True)
@click.pass_context
def warm(ctx: click.Context) -> None:
    """A warm runner of the local launcher's pool (``orchestrator.launchers.warm``): started and imported
    ahead, it waits for one order on stdin (the run's environment and working directory, one JSON line),
    then runs that deployment as `standard` does, and exits. Its stdin closing first: it exits, 0.

    \b
    Example:
      printf '%s\\n' '{"environ": {"MODE": "deploy", ...}, "cwd": "/runs/d-1/work"}' | po-runner warm
    """
    line = sys.stdin.buffer.readline()
    if not line.strip():
        sys.exit(0)
    try:
        order = WarmOrder.decode(line)
    except ValueError as exc:
        raise RunnerConfigurationError(f"invalid warm runner order: {exc}") from exc
    # From here on as a cold runner: stdin /dev/null, the run's directory and nothing but its environment.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.chdir(order.cwd)
    os.environ.clear()
    os.environ.update(order.environ)
    tempfile.tempdir = None  # TMPDIR is the run's now
    ctx.invoke(standard)


@main.command(hidden=True)
def zygote() -> None:
    """The local launcher's fork server (``orchestrator.launchers.zygote``): imports the runner once, then
    forks one runner per order arriving on its stdin (a socket only the launcher holds), each of which
    runs one deployment as `standard` does; exits when the launcher closes the socket.

    \b
    Example:
      po-runner zygote <&3      # fd 3: one end of a Unix socket pair, the launcher holds the other
    """
    import socket

    from orchestrator.launchers import zygote as fork_server

    if not fork_server.supported():
        raise RunnerConfigurationError("the zygote needs Linux (pidfds, fd passing)")
    channel = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    _preload()
    sys.exit(fork_server.serve(channel, partial(main.main, args=["standard"], prog_name="po-runner")))


def _preload() -> None:
    """What a run imports on its way, imported by the zygote once instead of by each child: httpx's
    transport (httpcore, h11, h2, anyio, certifi: made when the gateway client is), OpenSSL's first
    context, gzip (the logs), the idna codec (host names)."""
    import encodings.idna  # noqa: F401
    import gzip  # noqa: F401

    import httpx

    httpx.Client().close()


@main.command()
@click.option("--gateway-url", default=None, help="Runner gateway URL (overrides RUNNER_GATEWAY_URL).")
def remote(gateway_url: str | None) -> None:
    """The runner agent: ORG_ID, RUNNER_ID, PRIVATE_KEY (PKCS#8 PEM) and RUNNER_GATEWAY_URL come from the
    environment. Polls the gateway for commands and launches each deployment's runner; runs until stopped.

    \b
    Example:
      ORG_ID=acme RUNNER_ID=my-runner PRIVATE_KEY="$(cat agent.pem)" \\
        po-runner remote --gateway-url https://po.example.com
    """
    # Imported here: every deployment starts `po-runner standard`, which needs none of the agent.
    import asyncio

    from orchestrator.agent import main as agent_main
    from orchestrator.agent.settings import AgentSettings

    try:
        settings = AgentSettings(runner_gateway_url=gateway_url) if gateway_url else AgentSettings()
    except ValidationError as exc:
        raise RunnerConfigurationError(_describe(exc, "invalid agent environment")) from exc
    _configure_logs()
    try:
        asyncio.run(agent_main.serve(settings))
    except errors.ConfigurationError as exc:
        raise RunnerConfigurationError(exc.message) from exc


@main.command()
def managed() -> None:
    """A managed runner: RUNNER_URL, RUNNER_MANAGED_SECRET and RUNNER_NAME (and optionally RUNNER_TAGS,
    RUNNER_WORK_DIR, RUNNER_GATEWAY_CA) come from the environment. Registers into the Managed pool and runs
    the deployments it claims, one at a time, until stopped.

    \b
    Example:
      RUNNER_URL=https://po.example.com RUNNER_MANAGED_SECRET=... RUNNER_NAME=pool-1 po-runner managed
    """
    # Imported here: every deployment starts `po-runner standard`, which needs none of this.
    import asyncio

    from orchestrator.managed import main as managed_main
    from orchestrator.managed.settings import ManagedSettings

    try:
        settings = ManagedSettings()
    except ValidationError as exc:
        raise RunnerConfigurationError(_describe(exc, "invalid managed runner environment")) from exc
    _configure_logs()
    try:
        exit_code = asyncio.run(managed_main.serve(settings))
    except errors.ConfigurationError as exc:
        raise RunnerConfigurationError(exc.message) from exc
    sys.exit(exit_code)


def _configure_logs() -> None:
    """The agent's and the managed runner's logs: ``PO_LOG_LEVEL`` (or upstream's ``LOG_LEVEL``) and
    ``PO_LOG_FORMAT`` (see ``orchestrator.logs``)."""
    from orchestrator import logs

    try:
        level, fmt = logs.from_environ(os.environ)
    except ValueError as exc:
        raise RunnerConfigurationError(str(exc)) from exc
    logs.configure(level, fmt=fmt)


def _describe(exc: ValidationError, what: str = "invalid runner environment") -> str:
    # Never echo the input: TOKEN (or PRIVATE_KEY) would be printed.
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        variable = ".".join(str(part) for part in error["loc"]).upper()
        message = error["msg"].removeprefix("Value error, ")
        # A check of several variables (no location) names them in its message.
        problems.append(f"{variable}: {message}" if variable else message)
    return f"{what}: " + "; ".join(problems)


if __name__ == "__main__":
    main()
