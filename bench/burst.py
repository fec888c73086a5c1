"""Burst benchmark: N deployments created at once on the local launcher, and the create path alone.

    uv run python bench/burst.py [--deployments 100] [--concurrency 16] [--database sqlite|postgresql|both]
                                 [--floor-runs 3] [--only burst|creates] [--creates 1000] [--json]
                                 [--local-runs cold,warm,zygote] [--engine embedded|terraform|opentofu]

One `orchestrator serve` (a child process, fresh data dir; SQLite or a throwaway PostgreSQL), an org set up
through the API: a `vm` runner with a local connection (the embedded engine, `po-terraform`, or the
`--engine` binary on PATH), orchestrator state, a module of one `terraform_data` resource, and one
environment per deployment. Then:

1. burst: N deployments (one per environment) created by `--concurrency` concurrent `POST /deployments`,
   all at once, then waited for (one list request a second). Measured: deployments per minute (N over
   first POST sent -> last `completed_at`), `created_at -> completed_at` p50/p99, the create call's
   latency p50/p99, errors (a create not answered 201, a deployment not succeeded), and the CPU seconds
   per deployment (from /proc) of the server, of the runners (`po-runner standard`) and of the engine
   processes they start, next to the floor: the engine's own CPU for the same compiled module applied
   directly (`init` + `apply`, local backend), and for the engine steps the runner runs, measured
   in the same run with the server idle;
2. creates: `--creates` deployments created by `--concurrency` concurrent POSTs into a project whose
   runner is the Managed pool with no runner polling, so nothing runs: creates per second, latency
   p50/p99, errors and server CPU per create (the create path alone: compile, bundle, insert).

It prints a table and writes bench/results/burst-<database>.json. See bench/README.md for how to read it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import api
import deploy
import httpx
import launch

from orchestrator.dispatch import bundles
from orchestrator.secretbox import SecretBox, load_or_create_key

ROOT = api.ROOT
RESULTS_DIR = api.RESULTS_DIR
ORG = "bench"
PROJECT = "burst"
CREATES_PROJECT = "creates"
ENV_TYPE = "bench-env"
RESOURCE_TYPE = "burst-one"
RUNNER = "local"
MANAGED = "managed"
SECRET = "bench-burst-managed-runner-secret-" + "0123456789abcdefghijklmnopqrstuvwxyz"
#: Creates before the measured ones (not counted). Each create has an environment of its own: one
#: deployment at a time executes in an environment, and a create while one does is refused (409).
WARM_CREATES = 100
BURST_TIMEOUT_S = 900.0
#: How often the sampler reads /proc for the server's descendants (runners and their engine processes).
SAMPLE_INTERVAL_S = 0.05
POLL_INTERVAL_S = 1.0
#: The issue's targets (issue 14), printed next to the results.
TARGET_CREATES_PER_S = 400.0
TARGET_CREATE_P99_MS = 50.0
TARGET_CREATED_TO_COMPLETED_P50_S = 3.0
#: ``--local-runs``: the server settings of each way a local run can start.
LOCAL_RUNS: dict[str, dict[str, str]] = {
    # A fresh `po-runner standard` process per deployment.
    "cold": {"PO_LOCAL_ZYGOTE": "off", "PO_LOCAL_WARM_RUNNERS": "0"},
    # Runner processes started and imported ahead, one per deployment.
    "warm": {"PO_LOCAL_ZYGOTE": "off", "PO_LOCAL_WARM_RUNNERS": "2"},
    # One runner imported once, forked per deployment (launchers.zygote).
    "zygote": {"PO_LOCAL_ZYGOTE": "auto"},
}


@dataclass(frozen=True, kw_only=True)
class Options:
    databases: tuple[str, ...]
    deployments: int
    concurrency: int
    creates: int
    floor_runs: int
    only: str | None
    replicas: int
    local_run_limit: int | None
    json: bool
    #: How local runs start, one burst each (``LOCAL_RUNS``); empty: the server's default.
    local_runs: tuple[str, ...] = ()
    #: The runner's engine (``IAC_BACKEND``): embedded, terraform or opentofu (the binary on PATH).
    engine: str = "embedded"
    results_dir: Path = RESULTS_DIR


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- CPU from /proc --------------------------------------------------------------------------------


def _stat(pid: int | str) -> list[str] | None:
    try:
        return api._stat_fields(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None


def _ticks(fields: list[str], *first: int) -> float:
    return sum(int(fields[i]) for i in first) / os.sysconf("SC_CLK_TCK")


def self_cpu(fields: list[str]) -> float:
    """utime + stime (fields 14, 15; index 11, 12 after the name)."""
    return _ticks(fields, 11, 12)


def reaped_cpu(fields: list[str]) -> float:
    """cutime + cstime: the CPU of the children it waited for, theirs included (fields 16, 17)."""
    return _ticks(fields, 13, 14)


@dataclass
class Seen:
    """The last reading of one process: its own CPU, that of the children it reaped, its runner."""

    self_s: float = 0.0
    reaped_s: float = 0.0
    runner: tuple[int, int] | None = None


class DescendantSampler:
    """Reads /proc every ``SAMPLE_INTERVAL_S`` for the server's descendants: its children are runners
    (`po-runner standard`, each in a session of its own) or the zygote (`po-runner zygote`, whose children
    are the runners it forked), the runners' descendants the engine. Keyed by (pid, start time), so a
    recycled pid is a new process.

    The total CPU of runners and engine is exact (the server's cutime + cstime once every run was
    reaped, plus the live zygotes' own CPU and what they reaped: ``zygotes_s``); the split between them
    is sampled: a runner's engine CPU is the larger of the CPU its runner had reaped when last seen and
    the sum of its engine processes' CPU when last seen, so the engine's share can be under-counted by at
    most one sample interval per engine process.
    """

    def __init__(self, server_pids: Sequence[int]) -> None:
        self.server_pids = set(server_pids)
        self.seen: dict[tuple[int, int], Seen] = {}
        #: Per live zygote: its CPU and that of the runners it reaped, when last seen.
        self.zygotes: dict[tuple[int, int], float] = {}
        #: Per runner process: the deployment it runs (its DEPLOYMENT_ID), to find deployments run twice.
        self.deployment_of: dict[tuple[int, int], str] = {}
        self.alive: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_INTERVAL_S)

    def sample(self) -> None:
        table: dict[int, list[str]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                fields = _stat(entry.name)
                if fields is not None:
                    table[int(entry.name)] = fields
        alive: set[tuple[int, int]] = set()
        zygotes: dict[tuple[int, int], float] = {}
        for pid, fields in table.items():
            chain = [pid]
            parent = int(fields[1])
            while parent not in self.server_pids and parent > 1 and parent in table and len(chain) < 16:
                chain.append(parent)
                parent = int(table[parent][1])
            if parent not in self.server_pids:
                continue
            if is_zygote(chain[-1]):
                if len(chain) == 1:
                    zygotes[(pid, int(fields[19]))] = self_cpu(fields) + reaped_cpu(fields)
                    continue  # not a run: where runs are forked from
                chain.pop()
            runner_pid = chain[-1]
            if _idle_warm_runner(runner_pid):
                continue  # started ahead, no deployment yet (PO_LOCAL_WARM_RUNNERS): counted once handed one
            runner_key = (runner_pid, int(table[runner_pid][19]))
            key = (pid, int(fields[19]))
            seen = self.seen.setdefault(key, Seen())
            seen.self_s, seen.reaped_s = self_cpu(fields), reaped_cpu(fields)
            seen.runner = None if key == runner_key else runner_key
            if key == runner_key and self.deployment_of.get(key, "?") == "?":
                self.deployment_of[key] = _deployment_of(pid)
            alive.add(key)
        self.alive = alive
        self.zygotes = zygotes

    def zygotes_s(self) -> float:
        """The CPU of the live zygotes and of the runners they reaped (a zygote that exited is in the
        server's cutime: the server waits for it)."""
        return sum(self.zygotes.values())

    def split(self) -> tuple[float, int]:
        """Engine CPU seconds (see the class), and how many runner processes were seen."""
        runners = {key for key, seen in self.seen.items() if seen.runner is None}
        engines: dict[tuple[int, int], float] = {key: 0.0 for key in runners}
        for seen in self.seen.values():
            if seen.runner is not None and seen.runner in engines:
                engines[seen.runner] += seen.self_s
        total = sum(max(self.seen[key].reaped_s, engines[key]) for key in runners)
        return total, len(runners)


def _deployment_of(pid: int) -> str:
    """The DEPLOYMENT_ID in a runner's environment (nothing else of it is kept: it holds its token); for a
    warm runner, whose environment was set after it started, the run directory it works in
    (``<runs dir>/<deployment id>/work``)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return "?"
    for entry in environ.split(b"\0"):
        if entry.startswith(b"DEPLOYMENT_ID="):
            return entry.split(b"=", 1)[1].decode(errors="replace")
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return "?"
    return cwd.parent.name if cwd.name == "work" else "?"


def is_zygote(pid: int) -> bool:
    """The server's child ``po-runner zygote`` (its forked runners have its command line too: only the
    server's child is the zygote)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"orchestrator.cli.runner" in command and b"zygote" in command


def _idle_warm_runner(pid: int) -> bool:
    """A warm runner (``po-runner warm``) still waiting for its deployment: in ``/``, where it starts."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return b"warm" in command and os.readlink(f"/proc/{pid}/cwd") == "/"
    except OSError:
        return False


def machine_cpu() -> tuple[float, float]:
    """Busy and idle CPU seconds of the whole machine so far (all CPUs; /proc/stat's first line): with
    ours, what shows whether the burst left CPUs idle or other work had them."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, idle / tick


@dataclass
class CpuReading:
    server_s: float
    children_s: float
    postgres_s: float


def read_cpu(server_pids: Sequence[int], postmaster_pid: int | None) -> CpuReading:
    """The servers' own CPU and that of the runs they reaped, summed; PostgreSQL's."""
    total = CpuReading(0.0, 0.0, math.nan)
    for pid in server_pids:
        fields = _stat(pid)
        if fields is None:
            return CpuReading(math.nan, math.nan, math.nan)
        total.server_s += self_cpu(fields)
        total.children_s += reaped_cpu(fields)
    total.postgres_s = api.CpuMeter(server_pid=server_pids[0], postmaster_pid=postmaster_pid).read()[1]
    return total


# --- set-up ----------------------------------------------------------------------------------------


def env_ids(count: int, prefix: str = "e") -> list[str]:
    return [f"{prefix}{n}" for n in range(count)]


def set_up(
    client: httpx.Client, bootstrap_token: str, options: Options, engine_env: Mapping[str, str]
) -> None:
    admin = {"authorization": f"Bearer {bootstrap_token}"}

    def post(path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> Any:
        response = client.post(path, json=body, headers=headers)
        if response.status_code != 201:
            raise api.BenchError(f"POST {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    post("/orgs", {"id": ORG}, admin)
    token = post(f"/orgs/{ORG}/tokens", {"role": "admin"}, admin)
    client.headers["authorization"] = f"Bearer {token['token']}"
    base = f"/orgs/{ORG}"
    post(f"{base}/env-types", {"id": ENV_TYPE})
    post(
        f"{base}/resource-types",
        {
            "id": RESOURCE_TYPE,
            "description": "one terraform_data resource",
            "output_schema": {"type": "object", "properties": {"value": {"type": "string"}}},
        },
    )
    post(
        f"{base}/modules",
        {
            "id": RESOURCE_TYPE,
            "description": "one terraform_data resource whose input is the trigger",
            "resource_type": RESOURCE_TYPE,
            "module_source": "inline",
            "module_params": {"trigger": {"type": "string", "description": "changes on every deployment"}},
            "module_source_code": launch.MODULE,
        },
    )
    post(f"{base}/module-rules", {"module_id": RESOURCE_TYPE})
    runner = {
        "id": RUNNER,
        "runner_configuration": {
            "type": "vm",
            "connection": {"type": "local"},
            "job": {"runtime": "process", "environment": dict(engine_env)},
        },
        "state_storage_configuration": {"type": "orchestrator"},
    }
    post(f"{base}/runners", runner, admin)
    post(f"{base}/projects", {"id": PROJECT})
    post(f"{base}/runner-rules", {"runner_id": RUNNER, "project_id": PROJECT})
    post(f"{base}/projects", {"id": CREATES_PROJECT})
    post(f"{base}/runner-rules", {"runner_id": MANAGED, "project_id": CREATES_PROJECT})
    envs = [(PROJECT, env) for env in env_ids(options.deployments)] if options.only != "creates" else []
    if options.only != "burst":
        envs += [(CREATES_PROJECT, env) for env in env_ids(options.creates + WARM_CREATES, "c")]
    asyncio.run(create_envs(str(client.base_url), token["token"], envs))


async def create_envs(base_url: str, token: str, envs: Sequence[tuple[str, str]]) -> None:
    """The environments, 16 requests at a time (a deployment executes alone in its environment)."""
    queue = iter(envs)
    headers = {"authorization": f"Bearer {token}"}

    async def worker(client: httpx.AsyncClient) -> None:
        for project, env in queue:
            path = f"/orgs/{ORG}/projects/{project}/envs"
            response = await client.post(path, json={"id": env, "env_type_id": ENV_TYPE})
            if response.status_code != 201:
                raise api.BenchError(f"POST {path}: {response.status_code} {response.text[:500]}")

    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as client:
        await asyncio.gather(*(worker(client) for _ in range(16)))


def manifest(trigger: str) -> dict[str, Any]:
    return {
        "workloads": {
            "bench": {"resources": {"one": {"type": RESOURCE_TYPE, "params": {"trigger": trigger}}}}
        }
    }


# --- creating ----------------------------------------------------------------------------------------


@dataclass
class Creates:
    sent: dict[str, float] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    first_sent: float = math.nan
    last_answered: float = math.nan
    server_errors: int = 0

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def create_all(
    base_urls: Sequence[str],
    token: str,
    targets: Sequence[tuple[str, str]],
    concurrency: int,
    tag: str,
    *,
    extra_body: Mapping[str, Any] | None = None,
) -> Creates:
    """POST one deployment per (project, env) of ``targets``, ``concurrency`` at a time (worker n sends
    to server n modulo the number of servers); ``extra_body``: more fields of every body (e.g.
    ``encrypted_logs_recipient``)."""
    result = Creates()
    queue = iter(enumerate(targets))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(client: httpx.AsyncClient) -> None:
        for n, (project, env) in queue:
            body = {
                "project_id": project,
                "env_id": env,
                "mode": "deploy",
                "manifest": manifest(f"{tag}-{n}"),
                **(extra_body or {}),
            }
            before = time.perf_counter()
            wall = time.time()
            if math.isnan(result.first_sent):
                result.first_sent = wall
            try:
                response = await client.post(f"/orgs/{ORG}/deployments", json=body)
            except httpx.HTTPError as exc:
                result.error(f"{type(exc).__name__}: {str(exc)[:120]}")
                continue
            result.latencies.append(time.perf_counter() - before)
            result.last_answered = time.time()
            if response.status_code != 201:
                result.error(f"{response.status_code} {response.text[:160]}")
                if response.status_code >= 500:
                    result.server_errors += 1
                continue
            result.sent[str(response.json()["id"])] = wall

    headers = {"authorization": f"Bearer {token}"}
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits)
            )
            for url in base_urls
        ]
        await asyncio.gather(*(worker(clients[n % len(clients)]) for n in range(concurrency)))
    return result


def wait_all(
    client: httpx.Client, ids: set[str], deadline: float, *, project: str = PROJECT
) -> dict[str, dict[str, Any]]:
    """The final summaries of ``ids`` (of ``project``), read from the list one page at a time."""
    final: dict[str, dict[str, Any]] = {}
    while len(final) < len(ids) and time.monotonic() < deadline:
        page: str | None = None
        while True:
            params: dict[str, Any] = {"project_id": project, "per_page": 1000}
            if page:
                params["page"] = page
            response = client.get(f"/orgs/{ORG}/deployments", params=params)
            if response.status_code != 200:
                raise api.BenchError(f"GET deployments: {response.status_code} {response.text[:300]}")
            body = response.json()
            for item in body["items"]:
                if item["id"] in ids and item.get("completed_at"):
                    final[item["id"]] = item
            page = body.get("next_page_token")
            if not page:
                break
        if len(final) < len(ids):
            time.sleep(POLL_INTERVAL_S)
    return final


def wait_reaped(sampler: DescendantSampler, timeout: float = 60.0) -> bool:
    """Wait until the server has no descendants left (every runner reaped, so its CPU is in cutime)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sampler.sample()
        if not sampler.alive:
            return True
        time.sleep(0.2)
    return False


# --- statistics ------------------------------------------------------------------------------------


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    return deploy.summary(values) if values else {"count": 0, "p50": None, "p99": None, "max": None}


def per(value: float, count: int) -> float | None:
    return None if not count or math.isnan(value) else round(value / count, 4)


# --- 1. the burst ----------------------------------------------------------------------------------


def burst(
    client: httpx.Client,
    servers: Sequence[launch.LaunchServer],
    postmaster_pid: int | None,
    options: Options,
    *,
    project: str = PROJECT,
    envs: Sequence[str] | None = None,
    extra_body: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The burst: one deployment per environment of ``envs`` (default: ``options.deployments`` of them) in
    ``project``, created at once and waited for; ``extra_body`` as for ``create_all``."""
    token = client.headers["authorization"].removeprefix("Bearer ")
    targets = [(project, env) for env in (env_ids(options.deployments) if envs is None else envs)]
    pids = [server.pid for server in servers]
    sampler = DescendantSampler(pids)
    sampler.sample()
    zygotes_before = sampler.zygotes_s()
    sampler.start()
    before = read_cpu(pids, postmaster_pid)
    machine_before = machine_cpu()
    started = time.monotonic()
    urls = [server.base_url for server in servers]
    creates = asyncio.run(
        create_all(urls, token, targets, options.concurrency, "burst", extra_body=extra_body)
    )
    say(
        f"   {len(creates.sent)} created in {creates.last_answered - creates.first_sent:.1f} s; "
        f"waiting for them to complete"
    )
    final = wait_all(client, set(creates.sent), time.monotonic() + BURST_TIMEOUT_S, project=project)
    all_reaped = wait_reaped(sampler)
    sampler.stop()
    sampler.sample()
    after = read_cpu(pids, postmaster_pid)
    zygotes_after = sampler.zygotes_s()
    machine_after = machine_cpu()
    seconds = time.monotonic() - started
    runs: dict[str, int] = {}
    for deployment_id in sampler.deployment_of.values():
        if deployment_id != "?":  # a child of the server that is no runner, or one gone before it was read
            runs[deployment_id] = runs.get(deployment_id, 0) + 1
    count = len(creates.sent)
    succeeded = [d for d in final.values() if d["status"] == "succeeded"]
    failed = [
        {"id": d["id"], "status": d["status"], "message": d["status_message"][:300]}
        for d in final.values()
        if d["status"] != "succeeded"
    ]
    completed = [deploy.parse_time(d["completed_at"]) for d in final.values()]
    span = (max(completed) - creates.first_sent) if completed else math.nan
    engine_s, runners_seen = sampler.split()
    server_s = after.server_s - before.server_s
    children_s = after.children_s - before.children_s + zygotes_after - zygotes_before
    postgres_s = after.postgres_s - before.postgres_s
    return {
        "deployments": len(targets),
        "created": count,
        "succeeded": len(succeeded),
        "not_completed": count - len(final),
        "failed": failed,
        "create_errors": creates.errors,
        "server_errors": creates.server_errors,
        "replicas": len(servers),
        # Runner processes seen per deployment: more than one is a deployment run twice.
        "run_twice": sorted(d for d, n in runs.items() if n > 1),
        "runs_not_seen": sorted(set(creates.sent) - set(runs)),
        "seconds": round(seconds, 2),
        "span_s": round(span, 3),
        "deployments_per_minute": None
        if not succeeded or math.isnan(span)
        else round(60 * len(succeeded) / span, 1),
        "create_call_s": summary(creates.latencies),
        "created_to_completed_s": summary(
            [
                deploy.parse_time(d["completed_at"]) - deploy.parse_time(d["created_at"])
                for d in final.values()
            ]
        ),
        "created_to_launched_s": summary(
            [
                deploy.parse_time(d["launched_at"]) - deploy.parse_time(d["created_at"])
                for d in final.values()
                if d.get("launched_at")
            ]
        ),
        "cpu_s_per_deployment": {
            "server": per(server_s, count),
            "postgres": per(postgres_s, count),
            "runners": per(children_s - engine_s, count),
            "engine": per(engine_s, count),
            "runners_and_engine": per(children_s, count),
        },
        "cpu_s_total": {
            "server": round(server_s, 2),
            "postgres": None if math.isnan(postgres_s) else round(postgres_s, 2),
            "runners_and_engine": round(children_s, 2),
            "engine_sampled": round(engine_s, 2),
        },
        # The whole machine meanwhile, in CPUs (seconds per second): busy (ours and everything else's) and
        # idle; ours = the servers', the runs' and PostgreSQL's.
        "machine_cpus": {
            "busy": round((machine_after[0] - machine_before[0]) / seconds, 2),
            "idle": round((machine_after[1] - machine_before[1]) / seconds, 2),
            "ours": round(
                (server_s + children_s + (0.0 if math.isnan(postgres_s) else postgres_s)) / seconds, 2
            ),
        },
        "runner_processes_seen": runners_seen,
        "all_runs_reaped": all_reaped,
        "example_deployment": next(iter(final), None),
    }


def floor(
    data_dir: Path, deployment_id: str, work: Path, engine_env: Mapping[str, str], runs: int
) -> dict[str, Any]:
    """The engine alone on the compiled code of ``deployment_id`` (its bundle, a local backend): CPU and
    wall time of `init` + `apply`, and of the runner's engine steps (`deploy.runner_steps`), each in a fresh
    directory."""
    sealed = data_dir / "objects" / "bundles" / ORG / f"{deployment_id}.tar.gz.sealed"
    if not sealed.is_file():
        raise api.BenchError(f"no bundle at {sealed} (is the object store the default file store?)")
    bundle = work / "bundle.tar.gz"
    bundle.write_bytes(
        bundles.opened(SecretBox(load_or_create_key(data_dir)), ORG, deployment_id, sealed.read_bytes())
    )
    command = deploy.engine_command(engine_env["IAC_BACKEND"])
    env = {k: os.environ[k] for k in deploy.INHERITED if k in os.environ} | dict(engine_env)
    measured: dict[str, list[tuple[float, float]]] = {"init_apply": [], "runner_steps": []}
    for n in range(runs):
        for name, measure in (("init_apply", deploy.baseline_apply), ("runner_steps", deploy.runner_steps)):
            code = work / f"{name}-{n}"
            deploy.unpack_bundle(bundle, code)
            main_tf = code / "main.tf"
            main_tf.write_text(deploy.to_local_backend(main_tf.read_text(), code / "local.tfstate"))
            usage = resource.getrusage(resource.RUSAGE_CHILDREN)
            seconds, counts = measure(command, code, env)
            used = resource.getrusage(resource.RUSAGE_CHILDREN)
            if counts != (1, 0, 0):
                raise api.BenchError(f"floor {name}: added/changed/removed {counts}, expected (1, 0, 0)")
            cpu = (used.ru_utime - usage.ru_utime) + (used.ru_stime - usage.ru_stime)
            measured[name].append((cpu, seconds))
            shutil.rmtree(code)
    return {
        name: {"cpu_s": summary([c for c, _ in values]), "wall_s": summary([w for _, w in values])}
        for name, values in measured.items()
    }


# --- 2. creates alone ------------------------------------------------------------------------------


def creates_only(
    client: httpx.Client,
    servers: Sequence[launch.LaunchServer],
    postmaster_pid: int | None,
    options: Options,
) -> dict[str, Any]:
    token = client.headers["authorization"].removeprefix("Bearer ")
    envs = [(CREATES_PROJECT, env) for env in env_ids(options.creates + WARM_CREATES, "c")]
    urls, pids = [server.base_url for server in servers], [server.pid for server in servers]
    asyncio.run(create_all(urls, token, envs[:WARM_CREATES], options.concurrency, "warm"))
    targets = envs[WARM_CREATES:]
    before = read_cpu(pids, postmaster_pid)
    started = time.perf_counter()
    creates = asyncio.run(create_all(urls, token, targets, options.concurrency, "create"))
    seconds = time.perf_counter() - started
    after = read_cpu(pids, postmaster_pid)
    count = len(creates.latencies)
    return {
        "creates": options.creates,
        "answered": count,
        "errors": creates.errors,
        "seconds": round(seconds, 3),
        "creates_per_s": round(len(creates.sent) / seconds, 1) if seconds else None,
        "create_call_s": summary(creates.latencies),
        "cpu_ms_per_create": {
            "server": None if not count else round(1000 * (after.server_s - before.server_s) / count, 2),
            "postgres": None
            if not count or math.isnan(after.postgres_s)
            else round(1000 * (after.postgres_s - before.postgres_s) / count, 2),
        },
    }


# --- report ----------------------------------------------------------------------------------------


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _s(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(database: str, result: dict[str, Any]) -> str:
    out: list[str] = []
    b = result.get("burst")
    if b:
        cpu = b["cpu_s_per_deployment"]
        fl = result["floor"]
        out.append(
            f"burst ({database}): {b['created']} deployments created at once, one per environment, "
            f"{result['options']['concurrency']} concurrent creates, engine "
            f"{result['options'].get('engine', 'embedded')}"
        )
        rows: list[tuple[str, ...]] = [("measure", "value")]
        rows += [
            ("deployments per minute", _s(b["deployments_per_minute"], 1)),
            ("succeeded / created", f"{b['succeeded']} / {b['created']}"),
            ("servers (replicas on the database)", str(b["replicas"])),
            (
                "deployments run twice, 5xx answers",
                f"{len(b['run_twice'])}, {b['server_errors']}",
            ),
            (
                "errors (create calls, failed, not completed)",
                f"{sum(b['create_errors'].values())}, {len(b['failed'])}, {b['not_completed']}",
            ),
            (
                "created -> completed p50 / p99 (s)",
                f"{_s(b['created_to_completed_s']['p50'])} / {_s(b['created_to_completed_s']['p99'])}",
            ),
            (
                "created -> launched p50 / p99 (s)",
                f"{_s(b['created_to_launched_s']['p50'])} / {_s(b['created_to_launched_s']['p99'])}",
            ),
            (
                "create call p50 / p99 (ms)",
                f"{_ms(b['create_call_s']['p50'])} / {_ms(b['create_call_s']['p99'])}",
            ),
            (
                "machine CPUs busy (ours) / idle, during the burst",
                f"{b['machine_cpus']['busy']:.2f} ({b['machine_cpus']['ours']:.2f}) / "
                f"{b['machine_cpus']['idle']:.2f}",
            ),
            ("CPU s per deployment: server", _s(cpu["server"], 3)),
            ("CPU s per deployment: postgres", _s(cpu["postgres"], 3)),
            ("CPU s per deployment: runners (po-runner)", _s(cpu["runners"], 3)),
            ("CPU s per deployment: engine (sampled)", _s(cpu["engine"], 3)),
            ("floor: engine CPU s, init + apply direct", _s(fl["init_apply"]["cpu_s"]["p50"], 3)),
            ("floor: engine CPU s, the runner's engine steps", _s(fl["runner_steps"]["cpu_s"]["p50"], 3)),
        ]
        total = sum(v for k, v in cpu.items() if k in ("server", "postgres", "runners_and_engine") and v)
        floor_cpu = fl["init_apply"]["cpu_s"]["p50"]
        rows.append(
            (
                "total CPU s per deployment / floor",
                f"{total:.3f} / {floor_cpu:.3f} = {total / floor_cpu:.1f}x",
            )
        )
        out.append(deploy.table(rows))
    c = result.get("creates")
    if c:
        p99 = c["create_call_s"]["p99"]
        verdict = (
            "met"
            if c["creates_per_s"]
            and c["creates_per_s"] >= TARGET_CREATES_PER_S
            and p99 is not None
            and p99 * 1000 <= TARGET_CREATE_P99_MS
            else "NOT met"
        )
        out.append(
            f"creates ({database}, nothing running): {c['answered']} POST /deployments at concurrency "
            f"{result['options']['concurrency']}: {c['creates_per_s']} /s, "
            f"p50 {_ms(c['create_call_s']['p50'])} ms, "
            f"p99 {_ms(p99)} ms, errors {sum(c['errors'].values())}, server CPU "
            f"{c['cpu_ms_per_create']['server']} ms/create"
            + (
                f", postgres {c['cpu_ms_per_create']['postgres']} ms"
                if c["cpu_ms_per_create"]["postgres"]
                else ""
            )
            + f" (target >= {TARGET_CREATES_PER_S:.0f}/s, p99 <= {TARGET_CREATE_P99_MS:.0f} ms: {verdict})"
        )
    return "\n\n".join(out)


# --- the run ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def serving(
    tmp: Path, database: str, bootstrap_token: str, options: Options, local_runs: str | None = None
) -> Iterator[tuple[list[launch.LaunchServer], int | None]]:
    """``replicas`` servers on one database, sharing the data dir (the server key, the object store) and
    the runs dir, as replicas on one host do; the PostgreSQL postmaster's PID. ``local_runs``: how their
    local runs start (a key of ``LOCAL_RUNS``; None: the server's default)."""
    with contextlib.ExitStack() as stack:
        database_url, postmaster = None, None
        if database == "postgresql":
            database_url, postmaster = stack.enter_context(api.postgres_database(tmp / "pg"))
        servers = []
        limit = (
            {} if options.local_run_limit is None else {"PO_LOCAL_RUN_LIMIT": str(options.local_run_limit)}
        )
        for n in range(options.replicas):
            server = launch.LaunchServer(
                data_dir=tmp / "data",
                database_url=database_url,
                bootstrap_token=bootstrap_token,
                environment={
                    "PO_ALLOW_LOCAL_RUNNERS": "true",
                    "PO_LOCAL_RUN_USER": "",
                    "PO_LOCAL_RUNS_DIR": str(tmp / "runs"),
                    "PO_RUNNER_DENIED_NETWORKS": "",
                    "MANAGED_RUNNER_SECRET": SECRET,
                    **limit,
                    **(LOCAL_RUNS[local_runs] if local_runs else {}),
                },
            )
            if n:
                server.log_path = tmp / "data" / f"server-{n}.log"
            stack.callback(server.stop)
            server.start()
            servers.append(server)
        yield servers, postmaster


def run_one(database: str, options: Options, local_runs: str | None = None) -> dict[str, Any]:
    bootstrap_token = "po_bench_" + os.urandom(16).hex()
    result: dict[str, Any] = {
        "options": {
            "concurrency": options.concurrency,
            "local_run_limit": options.local_run_limit,
            "local_runs": local_runs or "the server's default",
            "engine": options.engine,
        }
    }
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="po-bench-burst-")))
        tf_config = tmp / "terraformrc"
        tf_config.touch()
        engine_env = {
            "IAC_BACKEND": options.engine,
            "TF_CLI_CONFIG_FILE": str(tf_config),
            "CHECKPOINT_DISABLE": "1",
        }
        servers, postmaster = stack.enter_context(
            serving(tmp, database, bootstrap_token, options, local_runs)
        )
        for n, server in enumerate(servers):
            stack.callback(_keep_log, server, options, database if not n else f"{database}-{n}")
        client = stack.enter_context(httpx.Client(base_url=servers[0].base_url, timeout=60))
        set_up(client, bootstrap_token, options, engine_env)
        if options.only in (None, "creates"):
            say(f"-- {database}: creates alone, {options.creates} at concurrency {options.concurrency}")
            result["creates"] = creates_only(client, servers, postmaster, options)
        if options.only in (None, "burst"):
            say(
                f"-- {database}: burst of {options.deployments} deployments, "
                f"{options.concurrency} creates at once"
                + (f", {local_runs} local runs" if local_runs else "")
            )
            result["burst"] = burst(client, servers, postmaster, options)
            example = result["burst"]["example_deployment"]
            if example is None:
                raise api.BenchError("no deployment of the burst completed")
            say(f"-- floor: the engine alone on the same compiled module, {options.floor_runs} run(s)")
            work = tmp / "floor"
            work.mkdir()
            result["floor"] = floor(tmp / "data", example, work, engine_env, options.floor_runs)
    return result


