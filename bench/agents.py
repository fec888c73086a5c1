"""Agent gateway benchmark: command delivery latency and memory per idle long poll (SQLite, PostgreSQL).

    uv run python bench/agents.py [--database sqlite|postgresql|both] [--agents 1000] [--samples 200]
                                  [--hold 10000] [--healthz 300]

For each database it starts ``orchestrator serve`` as a child process (``api.ServerProcess``; for
PostgreSQL a throwaway cluster), creates ``--agents`` ``vm`` runners with ``connection: {type: agent}``,
each with its own Ed25519 key, and holds one ``commands/next`` long poll per runner open from this
process (asyncio streams, one raw HTTP/1.1 keep-alive connection per poll, re-issued on 204). Then:

- latency: ``--samples`` deployments, each in a fresh environment of a project whose runner rule picks
  one of the runners; timed from the command's ``created_at`` (set in the dispatcher's transaction that
  commits it) and from the answer to ``POST /deployments`` to the moment the poll's 200 arrives here;
  the agent acks each command. Baseline in the same state: ``GET /healthz`` on its own connection.
- memory: the server's VmRSS with no poll held (after a warm-up), with ``--agents`` polls held, and with
  ``--hold`` polls held (extra polls spread over the same runners, as agent replicas would); bytes per
  poll are the RSS differences divided by the poll counts.

Prints a table with the issue's targets and writes bench/results/agents-<database>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import api
import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from orchestrator.protocol import agent_auth
from orchestrator.protocol import commands as protocol

ORG = "bench"
ENV_TYPE = "bench-env"
TARGET_P99_MS = 25.0
TARGET_BYTES_PER_POLL = 16 * 1024
TARGET_HELD_POLLS = 10_000
RECEIVE_TIMEOUT_S = 10.0
SEED_CONCURRENCY = 16
CONNECT_BATCH = 250


@dataclass(frozen=True, kw_only=True)
class Options:
    databases: tuple[str, ...]
    agents: int
    samples: int
    hold: int
    healthz: int
    max_seconds: float


@dataclass(kw_only=True)
class Agent:
    runner_id: str
    key: Ed25519PrivateKey
    received: asyncio.Queue[tuple[float, bytes]] = field(default_factory=asyncio.Queue)


@dataclass(kw_only=True)
class Pollers:
    """Long polls held from this process, one raw HTTP/1.1 connection each."""

    host: str
    port: int
    held: int = 0
    polls: int = 0
    empty: int = 0
    errors: list[str] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self, agent: Agent) -> None:
        self.tasks.append(asyncio.create_task(self._loop(agent)))

    async def _loop(self, agent: Agent) -> None:
        path = protocol.next_command_path(ORG, agent.runner_id)
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            self.errors.append(f"connect: {exc!r}")
            return
        try:
            while True:
                token = agent_auth.sign(agent.key, ORG, agent.runner_id)
                writer.write(
                    f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {token}\r\n"
                    "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}".encode()
                )
                self.held += 1
                self.polls += 1
                try:
                    status, body = await read_response(reader)
                finally:
                    self.held -= 1
                arrived = time.time()
                if status == 200:
                    agent.received.put_nowait((arrived, body))
                elif status == 204:
                    self.empty += 1
                else:
                    self.errors.append(f"{agent.runner_id}: {status} {body[:200]!r}")
                    await asyncio.sleep(1)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            self.errors.append(f"{agent.runner_id}: {exc!r}")
        finally:
            writer.close()

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
        elif name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
            raise ValueError("chunked answers are not expected")
    body = await reader.readexactly(length) if length else b""
    return status, body


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise api.BenchError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    return api._cpu_seconds(api._stat_fields(Path(f"/proc/{pid}/stat").read_text()))


def pct(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-len(ordered) * fraction // 1))
    return ordered[int(rank) - 1]


def summary_ms(values_s: list[float]) -> dict[str, float | int]:
    return {
        "count": len(values_s),
        "p50_ms": round(pct(values_s, 0.5) * 1000, 2),
        "p99_ms": round(pct(values_s, 0.99) * 1000, 2),
        "max_ms": round(max(values_s) * 1000, 2) if values_s else float("nan"),
    }


def parse_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class Bench:
    def __init__(self, base_url: str, server_pid: int, options: Options) -> None:
        self.base_url = base_url
        self.server_pid = server_pid
        self.options = options
        host, _, port = base_url.removeprefix("http://").partition(":")
        self.pollers = Pollers(host=host, port=int(port))
        self.agents: list[Agent] = []
        self.client = httpx.AsyncClient(base_url=base_url, timeout=20)
        self.targets: list[Agent] = []
        self.env_count = 0

    async def post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        response = await self.client.post(path, json=body, headers=headers)
        if response.status_code != 201:
            raise api.BenchError(f"POST {path}: {response.status_code} {response.text[:300]}")
        return response.json()

    async def set_up(self, bootstrap_token: str) -> float:
        admin = {"authorization": f"Bearer {bootstrap_token}"}
        await self.post("/orgs", {"id": ORG}, admin)
        token = await self.post(f"/orgs/{ORG}/tokens", {"role": "admin"}, admin)
        self.client.headers["authorization"] = f"Bearer {token['token']}"
        await self.post(f"/orgs/{ORG}/env-types", {"id": ENV_TYPE})
        started = time.perf_counter()
        numbers = iter(range(self.options.agents))

        async def seed() -> None:
            for n in numbers:
                private_pem, public_pem = agent_auth.generate_key_pair()
                agent = Agent(runner_id=f"agent-{n:05d}", key=agent_auth.load_private_key(private_pem))
                configuration = {"type": "vm", "connection": {"type": "agent", "key": public_pem}}
                body = {
                    "id": agent.runner_id,
                    "runner_configuration": configuration,
                    "state_storage_configuration": {"type": "orchestrator"},
                }
                await self.post(f"/orgs/{ORG}/runners", body)
                self.agents.append(agent)

        await asyncio.gather(*(seed() for _ in range(SEED_CONCURRENCY)))
        seeded = time.perf_counter() - started
        self.agents.sort(key=lambda a: a.runner_id)
        # One project and rule per target runner, spread over all runners; one environment per sample.
        count = min(self.options.samples, len(self.agents))
        step = len(self.agents) / count
        self.targets = [self.agents[int(i * step)] for i in range(count)]
        for agent in self.targets:
            await self.post(f"/orgs/{ORG}/projects", {"id": f"p-{agent.runner_id}"})
            await self.post(
                f"/orgs/{ORG}/runner-rules",
                {"runner_id": agent.runner_id, "project_id": f"p-{agent.runner_id}", "env_type_id": ENV_TYPE},
            )
        return seeded

    async def new_env(self, agent: Agent) -> tuple[str, str]:
        self.env_count += 1
        project, env = f"p-{agent.runner_id}", f"e{self.env_count}"
        await self.post(f"/orgs/{ORG}/projects/{project}/envs", {"id": env, "env_type_id": ENV_TYPE})
        return project, env

    async def hold(self, agents: list[Agent]) -> None:
        """Open one more poll for each of ``agents``, in batches, and wait until the server holds them."""
        for start in range(0, len(agents), CONNECT_BATCH):
            for agent in agents[start : start + CONNECT_BATCH]:
                self.pollers.start(agent)
            await asyncio.sleep(0.2)
        await self.settle()

    async def settle(self, quiet_s: float = 2.0, limit_s: float = 30.0) -> None:
        """Wait until the server's CPU has been nearly idle for ``quiet_s`` (it has taken the polls in)."""
        deadline = time.monotonic() + limit_s
        await asyncio.sleep(1.0)
        while time.monotonic() < deadline:
            before = cpu_seconds(self.server_pid)
            await asyncio.sleep(quiet_s)
            if cpu_seconds(self.server_pid) - before < 0.15 * quiet_s:
                return
        print("NOTE: the server did not go quiet after opening polls", flush=True)

    async def sample(self, agent: Agent) -> dict[str, float]:
        project, env = await self.new_env(agent)
        while not agent.received.empty():
            agent.received.get_nowait()
        body = {"project_id": project, "env_id": env, "mode": "deploy", "manifest": {"workloads": {}}}
        sent = time.time()
        created = await self.post(f"/orgs/{ORG}/deployments", body)
        answered = time.time()
        arrived, raw = await asyncio.wait_for(agent.received.get(), RECEIVE_TIMEOUT_S)
        delivered = protocol.NextCommand.model_validate_json(raw)
        if delivered.command.deployment_id != created["id"]:
            raise api.BenchError(
                f"{agent.runner_id} received {delivered.command.deployment_id}, not {created['id']}"
            )
        path = protocol.command_action_path(ORG, agent.runner_id, delivered.command.command_id, "ack")
        token = agent_auth.sign(agent.key, ORG, agent.runner_id)
        acked = await self.client.post(
            path, json={"receipt": delivered.receipt}, headers={"authorization": f"Bearer {token}"}
        )
        if acked.status_code != 204:
            raise api.BenchError(f"ack: {acked.status_code} {acked.text[:300]}")
        return {
            "commit_to_receive_s": arrived - delivered.command.created_at.timestamp(),
            "answer_to_receive_s": arrived - answered,
            "deployment_created_to_receive_s": arrived - parse_time(created["created_at"]),
            "post_latency_s": answered - sent,
        }

    async def latency(self, samples: int) -> dict[str, Any]:
        """``samples`` deliveries one after the other, or as many as fit in ``--max-seconds``."""
        rows = []
        failures: list[str] = []
        deadline = time.monotonic() + self.options.max_seconds
        for n in range(samples):
            if time.monotonic() > deadline:
                break
            try:
                rows.append(await self.sample(self.targets[n % len(self.targets)]))
            except (TimeoutError, api.BenchError, httpx.HTTPError) as exc:
                failures.append(f"sample {n}: {exc!r}"[:300])
            await asyncio.sleep(0.02)
        result: dict[str, Any] = {"asked": samples, "failed": len(failures), "failures": failures[:5]}
        if rows:
            result |= {key: summary_ms([row[key] for row in rows]) for key in rows[0]}
        return result

    async def healthz(self, requests: int) -> dict[str, Any]:
        reader, writer = await asyncio.open_connection(self.pollers.host, self.pollers.port)
        times = []
        try:
            for _ in range(requests):
                started = time.perf_counter()
                writer.write(f"GET /healthz HTTP/1.1\r\nHost: {self.pollers.host}\r\n\r\n".encode())
                status, _ = await read_response(reader)
                times.append(time.perf_counter() - started)
                if status != 200:
                    raise api.BenchError(f"/healthz answered {status}")
        finally:
            writer.close()
        return summary_ms(times)

    async def idle_cpu(self, seconds: float = 10.0) -> float:
        """The server's CPU share (of one core) while only idle polls are held."""
        before = cpu_seconds(self.server_pid)
        await asyncio.sleep(seconds)
        return (cpu_seconds(self.server_pid) - before) / seconds


