"""Live logs benchmark (issue 22): latency of streamed log lines, server memory under a large log, and what
streaming costs a burst.

    uv run python bench/live_logs.py [--database sqlite|postgresql|both] [--only latency|memory|cost]
                                     [--followers 50] [--mark-seconds 10] [--log-mib 100] [--burst 100]
                                     [--cost-rounds 2] [--json] [--results-dir DIR]

Each part starts its own `orchestrator serve` (bench/burst.py's `serving`: a child process, fresh data dir,
SQLite or a throwaway PostgreSQL) and sets up an org through the API: a `vm` runner with a local connection
and the embedded engine (`po-terraform`), orchestrator state, one environment per deployment. Every
deployment is created with an `encrypted_logs_recipient` (one age key pair per run), so its runner streams
its log in encrypted chunks; the followers here read `GET /orgs/{org}/deployments/{id}/logs?follow=true`
(server-sent events) and decrypt each chunk themselves (`protocol.log_stream.decrypt_chunk`), checking that
chunk numbers rise by one (no chunk lost or repeated) and end at the `end` event's `last_seq`.

1. latency: `--followers` deployments at once (`PO_LOCAL_RUN_LIMIT` raised to that), each of one
   `terraform_data` whose `local-exec` provisioner (a Python one-liner, so that printing costs no fork)
   prints `READY`, waits on a barrier (a file lock this process holds), then `MARK <epoch seconds> i/n`
   every `--mark-interval` for `--mark-seconds`. One follower per deployment; once every follower has
   seen `READY` the barrier is released, so all of them stream at once: first with their starts spread
   over one chunk interval (1 s, each its own offset), then with aligned starts (every runner cuts its
   chunks at the same moments: the worst case). Per marker line: its arrival at the follower (decrypted)
   minus the time in it, split at Terraform's `@timestamp` of the line and at the chunk's `received_at`
   (the gateway stored it). With it: the server's and the machine's CPUs while marking, and the server's
   chunk `PUT` durations and database writer waits (its `/metrics` before and after). Baseline: the same
   with one deployment alone, measured first on the same server.
2. memory: one deployment whose provisioner prints `--log-mib` MiB of log (lines of `--line-bytes`; the
   streamed log is Terraform's `-json` lines around them), a follower connected. The server's peak RSS
   (`VmHWM` from /proc, reset through `clear_refs` at each step, and `VmRSS` sampled every 50 ms) idle,
   during a trivial deployment (one `terraform_data`, followed) and during the large one, and for it the
   peak while streaming (its `VmHWM` read last before the last chunk arrived) and the RSS after (the
   whole log and the results); the runner's and the engine's peak RSS (`VmHWM` of the server's
   descendants, sampled).
3. cost: a burst of `--burst` deployments (bench/burst.py's, one `terraform_data` each) with streaming on
   and off (`RUNNER_LOG_STREAM_MAX_BYTES=0` in the runner's `job.environment`, which the local launcher
   gives the run), rounds alternating off, on, on, off (`--cost-rounds 2`), each round in fresh
   environments: deployments per minute and CPU per deployment (server, runners + engine, PostgreSQL,
   from /proc), and the ratios on / off. Chunks stored per deployment are counted (off: none).

It prints a table per database and writes bench/results/live-logs-<database>.json. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import math
import os
import platform
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import api
import burst
import deploy
import httpx
import launch

from orchestrator.protocol import age, log_stream

RESULTS_DIR = api.RESULTS_DIR
ORG = burst.ORG
ENV_TYPE = burst.ENV_TYPE
#: The resource type of bench/burst.py (its manifest names it); each part registers its own module for it.
RESOURCE_TYPE = burst.RESOURCE_TYPE
BIG_LOG = "big-log"
RUNNER_ON = burst.RUNNER
RUNNER_OFF = "local-no-stream"
PROJECT = "live"
PROJECT_OF = {"on": "stream-on", "off": "stream-off"}
#: The issue's targets (issue 22).
TARGET_LATENCY_S = 1.5
TARGET_COST = 0.10
SAMPLE_INTERVAL_S = 0.05
FOLLOW_TIMEOUT_S = 1800.0
MAX_RECONNECTS = 5
MIB = 1 << 20
#: Staggered starts spread over one chunk interval: the runners' time cuts fall evenly over it.
STAGGER_SECONDS = log_stream.FLUSH_SECONDS
#: What Terraform's `-json` line around one provisioner output line adds (measured: the line appears
#: twice, in `@message` and `hook.output`, with about 330 bytes of JSON); to size the large log.
JSON_LINE_OVERHEAD = 340
MARK = re.compile(r'"output":"MARK (\d+\.\d+) (\d+)/(\d+)"')
READY = '"output":"READY"'
TIMESTAMP = re.compile(r'"@timestamp":"([^"]+)"')
#: The gateway's chunk upload, as the request metrics name its route.
CHUNK_ROUTE = "/log-chunks/{seq}"


@dataclass(frozen=True, kw_only=True)
class Options:
    databases: tuple[str, ...]
    only: str | None
    followers: int
    mark_seconds: float
    mark_interval: float
    barrier_timeout: float
    log_mib: float
    line_bytes: int
    idle_seconds: float
    burst: int
    cost_rounds: int
    concurrency: int
    local_run_limit: int | None
    json: bool
    results_dir: Path = RESULTS_DIR


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- modules ---------------------------------------------------------------------------------------


def _provisioner_module(script: str) -> str:
    """One `terraform_data` (input: the trigger) whose `local-exec` provisioner runs ``script`` with this
    Python (the run is on this host), unbuffered."""
    if "${" in script or "%{" in script:
        raise ValueError("the script would be read as a Terraform template")
    return f"""\
variable "trigger" {{
  type = string
}}

resource "terraform_data" "one" {{
  input = var.trigger

  provisioner "local-exec" {{
    environment = {{ TRIGGER = var.trigger }}
    interpreter = [{json.dumps(sys.executable)}, "-u", "-c"]
    command     = <<EOT
{script}
EOT
  }}
}}

output "value" {{
  value = terraform_data.one.output
}}
"""


def marks_module(barrier: Path, marks: int, interval: float) -> str:
    """Prints `READY`, waits for the barrier, then the markers. A deployment whose trigger is
    `staggered-<n>` first waits a part of ``STAGGER_SECONDS`` of its own (n times the golden ratio, modulo
    1), so that the starts of many spread evenly over one chunk interval; `aligned-<n>` starts at once."""
    # `READY` is spelt in two pieces: the provisioner's own "Executing: ..." line holds this source.
    return _provisioner_module(
        f"""import fcntl, os, time
print("RE" + "ADY", flush=True)
with open({str(barrier)!r}) as barrier:
    fcntl.flock(barrier, fcntl.LOCK_SH)
