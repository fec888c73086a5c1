"""Console benchmark: what a page view of the web console costs the server, against the same API calls
made directly, and the deployments page with 10,000 deployments against the API's first page.

    uv run python bench/console.py [--database sqlite|postgresql|both] [--deployments 10000] [--views 100]

For each database it starts ``orchestrator serve`` as a child process (bench/api.py's ``ServerProcess``),
seeds an organization through the API and ``--deployments`` finished deployments straight into the
database (tests/support/deployments.py's ``insert_run``), signs in to the console in headless Chromium
(Debian's ``chromium``, PyPI ``playwright``) and, for each page:

1. views it ``--views`` times (a hash change re-renders the page: the page's API calls, no file is
   fetched again), recording the API requests each view made and the server's CPU seconds (user +
   system, /proc) over all views;
2. replays exactly those requests (method, URL, headers, body) with httpx, view by view, each view's
   requests concurrently as the page makes them, and measures the server's CPU the same way.

It prints, per page, the API calls of a view, the server's CPU milliseconds per view both ways and
their ratio (the console's promise: within 10 % of 1.00), and for the deployments page the median time
to a rendered page against the median time of ``GET /orgs/{org}/deployments?per_page=50`` alone. It
writes bench/results/console-<database>.json. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import api
import httpx
import repo_path  # noqa: F401  (puts the repository root on sys.path for tests.support)
import yaml

from orchestrator.store import db
from tests.support.deployments import insert_run

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
ORG = "bench"
PROJECT = "shop"
ENVS = ("dev", "staging", "prod", "qa", "demo")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
]
#: After a view rendered, requests it still makes (a deployment's log stream) are waited for this long.
SETTLE_SECONDS = 0.3
#: Headers of the browser's requests that the replaying client sets itself.
SET_BY_CLIENT = frozenset({"host", "content-length", "connection"})
#: Requests the page sent within this long of each other were sent together.
WAVE_SECONDS = 0.002
#: Views per round (console, then the same requests direct).
ROUND = 10


@dataclass(frozen=True, kw_only=True)
class Options:
    databases: tuple[str, ...]
    deployments: int
    views: int


@dataclass
class Sent:
    method: str
    url: str
    headers: dict[str, str]
    body: str | None
    #: When the page sent it (time.monotonic()): requests sent together are replayed together.
    at: float


@dataclass
class PageResult:
    name: str
    calls_per_view: float
    console_cpu_ms: float
    direct_cpu_ms: float
    view_ms: list[float] = field(default_factory=list)
    #: Per view: the longest API request the page waited for before it was rendered.
    api_wait_ms: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.console_cpu_ms / self.direct_cpu_ms if self.direct_cpu_ms else float("nan")


def seed(base_url: str, bootstrap_token: str) -> str:
    """The organization, its admin token (answered), an env type, project shop and its environments, an
    agent runner (nothing is launched) and a rule."""
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {bootstrap_token}"}) as platform_:
        _expect(platform_.post("/orgs", json={"id": ORG}), 201)
        token: str = _expect(platform_.post(f"/orgs/{ORG}/tokens", json={"role": "admin"}), 201)["token"]
    runner = yaml.safe_load((ROOT / "tests" / "data" / "runners" / "seed000-agent.yaml").read_text())
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}) as client:
        _expect(client.post(f"/orgs/{ORG}/env-types", json={"id": "development"}), 201)
        _expect(client.post(f"/orgs/{ORG}/projects", json={"id": PROJECT}), 201)
        for env in ENVS:
            body = {"id": env, "env_type_id": "development"}
            _expect(client.post(f"/orgs/{ORG}/projects/{PROJECT}/envs", json=body), 201)
        _expect(client.post(f"/orgs/{ORG}/runners", json={"id": "agent", **runner}), 201)
        _expect(client.post(f"/orgs/{ORG}/runner-rules", json={"runner_id": "agent"}), 201)
    return token


def _expect(response: httpx.Response, status: int) -> Any:
    if response.status_code != status:
        raise api.BenchError(
            f"{response.request.method} {response.request.url}: {response.status_code} {response.text}"
        )
    return response.json()


async def seed_deployments(database_url: str, envs: list[dict[str, Any]], count: int) -> str:
    """``count`` finished deployments spread over ``envs`` (as the API answers them), one minute apart;
    the newest's id."""
    engine = db.create_engine(database_url)
    start = datetime.now(UTC) - timedelta(minutes=count + 5)
    newest: uuid.UUID | None = None
    try:
        for first in range(0, count, 500):
            async with engine.begin() as conn:
                for n in range(first, min(count, first + 500)):
                    created = start + timedelta(minutes=n)
                    newest = await insert_run(
                        conn,
                        ORG,
                        envs[n % len(envs)],
                        runner_id="agent",
                        created_at=created,
                        launched_at=created + timedelta(seconds=2),
                        completed_at=created + timedelta(seconds=40),
                    )
    finally:
        await engine.dispose()
    assert newest is not None
    return str(newest)


