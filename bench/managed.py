"""The Managed pool's claim latency and claim throughput, against the local launcher in the same run.

    uv run python bench/managed.py [--database sqlite|postgresql|both] [--runs 8] [--warmup 1]
                                   [--real-runners 2] [--pollers 50] [--backlog 200]
                                   [--local-backlog 10] [--max-seconds 600] [--json]

Per database: one `orchestrator serve` (a child process, fresh data dir, `MANAGED_RUNNER_SECRET` set;
SQLite or a throwaway PostgreSQL from tests/support/postgres.py), with a recording reverse proxy in front
of it (bench/launch.py's) as its `PO_PUBLIC_URL` and as the real runners' `RUNNER_URL`. Two phases:

1. Latency. `--real-runners` real `po-runner managed` processes poll the pool (through the proxy). The
   same one-resource module is deployed alternately on the local launcher (`vm-local`, the baseline) and
   on the Managed pool, one deployment at a time. Measured on this host's clock from the
   `POST /deployments` answer: *claim* (managed only) = the proxy passing on the 200 answer of the
   `POST /runner/claim` that carried the deployment; *started* = the runner's first gateway request (its
   bundle download) at the proxy, for both; *completed* = `completed_at`.
2. Throughput. The real runners are stopped (SIGTERM by PID). `--pollers` lightweight pollers in this
   process (one asyncio loop, the runner's own `ManagedClient`, straight to the server) register, then
   claim with po-runner managed's 25 s long poll and report `finished` with exit code 0 at once. A claim's
   "run" is empty on purpose: the figure is the server's claim path (the claim transaction, the lease, the
   release, the deployment's failure on `finished`), not 50 po-runners on 2 cores. Measured: a *burst*,
   `--local-backlog` deployments created one after the other while the pollers wait, n / (first POST
   sent -> last claimed), against the same burst on the local launcher, n / (first POST sent -> last
   `launched_at`; real local runs); and a *drain*, a backlog of `--backlog` deployments created before
   the pollers start, backlog / (first claim sent -> last claimed), also shown against the POST rate of
   that backlog. Every error, and every deployment claimed twice or never, is counted.

Ratios are managed / local in the same run. The exit status is 1 when a latency deployment failed, a
claim errored, or the backlog was not drained. See bench/README.md for how to read it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import api
import deploy
import httpx
import launch
from starlette.types import Message, Receive, Scope, Send

from orchestrator.client.errors import ClientError
from orchestrator.managed.client import MAX_WAIT_SECONDS, ManagedClient

ORG = launch.ORG
ENV = launch.ENV
BASELINE = launch.BASELINE
MANAGED = "managed"
#: Not a real secret: the throwaway server's, for this run only.
SECRET = "bench-managed-runner-secret-" + "0123456789abcdefghijklmnopqrstuvwxyz"
#: The pollers' long poll: po-runner managed's own (25 s); they are cancelled once all is claimed.
POLL_WAIT_SECONDS = MAX_WAIT_SECONDS
RUNNER_STOP_TIMEOUT_S = 30.0
#: The venv's scripts and the system's, without /usr/local/bin (where a terraform binary may be).
ENGINELESS_PATH = f"{launch.VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_BACKLOG = 5000
MAX_POLLERS = 500


@dataclass(frozen=True, kw_only=True)
class Options:
    databases: tuple[str, ...]
    runs: int
    warmup: int
    real_runners: int
    pollers: int
    backlog: int
    local_backlog: int
    max_seconds: float
    json: bool
    results_dir: Path


# --- the proxy, which also notes claim answers ------------------------------------------------------


class ClaimRecordingProxy(launch.RecordingProxy):
    """bench/launch.py's recording proxy that also notes, per deployment, when the 200 answer of the
    ``POST /runner/claim`` that carried it was passed on to the runner."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.claim_answered: dict[str, float] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/runner/claim":
            await super().__call__(scope, receive, send)
            return
        status = 0
        gzipped = False
        body = bytearray()

        async def noting(message: Message) -> None:
            nonlocal status, gzipped
            if message["type"] == "http.response.start":
                status = message["status"]
                gzipped = any(
                    k.lower() == b"content-encoding" and v.lower() == b"gzip" for k, v in message["headers"]
                )
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if not message.get("more_body", False) and status == 200:
                    self._note(bytes(body), gzipped)
            await send(message)

        await super().__call__(scope, receive, noting)

    def _note(self, body: bytes, gzipped: bool) -> None:
        now = time.time()
        with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
            answer = json.loads(gzip.decompress(body) if gzipped else body)
            self.claim_answered.setdefault(str(answer["deployment"]["id"]), now)


