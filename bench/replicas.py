"""Replicas benchmark: a burst's throughput with one, two and three `orchestrator serve` replicas on one
PostgreSQL, and the time the others take to take over a dead replica's dispatch leases.

    uv run python bench/replicas.py [--deployments 30] [--replicas 1,2,3] [--concurrency 16]
                                    [--lease-seconds S] [--no-takeover] [--json] [--results-dir DIR]

One throwaway PostgreSQL (tests/support/postgres.py); each round gets a fresh database and data dir and
starts its replicas (tests/support/replicas.py: real server processes sharing the data dir and the runs
dir, as replicas on one host do) behind a round-robin TCP front (tests/support/round_robin.py), which is
every replica's PO_PUBLIC_URL and the only address the benchmark and the runners use. The organization is
bench/burst.py's: a `vm` runner with a local connection (the embedded engine), a module of one
`terraform_data`, one environment per deployment.

1. throughput, per replica count: `--deployments` deployments created at once (`--concurrency` concurrent
   POSTs through the front), waited for. Measured: deployments per minute (first create sent -> last
   `completed_at`) and its ratio to one replica's (measured in the same run), created -> completed
   p50/p99, the create call p50/p99, the servers' and PostgreSQL's CPU per deployment, the machine's busy
   and idle CPUs, how the front spread the connections and which replica launched the runs (runner
   processes seen as each server's children), and errors: a create not answered 201, a deployment not
   succeeded, a deployment whose runner process was seen more than once (run twice).
2. takeover (unless `--no-takeover`): the most replicas of the run, the same burst; once a quarter of it
   has ended, the first replica seen holding a dispatch lease is killed (`kill -9`). Measured: per lease it
   held, the lease time left at the kill and the seconds from the kill until another replica took the
   deployment over (claimed it, or it ended); and that the burst still completes, every deployment once.
   The lease is the servers' `PO_DISPATCH_LEASE_SECONDS` (default 60; `--lease-seconds` sets it for every
   round).

This machine is CPU-bound (two cores shared by the servers, PostgreSQL, the runners and the engine): more
replicas cannot add CPU here; what the ratios show is that nothing serialises on one replica. It prints a
table and writes bench/results/replicas.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import api
import burst
import deploy
import httpx
import repo_path

from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.outages import ServerProcess
from tests.support.postgres import PostgresServer
from tests.support.replicas import DispatchView, Replicas, owner_prefix

ROOT = repo_path.ROOT
RESULTS_DIR = api.RESULTS_DIR
BURST_TIMEOUT_S = 1800.0
#: How often the launch counter reads /proc for the servers' children (runner processes).
SAMPLE_INTERVAL_S = 0.05


@dataclass(frozen=True, kw_only=True)
class Options:
    deployments: int
    replicas: tuple[int, ...]
    concurrency: int
    lease_seconds: float | None
    takeover: bool
    local_run_limit: int | None
    json: bool
    results_dir: Path = RESULTS_DIR


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class LaunchCounter:
    """Reads /proc every ``SAMPLE_INTERVAL_S``: each child of a server is a runner process (a warm runner
    counted once it was handed its deployment); per runner process (pid, start time) the server that
    started it and the deployment it runs (``burst._deployment_of``)."""

    def __init__(self, server_pids: Sequence[int]) -> None:
        self.server_pids = {pid: n for n, pid in enumerate(server_pids)}
        self.runs: dict[tuple[int, int], tuple[int, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LaunchCounter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sample()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_INTERVAL_S)

    def sample(self) -> None:
        table: dict[int, list[str]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                fields = burst._stat(entry.name)
                if fields is not None:
                    table[int(entry.name)] = fields
        for pid, fields in table.items():
            parent = int(fields[1])
            if parent not in self.server_pids:
                # A runner forked by a server's zygote (``PO_LOCAL_ZYGOTE``) is the server's too.
                grandparent = int(table[parent][1]) if parent in table else 0
                if grandparent not in self.server_pids or not burst.is_zygote(parent):
                    continue
                parent = grandparent
            elif burst.is_zygote(pid):
                continue
            key = (pid, int(fields[19]))
            if key in self.runs and self.runs[key][1] != "?":
                continue
            if burst._idle_warm_runner(pid):
                continue
            self.runs[key] = (self.server_pids[parent], burst._deployment_of(pid))

    def per_deployment(self) -> Counter[str]:
        return Counter(deployment for _, deployment in self.runs.values() if deployment != "?")

    def per_server(self) -> Counter[int]:
        return Counter(server for server, deployment in self.runs.values() if deployment != "?")


@contextlib.contextmanager
def replicas_on(
    postgres: PostgresServer, work: Path, name: str, count: int, options: Options
) -> Iterator[Replicas]:
    """``count`` servers on a fresh database ``name`` behind one front, the burst benchmark's settings."""
    postgres.create_database(name)
    environment = {
        "PO_LOCAL_RUNS_DIR": str(work / "runs"),
        "PO_RUNNER_DENIED_NETWORKS": "",
        "MANAGED_RUNNER_SECRET": burst.SECRET,
        # The server's default (the test helper's is 0.5 s).
        "PO_STATUS_CHECK_INTERVAL_SECONDS": "5",
    }
    if options.lease_seconds is not None:
        environment["PO_DISPATCH_LEASE_SECONDS"] = str(options.lease_seconds)
    if options.local_run_limit is not None:
        environment["PO_LOCAL_RUN_LIMIT"] = str(options.local_run_limit)
    made = Replicas(count, postgres.url(name), work, environment=environment)
    try:
        made.start()
        yield made
    finally:
        made.stop()


