"""`orchestrator`: the server side (`serve`, `migrate`, `backup`, `restore`, `token create`).

Errors leave as one line with what to do next and exit code 1 (3 when the server could not start): a
wrong setting, a database that cannot be reached, a data dir that cannot be written. A traceback shows
only with ``PO_CLI_DEBUG=1``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from pydantic import AliasChoices, ValidationError

from orchestrator import data_dir, logs
from orchestrator.errors import DatabaseUnavailableError, OrchestratorError
from orchestrator.settings import ServerSettings

#: Exit code when the server could not start (as ``uvicorn.run``'s).
STARTUP_FAILURE = 3
#: Fixed id of the platform-admin token a first start without PO_BOOTSTRAP_TOKEN makes: a second start,
#: or another replica starting at the same time, finds it and makes none.
FIRST_TOKEN_ID = uuid.UUID("00000000-0000-0000-0000-0000000000b1")
#: The database URLs the server takes (the async drivers it ships with).
DATABASE_URL_FORMS = "sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DATABASE"
EXIT_CODES_HELP = (
    "Exit codes: 0 stopped cleanly, 1 a wrong setting or a failed command, 2 usage, 3 could not start."
)


class ServerFailure(click.ClickException):
    """A configuration or environment the server cannot work with, said in one line."""

    exit_code = 1


class StartupFailure(ServerFailure):
    exit_code = STARTUP_FAILURE


def setting_names() -> Iterator[tuple[str, str]]:
    """Every setting of :class:`ServerSettings` as (environment variable, description), generated from the
    settings object so that ``serve --help`` cannot drift from it."""
    for name, info in ServerSettings.model_fields.items():
        alias = info.validation_alias
        variable = str(alias.choices[0]) if isinstance(alias, AliasChoices) else f"PO_{name.upper()}"
        yield variable, (info.description or "").strip()


class _ServeCommand(click.Command):
    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Settings (environment variables; the flags above override theirs)"):
            formatter.write_dl(list(setting_names()))
        super().format_epilog(ctx, formatter)


class _ServerGroup(click.Group):
    """The error boundary of ``orchestrator``: no traceback reaches the user unless PO_CLI_DEBUG is set."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:
            if _debug():
                traceback.print_exception(exc, file=sys.stderr)
            raise describe(exc) from exc


def _debug() -> bool:
    return os.environ.get("PO_CLI_DEBUG", "").lower() in ("1", "true", "yes")


def describe(exc: BaseException, failure: type[ServerFailure] = ServerFailure) -> ServerFailure:
    """The one line an exception of the start becomes, with what to do next."""
    if isinstance(exc, DatabaseUnavailableError):
        return failure(
            f"{exc.message}: check PO_DATABASE_URL ({DATABASE_URL_FORMS}) and that the database server is "
            "running and reachable from here"
        )
    if isinstance(exc, OrchestratorError):
        return failure(exc.message)
    if isinstance(exc, PermissionError | OSError) and getattr(exc, "filename", None):
        reason = exc.strerror or type(exc).__name__
        return failure(
            f"cannot write {exc.filename}: {reason}; make the data dir writable by this user "
            "(PO_DATA_DIR, --data-dir) or point it elsewhere"
        )
    hint = "" if _debug() else " (PO_CLI_DEBUG=1 shows the traceback)"
    return failure(f"unexpected error: {type(exc).__name__}: {exc}{hint}")


def check_database_url(url: str | None) -> None:
    """Refuse, in one line, a PO_DATABASE_URL the server cannot use, before anything connects."""
    if url is None:
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ServerFailure(f"PO_DATABASE_URL is not a database URL; use {DATABASE_URL_FORMS}") from None
    if parsed.drivername not in ("sqlite+aiosqlite", "postgresql+asyncpg"):
        raise ServerFailure(
            f"PO_DATABASE_URL: the driver '{parsed.drivername}' is not one this server uses; "
            f"use {DATABASE_URL_FORMS}"
        )