class Console:
    """The console in one Chromium tab, signed in; views a page and records its API requests."""

    def __init__(self, page: Any, base_url: str) -> None:
        self.page = page
        self.base_url = base_url
        self.recording: list[Sent] | None = None
        page.on("request", self._request)

    def _request(self, request: Any) -> None:
        if self.recording is not None and "/console/" not in request.url:
            sent = Sent(
                request.method, request.url, dict(request.headers), request.post_data, time.monotonic()
            )
            self.recording.append(sent)

    def sign_in(self, token: str) -> None:
        self.page.goto(f"{self.base_url}/")
        self.page.get_by_label("API token").fill(token)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_selector("article.runner")

    def view(self, route: str) -> tuple[list[Sent], float, float]:
        """One view of ``route`` (navigating there, or re-rendering it): its requests, its time to a
        rendered page in milliseconds, measured in the page (hash change to the page's render done), and
        the longest API request the page waited for within it."""
        self.recording = []
        elapsed, waited = self.page.evaluate(VIEW_SCRIPT, route)
        self.page.wait_for_timeout(SETTLE_SECONDS * 1000)
        sent, self.recording = self.recording, None
        return sent, elapsed, waited

    def fetch_ms(self, path: str) -> float:
        """One ``fetch`` of the API from the page (its token), in milliseconds."""
        elapsed: float = self.page.evaluate(FETCH_SCRIPT, path)
        return elapsed


#: Navigate (or re-render the same route) and resolve with the milliseconds until app.js marks the view
#: rendered (main's data-rendered changes).
VIEW_SCRIPT = """route => new Promise(resolve => {
  const main = document.getElementById('main');
  const before = main.dataset.rendered;
  performance.clearResourceTimings();
  const started = performance.now();
  const observer = new MutationObserver(() => {
    if (main.dataset.rendered !== before) {
      observer.disconnect();
      const total = performance.now() - started;
      // The longest API request of the view that ended before it was rendered: what the page waited for.
      const waited = Math.max(0, ...performance.getEntriesByType('resource')
        .filter(e => e.responseEnd <= started + total).map(e => e.duration));
      resolve([total, waited]);
    }
  });
  observer.observe(main, {attributes: true, attributeFilter: ['data-rendered']});
  if (location.hash === route) window.dispatchEvent(new HashChangeEvent('hashchange'));
  else location.hash = route;
})"""
FETCH_SCRIPT = """async path => {
  const started = performance.now();
  const r = await fetch(new URL(path, new URL('../', document.baseURI)), {cache: 'no-store',
    headers: {Authorization: 'Bearer ' + sessionStorage.getItem('po.console.token')}});
  await r.json();
  return performance.now() - started;
}"""


def waves(requests: list[Sent]) -> list[list[Sent]]:
    """The view's requests in the waves the page sent them: together (within ``WAVE_SECONDS``), or after
    an answer (the deployments page's filters after its first page, a deployment's log after it)."""
    grouped: list[list[Sent]] = []
    for sent in requests:
        if grouped and sent.at - grouped[-1][-1].at <= WAVE_SECONDS:
            grouped[-1].append(sent)
        else:
            grouped.append([sent])
    return grouped