# --- real managed runners ---------------------------------------------------------------------------


class RealRunners:
    """``po-runner managed`` processes, each in a session of its own; stopped by PID."""

    def __init__(self, tmp: Path, url: str, count: int) -> None:
        self.tmp, self.url, self.count = tmp, url, count
        self.processes: list[subprocess.Popen[bytes]] = []
        self.killed: list[int] = []

    def start(self) -> None:
        executable = shutil.which("po-runner", path=launch.VENV_BIN)
        if executable is None:
            raise api.BenchError(f"no `po-runner` console script in {launch.VENV_BIN}: run `uv sync`")
        for n in range(self.count):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PO_", "RUNNER_"))}
            env |= {
                "RUNNER_URL": self.url,
                "RUNNER_MANAGED_SECRET": SECRET,
                "RUNNER_NAME": f"bench-real-{n}",
                "RUNNER_WORK_DIR": str(self.tmp / f"real-{n}"),
                # A deployment's po-runner gets only the claim's environment and the runner's PATH, so no
                # IAC_BACKEND: without tofu or terraform on its PATH it picks the embedded engine, as the
                # local baseline (IAC_BACKEND=embedded) does; "completed" then compares like with like.
                "PATH": ENGINELESS_PATH,
            }
            with (self.tmp / f"real-{n}.log").open("wb") as log:
                self.processes.append(
                    subprocess.Popen(
                        [executable, "managed"],
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def stop(self) -> None:
        """SIGTERM to each runner's process group, SIGKILL to those left after the timeout."""
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + RUNNER_STOP_TIMEOUT_S
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            if process.poll() is None:
                self.killed.append(process.pid)
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.processes = []

    def log_tail(self) -> str:
        return "\n".join(
            f"{p.name}: {p.read_text(errors='replace')[-1500:]}" for p in sorted(self.tmp.glob("real-*.log"))
        )


# --- set-up -----------------------------------------------------------------------------------------


def set_up(client: httpx.Client, bootstrap_token: str, shared: launch.Shared, options: Options) -> None:
    """bench/launch.py's org and vm-local project; project ``managed`` and a runner rule to the Managed
    pool; an environment per backlog deployment (one deployment at a time runs in an environment)."""
    launch.set_up(client, bootstrap_token, [launch.VmLocal(shared)])
    base = f"/orgs/{ORG}"
    posts: list[tuple[str, dict[str, Any]]] = [
        (f"{base}/projects/{BASELINE}/envs", {"id": f"b{n}", "env_type_id": launch.ENV_TYPE})
        for n in range(options.local_backlog)
    ]
    posts += [
        (f"{base}/projects", {"id": MANAGED}),
        (f"{base}/projects/{MANAGED}/envs", {"id": ENV, "env_type_id": launch.ENV_TYPE}),
        (f"{base}/runner-rules", {"runner_id": MANAGED, "project_id": MANAGED}),
    ]
    posts += [
        (f"{base}/projects/{MANAGED}/envs", {"id": f"b{n}", "env_type_id": launch.ENV_TYPE})
        for n in range(options.backlog)
    ]
    posts += [
        (f"{base}/projects/{MANAGED}/envs", {"id": f"c{n}", "env_type_id": launch.ENV_TYPE})
        for n in range(options.local_backlog)
    ]
    for path, body in posts:
        response = client.post(path, json=body)
        if response.status_code != 201:
            raise api.BenchError(f"POST {path}: {response.status_code} {response.text[:500]}")


def manifest(trigger: str) -> dict[str, Any]:
    return {
        "workloads": {
            "bench": {"resources": {"one": {"type": launch.RESOURCE_TYPE, "params": {"trigger": trigger}}}}
        }
    }


def create(client: httpx.Client, project: str, env: str, trigger: str) -> str:
    body = {"project_id": project, "env_id": env, "mode": "deploy", "manifest": manifest(trigger)}
    response = client.post(f"/orgs/{ORG}/deployments", json=body)
    if response.status_code != 201:
        raise api.BenchError(
            f"POST deployment ({project}/{env}): {response.status_code} {response.text[:500]}"
        )
    return str(response.json()["id"])


# --- phase 1: latency -------------------------------------------------------------------------------


def latency(
    client: httpx.Client, proxy: ClaimRecordingProxy, options: Options, deadline: float
) -> tuple[list[launch.Sample], dict[str, float | None], bool]:
    """Deployments alternately on vm-local and the Managed pool, one at a time; answers the samples, the
    claim answer per managed deployment (seconds after the POST answer), and whether the time ran out."""
    samples: list[launch.Sample] = []
    claims: dict[str, float | None] = {}
    rounds = [("warmup", n) for n in range(options.warmup)] + [("run", n) for n in range(options.runs)]
    for phase, n in rounds:
        if time.monotonic() > deadline:
            return samples, claims, True
        for target in (BASELINE, MANAGED):
            sample = launch.deploy_one(client, proxy, target, phase, n)
            samples.append(sample)
            if target == MANAGED:
                answered = proxy.claim_answered.get(sample.deployment_id)
                claims[sample.deployment_id] = None if answered is None else answered - sample.post_answered
            if sample.ok:
                say(f"   {phase} {n} {target}: started {sample.started_s() * 1000:.0f} ms")
            else:
                say(f"   {phase} {n} {target}: {sample.status.upper()}: {sample.message[:300]}")
    return samples, claims, False


# --- phase 2: throughput ----------------------------------------------------------------------------


@dataclass
class Drain:
    """What the pollers saw while draining the backlog."""

    backlog: set[str]
    #: False while the deployments are still being created (a burst): not done before they all are.
    created: bool = True
    claimed: Counter[str] = field(default_factory=Counter)
    claim_latencies: list[float] = field(default_factory=list)
    empty_polls: int = 0
    pollers: int = 0
    #: Pollers past their registration (registered, or failed to); all_ready when all are.
    ready: int = 0
    all_ready: asyncio.Event = field(default_factory=asyncio.Event)
    errors: Counter[str] = field(default_factory=Counter)
    started: float = 0.0
    #: How long ``make`` took (its POSTs), when it was given.
    created_s: float = 0.0
    last_claim: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def note_claim(self, deployment_id: str, sent: float, now: float) -> None:
        self.claimed[deployment_id] += 1
        self.claim_latencies.append(now - sent)
        self.last_claim = max(self.last_claim, now)
        self.check_done()

    def check_done(self) -> None:
        if self.created and self.backlog <= set(self.claimed):
            self.done.set()


async def poll(server_url: str, n: int, drain: Drain, go: asyncio.Event, deadline: float) -> None:
    client = ManagedClient(server_url, timeout_seconds=60.0)
    try:
        try:
            registration = await client.register(secret=SECRET, name=f"bench-poller-{n}", tags=[])
        finally:
            drain.ready += 1
            if drain.ready >= drain.pollers:
                drain.all_ready.set()
        await go.wait()
        while not drain.done.is_set() and time.monotonic() < deadline:
            sent = time.monotonic()
            try:
                claim = await client.claim(registration.token, wait_seconds=POLL_WAIT_SECONDS)
                if claim is None:
                    drain.empty_polls += 1
                    continue
                answered = time.monotonic()
                # Reported before the claim counts: the pollers are cancelled once all are counted.
                await client.finished(registration.token, claim.deployment.id, 0)
                drain.note_claim(claim.deployment.id, sent, answered)
            except ClientError as exc:
                drain.errors[str(exc)[:200]] += 1
                await asyncio.sleep(0.2)
    finally:
        await client.aclose()


async def drain_backlog(
    server_url: str,
    backlog: set[str],
    pollers: int,
    deadline: float,
    make: Callable[[], set[str]] | None = None,
) -> Drain:
    """The pollers claim ``backlog``, or with ``make``, the deployments it creates (in a thread) while
    they poll; the clock starts when they are all registered (and before ``make``'s first POST)."""
    drain = Drain(backlog=backlog, pollers=pollers, created=make is None)
    go = asyncio.Event()
    tasks = [asyncio.create_task(poll(server_url, n, drain, go, deadline)) for n in range(pollers)]
    # Every poller registered (or failed to) before the clock starts.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(drain.all_ready.wait(), max(1.0, deadline - time.monotonic()))
    drain.started = time.monotonic()
    go.set()
    if make is not None:
        drain.backlog = await asyncio.to_thread(make)
        drain.created_s = time.monotonic() - drain.started
        drain.created = True
        drain.check_done()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(drain.done.wait(), max(1.0, deadline - time.monotonic()))
    # Pollers still in a long poll are cancelled: nothing is queued any more.
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            drain.errors[f"poller: {str(result)[:200]}"] += 1
    return drain


def local_burst(client: httpx.Client, count: int) -> dict[str, Any]:
    """``count`` deployments created at once on vm-local (one per environment), waited for."""
    first_sent = time.time()
    ids = [create(client, BASELINE, f"b{n}", f"burst-{n}") for n in range(count)]
    created_s = time.time() - first_sent
    launched: list[float] = []
    failed = 0
    for deployment_id in ids:
        final: dict[str, Any] | None = None
        deadline = time.monotonic() + launch.DEPLOY_TIMEOUT_S
        url = f"/orgs/{ORG}/deployments/{deployment_id}/actions/wait-for-complete"
        while final is None and time.monotonic() < deadline:
            response = client.get(url, params={"timeout_in_seconds": 20}, timeout=60)
            if response.status_code == 200:
                final = response.json()
        stamp = None if final is None else launch._stamp(final.get("launched_at"))
        if final is None or final["status"] != "succeeded" or stamp is None:
            failed += 1
        if stamp is not None:
            launched.append(stamp)
    span = (max(launched) - first_sent) if launched else None
    return {
        "deployments": count,
        "failed": failed,
        "create_s": round(created_s, 3),
        "all_launched_s": None if span is None else round(span, 3),
        "launches_per_s": None if not span else round(len(launched) / span, 2),
    }


def throughput(client: httpx.Client, server_url: str, options: Options, deadline: float) -> dict[str, Any]:
    say(f"-- local launcher: {options.local_backlog} deployments created at once")
    local = local_burst(client, options.local_backlog)
    say(f"-- managed: {options.local_backlog} deployments created at once, {options.pollers} pollers")
    burst = asyncio.run(
        drain_backlog(
            server_url,
            set(),
            options.pollers,
            max(deadline, time.monotonic() + 60),
            lambda: {create(client, MANAGED, f"c{n}", f"burst-{n}") for n in range(options.local_backlog)},
        )
    )
    burst_span = (burst.last_claim - burst.started) if burst.claimed else None
    managed_burst: dict[str, Any] = {
        "pollers": options.pollers,
        "deployments": options.local_backlog,
        "claimed": sum(burst.claimed.values()),
        "claimed_twice": sorted(d for d, n in burst.claimed.items() if n > 1),
        "never_claimed": len(burst.backlog - set(burst.claimed)),
        "create_s": round(burst.created_s, 3),
        "claim_request_s": launch.summary(burst.claim_latencies),
        "empty_polls": burst.empty_polls,
        "all_claimed_s": None if burst_span is None else round(burst_span, 3),
        "claims_per_s": None if not burst_span else round(len(burst.claimed) / burst_span, 2),
        "errors": dict(burst.errors),
    }
    managed_burst["claims_per_s_x_local"] = launch.ratio(
        managed_burst["claims_per_s"], local["launches_per_s"]
    )
    say(f"-- managed: a backlog of {options.backlog}, then {options.pollers} pollers")
    created = time.monotonic()
    backlog = {create(client, MANAGED, f"b{n}", f"backlog-{n}") for n in range(options.backlog)}
    create_s = time.monotonic() - created
    drain = asyncio.run(
        drain_backlog(server_url, backlog, options.pollers, max(deadline, time.monotonic() + 60))
    )
    span = (drain.last_claim - drain.started) if drain.claimed else None
    twice = sorted(d for d, n in drain.claimed.items() if n > 1)
    never = sorted(backlog - set(drain.claimed))
    managed: dict[str, Any] = {
        "pollers": options.pollers,
        "backlog": options.backlog,
        "create_s": round(create_s, 3),
        "creates_per_s": round(options.backlog / create_s, 2),
        "claimed": sum(drain.claimed.values()),
        "claimed_twice": twice,
        "never_claimed": len(never),
        "drain_s": None if span is None else round(span, 3),
        "claims_per_s": None if not span else round(len(drain.claimed) / span, 2),
        "claim_request_s": launch.summary(drain.claim_latencies),
        "empty_polls": drain.empty_polls,
        "errors": dict(drain.errors),
    }
    managed["claims_per_s_x_local"] = launch.ratio(managed["claims_per_s"], local["launches_per_s"])
    managed["claims_per_s_x_creates"] = launch.ratio(managed["claims_per_s"], managed["creates_per_s"])
    return {"local": local, "managed_burst": managed_burst, "managed": managed}


# --- report -----------------------------------------------------------------------------------------


def latency_rows(samples: Sequence[launch.Sample], claims: dict[str, float | None]) -> dict[str, Any]:
    rows = launch.analyse(samples, [BASELINE, MANAGED])
    measured = [s.deployment_id for s in samples if s.type == MANAGED and s.phase == "run"]
    values = [v for d, v in claims.items() if d in measured and v is not None]
    rows[MANAGED]["claim_s"] = launch.summary(values)
    rows[BASELINE]["claim_s"] = launch.summary([])
    for row in rows.values():
        row.pop("first_launch_call_s", None)
    return rows


def report(result: dict[str, Any]) -> str:
    lines: list[tuple[str, ...]] = [
        (
            "database",
            "latency (ms)",
            "n",
            "failed",
            "claim p50",
            "started p50",
            "p90",
            "x local",
            "completed p50",
            "x local",
        )
    ]
    for database, run in result["databases"].items():
        for name, row in run["latency"].items():
            lines.append(
                (
                    database,
                    name,
                    str(row["deployments"]),
                    str(row["failed"]),
                    launch._ms(row["claim_s"]["p50"]),
                    launch._ms(row["started_s"]["p50"]),
                    launch._ms(row["started_s"]["p90"]),
                    launch._x(row["started_x_local"]),
                    launch._ms(row["completed_s"]["p50"]),
                    launch._x(row["completed_x_local"]),
                )
            )
    text = deploy.table(lines) + "\n\n"
    lines = [
        (
            "database",
            "throughput",
            "n",
            "per s",
            "x local",
            "claim req p50 ms",
            "p90",
            "errors",
            "twice",
            "never",
            "failed",
        )
    ]
    for database, run in result["databases"].items():
        local, managed = run["throughput"]["local"], run["throughput"]["managed"]
        lines.append(
            (
                database,
                f"{BASELINE} burst",
                str(local["deployments"]),
                f"{local['launches_per_s'] or 0:.1f}",
                "1.00",
                "-",
                "-",
                "-",
                "-",
                "-",
                str(local["failed"]),
            )
        )
        burst = run["throughput"]["managed_burst"]
        lines.append(
            (
                database,
                f"{MANAGED} burst, {burst['pollers']} pollers",
                str(burst["deployments"]),
                f"{burst['claims_per_s'] or 0:.1f}",
                launch._x(burst["claims_per_s_x_local"]),
                "-",
                "-",
                str(sum(burst["errors"].values())),
                str(len(burst["claimed_twice"])),
                str(burst["never_claimed"]),
                "-",
            )
        )
        lines.append(
            (
                database,
                f"{MANAGED} drain, {managed['pollers']} pollers",
                str(managed["backlog"]),
                f"{managed['claims_per_s'] or 0:.1f}",
                launch._x(managed["claims_per_s_x_local"]),
                launch._ms(managed["claim_request_s"]["p50"]),
                launch._ms(managed["claim_request_s"]["p90"]),
                str(sum(managed["errors"].values())),
                str(len(managed["claimed_twice"])),
                str(managed["never_claimed"]),
                "-",
            )
        )
    return text + deploy.table(lines)


MEASURED = (
    "latency, from the POST /deployments answer: claim = the 200 answer of the runner's POST /runner/claim "
    "passed on by the proxy; started = the runner's first gateway request (its bundle) at the proxy; "
    "completed = completed_at; x local = p50 / vm-local's p50 in this run (real po-runner managed vs the "
    "local launcher, one deployment at a time). throughput, with lightweight pollers that report finished "
    "at once: burst = n / (first POST sent -> last launched_at, or last claimed) of deployments created one "
    "after the other as fast as the API takes them (vm-local's are real runs); drain = backlog / (first "
    "claim sent -> last claimed) of deployments created before the pollers start; claim req = one claim "
    "request's time; x local = per s / the vm-local burst's per s in this run."
)


# --- the run ----------------------------------------------------------------------------------------


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def serving_server(
    tmp: Path, database: str, options: Options, bootstrap_token: str
) -> Iterator[tuple[launch.LaunchServer, ClaimRecordingProxy, launch.Shared]]:
    with contextlib.ExitStack() as stack:
        database_url = None
        if database == "postgresql":
            database_url, _ = stack.enter_context(api.postgres_database(tmp / "pg"))
        proxy_socket = launch.bound_socket()
        stack.callback(proxy_socket.close)
        tf_config = tmp / "terraformrc"
        tf_config.touch()
        shared = launch.Shared(
            tmp=tmp,
            public_url=f"http://127.0.0.1:{proxy_socket.getsockname()[1]}",
            engine_env={
                "IAC_BACKEND": "embedded",
                "TF_CLI_CONFIG_FILE": str(tf_config),
                "CHECKPOINT_DISABLE": "1",
            },
        )
        server = launch.LaunchServer(
            data_dir=tmp / "data",
            database_url=database_url,
            bootstrap_token=bootstrap_token,
            environment={
                "PO_PUBLIC_URL": shared.public_url,
                "PO_ALLOW_LOCAL_RUNNERS": "true",
                "PO_LOCAL_RUN_USER": "",
                "PO_LOCAL_RUNS_DIR": str(tmp / "runs"),
                "PO_RUNNER_DENIED_NETWORKS": "",
                "MANAGED_RUNNER_SECRET": SECRET,
            },
        )
        stack.callback(_keep_log, server, options, database)
        stack.callback(server.stop)
        server.start()
        proxy = ClaimRecordingProxy(server.base_url)
        stack.enter_context(launch.serving(proxy, proxy_socket))
        yield server, proxy, shared


def run_one(database: str, options: Options, deadline: float) -> dict[str, Any]:
    bootstrap_token = "po_bench_" + os.urandom(16).hex()
    killed: list[int] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="po-bench-managed-")))
        # Runs of the real runners execute as uids of their own (RUNNER_RUN_UIDS, as root): they pass
        # through to their work directories, and read nothing else here.
        tmp.chmod(0o711)
        server, proxy, shared = stack.enter_context(serving_server(tmp, database, options, bootstrap_token))
        stack.callback(lambda: killed.extend(launch.wait_for_runs([tmp / "runs"])))
        client = stack.enter_context(httpx.Client(base_url=server.base_url, timeout=60))
        set_up(client, bootstrap_token, shared, options)
        runners = RealRunners(tmp, shared.public_url, options.real_runners)
        stack.callback(lambda: killed.extend(runners.killed))
        stack.callback(runners.stop)
        runners.start()
        say(
            f"-- {database}: {options.real_runners} real po-runner managed; {options.warmup} warm-up and "
            f"{options.runs} measured deployment(s) each on {BASELINE} and {MANAGED}, one at a time"
        )
        samples, claims, capped = latency(client, proxy, options, deadline)
        runners.stop()
        if any(not s.ok for s in samples if s.type == MANAGED):
            say(runners.log_tail())
        measured = throughput(client, server.base_url, options, deadline)
    rows = latency_rows(samples, claims)
    return {
        "capped": capped,
        "latency": rows,
        "throughput": measured,
        "failures": [asdict(s) for s in samples if not s.ok],
        "processes_killed_at_exit": killed,
        "samples": [asdict(s) | {"claim_s": claims.get(s.deployment_id)} for s in samples],
    }