def _settings(**overrides: Any) -> ServerSettings:
    """Flags override PO_* environment variables, which override defaults."""
    try:
        settings = ServerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(map(str, first["loc"]))
        variable = next((v for v, _ in setting_names() if v == f"PO_{where.upper()}"), where)
        raise click.UsageError(f"{variable}: {first['msg']}" if where else first["msg"]) from exc
    check_database_url(settings.database_url)
    return settings


@click.group(
    cls=_ServerGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP
)
@click.version_option(package_name="platform-orchestrator", prog_name="orchestrator")
def main() -> None:
    """Platform Orchestrator server.

    \b
    Example:
      orchestrator serve                      # API and gateway on 127.0.0.1:8080, SQLite in the data dir
      PO_DATABASE_URL=postgresql+asyncpg://po:secret@db:5432/po orchestrator migrate
    """


@main.command(cls=_ServeCommand)
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
    """Run the API, the runner gateway and the background workers in one process.

    Started without PO_BOOTSTRAP_TOKEN on an empty database, it makes a platform admin token and prints
    it once, on stderr (`orchestrator token create` makes another).

    \b
    Example:
      orchestrator serve --listen 127.0.0.1:8080 --data-dir ./data
      PO_BOOTSTRAP_TOKEN=$(openssl rand -hex 32) orchestrator serve --public-url https://po.example.com
    """
    from orchestrator.server import Server, create_app, prepare, uvicorn_config
    from orchestrator.web.tls import ServerTls

    settings = _settings(**options)
    logs.configure(settings.log_level, fmt=settings.log_format)
    try:
        # Migrations, the key check, the object store: a wrong configuration is one line, not a traceback.
        asyncio.run(prepare(settings))
        if settings.bootstrap_token is None:
            first = asyncio.run(_mint_platform_token(settings, first_start=True))
            if first is not None:
                _first_start_banner(first)
        tls = ServerTls.from_settings(settings)
        app = create_app(settings, run_migrations=False)
    except (click.ClickException, KeyboardInterrupt):
        raise
    except Exception as exc:
        if _debug():
            traceback.print_exception(exc, file=sys.stderr)
        raise describe(exc, StartupFailure) from exc
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


def _first_start_banner(token: str) -> None:
    # Written straight to stderr, never through the logger: the token must not reach log files.
    click.echo(
        "\n"
        "  No PO_BOOTSTRAP_TOKEN is set and the database is empty: this platform admin token was made.\n"
        "  It is shown this once and is not stored in clear; keep it now:\n"
        "\n"
        f"    {token}\n"
        "\n"
        "  Use it: octl config set-token   (then: octl create org ORG; octl create token --org ORG ...)\n"
        "  Lost it? `orchestrator token create` (with this server's settings) makes another.\n",
        err=True,
    )


async def _mint_platform_token(settings: ServerSettings, *, first_start: bool) -> str | None:
    """A new platform-admin token, stored hashed; ``first_start``: only if the database holds no token
    and no organization yet (else None, and nothing is made)."""
    import secrets

    import sqlalchemy as sa

    from orchestrator.api.context import api_token_key, hash_token
    from orchestrator.api.orgs import TOKEN_PREFIX
    from orchestrator.errors import ConflictError
    from orchestrator.secretbox import decode_key, load_or_create_key
    from orchestrator.store import db
    from orchestrator.store import orgs as org_store
    from orchestrator.store.schema import api_tokens, orgs

    data_dir.prepare(settings.data_dir)
    if settings.encryption_key:
        key = decode_key(settings.encryption_key.get_secret_value())
    else:
        key = load_or_create_key(settings.data_dir)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    engine = db.create_engine(settings.resolved_database_url)
    try:
        async with engine.begin() as conn:
            if first_start:
                tokens = (await conn.execute(sa.select(sa.func.count()).select_from(api_tokens))).scalar()
                organizations = (await conn.execute(sa.select(sa.func.count()).select_from(orgs))).scalar()
                if tokens or organizations:
                    return None
            try:
                await org_store.create_token(
                    conn,
                    org_id=None,
                    role="platform-admin",
                    description="first start" if first_start else "orchestrator token create",
                    token_hash=hash_token(api_token_key(key), secret),
                    prefix=secret[: len(TOKEN_PREFIX) + 6],
                    token_id=FIRST_TOKEN_ID if first_start else None,
                )
            except ConflictError:
                return None
    finally:
        await db.dispose(engine)
    return secret