async def replay(views: list[list[Sent]], pace: float = 0.0) -> None:
    """Each view's requests as the page sent them (each wave concurrently, the waves one after the
    other), with the browser's headers; views one after the other, each taking at least ``pace`` seconds
    (as long as a view takes in the browser: the server idles alike between them)."""
    async with httpx.AsyncClient(timeout=60) as client:
        for requests in views:
            started = time.monotonic()
            for wave in waves(requests):
                await asyncio.gather(
                    *(
                        client.request(
                            sent.method,
                            sent.url,
                            headers={k: v for k, v in sent.headers.items() if k.lower() not in SET_BY_CLIENT},
                            content=sent.body,
                        )
                        for sent in wave
                    )
                )
            await asyncio.sleep(max(0.0, pace - (time.monotonic() - started)))


def in_thread(coroutine: Any) -> Any:
    """Run ``coroutine`` to its end in a thread of its own: Playwright's synchronous API runs an event loop
    in this one, where asyncio.run() cannot."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def idle_cpu_per_second(cpu: api.CpuMeter, seconds: float = 5.0) -> float:
    """The server's CPU seconds per second with no request: its background work (dispatcher, workers)."""
    before, started = cpu.read()[0], time.monotonic()
    time.sleep(seconds)
    return (cpu.read()[0] - before) / (time.monotonic() - started)


def cpu_of(cpu: api.CpuMeter, idle: float, work: Any) -> float:
    """The server's CPU seconds while ``work()`` runs, less its background work over that time."""
    before, started = cpu.read()[0], time.monotonic()
    work()
    used, elapsed = cpu.read()[0] - before, time.monotonic() - started
    return max(0.0, used - idle * elapsed)


def measure_page(
    console: Console, cpu: api.CpuMeter, idle: float, name: str, route: str, views: int
) -> PageResult:
    for _ in range(3):  # warm-up: the server's caches, the browser's modules
        console.view(route)
    recorded: list[list[Sent]] = []
    durations: list[float] = []
    waits: list[float] = []
    console_cpu = direct_cpu = 0.0
    # In rounds, console then direct, so that a change of the machine's load weighs on both alike.
    for done in range(0, views, ROUND):
        batch: list[list[Sent]] = []

        def view_batch(count: int = min(ROUND, views - done), batch: list[list[Sent]] = batch) -> None:
            for _ in range(count):
                sent, elapsed, waited = console.view(route)
                batch.append(sent)
                durations.append(elapsed)
                waits.append(waited)

        started = time.monotonic()
        console_cpu += cpu_of(cpu, idle, view_batch)
        pace = (time.monotonic() - started) / len(batch)
        if not recorded:
            in_thread(replay(batch[:3]))  # warm-up of the direct client
        direct_cpu += cpu_of(cpu, idle, lambda batch=batch, pace=pace: in_thread(replay(batch, pace)))
        recorded += batch
    return PageResult(
        name=name,
        calls_per_view=sum(len(r) for r in recorded) / views,
        console_cpu_ms=console_cpu * 1000 / views,
        direct_cpu_ms=direct_cpu * 1000 / views,
        view_ms=durations,
        api_wait_ms=waits,
    )


