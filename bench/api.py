"""API benchmark: `orchestrator serve` with 10,000 runners, on SQLite and/or PostgreSQL.

    uv run python bench/api.py [--database sqlite|postgresql|both] [--requests N] [--concurrency C]
                               [--runners 10000] [--warmup W] [--max-seconds S]

For each database it starts the server as a child process (fresh data dir; for PostgreSQL a throwaway
cluster from tests/support/postgres.py), seeds an org, an admin token and the runners through the API,
then measures each operation after a warm-up with the load generator in ``loadgen.py``. It prints a
table whose last columns are each rate divided by the rate of ``GET /healthz`` measured in the same run,
and writes the same to bench/results/api-<database>.json. See bench/README.md for how to read it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import loadgen
import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
#: A kubernetes-agent runner: no secret fields, so nothing is sealed on create.
PLAIN_RUNNER = ROOT / "tests" / "data" / "runners" / "seed000-agent.yaml"
#: A vm runner over SSH: a private key and two job secrets, sealed (AES-256-GCM) on create.
SECRET_RUNNER = ROOT / "tests" / "data" / "runners" / "vm-ssh.yaml"
ORG = "bench"
ENV_TYPE = "bench-env"
PER_PAGE = 50
STARTUP_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 15.0
REQUEST_TIMEOUT_SECONDS = 30.0
SEED_MAX_SECONDS = 300.0


@dataclass(frozen=True, kw_only=True)
class Options:
    databases: tuple[str, ...]
    requests: int
    concurrency: int
    runners: int
    warmup: int
    max_seconds: float


class BenchError(RuntimeError):
    """The benchmark could not set up or run its scenario."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """`orchestrator serve` as a child process on 127.0.0.1; stopped by its PID (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        *,
        data_dir: Path,
        database_url: str | None,
        bootstrap_token: str,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self._extra_env = dict(extra_env or {})
        self.log_path = data_dir / "server.log"
        self.base_url = ""
        self._database_url = database_url
        self._bootstrap_token = bootstrap_token
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        executable = shutil.which("orchestrator", path=str(Path(sys.executable).parent))
        if executable is None:
            raise BenchError(f"no `orchestrator` console script next to {sys.executable}: run `uv sync`")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PO_")}
        env |= {
            "PO_DATA_DIR": str(self.data_dir),
            "PO_LISTEN": f"127.0.0.1:{port}",
            "PO_BOOTSTRAP_TOKEN": self._bootstrap_token,
            "PO_LOG_LEVEL": "warning",
        }
        env |= self._extra_env
        if self._database_url is not None:
            env["PO_DATABASE_URL"] = self._database_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            # A session of its own: a Ctrl-C in the terminal reaches only us, and we stop it by PID.
            self._process = subprocess.Popen(
                [executable, "serve"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.base_url = f"http://127.0.0.1:{port}"
        self._wait_healthy()
        return self.base_url

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def _wait_healthy(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BenchError(f"the server exited with {self._process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.base_url}/healthz", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise BenchError(
            f"the server did not answer /healthz in {STARTUP_TIMEOUT_SECONDS:.0f} s:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_SECONDS)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"


@contextlib.contextmanager
def postgres_database(base_dir: Path) -> Iterator[tuple[str, int]]:
    """A throwaway PostgreSQL cluster with an empty database; yields its SQLAlchemy URL and postmaster PID."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.support.postgres import PostgresServer

    server = PostgresServer()
    try:
        server.start(base_dir)
        server.create_database("bench")
        assert server.pid is not None
        yield server.url("bench"), server.pid
    finally:
        server.stop()


def _stat_fields(stat: str) -> list[str]:
    """The fields of /proc/PID/stat after the parenthesised command name (index 0 is field 3, state)."""
    return stat.rsplit(")", 1)[1].split()


def _cpu_seconds(fields: list[str], *, reaped_children: bool = False) -> float:
    # utime and stime are fields 14 and 15; cutime and cstime (children waited for) 16 and 17.
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, kw_only=True)
class CpuMeter:
    """CPU seconds (user + system) of the server process and of PostgreSQL's processes, from /proc.

    Less sensitive than wall-clock rates to other load on the machine. PostgreSQL's share is the
    postmaster, its live children (the backends of the server's connections) and the children it has
    reaped (backends of connections the server closed meanwhile).
    """

    server_pid: int
    postmaster_pid: int | None

    def read(self) -> tuple[float, float]:
        try:
            server = _cpu_seconds(_stat_fields(Path(f"/proc/{self.server_pid}/stat").read_text()))
        except OSError:
            return math.nan, math.nan
        if self.postmaster_pid is None:
            return server, math.nan
        postgres = 0.0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = _stat_fields((entry / "stat").read_text())
            except OSError:
                continue  # exited meanwhile
            if int(entry.name) == self.postmaster_pid:
                postgres += _cpu_seconds(fields, reaped_children=True)
            elif int(fields[1]) == self.postmaster_pid:
                postgres += _cpu_seconds(fields)
        return server, postgres


def _body(path: Path) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(path.read_text())
    return body


class Scenario:
    """The seeded data and the iterations measured against it."""

    def __init__(self, client: httpx.AsyncClient, options: Options) -> None:
        self.client = client
        self.options = options
        self.runner_ids = [f"runner-{n:06d}" for n in range(options.runners)]
        self.deep_page_token = ""
        self._plain = _body(PLAIN_RUNNER)
        self._secret = _body(SECRET_RUNNER)
        self._rng = random.Random(1)
        # Rules must not share a (project, env type) match, so each in-flight rule borrows a project.
        self._free_projects: asyncio.Queue[str] = asyncio.Queue()

    async def _expect(self, method: str, url: str, status: int, **kwargs: Any) -> Any:
        response = await self.client.request(method, url, **kwargs)
        if response.status_code != status:
            raise BenchError(f"{method} {url}: {response.status_code} {response.text[:300]}")
        return response.json() if response.content else None

    async def set_up(self, bootstrap_token: str) -> None:
        """The org, an admin token (used from then on), an env type and one project per worker."""
        admin = {"authorization": f"Bearer {bootstrap_token}"}
        await self._expect("POST", "/orgs", 201, json={"id": ORG}, headers=admin)
        created = await self._expect(
            "POST", f"/orgs/{ORG}/tokens", 201, json={"role": "admin"}, headers=admin
        )
        self.client.headers["authorization"] = f"Bearer {created['token']}"
        await self._expect("POST", f"/orgs/{ORG}/env-types", 201, json={"id": ENV_TYPE})
        for n in range(self.options.concurrency):
            project = f"bench-p{n}"
            await self._expect("POST", f"/orgs/{ORG}/projects", 201, json={"id": project})
            self._free_projects.put_nowait(project)

    async def seed_runner(self, recorder: loadgen.Recorder, n: int) -> None:
        body = {**self._plain, "id": self.runner_ids[n]}
        await recorder.call(self.client, "POST runner", "POST", f"/orgs/{ORG}/runners", expect=201, json=body)

    async def find_deep_page(self) -> tuple[int, int]:
        """Follow page tokens to the next-to-last page; return (page number, page count)."""
        pages = -(-len(self.runner_ids) // PER_PAGE)
        target = max(1, pages - 1)
        token = ""
        for _ in range(target - 1):
            page = await self._expect("GET", f"/orgs/{ORG}/runners", 200, params=self._page_params(token))
            token = page["next_page_token"]
        page = await self._expect("GET", f"/orgs/{ORG}/runners", 200, params=self._page_params(token))
        expected = self.runner_ids[(target - 1) * PER_PAGE : target * PER_PAGE]
        if [item["id"] for item in page["items"]] != expected:
            raise BenchError(f"page {target} does not hold runners {expected[0]}..{expected[-1]}")
        self.deep_page_token = token
        return target, pages

    @staticmethod
    def _page_params(token: str) -> dict[str, str | int]:
        return {"per_page": PER_PAGE, "page": token} if token else {"per_page": PER_PAGE}

    async def healthz(self, recorder: loadgen.Recorder, n: int) -> None:
        await recorder.call(self.client, "GET healthz", "GET", "/healthz", expect=200)

    async def get_runner(self, recorder: loadgen.Recorder, n: int) -> None:
        runner_id = self._rng.choice(self.runner_ids)
        await recorder.call(self.client, "GET runner", "GET", f"/orgs/{ORG}/runners/{runner_id}", expect=200)

    async def first_page(self, recorder: loadgen.Recorder, n: int) -> None:
        params = self._page_params("")
        await recorder.call(self.client, "GET page", "GET", f"/orgs/{ORG}/runners", expect=200, params=params)

    async def deep_page(self, recorder: loadgen.Recorder, n: int) -> None:
        params = self._page_params(self.deep_page_token)
        await recorder.call(self.client, "GET page", "GET", f"/orgs/{ORG}/runners", expect=200, params=params)

    async def rule_create_delete(self, recorder: loadgen.Recorder, n: int) -> None:
        project = await self._free_projects.get()
        try:
            body = {
                "runner_id": self._rng.choice(self.runner_ids),
                "project_id": project,
                "env_type_id": ENV_TYPE,
            }
            url = f"/orgs/{ORG}/runner-rules"
            created = await recorder.call(self.client, "POST rule", "POST", url, expect=201, json=body)
            if created is not None:
                rule_id = created.json()["id"]
                await recorder.call(self.client, "DELETE rule", "DELETE", f"{url}/{rule_id}", expect=204)
        finally:
            self._free_projects.put_nowait(project)

    async def create_plain_runner(self, recorder: loadgen.Recorder, n: int) -> None:
        body = {**self._plain, "id": f"plain-{n:06d}"}
        await recorder.call(self.client, "POST runner", "POST", f"/orgs/{ORG}/runners", expect=201, json=body)

    async def create_secret_runner(self, recorder: loadgen.Recorder, n: int) -> None:
        body = {**self._secret, "id": f"secret-{n:06d}"}
        await recorder.call(self.client, "POST runner", "POST", f"/orgs/{ORG}/runners", expect=201, json=body)


@dataclass(frozen=True, kw_only=True)
class Measured:
    phase: loadgen.Phase
    server_cpu_s: float
    postgres_cpu_s: float
    client_cpu_s: float

    def row(self, operation: str) -> loadgen.Row:
        return loadgen.row(
            operation,
            self.phase,
            app_cpu_s=self.server_cpu_s,
            db_cpu_s=self.postgres_cpu_s,
            client_cpu_s=self.client_cpu_s,
        )


async def measure(
    name: str,
    iteration: loadgen.Iteration,
    iterations: int,
    options: Options,
    cpu: CpuMeter,
    notes: list[str],
) -> Measured:
    """Warm up (iteration numbers after the measured ones, so created ids never clash), then measure."""

    async def warm(recorder: loadgen.Recorder, n: int) -> None:
        await iteration(recorder, iterations + n)

    concurrency, max_seconds = options.concurrency, options.max_seconds
    warmup = await loadgen.run(
        warm, iterations=options.warmup, concurrency=concurrency, max_seconds=max_seconds
    )
    if warmup.recorder.errors:
        notes.append(f"{name}: warm-up errors {dict(warmup.recorder.errors)}")
    server_before, postgres_before = cpu.read()
    client_before = time.process_time()
    phase = await loadgen.run(
        iteration, iterations=iterations, concurrency=concurrency, max_seconds=max_seconds
    )
    client_cpu_s = time.process_time() - client_before
    server_after, postgres_after = cpu.read()
    if phase.recorder.errors:
        notes.append(f"{name}: errors {dict(phase.recorder.errors)}; e.g. {phase.recorder.error_examples}")
    print(f"  {name}: {phase.iterations} iterations in {phase.seconds:.1f} s", flush=True)
    return Measured(
        phase=phase,
        server_cpu_s=server_after - server_before,
        postgres_cpu_s=postgres_after - postgres_before,
        client_cpu_s=client_cpu_s,
    )


@dataclass(frozen=True, kw_only=True)
class Outcome:
    rows: list[loadgen.Row]
    #: Errors met while measuring (the run goes on; they are counted in the rows too).
    notes: list[str]


async def benchmark(base_url: str, bootstrap_token: str, options: Options, cpu: CpuMeter) -> Outcome:
    """Set up and seed, then measure every operation; rows carry their ratio to the baseline."""
    n = options.requests
    notes: list[str] = []
    limits = httpx.Limits(max_connections=options.concurrency, max_keepalive_connections=options.concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=REQUEST_TIMEOUT_SECONDS) as client:
        scenario = Scenario(client, options)
        await scenario.set_up(bootstrap_token)
        print(f"  seeding {options.runners} runners through the API ...", flush=True)
        seed_cpu = cpu.read()
        seed_client_cpu = time.process_time()
        seed = await loadgen.run(
            scenario.seed_runner,
            iterations=options.runners,
            concurrency=options.concurrency,
            max_seconds=SEED_MAX_SECONDS,
        )
        seed_cpu_after = cpu.read()
        seeded = Measured(
            phase=seed,
            server_cpu_s=seed_cpu_after[0] - seed_cpu[0],
            postgres_cpu_s=seed_cpu_after[1] - seed_cpu[1],
            client_cpu_s=time.process_time() - seed_client_cpu,
        )
        if seed.recorder.errors or seed.capped:
            raise BenchError(f"seeding failed: {dict(seed.recorder.errors)} {seed.recorder.error_examples}")
        print(f"  seeded in {seed.seconds:.1f} s", flush=True)
        deep, pages = await scenario.find_deep_page()

        baseline = await measure("GET /healthz", scenario.healthz, n, options, cpu, notes)
        get_one = await measure("GET runner", scenario.get_runner, n, options, cpu, notes)
        first = await measure("first page", scenario.first_page, n, options, cpu, notes)
        deep_phase = await measure("deep page", scenario.deep_page, n, options, cpu, notes)
        rules = await measure("rule create+delete", scenario.rule_create_delete, n // 2, options, cpu, notes)
        plain = await measure(
            "POST runner, no secrets", scenario.create_plain_runner, n // 2, options, cpu, notes
        )
        secret = await measure(
            "POST runner, secrets", scenario.create_secret_runner, n // 2, options, cpu, notes
        )

    base_row = baseline.row("GET /healthz (baseline, no database)")
    rows = [
        base_row,
        get_one.row(f"GET /runners/{{id}} (random of {options.runners})"),
        first.row(f"GET /runners?per_page={PER_PAGE} (page 1)"),
        deep_phase.row(f"GET /runners?per_page={PER_PAGE}&page=... (page {deep} of {pages})"),
        rules.row("runner rule POST + DELETE (iterations)"),
        loadgen.row("  POST /runner-rules", rules.phase, "POST rule"),
        loadgen.row("  DELETE /runner-rules/{id}", rules.phase, "DELETE rule"),
        plain.row("POST /runners (no secrets)"),
        secret.row("POST /runners (3 secrets, sealed)"),
        seeded.row(f"seed: POST /runners x{options.runners} (no warm-up)"),
    ]
    return Outcome(rows=loadgen.with_ratio(rows, base_row), notes=notes)


def run_database(database: str, options: Options) -> None:
    bootstrap_token = "po_bench_" + os.urandom(16).hex()
    cpus = os.cpu_count()
    sharing = "the load generator, the server" + (" and PostgreSQL" if database == "postgresql" else "")
    print(
        f"\n== {database}: {options.runners} runners, concurrency {options.concurrency}, {options.requests} "
        f"requests per operation (warm-up {options.warmup}, cap {options.max_seconds:.0f} s)",
        flush=True,
    )
    print(f"   {cpus} CPUs shared by {sharing}: compare the ratios, not absolute rates", flush=True)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="po-bench-")))
        database_url, postmaster_pid = None, None
        if database == "postgresql":
            database_url, postmaster_pid = stack.enter_context(postgres_database(tmp / "pg"))
        server = ServerProcess(
            data_dir=tmp / "data", database_url=database_url, bootstrap_token=bootstrap_token
        )
        stack.callback(_keep_log, server, database)
        stack.callback(server.stop)
        server.start()
        cpu = CpuMeter(server_pid=server.pid, postmaster_pid=postmaster_pid)
        load_before = os.getloadavg()
        outcome = asyncio.run(benchmark(server.base_url, bootstrap_token, options, cpu))
        load_after = os.getloadavg()
    rows, notes = outcome.rows, outcome.notes
    print(loadgen.table(rows))
    print(f"load average (1/5/15 min) before {_load(load_before)}, after {_load(load_after)}")
    for note in notes:
        print(f"NOTE {note}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    report = {
        "database": database,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": cpus,
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1_5_15_min_before": load_before,
            "load_average_1_5_15_min_after": load_after,
        },
        "note": f"{cpus} CPUs shared by {sharing}; ratio_to_baseline = per_second / GET /healthz per_second",
        "options": {k: v for k, v in options.__dict__.items() if k != "databases"},
        "operations": [r.as_json() for r in rows],
        "errors": notes,
    }
    path = RESULTS_DIR / f"api-{database}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")


def _load(averages: tuple[float, float, float]) -> str:
    return "/".join(f"{value:.2f}" for value in averages)


def _keep_log(server: ServerProcess, database: str) -> None:
    """Keep the server's log next to the results (it holds any traceback the server logged)."""
    if server.log_path.exists():
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(server.log_path, RESULTS_DIR / f"api-{database}-server.log")


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through the `finally`s that stop the server and PostgreSQL


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--requests", type=int, default=2000, help="requests per operation (default 2000)")
    parser.add_argument("--concurrency", type=int, default=16, help="in-flight requests (default 16)")
    parser.add_argument("--runners", type=int, default=10_000, help="runners to seed (default 10000)")
    parser.add_argument(
        "--warmup", type=int, default=200, help="warm-up iterations per operation (default 200)"
    )
    parser.add_argument("--max-seconds", type=float, default=30.0, help="wall-clock cap per operation")
    args = parser.parse_args(argv)
    if args.requests < 2 or args.concurrency < 1 or args.runners < PER_PAGE * 2 or args.warmup < 0:
        parser.error(f"need --requests >= 2, --concurrency >= 1, --runners >= {PER_PAGE * 2}, --warmup >= 0")
    databases = ("sqlite", "postgresql") if args.database == "both" else (args.database,)
    return Options(
        databases=databases,
        requests=args.requests,
        concurrency=args.concurrency,
        runners=args.runners,
        warmup=args.warmup,
        max_seconds=args.max_seconds,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    started = time.monotonic()
    try:
        for database in options.databases:
            run_database(database, options)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the server and PostgreSQL were stopped", file=sys.stderr)
        return 130
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
