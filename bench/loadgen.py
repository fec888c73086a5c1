"""An async HTTP load generator for the benchmarks.

A fixed number of workers share one ``httpx.AsyncClient`` (one keep-alive connection each) and run
numbered iterations until the iteration count is reached or the wall-clock cap expires. Every answer's
status is checked against the one the call expects; anything else (including transport errors) is
counted as an error and a few examples are kept, so a fast but failing endpoint cannot look good.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

MAX_ERROR_EXAMPLES = 5
ITERATION = "iteration"


class Recorder:
    """Latencies per call label (seconds), and every unexpected answer."""

    def __init__(self) -> None:
        self.latencies_s: dict[str, list[float]] = {}
        self.errors: Counter[str] = Counter()
        self.error_examples: list[str] = []

    async def call(
        self,
        client: httpx.AsyncClient,
        label: str,
        method: str,
        url: str,
        *,
        expect: int,
        **kwargs: Any,
    ) -> httpx.Response | None:
        """Send one request; None when it failed or answered another status than ``expect``."""
        started = time.perf_counter()
        try:
            response = await client.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            self._error(label, type(exc).__name__, f"{method} {url}: {type(exc).__name__}: {exc}")
            return None
        self.latencies_s.setdefault(label, []).append(time.perf_counter() - started)
        if response.status_code != expect:
            body = response.text[:300]
            self._error(label, str(response.status_code), f"{method} {url}: {response.status_code} {body}")
            return None
        return response

    def _error(self, label: str, kind: str, example: str) -> None:
        self.errors[f"{label}: {kind}"] += 1
        if len(self.error_examples) < MAX_ERROR_EXAMPLES:
            self.error_examples.append(example)


#: One iteration: given the recorder and the iteration number, make one or more calls.
Iteration = Callable[[Recorder, int], Awaitable[None]]


@dataclass(frozen=True, kw_only=True)
class Phase:
    """The outcome of one ``run``."""

    recorder: Recorder
    iterations: int
    seconds: float
    #: True when the wall-clock cap ended the run before the iteration count.
    capped: bool


async def run(iteration: Iteration, *, iterations: int, concurrency: int, max_seconds: float) -> Phase:
    """Run ``iterations`` iterations on ``concurrency`` workers, stopping early at ``max_seconds``."""
    recorder = Recorder()
    numbers = itertools.count()
    deadline = time.monotonic() + max_seconds
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            number = next(numbers)
            if number >= iterations:
                return
            started = time.perf_counter()
            await iteration(recorder, number)
            recorder.latencies_s.setdefault(ITERATION, []).append(time.perf_counter() - started)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    return Phase(recorder=recorder, iterations=done, seconds=seconds, capped=done < iterations)


def percentile_ms(latencies_s: list[float], fraction: float) -> float:
    """Nearest-rank percentile, in milliseconds (NaN when there is no sample)."""
    if not latencies_s:
        return math.nan
    ordered = sorted(latencies_s)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1] * 1000.0


@dataclass(frozen=True, kw_only=True)
class Row:
    """One line of the results table."""

    operation: str
    count: int
    seconds: float
    per_second: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    errors: int
    capped: bool
    #: CPU milliseconds per iteration of the server process and of PostgreSQL (NaN: not measured).
    app_cpu_ms: float = math.nan
    db_cpu_ms: float = math.nan
    #: CPU milliseconds per iteration of this load generator (it shares the machine with the server).
    client_cpu_ms: float = math.nan
    ratio: float = math.nan

    def as_json(self) -> dict[str, Any]:
        def number(value: float) -> float | None:
            return None if math.isnan(value) else round(value, 4)

        return {
            "operation": self.operation,
            "count": self.count,
            "seconds": number(self.seconds),
            "per_second": number(self.per_second),
            "p50_ms": number(self.p50_ms),
            "p99_ms": number(self.p99_ms),
            "max_ms": number(self.max_ms),
            "ratio_to_baseline": number(self.ratio),
            "server_cpu_ms_per_iteration": number(self.app_cpu_ms),
            "postgres_cpu_ms_per_iteration": number(self.db_cpu_ms),
            "load_generator_cpu_ms_per_iteration": number(self.client_cpu_ms),
            "errors": self.errors,
            "capped": self.capped,
        }


def row(
    operation: str,
    phase: Phase,
    label: str = ITERATION,
    *,
    app_cpu_s: float = math.nan,
    db_cpu_s: float = math.nan,
    client_cpu_s: float = math.nan,
) -> Row:
    """Summarise calls ``label`` of ``phase`` (by default whole iterations); rate = count / phase time.

    ``app_cpu_s``, ``db_cpu_s`` and ``client_cpu_s`` are the CPU seconds the server, PostgreSQL and the
    load generator spent during the phase.
    """
    latencies = phase.recorder.latencies_s.get(label, [])
    errors = sum(
        n for key, n in phase.recorder.errors.items() if label == ITERATION or key.startswith(f"{label}:")
    )
    return Row(
        operation=operation,
        count=len(latencies),
        seconds=phase.seconds,
        per_second=len(latencies) / phase.seconds if phase.seconds > 0 else math.nan,
        p50_ms=percentile_ms(latencies, 0.50),
        p99_ms=percentile_ms(latencies, 0.99),
        max_ms=max(latencies, default=math.nan) * 1000.0,
        errors=errors,
        capped=phase.capped,
        app_cpu_ms=app_cpu_s * 1000.0 / phase.iterations if phase.iterations else math.nan,
        db_cpu_ms=db_cpu_s * 1000.0 / phase.iterations if phase.iterations else math.nan,
        client_cpu_ms=client_cpu_s * 1000.0 / phase.iterations if phase.iterations else math.nan,
    )


def with_ratio(rows: list[Row], baseline: Row) -> list[Row]:
    """``rows`` with ``ratio`` set to their rate divided by the baseline's rate."""
    return [dataclasses.replace(r, ratio=r.per_second / baseline.per_second) for r in rows]


def table(rows: list[Row]) -> str:
    """A fixed-width text table of ``rows``."""
    header = (
        "operation",
        "count",
        "req/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "x baseline",
        "errors",
        "srv cpu ms",
        "pg cpu ms",
        "client cpu ms",
    )
    lines = [
        (
            r.operation + (" (capped)" if r.capped else ""),
            str(r.count),
            f"{r.per_second:.0f}",
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
            f"{r.max_ms:.1f}",
            f"{r.ratio:.3f}",
            str(r.errors),
            "-" if math.isnan(r.app_cpu_ms) else f"{r.app_cpu_ms:.2f}",
            "-" if math.isnan(r.db_cpu_ms) else f"{r.db_cpu_ms:.2f}",
            "-" if math.isnan(r.client_cpu_ms) else f"{r.client_cpu_ms:.2f}",
        )
        for r in rows
    ]
    widths = [max(len(cells[i]) for cells in [header, *lines]) for i in range(len(header))]

    def fmt(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join(
            [first, *(cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))]
        )

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *(fmt(cells) for cells in lines)])