def run(options: Options) -> dict[str, Any]:
    started = time.monotonic()
    load_before = os.getloadavg()
    deadline = time.monotonic() + options.max_seconds
    databases = {database: run_one(database, options, deadline) for database in options.databases}
    return {
        "benchmark": "managed",
        "measured": MEASURED,
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
        "options": {
            k: v for k, v in asdict(options).items() if k not in ("json", "results_dir", "databases")
        },
        "databases": databases,
    }


def failed(result: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    for database, run_ in result["databases"].items():
        problems += [
            f"{database}: {f['type']} {f['deployment_id']}: {f['message']}" for f in run_["failures"]
        ]
        local = run_["throughput"]["local"]
        if local["failed"]:
            problems.append(f"{database}: {local['failed']} local burst deployment(s) failed")
        for phase in ("managed_burst", "managed"):
            managed = run_["throughput"][phase]
            if managed["errors"]:
                problems.append(f"{database} {phase}: claim errors: {managed['errors']}")
            if managed["claimed_twice"] or managed["never_claimed"]:
                problems.append(
                    f"{database} {phase}: claimed twice {managed['claimed_twice']}, "
                    f"never {managed['never_claimed']}"
                )
    return problems


def _keep_log(server: launch.LaunchServer, options: Options, database: str) -> None:
    if server.log_path.exists():
        options.results_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(server.log_path, options.results_dir / f"managed-{database}-server.log")


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="sqlite")
    parser.add_argument("--runs", type=int, default=8, help="measured deployments per side (default 8)")
    parser.add_argument("--warmup", type=int, default=1, help="deployments per side first, not counted (1)")
    parser.add_argument("--real-runners", type=int, default=2, help="po-runner managed processes (2)")
    parser.add_argument("--pollers", type=int, default=50, help="lightweight pollers for throughput (50)")
    parser.add_argument("--backlog", type=int, default=200, help="managed deployments to drain (200)")
    parser.add_argument(
        "--local-backlog", type=int, default=10, help="local deployments created at once (10)"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=600.0,
        help="no new latency round starts after this, and the pollers stop (default 600)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=api.RESULTS_DIR,
        help="where managed.json and the servers' logs are written (default bench/results)",
    )
    args = parser.parse_args(argv)
    if not (
        1 <= args.runs <= launch.MAX_RUNS
        and args.warmup >= 0
        and 1 <= args.real_runners <= 8
        and 1 <= args.pollers <= MAX_POLLERS
        and 1 <= args.backlog <= MAX_BACKLOG
        and 1 <= args.local_backlog <= 50
        and args.max_seconds > 0
    ):
        parser.error(
            f"need 1 <= --runs <= {launch.MAX_RUNS}, --warmup >= 0, 1 <= --real-runners <= 8, "
            f"1 <= --pollers <= {MAX_POLLERS}, 1 <= --backlog <= {MAX_BACKLOG}, "
            "1 <= --local-backlog <= 50, --max-seconds > 0"
        )
    databases = ("sqlite", "postgresql") if args.database == "both" else (args.database,)
    return Options(
        databases=databases,
        runs=args.runs,
        warmup=args.warmup,
        real_runners=args.real_runners,
        pollers=args.pollers,
        backlog=args.backlog,
        local_backlog=args.local_backlog,
        max_seconds=args.max_seconds,
        json=args.json,
        results_dir=args.results_dir,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, api._stop_on_sigterm)
    try:
        result = run(options)
    except api.BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the server, the runners and the pollers were stopped", file=sys.stderr)
        return 130
    options.results_dir.mkdir(parents=True, exist_ok=True)
    path = options.results_dir / "managed.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    problems = failed(result)
    if options.json:
        print(json.dumps(result, indent=2))
    else:
        load = result["machine"]
        print(report(result))
        print()
        print(MEASURED)
        print(
            f"{os.cpu_count()} CPUs shared by the bench (proxy, pollers), the server, the runners and "
            f"anything else; load average before {api._load(load['load_average_1_5_15_min_before'])}, after "
            f"{api._load(load['load_average_1_5_15_min_after'])}; {result['seconds']:.0f} s"
        )
        for problem in problems:
            print(f"FAILED {problem}")
        print(f"wrote {path}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