@main.command()
@click.option("--database-url", help="SQLAlchemy URL [env PO_DATABASE_URL]")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Data directory [env PO_DATA_DIR]")
def migrate(**options: Any) -> None:
    """Bring the database schema up to date (safe to run from several replicas at once).

    \b
    Example:
      PO_DATABASE_URL=postgresql+asyncpg://po:secret@db:5432/po orchestrator migrate
    """
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


@main.command()
@click.argument("destination", type=click.Path(file_okay=False, path_type=Path))
@click.option("--include-key", is_flag=True, help="Put the server key in the backup too (mode 0600)")
@click.option("--database-url", help="SQLAlchemy URL [env PO_DATABASE_URL]")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Data directory [env PO_DATA_DIR]")
def backup(destination: Path, include_key: bool, **options: Any) -> None:
    """Copy the database and the objects (bundles, logs) into DESTINATION, a new directory, while the
    server runs: SQLite with its online backup, PostgreSQL with `pg_dump` (on PATH or in PO_PG_BIN).

    Run it with the server's settings. The server key is not in the backup unless --include-key is given:
    keep the key (PO_ENCRYPTION_KEY, or the data dir's server.key) apart, or the backup does not open.

    \b
    Example:
      orchestrator backup /backups/po-$(date +%F)
    """
    from orchestrator import backup as backups

    settings = _settings(**options)
    manifest = backups.backup(settings, destination, include_key=include_key, progress=_progress)
    key = "included" if manifest["key_included"] else "not included: keep it apart"
    click.echo(
        f"backup of schema {manifest['schema_revision']} ({manifest['database']}, {manifest['objects']} "
        f"objects) written to {destination}; server key {key}",
        err=True,
    )


@main.command()
@click.argument("source", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--database-url", help="SQLAlchemy URL [env PO_DATABASE_URL]")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Data directory [env PO_DATA_DIR]")
def restore(source: Path, **options: Any) -> None:
    """Restore the backup in SOURCE onto an empty data dir and database (and object store), then bring
    its schema up to date. The server key is PO_ENCRYPTION_KEY, the data dir's server.key, or the one in
    the backup (made with --include-key); a key that does not open the backup is refused.

    \b
    Example:
      orchestrator restore /backups/po-2026-01-31 --data-dir /var/lib/po
    """
    from orchestrator import backup as backups

    settings = _settings(**options)
    manifest = backups.restore(settings, source, progress=_progress)
    click.echo(
        f"restored the backup of {manifest['created_at']} (schema {manifest['schema_revision']}); the "
        "schema is up to date: start the server with these settings",
        err=True,
    )


def _progress(line: str) -> None:
    click.echo(line, err=True)


@main.group()
def token() -> None:
    """Platform admin tokens, made directly in the database (for when no token is at hand).

    \b
    Example:
      orchestrator token create
    """


@token.command("create")
@click.option("--database-url", help="SQLAlchemy URL [env PO_DATABASE_URL]")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Data directory [env PO_DATA_DIR]")
def token_create(**options: Any) -> None:
    """Make a platform admin token and print it on stdout (shown this once; stored hashed).

    Run it with the server's settings (the same PO_DATABASE_URL and data dir or PO_ENCRYPTION_KEY): the
    token is hashed with the server's key. The schema must be up to date (`orchestrator migrate`).

    \b
    Example:
      orchestrator token create | octl config set-token
    """
    settings = _settings(**options)
    made = asyncio.run(_mint_platform_token(settings, first_start=False))
    assert made is not None
    click.echo(made)
    click.echo("Platform admin token made; it is not shown again.", err=True)


if __name__ == "__main__":
    main()
