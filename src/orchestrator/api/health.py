"""The probes, public: ``/healthz`` (live: the process answers) and ``/readyz`` (ready: the database answers,
its schema is this code's, and the object store takes a write and a delete). Kubernetes' liveness probe
asks the first (a restart cannot mend a database outage), its readiness probe the second (a replica that
cannot serve is taken out of the Service until it can)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final

import sqlalchemy as sa
import structlog
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from orchestrator.errors import OrchestratorError, ServiceUnavailableError
from orchestrator.store import migrate
from orchestrator.web import openapi
from orchestrator.web.services import Services, services

log = structlog.get_logger(__name__)

router = APIRouter(tags=["Meta"])

#: The longest a readiness check may take: a database or object store that hangs fails it.
CHECK_TIMEOUT_SECONDS: Final = 4.0
#: Where the object store's probe object is written (and deleted at once).
PROBE_PREFIX: Final = "probes/readyz-"
OK: Final = "ok"
NOT_CHECKED: Final = "not checked: the database does not answer"


class Health(BaseModel):
    """The process answers."""

    status: str


class Readiness(BaseModel):
    """Every check passed: ``checks`` maps ``database``, ``migrations`` and ``object_store`` to ``ok``."""

    status: str
    checks: dict[str, str]


@router.get("/healthz", summary="Liveness probe")
async def healthz() -> Health:
    """2xx once the server has started (migrations done); touches no database."""
    return Health(status=OK)


async def _database(svc: Services) -> str:
    async with svc.reader.connect() as conn:
        await conn.execute(sa.text("SELECT 1"))
    return OK


async def _migrations(svc: Services) -> str:
    async with svc.reader.connect() as conn:
        current = await migrate.current_revisions(conn)
    expected = migrate.head_revisions()
    if current != expected:
        found = ", ".join(sorted(current)) or "none"
        if not all(migrate.known_revision(revision) for revision in current):
            # A newer orchestrator migrated the database (a rolling upgrade): this replica is the old one.
            return (
                f"the schema is at revision {found}, newer than this server's {migrate.head()}: replace "
                "this server with a newer orchestrator"
            )
        return (
            f"the schema is at revision {found}, this server needs {', '.join(sorted(expected))}: "
            "run `orchestrator migrate`"
        )
    return OK


async def _object_store(svc: Services) -> str:
    key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    await svc.blobs.put(key, b"ready")
    await svc.blobs.delete(key)
    return OK


async def _run(name: str, check: Callable[[Services], Awaitable[str]], svc: Services) -> str:
    """``ok``, or what failed in one line: an orchestrator error's message (written for clients), else
    only the exception's type (a driver's message may name hosts and ports); the whole error is logged."""
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            return await check(svc)
    except TimeoutError:
        log.warning("readiness check timed out", check=name)
        return f"no answer within {CHECK_TIMEOUT_SECONDS:g} s"
    except OrchestratorError as exc:
        log.warning("readiness check failed", check=name, error=exc.message)
        return exc.message
    except Exception as exc:  # a probe reports every failure as such, never as a 500
        log.warning("readiness check failed", check=name, error=repr(exc))
        return f"failed ({type(exc).__name__})"


@router.get(
    "/readyz",
    summary="Readiness probe",
    responses={
        200: {"model": Readiness, "description": "Ready."},
        503: {"description": "A check failed: `details.failed` names it, `details.checks` says why."},
    },
)
@openapi.may_answer(503)
async def readyz(svc: Annotated[Services, Depends(services)]) -> JSONResponse:
    """2xx when the database answers, its schema is current and the object store takes a write and a
    delete of a small probe object; else 503 naming the checks that failed (`details.checks`). The
    migrations check is skipped while the database does not answer."""

    async def database_then_migrations() -> tuple[str, str]:
        database = await _run("database", _database, svc)
        if database != OK:
            return database, NOT_CHECKED
        return database, await _run("migrations", _migrations, svc)

    # Side by side: the answer comes within two check timeouts (the charts' probe allows 10 s).
    (database, migrations), object_store = await asyncio.gather(
        database_then_migrations(), _run("object_store", _object_store, svc)
    )
    checks: dict[str, Any] = {"database": database, "migrations": migrations, "object_store": object_store}
    failed = [name for name, result in checks.items() if result not in (OK, NOT_CHECKED)]
    if failed:
        raise ServiceUnavailableError(
            f"not ready: {'; '.join(f'{name}: {checks[name]}' for name in failed)}",
            details={"checks": checks, "failed": failed},
        )
    return JSONResponse(Readiness(status=OK, checks=checks).model_dump())