def set_up(url: str, work: Path, options: Options) -> str:
    """bench/burst.py's organization and environments, through the front; the org admin's token."""
    tf_config = work / "terraformrc"
    tf_config.touch()
    engine_env = {"IAC_BACKEND": "embedded", "TF_CLI_CONFIG_FILE": str(tf_config), "CHECKPOINT_DISABLE": "1"}
    burst_options = burst.Options(
        databases=("postgresql",),
        deployments=options.deployments,
        concurrency=options.concurrency,
        creates=1,
        floor_runs=1,
        only="burst",
        replicas=1,
        local_run_limit=options.local_run_limit,
        json=False,
    )
    with httpx.Client(base_url=url, timeout=60) as client:
        burst.set_up(client, BOOTSTRAP_TOKEN, burst_options, engine_env)
        return str(client.headers["authorization"]).removeprefix("Bearer ")


def wait_all(url: str, token: str, ids: set[str]) -> dict[str, dict[str, Any]]:
    """``burst.wait_all`` through replicas dying: a cut connection starts it again."""
    deadline = time.monotonic() + BURST_TIMEOUT_S
    while True:
        try:
            with httpx.Client(
                base_url=url,
                headers={"authorization": f"Bearer {token}"},
                timeout=60,
                limits=httpx.Limits(max_keepalive_connections=0),
            ) as client:
                return burst.wait_all(client, ids, deadline)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def run_burst(
    replicas: Replicas, token: str, postmaster_pid: int | None, options: Options, *, during: Any = None
) -> dict[str, Any]:
    """The burst through the front; ``during`` (a callable taking the created ids) runs in a thread
    while it is waited for."""
    pids = [server.process.pid for server in replicas.servers if server.process is not None]
    counter = LaunchCounter(pids).start()
    before = burst.read_cpu(pids, postmaster_pid)
    machine_before = burst.machine_cpu()
    started = time.monotonic()
    targets = [(burst.PROJECT, env) for env in burst.env_ids(options.deployments)]
    creates = asyncio.run(burst.create_all([replicas.url], token, targets, options.concurrency, "burst"))
    say(f"   {len(creates.sent)} created in {creates.last_answered - creates.first_sent:.1f} s; waiting")
    side: dict[str, Any] = {}
    thread = None
    if during is not None:
        thread = threading.Thread(target=lambda: side.update(during(set(creates.sent))), daemon=True)
        thread.start()
    final = wait_all(replicas.url, token, set(creates.sent))
    if thread is not None:
        thread.join()
    counter.stop()
    seconds = time.monotonic() - started
    # A replica killed meanwhile took its CPU figures with it: none for that round.
    alive = all(burst._stat(pid) is not None for pid in pids)
    after = burst.read_cpu(pids, postmaster_pid) if alive else burst.CpuReading(math.nan, math.nan, math.nan)
    machine_after = burst.machine_cpu()
    count = len(creates.sent)
    succeeded = [d for d in final.values() if d["status"] == "succeeded"]
    completed = [deploy.parse_time(d["completed_at"]) for d in final.values()]
    span = (max(completed) - creates.first_sent) if completed else math.nan
    runs = counter.per_deployment()
    ports = {server.port: n for n, server in enumerate(replicas.servers)}
    server_s = after.server_s - before.server_s
    postgres_s = after.postgres_s - before.postgres_s
    return {
        "replicas": len(replicas.servers),
        "created": count,
        "succeeded": len(succeeded),
        "not_completed": count - len(final),
        "failed": [
            {"id": d["id"], "status": d["status"], "message": d["status_message"][:300]}
            for d in final.values()
            if d["status"] != "succeeded"
        ],
        "create_errors": creates.errors,
        "server_errors": creates.server_errors,
        "run_twice": sorted(d for d, n in runs.items() if n > 1),
        "runs_not_seen": len(set(creates.sent) - set(runs)),
        "seconds": round(seconds, 2),
        "span_s": round(span, 3),
        "deployments_per_minute": None
        if not succeeded or math.isnan(span)
        else round(60 * len(succeeded) / span, 1),
        "create_call_s": burst.summary(creates.latencies),
        "created_to_completed_s": burst.summary(
            [
                deploy.parse_time(d["completed_at"]) - deploy.parse_time(d["created_at"])
                for d in final.values()
            ]
        ),
        "cpu_s_per_deployment": {
            "servers": burst.per(server_s, count),
            "postgres": burst.per(postgres_s, count),
        },
        "machine_cpus": {
            "busy": round((machine_after[0] - machine_before[0]) / seconds, 2),
            "idle": round((machine_after[1] - machine_before[1]) / seconds, 2),
        },
        "front_connections": {f"r{ports[port]}": n for port, n in sorted(replicas.front.connections.items())},
        "runs_launched_by": {f"r{n}": c for n, c in sorted(counter.per_server().items())},
        **side,
    }