def _keep_log(server: launch.LaunchServer, options: Options, name: str) -> None:
    if server.log_path.exists():
        options.results_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(server.log_path, options.results_dir / f"burst-{name}-server.log")


def problems(result: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for database, run in result["databases"].items():
        b = run.get("burst")
        if b:
            if b["create_errors"] or b["failed"] or b["not_completed"] or b["run_twice"]:
                found.append(
                    f"{database} burst: create errors {b['create_errors']}, failed {b['failed'][:3]}, "
                    f"not completed {b['not_completed']}, run twice {b['run_twice']}"
                )
        c = run.get("creates")
        if c and c["errors"]:
            found.append(f"{database} creates: errors {c['errors']}")
    return found


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="sqlite")
    parser.add_argument("--deployments", type=int, default=100, help="deployments in the burst (default 100)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent creates (default 16)")
    parser.add_argument("--creates", type=int, default=1000, help="creates measured alone (default 1000)")
    parser.add_argument(
        "--floor-runs", type=int, default=3, help="direct engine runs for the floor (default 3)"
    )
    parser.add_argument("--only", choices=["burst", "creates"], help="run one part only")
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="servers on the one database (PostgreSQL only): creates spread over them (default 1)",
    )
    parser.add_argument(
        "--local-run-limit",
        type=int,
        help="the servers' PO_LOCAL_RUN_LIMIT (default: theirs, one per CPU)",
    )
    parser.add_argument(
        "--local-runs",
        default="",
        help="how local runs start, comma-separated, one burst each in this order: "
        f"{', '.join(LOCAL_RUNS)} (default: the server's default, one burst)",
    )
    parser.add_argument(
        "--engine",
        choices=["embedded", "terraform", "opentofu"],
        default="embedded",
        help="the runners' engine (IAC_BACKEND; terraform, opentofu: the binary on PATH; default embedded)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    local_runs = tuple(name.strip() for name in args.local_runs.split(",") if name.strip())
    unknown = [name for name in local_runs if name not in LOCAL_RUNS]
    if unknown:
        parser.error(f"--local-runs: {', '.join(unknown)} is none of {', '.join(LOCAL_RUNS)}")
    binary = {"terraform": "terraform", "opentofu": "tofu"}.get(args.engine)
    if binary is not None and shutil.which(binary) is None:
        parser.error(f"--engine {args.engine}: no `{binary}` executable on PATH")
    if args.replicas > 1 and args.database != "postgresql":
        parser.error("--replicas above 1 needs --database postgresql (SQLite is one server's)")
    if min(args.deployments, args.concurrency, args.creates, args.floor_runs, args.replicas) < 1:
        parser.error("--deployments, --concurrency, --creates and --floor-runs must be >= 1")
    return Options(
        databases=("sqlite", "postgresql") if args.database == "both" else (args.database,),
        deployments=args.deployments,
        concurrency=args.concurrency,
        creates=args.creates,
        floor_runs=args.floor_runs,
        only=args.only,
        replicas=args.replicas,
        local_run_limit=args.local_run_limit,
        local_runs=local_runs,
        engine=args.engine,
        json=args.json,
        results_dir=args.results_dir,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, api._stop_on_sigterm)
    started = time.monotonic()
    load_before = os.getloadavg()
    try:
        databases = {
            (f"{database}-{local_runs}" if local_runs else database): run_one(database, options, local_runs)
            for database in options.databases
            for local_runs in options.local_runs or (None,)
        }
    except api.BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the server was stopped", file=sys.stderr)
        return 130
    result = {
        "benchmark": "burst",
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
        "databases": databases,
    }
    options.results_dir.mkdir(parents=True, exist_ok=True)
    for database, run in databases.items():
        (options.results_dir / f"burst-{database}.json").write_text(
            json.dumps(result | {"databases": {database: run}}, indent=2, default=str) + "\n"
        )
    if options.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        for database, run in databases.items():
            print(report(database, run))
            print()
        print(
            f"load average (1/5/15 min) before {api._load(load_before)}, after {api._load(os.getloadavg())}; "
            f"{os.cpu_count()} CPUs shared by this script, the server, the runners and the engine"
        )
    found = problems(result)
    for problem in found:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
