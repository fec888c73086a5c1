"""The server's composition root: ``create_app(settings)`` mounts the API (and later the gateway)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from orchestrator.api import catalogue, errors, orgs, projects, runner_rules, runners
from orchestrator.api.context import Services, hash_token
from orchestrator.api.limits import BodyLimitMiddleware
from orchestrator.secretbox import SecretBox, decode_key, load_or_create_key
from orchestrator.settings import ServerSettings
from orchestrator.store import db, migrate
from orchestrator.store import orgs as org_store

#: Fixed id of the bootstrap token's row, so a changed PO_BOOTSTRAP_TOKEN replaces the old one.
BOOTSTRAP_TOKEN_ID = uuid.UUID("00000000-0000-0000-0000-0000000000b0")


def create_app(settings: ServerSettings, *, run_migrations: bool = True) -> FastAPI:
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
            app.state.services = Services(settings=settings, engine=engine, box=SecretBox(key))
            yield
        finally:
            await engine.dispose()

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
    for router in (orgs.router, projects.router, runners.router, runner_rules.router, catalogue.router):
        app.include_router(router)

    @app.get("/healthz", tags=["Meta"])
    async def healthz() -> JSONResponse:
        """2xx once the server has started (migrations done); touches no database."""
        return JSONResponse({"status": "ok"})

    return app
