"""Metrics overhead: the server CPU that the metrics middleware adds to a request.

    uv run python bench/metrics.py [--requests 3000] [--rounds 5] [--concurrency 8] [--json]
                                   [--results-dir DIR]

Starts two ``orchestrator serve`` on SQLite side by side, alike but for ``PO_METRICS_ENABLED``: ``true``
(every request counted and timed by route template, method and status; ``/metrics`` answers) and
``false`` (neither: the baseline). Each gets an org, an admin token and one runner. Then, in ``--rounds``
rounds alternating which server goes first, the same requests go to each (after a warm-up), and each
server's CPU time (user + system, from /proc) is read before and after. Per operation it prints the server
CPU per request of both and the overhead, metrics / baseline - 1 (target: at most 5 %), then what one
scrape of ``/metrics`` costs the server. ``--json`` prints the result as JSON instead of the table; it is
also written to ``<results dir>/metrics.json``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import api
import httpx
import loadgen
import yaml

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "tests" / "data" / "runners" / "seed000-agent.yaml"
ORG = "bench"
TARGET_OVERHEAD = 0.05


@dataclass(frozen=True, kw_only=True)
class Options:
    requests: int
    rounds: int
    concurrency: int
    warmup: int
    scrapes: int
    json: bool
    results_dir: Path


@dataclass(kw_only=True)
class Server:
    """One of the two servers: its process, its CPU meter and an admin client."""

    name: str
    process: api.ServerProcess
    cpu: api.CpuMeter
    client: httpx.AsyncClient
    cpu_s: dict[str, float]
    requests: dict[str, int]
    errors: dict[str, int]


async def _expect(client: httpx.AsyncClient, method: str, url: str, status: int, **kwargs: Any) -> Any:
    response = await client.request(method, url, **kwargs)
    if response.status_code != status:
        raise api.BenchError(f"{method} {url}: {response.status_code} {response.text[:300]}")
    return response.json() if response.content else None


async def _set_up(client: httpx.AsyncClient, bootstrap_token: str) -> None:
    admin = {"authorization": f"Bearer {bootstrap_token}"}
    await _expect(client, "POST", "/orgs", 201, json={"id": ORG}, headers=admin)
    created = await _expect(client, "POST", f"/orgs/{ORG}/tokens", 201, json={"role": "admin"}, headers=admin)
    client.headers["authorization"] = f"Bearer {created['token']}"
    body = {**yaml.safe_load(RUNNER.read_text()), "id": "runner-1"}
    await _expect(client, "POST", f"/orgs/{ORG}/runners", 201, json=body)


#: The operations measured: the smallest request (no database, no authentication: the middleware's
#: largest share) and a typical API read (authentication and a database read).
OPERATIONS: dict[str, tuple[str, str]] = {
    "GET /healthz": ("GET", "/healthz"),
    "GET /orgs/{org}/runners/{id}": ("GET", f"/orgs/{ORG}/runners/runner-1"),
}


async def _load(server: Server, operation: str, iterations: int, concurrency: int) -> loadgen.Phase:
    method, url = OPERATIONS[operation]

    async def call(recorder: loadgen.Recorder, _n: int) -> None:
        await recorder.call(server.client, operation, method, url, expect=200)

    return await loadgen.run(call, iterations=iterations, concurrency=concurrency, max_seconds=600)


async def _measure(server: Server, operation: str, options: Options) -> float:
    """One measurement; the server CPU milliseconds per request it took."""
    await _load(server, operation, options.warmup, options.concurrency)
    before, _ = server.cpu.read()
    phase = await _load(server, operation, options.requests, options.concurrency)
    after, _ = server.cpu.read()
    server.cpu_s[operation] = server.cpu_s.get(operation, 0.0) + after - before
    server.requests[operation] = server.requests.get(operation, 0) + phase.iterations
    for kind, count in phase.recorder.errors.items():
        server.errors[kind] = server.errors.get(kind, 0) + count
    return (after - before) * 1000.0 / max(1, phase.iterations)


async def _scrape_cost(server: Server, scrapes: int) -> float:
    """Server CPU milliseconds per ``GET /metrics``."""
    before, _ = server.cpu.read()
    for _ in range(scrapes):
        scraped = await server.client.get("/metrics")
        if scraped.status_code != 200:
            raise api.BenchError(f"GET /metrics: {scraped.status_code} {scraped.text[:300]}")
    after, _ = server.cpu.read()
    return (after - before) * 1000.0 / scrapes


async def benchmark(servers: list[Server], bootstrap_token: str, options: Options) -> dict[str, Any]:
    for server in servers:
        await _set_up(server.client, bootstrap_token)
    statuses = {s.name: (await s.client.get("/metrics")).status_code for s in servers}
    if statuses != {"metrics": 200, "baseline": 404}:
        raise api.BenchError(f"GET /metrics should answer 200 with metrics and 404 without: {statuses}")
    #: Per operation, each round's overhead (metrics / baseline - 1): how much the machine's load moved it.
    per_round: dict[str, list[float]] = {operation: [] for operation in OPERATIONS}
    for number in range(options.rounds):
        # Alternate which server goes first, so that a drift of the machine's load hits both alike.
        order = servers if number % 2 == 0 else servers[::-1]
        for operation in OPERATIONS:
            measured = {server.name: await _measure(server, operation, options) for server in order}
            if measured["baseline"] > 0:
                per_round[operation].append(round(measured["metrics"] / measured["baseline"] - 1.0, 4))
        print(f"  round {number + 1}/{options.rounds} done", file=sys.stderr, flush=True)
    metrics_server, baseline = servers
    operations: dict[str, dict[str, Any]] = {}
    for operation in OPERATIONS:
        with_ms = metrics_server.cpu_s[operation] * 1000.0 / metrics_server.requests[operation]
        without_ms = baseline.cpu_s[operation] * 1000.0 / baseline.requests[operation]
        operations[operation] = {
            "requests_each": metrics_server.requests[operation],
            "baseline_cpu_ms": round(without_ms, 4),
            "metrics_cpu_ms": round(with_ms, 4),
            # None when the baseline's CPU was below the clock tick (too few requests to measure).
            "overhead": round(with_ms / without_ms - 1.0, 4) if without_ms > 0 else None,
            "overhead_per_round": per_round[operation],
        }
    return {
        "operations": operations,
        "target_overhead": TARGET_OVERHEAD,
        "met": all(
            row["overhead"] is not None and row["overhead"] <= TARGET_OVERHEAD for row in operations.values()
        ),
        "scrape_cpu_ms": round(await _scrape_cost(metrics_server, options.scrapes), 3),
        "errors": {s.name: s.errors for s in servers},
    }


def middleware_us(calls: int = 20000, repeat: int = 5) -> float:
    """Microseconds the middleware adds to one request, in this process: a trivial ASGI app called with
    and without ``MetricsMiddleware`` around it (best of ``repeat``), with a routed request's scope."""
    from orchestrator.web.metrics import MetricsMiddleware

    class Route:
        path = "/orgs/{org_id}/runners/{runner_id}"

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        scope["route"] = Route
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def send(_message: Any) -> None:
        return None

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    wrapped = MetricsMiddleware(app)

    async def timed(target: Any) -> float:
        best = float("inf")
        for _ in range(repeat):
            started = time.perf_counter()
            for _ in range(calls):
                await target({"type": "http", "method": "GET", "path": "/orgs/o/runners/r"}, receive, send)
            best = min(best, time.perf_counter() - started)
        return best

    async def both() -> float:
        return (await timed(wrapped) - await timed(app)) * 1e6 / calls

    return asyncio.run(both())


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{'operation':32} {'requests':>9} {'baseline cpu ms':>16} {'metrics cpu ms':>15} {'overhead':>9}",
    ]
    for name, row in result["operations"].items():
        lines.append(
            f"{name:32} {row['requests_each']:>9} {row['baseline_cpu_ms']:>16.4f} "
            f"{row['metrics_cpu_ms']:>15.4f} "
            + (f"{row['overhead']:>+9.1%}" if row["overhead"] is not None else f"{'-':>9}")
            + "  rounds: "
            + " ".join(f"{o:+.1%}" for o in row["overhead_per_round"])
        )

    def share(key: str) -> str:
        return "-" if result[key] is None else f"{result[key]:.1%}"

    lines.append(
        f"the middleware alone, in process: {result['middleware_us']:.1f} µs per request "
        f"({share('middleware_share_of_get_runner')} of the baseline's CPU per GET runner, "
        f"{share('middleware_share_of_healthz')} per GET /healthz)"
    )
    verdict = "met" if result["met"] else "NOT met"
    lines.append(f"target: overhead <= {result['target_overhead']:.0%} on every operation: {verdict}")
    lines.append(f"one scrape of /metrics: {result['scrape_cpu_ms']:.2f} ms of server CPU")
    return "\n".join(lines)