def takeover(replicas: Replicas, database_url: str, options: Options) -> Any:
    """What runs beside the takeover round's burst: once a quarter of it has ended, kill -9 the first
    replica seen holding a dispatch lease, and time the takeover of each of its leases."""
    lease = options.lease_seconds or 60.0

    def during(ids: set[str]) -> dict[str, Any]:
        prefixes = {owner_prefix(server): server for server in replicas.servers}
        with DispatchView(database_url) as view:
            deadline = time.monotonic() + BURST_TIMEOUT_S
            while time.monotonic() < deadline:
                rows = view.all()
                if sum(row.status != "executing" for row in rows.values()) >= max(1, len(ids) // 4):
                    break
                time.sleep(0.2)
            victim = _first_holder(view, prefixes, deadline=time.monotonic() + 120)
            if victim is None:
                note = "no replica was seen holding a lease before the burst ended"
                return {"takeover": {"killed": None, "note": note}}
            prefix = owner_prefix(victim)
            victim.kill()
            killed_at, killed_wall = time.monotonic(), datetime.now(UTC)
            leases = view.held_by(prefix)
            left = {
                deployment_id: _seconds_left(row.lease_until, killed_wall)
                for deployment_id, row in leases.items()
            }
            say(f"   killed r{replicas.servers.index(victim)} (kill -9) holding {len(leases)} lease(s)")
            taken = view.watch_takeover(prefix, leases, since=killed_at, timeout_seconds=lease + 120)
        seconds = [s for s in taken.values() if s is not None]
        beyond = []
        for deployment_id, after in taken.items():
            before = left.get(deployment_id)
            if after is not None and before is not None:
                beyond.append(after - before)
        return {
            "takeover": {
                "killed": f"r{replicas.servers.index(victim)}",
                "lease_seconds": lease,
                "leases_held": len(leases),
                "lease_left_at_kill_s": burst.summary([v for v in left.values() if v is not None]),
                "taken_over_after_s": burst.summary(seconds),
                "after_the_lease_ran_out_s": burst.summary(beyond),
                "not_taken_over": sorted(d for d, s in taken.items() if s is None),
            }
        }

    return during


def _first_holder(
    view: DispatchView, prefixes: dict[str, ServerProcess], *, deadline: float
) -> ServerProcess | None:
    """The first replica seen holding a dispatch lease (None: the burst ended first, or the deadline)."""
    while time.monotonic() < deadline:
        rows = view.all().values()
        for row in rows:
            owner = row.owner
            if row.status == "executing" and owner:
                holder = next((s for p, s in prefixes.items() if owner.startswith(p)), None)
                if holder is not None:
                    return holder
        if all(row.status != "executing" for row in rows):
            return None
        time.sleep(0.01)
    return None


def _seconds_left(until: datetime | None, now: datetime) -> float | None:
    if until is None:
        return None
    if until.tzinfo is None:
        until = until.replace(tzinfo=UTC)
    return round((until - now).total_seconds(), 2)


def run(options: Options) -> dict[str, Any]:
    rounds: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="po-bench-replicas-")))
        postgres = PostgresServer()
        postgres.start(tmp / "pg")
        stack.callback(postgres.stop)
        for count in options.replicas:
            work = tmp / f"replicas-{count}"
            say(f"-- {count} replica(s): burst of {options.deployments}")
            with replicas_on(postgres, work, f"r{count}", count, options) as replicas:
                token = set_up(replicas.url, work, options)
                rounds[str(count)] = run_burst(replicas, token, postgres.pid, options)
        if options.takeover:
            count = max(options.replicas)
            work = tmp / "takeover"
            say(f"-- takeover: {count} replicas, burst of {options.deployments}, one killed (kill -9)")
            with replicas_on(postgres, work, "takeover", count, options) as replicas:
                token = set_up(replicas.url, work, options)
                during = takeover(replicas, postgres.url("takeover"), options)
                rounds["takeover"] = run_burst(replicas, token, postgres.pid, options, during=during)
    base = rounds.get(str(min(options.replicas)), {}).get("deployments_per_minute")
    for key, result in rounds.items():
        if key != "takeover":
            rate = result["deployments_per_minute"]
            result["ratio_to_fewest_replicas"] = round(rate / base, 2) if rate and base else None
    return rounds