async def run_scenario(base_url: str, server_pid: int, bootstrap: str, options: Options) -> dict[str, Any]:
    bench = Bench(base_url, server_pid, options)
    result: dict[str, Any] = {}
    try:
        result["seed_seconds"] = round(await bench.set_up(bootstrap), 2)
        print(f"  seeded {options.agents} agent runners in {result['seed_seconds']} s", flush=True)
        # Warm-up: a few polls and deliveries, so that the code paths are loaded before the idle RSS.
        warm = bench.targets[: min(5, len(bench.targets))]
        await bench.hold(warm)
        for agent in warm:
            await bench.sample(agent)
        await bench.pollers.stop()
        await bench.settle()
        result["rss_idle_bytes"] = rss_bytes(server_pid)
        result["healthz_no_polls"] = await bench.healthz(options.healthz)

        await bench.hold(bench.agents)
        result["held_agents"] = bench.pollers.held
        result["rss_agents_bytes"] = rss_bytes(server_pid)
        result["idle_cpu_share_agents"] = round(await bench.idle_cpu(), 3)
        result["healthz_agents"] = await bench.healthz(options.healthz)
        print(f"  holding {bench.pollers.held} polls; measuring {options.samples} deliveries", flush=True)
        result["latency_agents"] = await bench.latency(options.samples)

        extra = max(0, options.hold - options.agents)
        if extra:
            more = [bench.agents[n % len(bench.agents)] for n in range(extra)]
            await bench.hold(more)
            result["held_total"] = bench.pollers.held
            result["rss_hold_bytes"] = rss_bytes(server_pid)
            result["idle_cpu_share_hold"] = round(await bench.idle_cpu(), 3)
            result["healthz_hold"] = await bench.healthz(options.healthz)
            print(
                f"  holding {bench.pollers.held} polls; measuring {options.samples // 2} deliveries",
                flush=True,
            )
            result["latency_hold"] = await bench.latency(max(1, options.samples // 2))
            result["held_total_after"] = bench.pollers.held
        result["client_poll_errors"] = bench.pollers.errors[:10]
        result["client_poll_error_count"] = len(bench.pollers.errors)
        result["polls_sent"] = bench.pollers.polls
        result["polls_answered_204"] = bench.pollers.empty
    finally:
        await bench.pollers.stop()
        await bench.client.aclose()
    held = result.get("held_agents") or 0
    if held:
        result["bytes_per_poll_agents"] = round(
            (result["rss_agents_bytes"] - result["rss_idle_bytes"]) / held
        )
    if result.get("held_total"):
        added = result["held_total"] - held
        result["bytes_per_poll_hold"] = round(
            (result["rss_hold_bytes"] - result["rss_idle_bytes"]) / result["held_total"]
        )
        result["bytes_per_poll_marginal"] = round(
            (result["rss_hold_bytes"] - result["rss_agents_bytes"]) / added
        )
    return result


def memory_rows(result: dict[str, Any], options: Options) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    mib = 1024 * 1024
    rows.append(("server RSS, no polls", f"{result.get('rss_idle_bytes', 0) / mib:.1f} MiB", "", ""))
    for key, polls in (("agents", result.get("held_agents")), ("hold", result.get("held_total"))):
        if f"rss_{key}_bytes" in result:
            rows.append((f"server RSS, {polls} polls", f"{result[f'rss_{key}_bytes'] / mib:.1f} MiB", "", ""))
    for key, label in (
        ("bytes_per_poll_agents", "per poll (first polls)"),
        ("bytes_per_poll_hold", "per poll (all held)"),
        ("bytes_per_poll_marginal", "per poll (marginal)"),
    ):
        if key in result:
            value = result[key]
            met = "met" if value <= TARGET_BYTES_PER_POLL else "NOT met"
            rows.append((label, f"{value / 1024:.1f} KiB", "<= 16 KiB", met))
    if "held_total" in result:
        held = min(result["held_total"], result.get("held_total_after", 0))
        met = "met" if held >= TARGET_HELD_POLLS and not result["client_poll_error_count"] else "NOT met"
        rows.append(
            ("polls held by one process", f"{held} (asked {options.hold})", f">= {TARGET_HELD_POLLS}", met)
        )
    for key in ("idle_cpu_share_agents", "idle_cpu_share_hold"):
        if key in result:
            rows.append(
                (
                    f"server CPU while idle ({key.rsplit('_', 1)[1]})",
                    f"{result[key] * 100:.1f} % of a core",
                    "",
                    "",
                )
            )
    return rows


def report(database: str, result: dict[str, Any], options: Options) -> str:
    rows: list[tuple[str, str, str, str]] = []

    def lat(label: str, key: str, target: bool) -> None:
        if key not in result:
            return
        for name, values in result[key].items():
            if not isinstance(values, dict):
                continue
            if name == "post_latency_s":
                label_name = f"{label}: POST /deployments"
            else:
                label_name = f"{label}: {name.removesuffix('_s').replace('_', ' ')}"
            goal = f"p99 <= {TARGET_P99_MS:.0f} ms" if target and name == "commit_to_receive_s" else ""
            met = ("met" if values["p99_ms"] <= TARGET_P99_MS else "NOT met") if goal else ""
            rows.append(
                (
                    label_name,
                    f"p50 {values['p50_ms']} / p99 {values['p99_ms']} / max {values['max_ms']} ms",
                    goal,
                    met,
                )
            )

    def hz(label: str, key: str) -> None:
        if key in result:
            v = result[key]
            rows.append(
                (label, f"p50 {v['p50_ms']} / p99 {v['p99_ms']} / max {v['max_ms']} ms", "baseline", "")
            )

    hz("GET /healthz, no polls", "healthz_no_polls")
    hz(f"GET /healthz, {result.get('held_agents')} polls", "healthz_agents")
    lat(f"{result.get('held_agents')} polls", "latency_agents", True)
    hz(f"GET /healthz, {result.get('held_total')} polls", "healthz_hold")
    lat(f"{result.get('held_total')} polls", "latency_hold", True)
    rows += memory_rows(result, options)
    rows.append(("poll errors (client)", str(result.get("client_poll_error_count")), "0", ""))
    widths = [max(len(r[i]) for r in [*rows, ("measure", "value", "target", "")]) for i in range(4)]
    lines = [f"{database}:"]
    for r in [("measure", "value", "target", ""), *rows]:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def raise_nofile(needed: int) -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        print(f"NOTE: RLIMIT_NOFILE is {soft}, fewer than the {needed} descriptors asked for", flush=True)
    return soft, hard


def run_database(database: str, options: Options) -> dict[str, Any]:
    bootstrap = "bench-bootstrap-token-" + os.urandom(8).hex()
    with tempfile.TemporaryDirectory(prefix=f"po-bench-agents-{database}-") as tmp:
        base = Path(tmp)
        with contextlib.ExitStack() as stack:
            url = None
            if database == "postgresql":
                url, _ = stack.enter_context(api.postgres_database(base / "pg"))
            server = api.ServerProcess(data_dir=base / "data", database_url=url, bootstrap_token=bootstrap)
            stack.callback(server.stop)
            base_url = server.start()
            started = time.perf_counter()
            result = asyncio.run(run_scenario(base_url, server.pid, bootstrap, options))
            result["seconds"] = round(time.perf_counter() - started, 1)
            api.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                (api.RESULTS_DIR / f"agents-{database}-server.log").write_text(server.log_path.read_text())
    return result


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--agents", type=int, default=1000, help="agent runners, one idle poll each")
    parser.add_argument("--samples", type=int, default=200, help="deliveries timed with --agents polls")
    parser.add_argument("--hold", type=int, default=10_000, help="polls held in all for the capacity step")
    parser.add_argument("--healthz", type=int, default=300, help="GET /healthz requests per baseline")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="cap on each latency step")
    args = parser.parse_args(argv)
    if args.agents < 1 or args.samples < 1:
        parser.error("--agents and --samples must be at least 1")
    databases = ("sqlite", "postgresql") if args.database == "both" else (args.database,)
    return Options(
        databases=databases,
        agents=args.agents,
        samples=args.samples,
        hold=args.hold,
        healthz=args.healthz,
        max_seconds=args.max_seconds,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    soft, hard = raise_nofile(max(options.hold, options.agents) + 200)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    machine = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "rlimit_nofile": [soft, hard],
    }
    for database in options.databases:
        print(f"{database}: starting", flush=True)
        load_before = os.getloadavg()
        result = run_database(database, options)
        result |= {
            "database": database,
            "options": {k: v for k, v in vars(options).items() if k != "databases"},
            "machine": machine | {"load_before": load_before, "load_after": os.getloadavg()},
            "targets": {
                "p99_ms": TARGET_P99_MS,
                "bytes_per_poll": TARGET_BYTES_PER_POLL,
                "held_polls": TARGET_HELD_POLLS,
            },
        }
        print(report(database, result, options), flush=True)
        out = api.RESULTS_DIR / f"agents-{database}.json"
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"  -> {out.relative_to(api.ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
