"""The server's composition root: ``create_app(settings)`` mounts the API (and later the gateway)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from functools import partial

import pydantic
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from orchestrator.api import catalogue, deployments, errors, orgs, projects, runner_rules, runners
from orchestrator.api.context import Services, hash_token
from orchestrator.api.limits import BodyLimitMiddleware
from orchestrator.blobs.location import open_blob_store
from orchestrator.dispatch import creation, retention
from orchestrator.dispatch.dispatcher import Dispatcher, DispatchSettings
from orchestrator.domain.runner_types import K8sRunnerConfiguration
from orchestrator.gateway import commands as gateway_commands
from orchestrator.gateway import deployments as gateway_deployments
from orchestrator.gateway import receipts, tokens
from orchestrator.gateway import state as gateway_state
from orchestrator.gateway.long_poll import LongPollMiddleware
from orchestrator.launchers.base import Launcher
from orchestrator.launchers.local import LocalLauncher
from orchestrator.notify import Notifier
from orchestrator.secretbox import SecretBox, decode_key, load_or_create_key
from orchestrator.settings import ServerSettings
from orchestrator.store import agent_commands as command_store
from orchestrator.store import db, listener, migrate
from orchestrator.store import orgs as org_store

#: Fixed id of the bootstrap token's row, so a changed PO_BOOTSTRAP_TOKEN replaces the old one.
BOOTSTRAP_TOKEN_ID = uuid.UUID("00000000-0000-0000-0000-0000000000b0")


def launcher_for(
    settings: ServerSettings, local: LocalLauncher, runner_type: str, config: dict[str, object]
) -> Launcher | None:
    """The launcher for a direct runner; None for types launched elsewhere (agents) or not yet supported."""
    connection = config.get("connection")
    if runner_type == "vm" and isinstance(connection, dict) and connection.get("type") == "local":
        return local if settings.allow_local_runners else None
    if runner_type == "kubernetes":
        return _kubernetes_launcher(config)
    return None


def _kubernetes_launcher(config: dict[str, object]) -> Launcher | None:
    """The cluster's launcher; None without the ``kubernetes`` extra (lightkube) installed."""
    try:
        from orchestrator.launchers import kubernetes  # the optional extra: imported only when used
    except ImportError:
        return None
    try:
        parsed = K8sRunnerConfiguration.model_validate(config)
    except pydantic.ValidationError:
        return None
    return kubernetes.KubernetesLauncher(kubernetes.ClusterAccess.from_cluster(parsed.cluster))


def create_app(
    settings: ServerSettings,
    *,
    run_migrations: bool = True,
    run_dispatcher: bool = True,
) -> FastAPI:
    """The whole server as one ASGI app; its lifespan opens and closes the database."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        key = (
            decode_key(settings.encryption_key.get_secret_value())
            if settings.encryption_key
            else load_or_create_key(settings.data_dir)
        )
        engine = db.create_engine(settings.resolved_database_url, pool_size=settings.db_pool_size)
        stop = asyncio.Event()
        worker: asyncio.Task[None] | None = None
        background: list[asyncio.Task[None]] = []
        try:
            if run_migrations:
                await migrate.upgrade(engine)
            if settings.bootstrap_token is not None:
                async with engine.begin() as conn:
                    await org_store.replace_platform_token(
                        conn,
                        token_id=BOOTSTRAP_TOKEN_ID,
                        token_hash=hash_token(settings.bootstrap_token.get_secret_value()),
                    )
            box = SecretBox(key)
            token_key = tokens.token_key(key)
            notifier = Notifier()
            local = LocalLauncher(settings.data_dir / "runs", environ=os.environ)
            blobs = await open_blob_store(
                settings.object_store_url,
                data_dir=settings.data_dir,
                endpoint_url=settings.object_store_endpoint,
            )
            agent_gateway = gateway_commands.AgentGateway(
                settings=settings, receipt_key=receipts.receipt_key(key), on_final=notifier.notify
            )
            dispatcher = Dispatcher(
                engine=engine,
                box=box,
                blobs=blobs,
                token_key=token_key,
                gateway_url=settings.resolved_public_url,
                launcher_for=partial(launcher_for, settings, local),
                on_final=notifier.notify,
                settings=DispatchSettings(
                    check_interval_seconds=settings.status_check_interval_seconds,
                    command_ttl_seconds=settings.agent_command_ttl_seconds,
                ),
                on_command=agent_gateway.waker.notify,
            )
            app.state.services = Services(
                settings=settings,
                engine=engine,
                reader=db.readonly(engine),
                box=box,
                blobs=blobs,
                token_key=token_key,
                notifier=notifier,
                creation=creation.Context(
                    blobs=blobs,
                    public_url=settings.resolved_public_url,
                    timeout=timedelta(seconds=settings.deployment_timeout_seconds),
                ),
                wake_dispatcher=dispatcher.wake,
            )
            app.state.dispatcher = dispatcher
            app.state.agent_gateway = agent_gateway
            background.append(
                asyncio.create_task(agent_gateway.run(app.state.services, stop), name="agent-gateway")
            )
            if engine.dialect.name == "postgresql":
                background.append(
                    asyncio.create_task(
                        listener.listen(
                            engine.url,
                            command_store.CHANNEL,
                            agent_gateway.announced,
                            stop,
                            on_connected=agent_gateway.listener_connected,
                        ),
                        name="agent-command-listener",
                    )
                )
            app.state.retention = retention.RetentionWorker(
                engine=engine,
                blobs=blobs,
                retention=timedelta(days=settings.object_retention_days),
                interval_seconds=settings.cleanup_interval_seconds,
            )
            background.append(asyncio.create_task(app.state.retention.run(stop), name="object-retention"))
            if run_dispatcher:
                worker = asyncio.create_task(dispatcher.run(stop), name="dispatcher")
            yield
        finally:
            stop.set()
            if worker is not None:
                dispatcher.wake()
                await worker
            for task in background:
                await task
            await db.dispose(engine)

    app = FastAPI(
        title="Platform Orchestrator",
        version="0.1.0",
        lifespan=lifespan,
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    errors.install(app)
    app.add_middleware(BodyLimitMiddleware)
    # Outermost of ours: agents' long polls skip the rest of the stack while they wait.
    app.add_middleware(LongPollMiddleware)
    for router in (
        orgs.router,
        projects.router,
        runners.router,
        runner_rules.router,
        catalogue.router,
        deployments.router,
        gateway_deployments.router,
        gateway_commands.router,
        gateway_state.router,
    ):
        app.include_router(router)

    @app.get("/healthz", tags=["Meta"])
    async def healthz() -> JSONResponse:
        """2xx once the server has started (migrations done); touches no database."""
        return JSONResponse({"status": "ok"})

    return app