def run(options: Options) -> dict[str, Any]:
    bootstrap_token = "po_bench_" + os.urandom(16).hex()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="po-bench-metrics-") as tmp:
        processes = {
            name: api.ServerProcess(
                data_dir=Path(tmp) / name,
                database_url=None,
                bootstrap_token=bootstrap_token,
                extra_env={"PO_METRICS_ENABLED": enabled},
            )
            for name, enabled in (("metrics", "true"), ("baseline", "false"))
        }
        try:
            for process in processes.values():
                process.start()

            async def measure() -> dict[str, Any]:
                limits = httpx.Limits(
                    max_connections=options.concurrency, max_keepalive_connections=options.concurrency
                )
                clients = [
                    httpx.AsyncClient(base_url=p.base_url, limits=limits, timeout=api.REQUEST_TIMEOUT_SECONDS)
                    for p in processes.values()
                ]
                servers = [
                    Server(
                        name=name,
                        process=process,
                        cpu=api.CpuMeter(server_pid=process.pid, postmaster_pid=None),
                        client=client,
                        cpu_s={},
                        requests={},
                        errors={},
                    )
                    for (name, process), client in zip(processes.items(), clients, strict=True)
                ]
                try:
                    return await benchmark(servers, bootstrap_token, options)
                finally:
                    for client in clients:
                        await client.aclose()

            result = asyncio.run(measure())
        finally:
            for process in processes.values():
                process.stop()
    result["middleware_us"] = round(middleware_us(), 2)
    for key, operation in (
        ("middleware_share_of_healthz", "GET /healthz"),
        ("middleware_share_of_get_runner", "GET /orgs/{org}/runners/{id}"),
    ):
        baseline_ms = result["operations"][operation]["baseline_cpu_ms"]
        result[key] = round(result["middleware_us"] / 1000.0 / baseline_ms, 4) if baseline_ms > 0 else None
    result["options"] = {
        "requests": options.requests,
        "rounds": options.rounds,
        "concurrency": options.concurrency,
        "warmup": options.warmup,
        "scrapes": options.scrapes,
    }
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return result


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="requests per operation, server and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, alternating which server goes first")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--warmup", type=int, default=200, help="requests before each measurement")
    parser.add_argument("--scrapes", type=int, default=50, help="scrapes of /metrics measured")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--results-dir", type=Path, default=api.RESULTS_DIR)
    args = parser.parse_args(argv)
    return Options(
        requests=args.requests,
        rounds=args.rounds,
        concurrency=args.concurrency,
        warmup=args.warmup,
        scrapes=args.scrapes,
        json=args.json,
        results_dir=args.results_dir,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    try:
        result = run(options)
    except api.BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    options.results_dir.mkdir(parents=True, exist_ok=True)
    (options.results_dir / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2) if options.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
