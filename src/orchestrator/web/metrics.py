"""The metrics of requests (an ASGI middleware), of the database pools, and the ``GET /metrics`` answer.

The middleware labels each request with its route *template* (``scope["route"]``, set by the routing),
never its path; a request no route matched is ``unmatched``. The agents' long poll, answered in front of
the routing (``gateway.long_poll``), names its template in ``scope[ROUTE_KEY]``. It adds a few
microseconds to a request (``bench/metrics.py`` measures the share of the server's CPU).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator import metrics

log = structlog.get_logger(__name__)

#: Where a middleware answering in front of the routing names the route template it served.
ROUTE_KEY = "po.route"

_Children = tuple[Any, Any]


class MetricsMiddleware:
    """Counts and times every HTTP request by route template, method and status."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        #: (route, method, status) → (counter, histogram) children: labels() once per combination.
        self._children: dict[tuple[str, str, int], _Children] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self._observe(scope, status, time.perf_counter() - started)

    def _observe(self, scope: Scope, status: int, seconds: float) -> None:
        route = scope.get("route")
        template = getattr(route, "path", None) or scope.get(ROUTE_KEY) or metrics.UNMATCHED_ROUTE
        method = scope["method"]
        key = (template, method, status)
        children = self._children.get(key)
        if children is None:
            label = method if method in metrics.METHODS else "other"
            labels = (template, label, str(status))
            children = (metrics.HTTP_REQUESTS.labels(*labels), metrics.HTTP_REQUEST_DURATION.labels(*labels))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)


def instrument_pool(engine: AsyncEngine, pool: str) -> None:
    """Connections in use (checkout/checkin events) and the time to get one (``po_db_pool_*``)."""
    sync_pool = engine.sync_engine.pool
    in_use = metrics.DB_POOL_IN_USE.labels(pool)
    wait = metrics.DB_POOL_WAIT.labels(pool)
    size = getattr(sync_pool, "size", None)
    if callable(size):
        metrics.DB_POOL_SIZE.labels(pool).set(size())

    checkedout = getattr(sync_pool, "checkedout", None)
    if callable(checkedout):
        # Read from the pool at scrape time: counting checkout/checkin events goes below zero when a
        # connection taken before this call (the start's migrations) comes back after it.
        in_use.set_function(lambda: float(checkedout()))
    else:  # pools that keep no count (NullPool, StaticPool)

        @sa.event.listens_for(sync_pool, "checkout")
        def _checkout(*_args: Any) -> None:
            in_use.inc()

        @sa.event.listens_for(sync_pool, "checkin")
        def _checkin(*_args: Any) -> None:
            in_use.dec()

    # The pool has no event before a checkout: time its ``_do_get`` (the wait for a free connection, or
    # the connect of a new one), which every checkout calls.
    do_get = sync_pool._do_get

    def timed_do_get() -> Any:
        started = time.perf_counter()
        try:
            return do_get()
        finally:
            wait.observe(time.perf_counter() - started)

    sync_pool._do_get = timed_do_get  # type: ignore[method-assign]


async def metrics_response(refresh: Callable[[], Awaitable[None]] | None) -> Response:
    """The exposition of every family; ``refresh`` first sets the gauges read from the database (a
    failure is logged and counted, and the rest is answered all the same)."""
    if refresh is not None:
        try:
            await refresh()
        except Exception as exc:
            metrics.DATABASE_GAUGE_ERRORS.inc()
            log.warning("metrics: the database gauges could not be read", error=str(exc))
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)


async def metrics_endpoint(request: Request) -> Response:
    """``GET /metrics``: the app's ``state.metrics_refresh`` (set by its lifespan) reads the database."""
    refresh: Callable[[], Awaitable[None]] | None = getattr(request.app.state, "metrics_refresh", None)
    return await metrics_response(refresh)
