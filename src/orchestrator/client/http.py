"""The base of the orchestrator's HTTP clients: how a client is built (TLS, timeout, headers, no redirects)
and how a request is tried again (backoff). Each client keeps its routes and its own policy values:
``octl`` (``client.api``), the runner (``runner.gateway_client``), the agent (``agent.client``).

Imports httpx, ``client.errors`` and ``client.tls`` only: the runner and the agent ship without server
code, and ``po-runner standard`` and ``octl`` start in about 0.2 s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from orchestrator.client.errors import ClientError
from orchestrator.client.tls import GatewayTls, client_verify

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """The wait before attempt ``n + 1``: ``first_seconds`` doubled ``n - 1`` times (at most
    ``max_doublings``), at most ``max_seconds``; with ``jitter`` a random point in its upper half."""

    first_seconds: float
    max_seconds: float = float("inf")
    max_doublings: int = 16
    jitter: bool = False

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        delay = min(self.max_seconds, self.first_seconds * 2 ** min(attempt - 1, self.max_doublings))
        return (rng or random).uniform(delay / 2, delay) if self.jitter else delay


@dataclass(frozen=True, kw_only=True)
class Retry:
    """How often a request is tried: ``attempts`` tries of a :class:`ClientError` of ``on`` that is
    ``retryable``, and more while the next one starts before a deadline."""

    attempts: int
    backoff: Backoff
    on: type[ClientError] | tuple[type[ClientError], ...] = ClientError
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def delay_after(self, failure: ClientError, attempt: int, deadline: float | None) -> float | None:
        """The wait before the attempt after the failed ``attempt``, or None: no more attempts."""
        if not (isinstance(failure, self.on) and failure.retryable):
            return None
        delay = self.backoff.delay(attempt)
        within_deadline = deadline is not None and self.clock() + delay < deadline
        return None if attempt >= self.attempts and not within_deadline else delay

    def call(
        self,
        request: Callable[[], T],
        *,
        deadline: float | None = None,
        on_retry: Callable[[ClientError], None] | None = None,
    ) -> T:
        """``request()`` until it answers, or its :class:`ClientError` is final (raised); ``on_retry`` is
        told of each failure that is tried again."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return request()
            except ClientError as failure:
                delay = self.delay_after(failure, attempt, deadline)
                if delay is None:
                    raise
                if on_retry is not None:
                    on_retry(failure)
                self.sleep(delay)


@dataclass(frozen=True, kw_only=True)
class Connection:
    """What every client of one orchestrator URL is built with: relative paths against ``base_url``
    (``scheme://host[:port][/path]``), redirects never followed, trusting the system CAs and ``tls``
    (extra CA, mTLS pair); over plain ``http`` without a proxy no CA bundle is loaded at all."""

    base_url: str
    user_agent: str
    timeout_seconds: float
    headers: Mapping[str, str] = field(default_factory=dict)
    tls: GatewayTls | None = None

    def _options(self) -> dict[str, Any]:
        scheme = httpx.URL(self.base_url).scheme
        return {
            "base_url": self.base_url,
            "verify": client_verify(scheme, self.tls),
            "timeout": self.timeout_seconds,
            "headers": {"User-Agent": self.user_agent, **self.headers},
            "follow_redirects": False,
        }

    def client(
        self,
        transport: httpx.BaseTransport | None = None,
        *,
        on_request: Callable[[httpx.Request], None] | None = None,
        on_response: Callable[[httpx.Response], None] | None = None,
    ) -> httpx.Client:
        hooks: dict[str, list[Callable[..., Any]]] = {
            "request": [on_request] if on_request else [],
            "response": [on_response] if on_response else [],
        }
        return httpx.Client(transport=transport, event_hooks=hooks, **self._options())

    def async_client(self, transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=transport, **self._options())
