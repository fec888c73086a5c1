"""`orchestrator`: the server side (`serve`, `migrate`)."""

from __future__ import annotations

import asyncio
from typing import Any

import click
from pydantic import ValidationError

from orchestrator import data_dir, logs
from orchestrator.errors import OrchestratorError
from orchestrator.settings import ServerSettings

#: Exit code when the server could not start (as ``uvicorn.run``'s).
STARTUP_FAILURE = 3


def _settings(**overrides: Any) -> ServerSettings:
    """Flags override PO_* environment variables, which override defaults."""
    try:
        return ServerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise click.UsageError(f"{where}: {first['msg']}" if where else first["msg"]) from exc


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Platform Orchestrator server."""


@main.command()
@click.option("--listen", help="host:port to bind [env PO_LISTEN, default 127.0.0.1:8080]")
@click.option("--database-url", help="SQLAlchemy URL [env PO_DATABASE_URL, default SQLite in the data dir]")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Data directory [env PO_DATA_DIR]")
@click.option("--public-url", help="URL runners use to reach this server [env PO_PUBLIC_URL]")
@click.option(
    "--allow-local-runners/--no-allow-local-runners",
    default=None,
    help="Accept `vm` runners with a local connection [env PO_ALLOW_LOCAL_RUNNERS, default off]",
)
@click.option(
    "--local-run-user",
    help="When serving as root, local runs execute as this unprivileged user; empty: as the server's "
    "user [env PO_LOCAL_RUN_USER, default nobody]",
)
@click.option(
    "--local-runs-dir",
    type=click.Path(file_okay=False),
    help="Working directories of local runs, outside the data dir [env PO_LOCAL_RUNS_DIR, default "
    "<temp dir>/platform-orchestrator-runs-<uid>]",
)
@click.option("--log-level", help="debug, info, warning, error [env PO_LOG_LEVEL]")
@click.option(
    "--log-format",
    type=click.Choice(["json", "console"]),
    help="json or console [env PO_LOG_FORMAT, default json unless stderr is a terminal]",
)
def serve(**options: Any) -> None:
    """Run the API, the runner gateway and the background workers in one process."""
    from orchestrator.server import Server, create_app, prepare, uvicorn_config
    from orchestrator.web.tls import ServerTls

    settings = _settings(**options)
    logs.configure(settings.log_level, fmt=settings.log_format)
    try:
        # Migrations, the key check, the object store: a wrong configuration is one line, not a traceback.
        asyncio.run(prepare(settings))
        tls = ServerTls.from_settings(settings)
        app = create_app(settings, run_migrations=False)
    except OrchestratorError as exc:
        raise click.ClickException(exc.message) from exc
    # SIGTERM and SIGINT stop it gracefully; open long polls answer at once (server.Server); SIGHUP
    # reloads the TLS files.
    server = Server(
        uvicorn_config(
            settings, app, tls, log_level=logs.LEVELS.get(settings.log_level.lower(), logs.LEVELS["info"])
        ),
        app,
        tls=tls,
        tls_reload_interval_seconds=settings.tls_reload_interval_seconds,
    )
    server.run()
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)


@main.command()
@click.option("--database-url", help="SQLAlchemy URL [env PO_DATABASE_URL]")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Data directory [env PO_DATA_DIR]")
def migrate(**options: Any) -> None:
    """Bring the database schema up to date (safe to run from several replicas at once)."""
    from orchestrator.store import db
    from orchestrator.store import migrate as migrations

    settings = _settings(**options)
    data_dir.prepare(settings.data_dir)
    data_dir.private_sqlite_file(settings.resolved_database_url)

    async def run() -> None:
        engine = db.create_engine(settings.resolved_database_url)
        try:
            await migrations.upgrade(engine)
        finally:
            await engine.dispose()

    asyncio.run(run())
    click.echo("database schema is up to date", err=True)


if __name__ == "__main__":
    main()