def report(rounds: dict[str, Any]) -> str:
    rows: list[tuple[str, ...]] = [
        (
            "replicas",
            "deployments/min",
            "ratio",
            "created->completed p50/p99 s",
            "create p50/p99 ms",
            "CPU s/deployment servers·pg",
            "CPUs busy/idle",
            "runs launched by",
            "ok/created, run twice",
        )
    ]
    for key, r in rounds.items():
        c, cc, cpu = r["create_call_s"], r["created_to_completed_s"], r["cpu_s_per_deployment"]
        rows.append(
            (
                key if key != "takeover" else f"{r['replicas']}, one killed",
                burst._s(r["deployments_per_minute"], 1),
                burst._s(r.get("ratio_to_fewest_replicas"), 2),
                f"{burst._s(cc['p50'], 1)} / {burst._s(cc['p99'], 1)}",
                f"{burst._ms(c['p50'])} / {burst._ms(c['p99'])}",
                f"{burst._s(cpu['servers'], 3)} · {burst._s(cpu['postgres'], 3)}",
                f"{r['machine_cpus']['busy']:.2f} / {r['machine_cpus']['idle']:.2f}",
                " ".join(f"{k}:{v}" for k, v in r["runs_launched_by"].items()),
                f"{r['succeeded']}/{r['created']}, {len(r['run_twice'])}",
            )
        )
    out = [deploy.table(rows)]
    t = rounds.get("takeover", {}).get("takeover")
    if t and t.get("killed"):
        after, left, beyond = (
            t["taken_over_after_s"],
            t["lease_left_at_kill_s"],
            t["after_the_lease_ran_out_s"],
        )
        out.append(
            f"takeover: {t['killed']} killed holding {t['leases_held']} lease(s) "
            f"(lease {t['lease_seconds']:g} s, "
            f"{burst._s(left['min'], 1)}-{burst._s(left['max'], 1)} s of it left at the kill); taken over "
            f"{burst._s(after['min'], 1)}-{burst._s(after['max'], 1)} s after the kill, "
            f"{burst._s(beyond['min'], 1)}-{burst._s(beyond['max'], 1)} s after each lease ran out; "
            f"not taken over: {len(t['not_taken_over'])}"
        )
    elif t:
        out.append(f"takeover: {t.get('note')}")
    return "\n".join(out)