tag, n = os.environ["TRIGGER"].rsplit("-", 1)
if tag == "staggered":
    time.sleep((int(n) * 0.6180339887) % 1.0 * {STAGGER_SECONDS})
for i in range({marks}):
    print("MARK %.3f %d/%d" % (time.time(), i, {marks}), flush=True)
    time.sleep({interval})"""
    )


def big_log_lines(log_mib: float, line_bytes: int) -> int:
    return max(1, math.ceil(log_mib * MIB / (2 * (line_bytes + 10) + JSON_LINE_OVERHEAD)))


def big_log_module(lines: int, line_bytes: int) -> str:
    return _provisioner_module(
        f"""import sys
piece = "x" * {line_bytes}
for i in range({lines}):
    sys.stdout.write("%09d %s\\n" % (i, piece))"""
    )


def manifest(resource_type: str, trigger: str) -> dict[str, Any]:
    return {
        "workloads": {
            "bench": {"resources": {"one": {"type": resource_type, "params": {"trigger": trigger}}}}
        }
    }


# --- set-up ----------------------------------------------------------------------------------------


def set_up(
    client: httpx.Client,
    bootstrap_token: str,
    *,
    modules: Mapping[str, str],
    runners: Mapping[str, Mapping[str, str]],
    projects: Mapping[str, str],
    envs: Sequence[tuple[str, str]],
) -> str:
    """An org as bench/burst.py sets it up: ``modules`` (resource type -> inline module with a `trigger`
    parameter), local `vm` runners (id -> job environment), projects (id -> runner), environments. Leaves
    ``client`` with the org admin's token, and answers it."""
    admin = {"authorization": f"Bearer {bootstrap_token}"}

    def post(path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> Any:
        response = client.post(path, json=body, headers=headers)
        if response.status_code != 201:
            raise api.BenchError(f"POST {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    post("/orgs", {"id": ORG}, admin)
    token: str = post(f"/orgs/{ORG}/tokens", {"role": "admin"}, admin)["token"]
    client.headers["authorization"] = f"Bearer {token}"
    base = f"/orgs/{ORG}"
    post(f"{base}/env-types", {"id": ENV_TYPE})
    for resource_type, source in modules.items():
        post(
            f"{base}/resource-types",
            {
                "id": resource_type,
                "output_schema": {"type": "object", "properties": {"value": {"type": "string"}}},
            },
        )
        post(
            f"{base}/modules",
            {
                "id": resource_type,
                "resource_type": resource_type,
                "module_source": "inline",
                "module_params": {"trigger": {"type": "string"}},
                "module_source_code": source,
            },
        )
        post(f"{base}/module-rules", {"module_id": resource_type})
    for runner_id, environment in runners.items():
        runner = {
            "id": runner_id,
            "runner_configuration": {
                "type": "vm",
                "connection": {"type": "local"},
                "job": {"runtime": "process", "environment": dict(environment)},
            },
            "state_storage_configuration": {"type": "orchestrator"},
        }
        post(f"{base}/runners", runner, admin)
    for project, runner_id in projects.items():
        post(f"{base}/projects", {"id": project})
        post(f"{base}/runner-rules", {"runner_id": runner_id, "project_id": project})
    asyncio.run(burst.create_envs(str(client.base_url), token, envs))
    return token


def engine_env(tmp: Path) -> dict[str, str]:
    tf_config = tmp / "terraformrc"
    tf_config.touch()
    return {"IAC_BACKEND": "embedded", "TF_CLI_CONFIG_FILE": str(tf_config), "CHECKPOINT_DISABLE": "1"}


def burst_options(options: Options, *, deployments: int, local_run_limit: int | None) -> burst.Options:
    return burst.Options(
        databases=(),
        deployments=deployments,
        concurrency=options.concurrency,
        creates=1,
        floor_runs=1,
        only="burst",
        replicas=1,
        local_run_limit=local_run_limit,
        json=False,
        results_dir=options.results_dir,
    )


@contextlib.contextmanager
def one_server(
    tmp: Path, database: str, options: Options, part: str, *, local_run_limit: int | None
) -> Iterator[tuple[launch.LaunchServer, int | None, str]]:
    """A fresh server for one part (its log kept in the results); its PostgreSQL postmaster's PID and the
    bootstrap token."""
    token = "po_bench_" + os.urandom(16).hex()
    serving = burst.serving(
        tmp, database, token, burst_options(options, deployments=1, local_run_limit=local_run_limit)
    )
    with serving as (servers, postmaster):
        try:
            yield servers[0], postmaster, token
        finally:
            log = servers[0].log_path
            if log.exists():
                options.results_dir.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log, options.results_dir / f"live-logs-{database}-{part}-server.log")


# --- following -------------------------------------------------------------------------------------


@dataclass
class Mark:
    index: int
    #: The time printed in the marker line (the provisioner's clock: this host's).
    marked_at: float
    #: Terraform's ``@timestamp`` of the JSON line carrying it (when the engine wrote it out).
    emitted_at: float
    #: The chunk's ``received_at`` (the gateway stored it).
    stored_at: float
    #: Decrypted by the follower.
    arrived_at: float


@dataclass
class Followed:
    """What one follower saw of one deployment."""

    deployment_id: str
    chunks: int = 0
    last_seq: int = 0
    repeated: list[int] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)
    undecryptable: list[int] = field(default_factory=list)
    text_bytes: int = 0
    phases: list[str] = field(default_factory=list)
    end: dict[str, Any] | None = None
    reconnects: int = 0
    errors: list[str] = field(default_factory=list)
    ready_at: float | None = None
    marks: dict[int, Mark] = field(default_factory=dict)
    marks_expected: int | None = None
    repeated_marks: int = 0
    first_chunk_at: float | None = None
    last_chunk_at: float | None = None

    @property
    def lost_at_end(self) -> int:
        """Chunks the `end` event counts that never came."""
        return max(0, int(self.end["last_seq"]) - self.last_seq) if self.end else 0

    def summary(self) -> dict[str, Any]:
        return {
            "deployment_id": self.deployment_id,
            "status": None if self.end is None else self.end["status"],
            "chunks": self.chunks,
            "last_seq": self.last_seq,
            "end_last_seq": None if self.end is None else self.end["last_seq"],
            "repeated": self.repeated,
            "gaps": self.gaps,
            "undecryptable": self.undecryptable,
            "text_bytes": self.text_bytes,
            "phases": self.phases,
            "reconnects": self.reconnects,
            "errors": self.errors[:5],
        }