def run_database(database: str, options: Options) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    bootstrap_token = "po_bench_" + os.urandom(16).hex()
    print(f"\n== {database}: {options.deployments} deployments, {options.views} views per page", flush=True)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="po-bench-console-")))
        postmaster_pid = None
        if database == "postgresql":
            database_url, postmaster_pid = stack.enter_context(api.postgres_database(tmp / "pg"))
        else:
            database_url = f"sqlite+aiosqlite:///{tmp / 'bench.db'}"
        server = api.ServerProcess(
            data_dir=tmp / "data", database_url=database_url, bootstrap_token=bootstrap_token
        )
        stack.callback(server.stop)
        cpus = sorted(os.sched_getaffinity(0))
        stack.callback(os.sched_setaffinity, 0, cpus)
        if len(cpus) > 1:
            # The server on one CPU, the browser and the replaying client on the others (set before each
            # starts: children inherit it), so that the page's rendering does not slow the server's work.
            os.sched_setaffinity(0, cpus[:1])
        base_url = server.start()
        if len(cpus) > 1:
            os.sched_setaffinity(0, cpus[1:])
        cpu = api.CpuMeter(server_pid=server.pid, postmaster_pid=postmaster_pid)
        token = seed(base_url, bootstrap_token)
        seeded = time.perf_counter()
        with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}) as client:
            envs = _expect(client.get(f"/orgs/{ORG}/envs"), 200)["items"]
        newest = asyncio.run(seed_deployments(database_url, envs, options.deployments))
        print(
            f"   seeded {options.deployments} deployments in {time.perf_counter() - seeded:.1f} s", flush=True
        )
        playwright = stack.enter_context(sync_playwright())
        executable = os.environ.get("PO_TEST_CHROMIUM", "/usr/bin/chromium")
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        stack.callback(browser.close)
        console = Console(browser.new_page(viewport={"width": 1280, "height": 800}), base_url)
        console.sign_in(token)
        pages = [
            ("Runners", "#/runners"),
            ("Environments", "#/environments"),
            ("Deployments (first page)", "#/deployments"),
            ("A deployment", f"#/deployments/{newest}"),
            ("Usage", "#/usage"),
        ]
        idle = idle_cpu_per_second(cpu)
        print(
            f"   the idle server's background work: {idle * 1000:.1f} CPU ms per second (subtracted)",
            flush=True,
        )
        results = [measure_page(console, cpu, idle, name, route, options.views) for name, route in pages]
        for _ in range(3):
            console.fetch_ms(f"orgs/{ORG}/deployments?per_page=50")
        api_ms = [console.fetch_ms(f"orgs/{ORG}/deployments?per_page=50") for _ in range(options.views)]
    print(f"{'page':28} {'API calls':>9} {'CPU ms/view (console)':>22} {'(direct)':>9} {'ratio':>6}")
    for r in results:
        cpu_ms = f"{r.console_cpu_ms:22.2f} {r.direct_cpu_ms:9.2f}"
        print(f"{r.name:28} {r.calls_per_view:9.1f} {cpu_ms} {r.ratio:6.2f}")
    deployments = results[2]
    page_median, api_median = statistics.median(deployments.view_ms), statistics.median(api_ms)
    waited_median = statistics.median(deployments.api_wait_ms)
    print(
        f"deployments page with {options.deployments} deployments: median {page_median:.1f} ms from the "
        f"click to a rendered page, of which {waited_median:.1f} ms waiting for the API (one request: the "
        f"first page); GET /orgs/{ORG}/deployments?per_page=50 alone, fetched from the page: median "
        f"{api_median:.1f} ms"
    )
    report = {
        "database": database,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average": os.getloadavg()},
        "options": {"deployments": options.deployments, "views": options.views},
        "pages": [
            {
                "page": r.name,
                "api_calls_per_view": r.calls_per_view,
                "server_cpu_ms_per_view_console": r.console_cpu_ms,
                "server_cpu_ms_per_view_direct": r.direct_cpu_ms,
                "ratio": r.ratio,
                "median_ms_to_rendered": statistics.median(r.view_ms),
            }
            for r in results
        ],
        "deployments_page": {
            "median_ms_to_rendered": page_median,
            "median_ms_waiting_for_the_api": waited_median,
            "median_ms_api_first_page_alone": api_median,
        },
        "idle_server_cpu_ms_per_second": idle * 1000,
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"console-{database}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return report


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--deployments", type=int, default=10_000, help="deployments to seed (default 10000)")
    parser.add_argument("--views", type=int, default=100, help="views per page measured (default 100)")
    args = parser.parse_args(argv)
    if args.deployments < 1 or args.views < 3:
        parser.error("need --deployments >= 1 and --views >= 3")
    databases = ("sqlite", "postgresql") if args.database == "both" else (args.database,)
    return Options(databases=databases, deployments=args.deployments, views=args.views)


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        for database in options.databases:
            run_database(database, options)
    except api.BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the server and PostgreSQL were stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
