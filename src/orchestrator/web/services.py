"""What every route of the API and the gateway reaches the process's objects through, and its transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from orchestrator.blobs import BlobStore
from orchestrator.dispatch import creation, log_followers, log_writer
from orchestrator.identity.issuer import WorkloadIssuer
from orchestrator.notify import Notifier
from orchestrator.secretbox import SecretBox
from orchestrator.settings import ServerSettings


@dataclass(frozen=True, kw_only=True)
class Services:
    """Process-wide objects, created once by ``server.create_app``."""

    settings: ServerSettings
    engine: AsyncEngine
    #: The same engine for read-only work (``store.db.readonly``).
    reader: AsyncEngine
    box: SecretBox
    blobs: BlobStore
    #: Key of the per-deployment tokens (derived from the server key).
    token_key: bytes
    #: Key of the stored API token hashes (derived from the server key; ``api.context.api_token_key``).
    api_token_key: bytes
    notifier: Notifier
    #: Stores the live log's chunks, those uploaded together in one transaction.
    log_writer: log_writer.ChunkWriter
    #: Where each followed live log stands, for all followers of the process (one poll).
    log_followers: log_followers.FollowHub
    creation: creation.Context
    #: Tells the dispatcher that a deployment was committed.
    wake_dispatcher: Callable[[], None]
    #: The OIDC issuer of the runners' workload identity tokens, and of the documents it publishes.
    issuer: WorkloadIssuer


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


@asynccontextmanager
async def transaction(svc: Services) -> AsyncIterator[AsyncConnection]:
    """One transaction; committed before the route answers, rolled back on any error."""
    async with svc.engine.begin() as conn:
        yield conn