async def follow(
    client: httpx.AsyncClient,
    followed: Followed,
    identity: str,
    *,
    markers: bool,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Follow one deployment's log to its `end` event (reconnecting after the last chunk seen if the stream
    breaks), decrypting every chunk; with ``markers``, note each marker line's arrival."""
    path = f"/orgs/{ORG}/deployments/{followed.deployment_id}/logs"
    timeout = httpx.Timeout(60.0, read=60.0)  # the server sends a keep-alive every 15 s
    while followed.end is None:
        headers = {"Last-Event-ID": str(followed.last_seq)} if followed.last_seq else {}
        try:
            async with client.stream(
                "GET", path, params={"follow": "true"}, headers=headers, timeout=timeout
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    followed.errors.append(f"GET {path}: {response.status_code} {response.text[:200]}")
                    return
                name, data = "message", ""
                async for line in response.aiter_lines():
                    if line == "":
                        if data:
                            _event(followed, name, json.loads(data), identity, markers, on_ready)
                        name, data = "message", ""
                    elif line.startswith(":"):
                        continue
                    else:
                        key, _, value = line.partition(":")
                        value = value.removeprefix(" ")
                        if key == "event":
                            name = value
                        elif key == "data":
                            data += value
        except httpx.HTTPError as exc:
            followed.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
        if followed.end is None:
            followed.reconnects += 1
            if followed.reconnects > MAX_RECONNECTS:
                followed.errors.append("gave up: the stream broke too often")
                return
            await asyncio.sleep(0.5)


def _event(
    followed: Followed,
    name: str,
    data: dict[str, Any],
    identity: str,
    markers: bool,
    on_ready: Callable[[], None] | None,
) -> None:
    if name == log_stream.SSE_PHASE:
        followed.phases.append(str(data["phase"]))
    elif name == log_stream.SSE_END:
        followed.end = data
    elif name == log_stream.SSE_CHUNK:
        seq = int(data["seq"])
        if seq <= followed.last_seq:
            followed.repeated.append(seq)
            return
        if seq != followed.last_seq + 1:
            followed.gaps.append((followed.last_seq + 1, seq - 1))
        followed.last_seq = seq
        followed.chunks += 1
        try:
            plain = log_stream.decrypt_chunk(
                data["ciphertext"], identity, deployment_id=followed.deployment_id, seq=seq
            )
        except age.AgeDecryptError:
            followed.undecryptable.append(seq)
            return
        arrived = time.time()
        followed.first_chunk_at = followed.first_chunk_at or arrived
        followed.last_chunk_at = arrived
        followed.text_bytes += len(plain.text.encode())
        if markers:
            stored = deploy.parse_time(data["received_at"])
            for line in plain.text.splitlines():
                if followed.ready_at is None and READY in line:
                    followed.ready_at = arrived
                    if on_ready is not None:
                        on_ready()
                found = MARK.search(line)
                if found is None:
                    continue
                index = int(found[2])
                followed.marks_expected = int(found[3])
                if index in followed.marks:
                    followed.repeated_marks += 1
                else:
                    emitted = TIMESTAMP.search(line)
                    followed.marks[index] = Mark(
                        index,
                        float(found[1]),
                        deploy.parse_time(emitted[1]) if emitted else math.nan,
                        stored,
                        arrived,
                    )


def chunk_problems(followed: Sequence[Followed]) -> dict[str, Any]:
    """Chunks lost (gaps, or fewer than the `end` event's `last_seq`), repeated, not decryptable; follows
    that did not reach `end`."""
    return {
        "chunks": sum(f.chunks for f in followed),
        "lost": sum(b - a + 1 for f in followed for a, b in f.gaps) + sum(f.lost_at_end for f in followed),
        "repeated": sum(len(f.repeated) for f in followed),
        "undecryptable": sum(len(f.undecryptable) for f in followed),
        "not_ended": sum(1 for f in followed if f.end is None),
        "reconnects": sum(f.reconnects for f in followed),
        "follow_errors": [e for f in followed for e in f.errors][:5],
    }


# --- 1. latency ------------------------------------------------------------------------------------


def _env_targets(project: str, prefix: str, count: int) -> list[tuple[str, str]]:
    return [(project, env) for env in burst.env_ids(count, prefix)]


async def latency_round(
    base_url: str,
    server_pid: int,
    token: str,
    keys: tuple[str, str],
    targets: Sequence[tuple[str, str]],
    barrier: Path,
    options: Options,
    tag: str,
) -> dict[str, Any]:
    """``targets`` deployed at once behind the barrier, followed; the markers' latencies."""
    identity, recipient = keys
    with barrier.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        creates = await burst.create_all(
            [base_url],
            token,
            targets,
            options.concurrency,
            tag,
            extra_body={"encrypted_logs_recipient": recipient},
        )
        if creates.errors:
            raise api.BenchError(f"creating the deployments: {creates.errors}")
        followed = [Followed(deployment_id) for deployment_id in creates.sent]
        all_ready = asyncio.Event()
        ready = 0

        def one_ready() -> None:
            nonlocal ready
            ready += 1
            if ready == len(followed):
                all_ready.set()

        limits = httpx.Limits(max_connections=len(followed) + 4, max_keepalive_connections=len(followed) + 4)
        headers = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits) as client:
            tasks = [
                asyncio.create_task(follow(client, f, identity, markers=True, on_ready=one_ready))
                for f in followed
            ]
            waiting = asyncio.create_task(all_ready.wait())
            everything = asyncio.ensure_future(asyncio.gather(*tasks))
            either: list[asyncio.Future[Any]] = [waiting, everything]
            await asyncio.wait(
                either,
                timeout=options.barrier_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
            waiting.cancel()
            metrics_before = await scrape(client)
            window = asyncio.create_task(cpu_window(server_pid, options.mark_seconds))
            released = time.time()
            say(f"   {ready} of {len(followed)} provisioners ready: barrier released, marking")
            fcntl.flock(held, fcntl.LOCK_UN)
            async with asyncio.timeout(FOLLOW_TIMEOUT_S):
                await everything
            metrics_after = await scrape(client)
    result = analyse_latency(followed, ready, released)
    result["while_marking_cpus"] = await window
    result["server_chunk_put_s"] = histogram_delta(
        metrics_before,
        metrics_after,
        "po_http_request_duration_seconds",
        lambda labels: labels.get("route", "").endswith(CHUNK_ROUTE) and labels.get("method") == "PUT",
    )
    result["server_writer_wait_s"] = histogram_delta(
        metrics_before, metrics_after, "po_db_pool_wait_seconds", lambda labels: labels.get("pool") == "main"
    )
    # The chunk writer's transactions (servers that batch the chunks: count 0 on older ones).
    result["server_chunk_writes_s"] = histogram_delta(
        metrics_before, metrics_after, "po_log_chunk_write_seconds", lambda labels: True
    )
    result["server_chunk_batches"] = histogram_delta(
        metrics_before, metrics_after, "po_log_chunk_batch_chunks", lambda labels: True
    )
    return result


async def cpu_window(server_pid: int, seconds: float) -> dict[str, float | None]:
    """CPUs (seconds per second) the server and the whole machine were busy for ``seconds`` from now."""
    fields = burst._stat(server_pid)
    server_before = burst.self_cpu(fields) if fields else math.nan
    machine_before, started = burst.machine_cpu()[0], time.monotonic()
    await asyncio.sleep(seconds)
    fields = burst._stat(server_pid)
    server_after = burst.self_cpu(fields) if fields else math.nan
    elapsed = time.monotonic() - started
    server = (server_after - server_before) / elapsed
    return {
        "server": None if math.isnan(server) else round(server, 2),
        "machine_busy": round((burst.machine_cpu()[0] - machine_before) / elapsed, 2),
    }


Sample = tuple[str, dict[str, str], float]
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


async def scrape(client: httpx.AsyncClient) -> list[Sample]:
    """The server's ``GET /metrics`` (Prometheus' text format), as (name, labels, value)."""
    response = await client.get("/metrics")
    if response.status_code != 200:
        return []
    samples: list[Sample] = []
    for line in response.text.splitlines():
        found = _SAMPLE.match(line)
        if found and not line.startswith("#"):
            samples.append((found[1], dict(_LABEL.findall(found[2] or "")), float(found[3])))
    return samples


def histogram_delta(
    before: Sequence[Sample], after: Sequence[Sample], name: str, match: Callable[[dict[str, str]], bool]
) -> dict[str, Any]:
    """What a histogram counted between two scrapes (the label sets ``match`` takes, summed): count, mean,
    and the bucket bounds (``le``) under which half, 99 % and all of the observations fell."""

    def totals(samples: Sequence[Sample]) -> tuple[dict[float, float], float, float]:
        buckets: dict[float, float] = {}
        count = total = 0.0
        for metric, labels, value in samples:
            if not match(labels):
                continue
            if metric == f"{name}_bucket":
                bound = float(labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + value
            elif metric == f"{name}_count":
                count += value
            elif metric == f"{name}_sum":
                total += value
        return buckets, count, total

    (b0, c0, s0), (b1, c1, s1) = totals(before), totals(after)
    count = c1 - c0
    if count <= 0:
        return {"count": 0, "mean": None, "p50_under": None, "p99_under": None, "max_under": None}
    cumulative = sorted((bound, value - b0.get(bound, 0.0)) for bound, value in b1.items())

    def under(fraction: float) -> float | None:
        bound = next((b for b, c in cumulative if c >= fraction * count), None)
        return None if bound is None or math.isinf(bound) else bound

    return {
        "count": int(count),
        "mean": round((s1 - s0) / count, 4),
        "p50_under": under(0.5),
        "p99_under": under(0.99),
        "max_under": under(1.0),
    }


def analyse_latency(followed: Sequence[Followed], ready: int, released: float) -> dict[str, Any]:
    marks = [m for f in followed for m in f.marks.values()]
    expected = sum(f.marks_expected or 0 for f in followed)
    windows = [
        (min(m.marked_at for m in f.marks.values()), max(m.marked_at for m in f.marks.values()))
        for f in followed
        if f.marks
    ]
    at_once = [sum(1 for a, b in windows if a <= m.marked_at <= b) for m in marks]
    return {
        "deployments": len(followed),
        "succeeded": sum(1 for f in followed if f.end and f.end["status"] == "succeeded"),
        "ready_at_release": ready,
        "marks_expected": expected,
        "marks_received": len(marks),
        "marks_missing": sum((f.marks_expected or 0) - len(f.marks) for f in followed),
        "marks_repeated": sum(f.repeated_marks for f in followed),
        "deployments_without_marks": sum(1 for f in followed if not f.marks),
        # Mark printed -> decrypted by its follower; split at the gateway's receipt of its chunk.
        "latency_s": burst.summary([m.arrived_at - m.marked_at for m in marks]),
        "marked_to_stored_s": burst.summary([m.stored_at - m.marked_at for m in marks]),
        # ... split at Terraform's own stamp of the line: the engine, then the runner and the upload.
        "marked_to_emitted_s": burst.summary(
            [m.emitted_at - m.marked_at for m in marks if not math.isnan(m.emitted_at)]
        ),
        "emitted_to_stored_s": burst.summary(
            [m.stored_at - m.emitted_at for m in marks if not math.isnan(m.emitted_at)]
        ),
        "stored_to_follower_s": burst.summary([m.arrived_at - m.stored_at for m in marks]),
        # Deployments printing markers at the time of each marker (their first to last marker).
        "marking_at_once": burst.summary([float(n) for n in at_once]),
        "first_mark_after_release_s": None
        if not marks
        else round(min(m.marked_at for m in marks) - released, 3),
        **chunk_problems(followed),
        "failed": [f.summary() for f in followed if not f.end or f.end["status"] != "succeeded"][:5],
    }


def latency_part(database: str, tmp: Path, options: Options, keys: tuple[str, str]) -> dict[str, Any]:
    limit = options.local_run_limit or max(options.followers, 4 * (os.cpu_count() or 1))
    barrier = tmp / "barrier"
    marks = max(1, round(options.mark_seconds / options.mark_interval))
    baseline_targets = _env_targets(PROJECT, "alone", 1)
    staggered = _env_targets(PROJECT, "s", options.followers)
    aligned = _env_targets(PROJECT, "a", options.followers)
    load_before = os.getloadavg()
    with one_server(tmp, database, options, "latency", local_run_limit=limit) as (server, _, bootstrap):
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            token = set_up(
                client,
                bootstrap,
                modules={RESOURCE_TYPE: marks_module(barrier, marks, options.mark_interval)},
                runners={RUNNER_ON: engine_env(tmp)},
                projects={PROJECT: RUNNER_ON},
                envs=[*baseline_targets, *staggered, *aligned],
            )
        say(f"-- {database} latency: baseline, one deployment alone, {marks} markers")
        alone = asyncio.run(
            latency_round(
                server.base_url, server.pid, token, keys, baseline_targets, barrier, options, "alone"
            )
        )
        rounds = {}
        for tag, targets in (("staggered", staggered), ("aligned", aligned)):
            say(
                f"-- {database} latency: {options.followers} deployments at once ({tag} starts), "
                f"{marks} markers each"
            )
            rounds[tag] = asyncio.run(
                latency_round(server.base_url, server.pid, token, keys, targets, barrier, options, tag)
            )
    return {
        "options": {
            "followers": options.followers,
            "marks": marks,
            "mark_interval_s": options.mark_interval,
            "local_run_limit": limit,
        },
        "alone": alone,
        **rounds,
        "ratios": {
            tag: {
                "p50": _ratio(r["latency_s"]["p50"], alone["latency_s"]["p50"]),
                "p99": _ratio(r["latency_s"]["p99"], alone["latency_s"]["p99"]),
            }
            for tag, r in rounds.items()
        },
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }


def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else round(value / base, 2)


# --- 2. memory -------------------------------------------------------------------------------------


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in KiB (empty once it is gone)."""
    values: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                values[key] = int(value.split()[0])
    except (OSError, ValueError):
        return {}
    return values


def reset_peak(pid: int) -> bool:
    """Reset ``pid``'s VmHWM to its current RSS (``clear_refs`` 5); False where that is not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class MemorySampler:
    """Reads /proc every ``SAMPLE_INTERVAL_S``: the server's VmRSS (its peak per step), and the VmHWM of its
    descendants: the runners (its children, idle warm runners left out), the engine (`po-terraform`
    processes) and anything else (the provisioner), keyed by (pid, start time)."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.server_peak_kib = 0
        self.server_last_kib = 0
        self.peaks: dict[str, int] = {"runner": 0, "engine": 0, "other": 0}
        #: The server's VmRSS (wall-clock time, KiB) since the last step.
        self.timeline: list[tuple[float, int]] = []
        #: ... and its VmHWM (peak since the step began, the server's peak being reset then).
        self.peak_timeline: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def step(self, streaming: tuple[float, float] | None = None) -> dict[str, Any]:
        """The peaks since the last step, and start afresh; with ``streaming`` (its first and last chunk's
        arrival), the server's peak RSS while the log streamed and after it (the whole log and the results
        are sent after the last chunk)."""
        self.sample()
        with self._lock:
            taken: dict[str, Any] = {
                "server_sampled_peak_kib": self.server_peak_kib,
                "server_rss_kib": self.server_last_kib,
            }
            taken |= {f"{kind}_peak_kib": value for kind, value in self.peaks.items()}
            taken["server_rss_quarters_peak_kib"] = _quarters(self.timeline)
            if streaming is not None:
                _, last = streaming
                # VmHWM read last before the last chunk arrived: the peak until then, spikes between two
                # samples included.
                taken["server_streaming_peak_kib"] = max(
                    (kib for at, kib in self.peak_timeline if at <= last), default=None
                )
                taken["server_after_streaming_peak_kib"] = max(
                    (kib for at, kib in self.timeline if at > last), default=None
                )
            self.server_peak_kib = self.server_last_kib
            self.peaks = dict.fromkeys(self.peaks, 0)
            self.timeline = []
            self.peak_timeline = []
        return taken

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def sample(self) -> None:
        status = _status(self.server_pid)
        server = status.get("VmRSS", 0)
        parents: dict[int, int] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                fields = burst._stat(entry.name)
                if fields is not None:
                    parents[int(entry.name)] = int(fields[1])
        found: dict[str, int] = {}
        for pid in parents:
            chain = [pid]
            parent = parents[pid]
            while parent != self.server_pid and parent > 1 and parent in parents and len(chain) < 16:
                chain.append(parent)
                parent = parents[parent]
            if parent != self.server_pid or burst._idle_warm_runner(chain[-1]):
                continue
            if burst.is_zygote(chain[-1]):
                if len(chain) == 1:
                    continue  # where runs are forked from (PO_LOCAL_ZYGOTE), not a run
                chain.pop()
            kind = "runner" if len(chain) == 1 else "engine" if _is_engine(pid) else "other"
            found[kind] = max(found.get(kind, 0), _status(pid).get("VmHWM", 0))
        with self._lock:
            self.timeline.append((time.time(), server))
            self.peak_timeline.append((time.time(), status.get("VmHWM", 0)))
            self.server_last_kib = server
            self.server_peak_kib = max(self.server_peak_kib, server)
            for kind, value in found.items():
                self.peaks[kind] = max(self.peaks[kind], value)


def _quarters(timeline: Sequence[tuple[float, int]]) -> list[int]:
    """The highest reading in each quarter of the time ``timeline`` spans: level once the log is under way,
    the server's memory is bounded; rising to the end, it grows with the log."""
    if len(timeline) < 2:
        return []
    start, span = timeline[0][0], timeline[-1][0] - timeline[0][0]
    peaks = [0, 0, 0, 0]
    for at, kib in timeline:
        quarter = min(3, int(4 * (at - start) / span)) if span > 0 else 0
        peaks[quarter] = max(peaks[quarter], kib)
    return peaks


def _is_engine(pid: int) -> bool:
    try:
        return b"po-terraform" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def memory_step(
    server_pid: int,
    sampler: MemorySampler,
    run: Callable[[], Followed | None],
) -> dict[str, Any]:
    """One step: the server's peak reset, ``run`` (None: idle), the peaks read back."""
    reset = reset_peak(server_pid)
    sampler.step()
    started = time.monotonic()
    followed = run()
    seconds = time.monotonic() - started
    step: dict[str, Any] = {"seconds": round(seconds, 2), "server_vmhwm_kib": None}
    if reset:
        step["server_vmhwm_kib"] = _status(server_pid).get("VmHWM")
    window = None
    if followed is not None and followed.first_chunk_at and followed.last_chunk_at:
        window = (followed.first_chunk_at, followed.last_chunk_at)
    step |= sampler.step(window)
    if followed is not None:
        step["follow"] = followed.summary()
        step |= {k: v for k, v in chunk_problems([followed]).items() if k != "chunks"}
        if followed.first_chunk_at and followed.last_chunk_at and followed.text_bytes:
            span = followed.last_chunk_at - followed.first_chunk_at
            step["streamed_mib_per_s"] = round(followed.text_bytes / MIB / span, 2) if span > 0 else None
    return step


def deploy_and_follow(
    base_url: str, token: str, keys: tuple[str, str], env: str, resource_type: str
) -> Followed:
    identity, recipient = keys
    headers = {"authorization": f"Bearer {token}"}

    async def go() -> Followed:
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as client:
            response = await client.post(
                f"/orgs/{ORG}/deployments",
                json={
                    "project_id": PROJECT,
                    "env_id": env,
                    "mode": "deploy",
                    "manifest": manifest(resource_type, env),
                    "encrypted_logs_recipient": recipient,
                },
            )
            if response.status_code != 201:
                raise api.BenchError(f"POST deployments: {response.status_code} {response.text[:300]}")
            followed = Followed(str(response.json()["id"]))
            async with asyncio.timeout(FOLLOW_TIMEOUT_S):
                await follow(client, followed, identity, markers=False)
            return followed

    return asyncio.run(go())


def memory_part(database: str, tmp: Path, options: Options, keys: tuple[str, str]) -> dict[str, Any]:
    lines = big_log_lines(options.log_mib, options.line_bytes)
    load_before = os.getloadavg()
    with one_server(tmp, database, options, "memory", local_run_limit=options.local_run_limit) as (
        server,
        _,
        bootstrap,
    ):
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            token = set_up(
                client,
                bootstrap,
                modules={RESOURCE_TYPE: launch.MODULE, BIG_LOG: big_log_module(lines, options.line_bytes)},
                runners={RUNNER_ON: engine_env(tmp)},
                projects={PROJECT: RUNNER_ON},
                envs=[(PROJECT, "trivial"), (PROJECT, "big")],
            )
        sampler = MemorySampler(server.pid).start()
        try:
            say(f"-- {database} memory: idle for {options.idle_seconds:g} s")
            idle = memory_step(server.pid, sampler, lambda: time.sleep(options.idle_seconds))
            say(f"-- {database} memory: a trivial deployment, followed")
            trivial = memory_step(
                server.pid,
                sampler,
                lambda: deploy_and_follow(server.base_url, token, keys, "trivial", RESOURCE_TYPE),
            )
            say(
                f"-- {database} memory: a deployment printing {lines} lines of {options.line_bytes} bytes "
                f"(a ~{options.log_mib:g} MiB log), followed"
            )
            big = memory_step(
                server.pid, sampler, lambda: deploy_and_follow(server.base_url, token, keys, "big", BIG_LOG)
            )
        finally:
            sampler.stop()
    steps = {"idle": idle, "trivial": trivial, "big": big}

    def peak(step: dict[str, Any]) -> int:
        return max(int(step["server_vmhwm_kib"] or 0), int(step["server_sampled_peak_kib"]))

    base = peak(idle)
    for step in steps.values():
        step["server_peak_kib"] = peak(step)
        step["server_peak_above_idle_mib"] = round((peak(step) - base) / 1024, 1)
        streaming = step.get("server_streaming_peak_kib")
        step["server_streaming_peak_above_idle_mib"] = (
            None if streaming is None else round((streaming - base) / 1024, 1)
        )
    return {
        "options": {"log_mib": options.log_mib, "lines": lines, "line_bytes": options.line_bytes},
        "steps": steps,
        "ratio_big_to_trivial_above_idle": _ratio(
            big["server_peak_above_idle_mib"], trivial["server_peak_above_idle_mib"]
        ),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }


# --- 3. cost ---------------------------------------------------------------------------------------


def cost_order(rounds: int) -> list[str]:
    """off, on, on, off, off, on, ...: each mode first as often as last, against drift of the machine."""
    order: list[str] = []
    for n in range(rounds):
        order += ["off", "on"] if n % 2 == 0 else ["on", "off"]
    return order


def stored_chunks(client: httpx.Client, project: str, prefix: str) -> dict[str, Any]:
    """Chunks stored per deployment of the round (``prefix`` of its environments), and whole logs."""
    ids: list[str] = []
    page: str | None = None
    while True:
        params: dict[str, Any] = {"project_id": project, "per_page": 1000} | ({"page": page} if page else {})
        response = client.get(f"/orgs/{ORG}/deployments", params=params)
        response.raise_for_status()
        body = response.json()
        ids += [d["id"] for d in body["items"] if str(d["env_id"]).startswith(prefix)]
        page = body.get("next_page_token")
        if not page:
            break
    chunks, whole = [], 0
    for deployment_id in ids:
        response = client.get(f"/orgs/{ORG}/deployments/{deployment_id}/logs", params={"limit": 1})
        response.raise_for_status()
        body = response.json()
        chunks.append(int(body["last_seq"]))
        whole += bool(body["whole_log"])
    return {
        "deployments": len(ids),
        "chunks_total": sum(chunks),
        "chunks_per_deployment": burst.summary([float(c) for c in chunks]),
        "with_chunks": sum(1 for c in chunks if c),
        "with_whole_log": whole,
    }


def cost_part(database: str, tmp: Path, options: Options, keys: tuple[str, str]) -> dict[str, Any]:
    order = cost_order(options.cost_rounds)
    prefixes = [f"{mode}{n}-" for n, mode in enumerate(order)]
    envs = [
        (PROJECT_OF[mode], env)
        for prefix, mode in zip(prefixes, order, strict=True)
        for env in burst.env_ids(options.burst, prefix)
    ]
    load_before = os.getloadavg()
    bopts = burst_options(options, deployments=options.burst, local_run_limit=options.local_run_limit)
    rounds: list[dict[str, Any]] = []
    with one_server(tmp, database, options, "cost", local_run_limit=options.local_run_limit) as (
        server,
        postmaster,
        bootstrap,
    ):
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            env = engine_env(tmp)
            set_up(
                client,
                bootstrap,
                modules={RESOURCE_TYPE: launch.MODULE},
                runners={RUNNER_ON: env, RUNNER_OFF: {**env, "RUNNER_LOG_STREAM_MAX_BYTES": "0"}},
                projects={PROJECT_OF["on"]: RUNNER_ON, PROJECT_OF["off"]: RUNNER_OFF},
                envs=envs,
            )
            for prefix, mode in zip(prefixes, order, strict=True):
                say(f"-- {database} cost: burst of {options.burst}, streaming {mode}")
                result = burst.burst(
                    client,
                    [server],
                    postmaster,
                    bopts,
                    project=PROJECT_OF[mode],
                    envs=burst.env_ids(options.burst, prefix),
                    extra_body={"encrypted_logs_recipient": keys[1]},
                )
                result.pop("example_deployment", None)
                rounds.append(
                    {"streaming": mode, **result, "stored": stored_chunks(client, PROJECT_OF[mode], prefix)}
                )
    modes = {mode: _cost_mode([r for r in rounds if r["streaming"] == mode]) for mode in ("off", "on")}
    return {
        "options": {"burst": options.burst, "rounds": options.cost_rounds, "order": order},
        "rounds": rounds,
        "modes": modes,
        "ratio_rate_on_off": _ratio(
            modes["on"]["deployments_per_minute"], modes["off"]["deployments_per_minute"]
        ),
        "ratio_cpu_on_off": _ratio(modes["on"]["cpu_s_per_deployment"], modes["off"]["cpu_s_per_deployment"]),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }


def _cost_mode(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    def mean(values: Sequence[float | None]) -> float | None:
        kept = [v for v in values if v is not None and not math.isnan(v)]
        return round(sum(kept) / len(kept), 4) if kept else None

    def total(r: dict[str, Any]) -> float:
        cpu = r["cpu_s_per_deployment"]
        return sum(cpu[k] or 0.0 for k in ("server", "postgres", "runners_and_engine"))

    return {
        "rounds": len(rounds),
        "deployments_per_minute": mean([r["deployments_per_minute"] for r in rounds]),
        "deployments_per_minute_each": [r["deployments_per_minute"] for r in rounds],
        "cpu_s_per_deployment": mean([total(r) for r in rounds]),
        "cpu_s_per_deployment_each": [round(total(r), 4) for r in rounds],
        "server_cpu_s_per_deployment": mean([r["cpu_s_per_deployment"]["server"] for r in rounds]),
        "postgres_cpu_s_per_deployment": mean([r["cpu_s_per_deployment"]["postgres"] for r in rounds]),
        "runners_and_engine_cpu_s_per_deployment": mean(
            [r["cpu_s_per_deployment"]["runners_and_engine"] for r in rounds]
        ),
        "created_to_completed_p50_s": mean([r["created_to_completed_s"]["p50"] for r in rounds]),
        "machine_cpus_busy": mean([r["machine_cpus"]["busy"] for r in rounds]),
        "chunks_per_deployment": mean([r["stored"]["chunks_per_deployment"]["mean"] for r in rounds]),
    }


# --- report ----------------------------------------------------------------------------------------


def _s(value: Any, digits: int = 2) -> str:
    return burst._s(value, digits)


def _ms(seconds: Any) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def _mib(kib: Any) -> str:
    return "-" if kib is None else f"{kib / 1024:.1f}"


def report(database: str, run: dict[str, Any]) -> str:
    out: list[str] = []
    lat = run.get("latency")
    if lat:
        rows: list[tuple[str, ...]] = [
            (
                "latency (s)",
                "deployments",
                "marks",
                "p50",
                "p90",
                "p99",
                "max",
                "x alone p50/p99",
                "lost",
                "repeated",
                "missing marks",
            )
        ]
        labels = {
            "alone": "1 alone (baseline)",
            "staggered": f"{lat['staggered']['deployments']} at once, starts spread over 1 s",
            "aligned": f"{lat['aligned']['deployments']} at once, aligned starts",
        }
        for key, label in labels.items():
            r = lat[key]
            latency = r["latency_s"]
            ratio = lat["ratios"].get(key, {"p50": 1.0, "p99": 1.0})
            rows.append(
                (
                    f"{label}: written -> follower",
                    str(r["deployments"]),
                    str(r["marks_received"]),
                    _s(latency["p50"]),
                    _s(latency["p90"]),
                    _s(latency["p99"]),
                    _s(latency["max"]),
                    f"{_s(ratio['p50'])} / {_s(ratio['p99'])}",
                    str(r["lost"]),
                    str(r["repeated"]),
                    str(r["marks_missing"]),
                )
            )
            for part, name in (
                ("marked_to_emitted_s", "  written -> Terraform's JSON line"),
                ("emitted_to_stored_s", "  Terraform's line -> stored"),
                ("stored_to_follower_s", "  stored -> follower"),
            ):
                s = r[part]
                rows.append(
                    (name, "", "", _s(s["p50"]), _s(s["p90"]), _s(s["p99"]), _s(s["max"]), "", "", "", "")
                )
        out.append(f"latency ({database})\n" + deploy.table(rows))
        for key in ("staggered", "aligned"):
            r = lat[key]
            met = all(
                v is not None and v <= TARGET_LATENCY_S
                for v in (r["latency_s"]["p50"], r["latency_s"]["p99"])
            )
            out.append(
                f"{labels[key]}: marking at once p50 {_s(r['marking_at_once']['p50'], 0)}, "
                f"max {_s(r['marking_at_once']['max'], 0)}; {r['succeeded']} succeeded; "
                f"chunks {r['chunks']}, lost {r['lost']}, repeated {r['repeated']}; "
                f"target p50 and p99 <= {TARGET_LATENCY_S} s: {'met' if met else 'NOT met'}"
            )
        for key in labels:
            r = lat[key]
            put, wait, cpus = r["server_chunk_put_s"], r["server_writer_wait_s"], r["while_marking_cpus"]
            marking_s = lat["options"]["marks"] * lat["options"]["mark_interval_s"]
            cpu_per_put = (
                cpus["server"] * marking_s / put["count"]
                if cpus["server"] is not None and put["count"]
                else None
            )
            out.append(
                f"{labels[key]}, while marking: CPUs busy: server {_s(cpus['server'])}, "
                f"machine {_s(cpus['machine_busy'])}; server's chunk PUTs {put['count']}, "
                f"mean {_ms(put['mean'])} ms, p50 <= {_ms(put['p50_under'])} ms, "
                f"p99 <= {_ms(put['p99_under'])} ms; server CPU per PUT {_ms(cpu_per_put)} ms; "
                f"writer lock wait mean {_ms(wait['mean'])} ms, p99 <= {_ms(wait['p99_under'])} ms"
            )
            writes, batches = r.get("server_chunk_writes_s"), r.get("server_chunk_batches")
            if writes and batches and writes["count"]:
                out.append(
                    f"{labels[key]}, chunk writer: {writes['count']} transactions, "
                    f"{_s(batches['mean'])} chunks each (mean), each mean {_ms(writes['mean'])} ms, "
                    f"p99 <= {_ms(writes['p99_under'])} ms"
                )
    mem = run.get("memory")
    if mem:
        rows = [
            (
                "memory (MiB)",
                "server peak",
                "above idle",
                "server RSS after",
                "peak streaming / RSS after it",
                "server RSS by quarter",
                "runner peak",
                "engine peak",
                "log streamed",
                "chunks",
                "lost",
                "seconds",
            )
        ]
        for key, step in mem["steps"].items():
            follow = step.get("follow") or {}
            rows.append(
                (
                    {
                        "idle": "server idle",
                        "trivial": "trivial deployment",
                        "big": f"~{mem['options']['log_mib']:g} MiB log",
                    }[key],
                    _mib(step["server_peak_kib"]),
                    _s(step["server_peak_above_idle_mib"], 1),
                    _mib(step["server_rss_kib"]),
                    f"{_mib(step.get('server_streaming_peak_kib'))} / "
                    f"{_mib(step.get('server_after_streaming_peak_kib'))}",
                    " ".join(_mib(v) for v in step["server_rss_quarters_peak_kib"]) or "-",
                    _mib(step["runner_peak_kib"] or None),
                    _mib(step["engine_peak_kib"] or None),
                    "-" if not follow else f"{follow['text_bytes'] / MIB:.1f}",
                    str(follow.get("chunks", "-")),
                    str(step.get("lost", "-")),
                    _s(step["seconds"], 1),
                )
            )
        out.append(f"memory ({database})\n" + deploy.table(rows))
    cost = run.get("cost")
    if cost:
        rows = [
            (
                "cost",
                "rounds",
                "deployments/min",
                "CPU s/deployment",
                "server",
                "runners+engine",
                "postgres",
                "chunks/deployment",
                "created->completed p50 s",
            )
        ]
        for mode in ("off", "on"):
            m = cost["modes"][mode]
            rows.append(
                (
                    f"streaming {mode}" + (" (baseline)" if mode == "off" else ""),
                    str(m["rounds"]),
                    " ".join(_s(v, 1) for v in m["deployments_per_minute_each"]),
                    " ".join(_s(v, 3) for v in m["cpu_s_per_deployment_each"]),
                    _s(m["server_cpu_s_per_deployment"], 3),
                    _s(m["runners_and_engine_cpu_s_per_deployment"], 3),
                    _s(m["postgres_cpu_s_per_deployment"], 3),
                    _s(m["chunks_per_deployment"], 1),
                    _s(m["created_to_completed_p50_s"], 1),
                )
            )
        rate, cpu = cost["ratio_rate_on_off"], cost["ratio_cpu_on_off"]
        met = rate is not None and cpu is not None and rate >= 1 - TARGET_COST and cpu <= 1 + TARGET_COST
        out.append(
            f"cost ({database}, bursts of {cost['options']['burst']}, "
            f"order {' '.join(cost['options']['order'])})\n"
            + deploy.table(rows)
            + f"\non / off: deployments per minute x{_s(rate)}, CPU per deployment x{_s(cpu)} "
            f"(target: at most {TARGET_COST:.0%} cost: {'met' if met else 'NOT met'})"
        )
    return "\n\n".join(out)


def problems(databases: Mapping[str, dict[str, Any]]) -> list[str]:
    found: list[str] = []
    for database, run in databases.items():
        lat = run.get("latency") or {}
        for key in ("alone", "staggered", "aligned") if lat else ():
            r = lat[key]
            if r["lost"] or r["repeated"] or r["undecryptable"] or r["not_ended"]:
                found.append(
                    f"{database} latency {key}: chunks lost {r['lost']}, repeated {r['repeated']}, "
                    f"undecryptable {r['undecryptable']}, follows not ended {r['not_ended']}"
                )
            if r["marks_missing"] or r["marks_repeated"] or r["deployments_without_marks"]:
                found.append(
                    f"{database} latency {key}: markers missing {r['marks_missing']}, repeated "
                    f"{r['marks_repeated']}, deployments without any {r['deployments_without_marks']}"
                )
            if r["succeeded"] != r["deployments"]:
                found.append(
                    f"{database} latency {key}: {r['deployments'] - r['succeeded']} not succeeded: "
                    f"{r['failed'][:2]}"
                )
        mem = run.get("memory")
        for key, step in (mem or {}).get("steps", {}).items():
            if "follow" in step and (
                step["lost"]
                or step["repeated"]
                or step["not_ended"]
                or step["undecryptable"]
                or step["follow"]["status"] != "succeeded"
            ):
                found.append(f"{database} memory {key}: {step['follow']}")
        cost = run.get("cost")
        for r in (cost or {}).get("rounds", []):
            if r["create_errors"] or r["failed"] or r["not_completed"] or r["run_twice"]:
                found.append(
                    f"{database} cost ({r['streaming']}): create errors {r['create_errors']}, failed "
                    f"{r['failed'][:2]}, not completed {r['not_completed']}, run twice {r['run_twice']}"
                )
            stored = r["stored"]
            if r["streaming"] == "off" and stored["with_chunks"]:
                found.append(
                    f"{database} cost: {stored['with_chunks']} deployments streamed with streaming off"
                )
            if r["streaming"] == "on" and stored["with_chunks"] != stored["deployments"]:
                found.append(
                    f"{database} cost: {stored['deployments'] - stored['with_chunks']} deployments "
                    "streamed nothing with streaming on"
                )
    return found


# --- the run ---------------------------------------------------------------------------------------


def run_one(database: str, options: Options) -> dict[str, Any]:
    keys = age.generate_identity()
    result: dict[str, Any] = {}
    for part, measure in (("latency", latency_part), ("memory", memory_part), ("cost", cost_part)):
        if options.only not in (None, part):
            continue
        with tempfile.TemporaryDirectory(prefix=f"po-bench-live-logs-{part}-") as tmp:
            result[part] = measure(database, Path(tmp), options, keys)
    return result


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="sqlite")
    parser.add_argument("--only", choices=["latency", "memory", "cost"], help="run one part only")
    parser.add_argument(
        "--followers", type=int, default=50, help="deployments streaming at once (default 50)"
    )
    parser.add_argument("--mark-seconds", type=float, default=10.0, help="how long each prints markers (10)")
    parser.add_argument("--mark-interval", type=float, default=0.2, help="seconds between markers (0.2)")
    parser.add_argument(
        "--barrier-timeout", type=float, default=600.0, help="longest wait for every provisioner (600 s)"
    )
    parser.add_argument("--log-mib", type=float, default=100.0, help="size of the large log (100 MiB)")
    parser.add_argument("--line-bytes", type=int, default=1000, help="its provisioner's line length (1000)")
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="idle server measured (5 s)")
    parser.add_argument("--burst", type=int, default=100, help="deployments per cost burst (default 100)")
    parser.add_argument(
        "--cost-rounds", type=int, default=2, help="burst pairs, alternating off on / on off (default 2)"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent creates (default 16)")
    parser.add_argument(
        "--local-run-limit",
        type=int,
        help="the servers' PO_LOCAL_RUN_LIMIT (default: theirs; the latency part: at least --followers)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if min(args.followers, args.burst, args.cost_rounds, args.concurrency, args.line_bytes) < 1:
        parser.error("--followers, --burst, --cost-rounds, --concurrency and --line-bytes must be >= 1")
    if min(args.mark_seconds, args.mark_interval, args.log_mib, args.barrier_timeout) <= 0:
        parser.error("--mark-seconds, --mark-interval, --log-mib and --barrier-timeout must be > 0")
    return Options(
        databases=("sqlite", "postgresql") if args.database == "both" else (args.database,),
        only=args.only,
        followers=args.followers,
        mark_seconds=args.mark_seconds,
        mark_interval=args.mark_interval,
        barrier_timeout=args.barrier_timeout,
        log_mib=args.log_mib,
        line_bytes=args.line_bytes,
        idle_seconds=max(0.0, args.idle_seconds),
        burst=args.burst,
        cost_rounds=args.cost_rounds,
        concurrency=args.concurrency,
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
        databases = {database: run_one(database, options) for database in options.databases}
    except api.BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the server was stopped", file=sys.stderr)
        return 130
    result = {
        "benchmark": "live_logs",
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
        (options.results_dir / f"live-logs-{database}.json").write_text(
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
    found = problems(databases)
    for problem in found:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