def problems(rounds: dict[str, Any]) -> list[str]:
    found = []
    for key, r in rounds.items():
        if r["create_errors"] or r["failed"] or r["not_completed"] or r["run_twice"]:
            found.append(
                f"{key}: create errors {r['create_errors']}, failed {r['failed'][:3]}, "
                f"not completed {r['not_completed']}, run twice {r['run_twice']}"
            )
    t = rounds.get("takeover", {}).get("takeover")
    if t and t.get("not_taken_over"):
        found.append(f"takeover: leases never taken over: {t['not_taken_over']}")
    return found


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--deployments", type=int, default=30, help="deployments per burst (default 30; the issue's: 200)"
    )
    parser.add_argument(
        "--replicas", default="1,2,3", help="replica counts measured, in order (default 1,2,3)"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent creates (default 16)")
    parser.add_argument(
        "--lease-seconds", type=float, help="the servers' PO_DISPATCH_LEASE_SECONDS (default: theirs, 60)"
    )
    parser.add_argument("--no-takeover", action="store_true", help="skip the takeover round")
    parser.add_argument(
        "--local-run-limit", type=int, help="the servers' PO_LOCAL_RUN_LIMIT (default: theirs, four per CPU)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    try:
        counts = tuple(int(part) for part in args.replicas.split(",") if part.strip())
    except ValueError:
        parser.error("--replicas: comma-separated numbers, e.g. 1,2,3")
    if not counts or min(counts) < 1 or min(args.deployments, args.concurrency) < 1:
        parser.error("--replicas, --deployments and --concurrency must be >= 1")
    return Options(
        deployments=args.deployments,
        replicas=counts,
        concurrency=args.concurrency,
        lease_seconds=args.lease_seconds,
        takeover=not args.no_takeover,
        local_run_limit=args.local_run_limit,
        json=args.json,
        results_dir=args.results_dir,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, api._stop_on_sigterm)
    started = time.monotonic()
    load_before = os.getloadavg()
    try:
        rounds = run(options)
    except api.BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the servers were stopped", file=sys.stderr)
        return 130
    result = {
        "benchmark": "replicas",
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - started, 1),
        "code": deploy.code_version(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1_5_15_min_before": load_before,
            "load_average_1_5_15_min_after": os.getloadavg(),
        },
        "options": {k: v for k, v in asdict(options).items() if k not in ("json", "results_dir")},
        "rounds": rounds,
    }
    options.results_dir.mkdir(parents=True, exist_ok=True)
    (options.results_dir / "replicas.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    if options.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(report(rounds))
        print(
            f"load average (1/5/15 min) before {api._load(load_before)}, after {api._load(os.getloadavg())}; "
            f"{os.cpu_count()} CPUs shared by this script, the servers, PostgreSQL, the runners, the engine"
        )
    found = problems(rounds)
    for problem in found:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
