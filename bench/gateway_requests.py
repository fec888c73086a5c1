"""Server CPU per runner gateway request, by route: what one deployment's runner and engine send.

    uv run python bench/gateway_requests.py [--requests 300] [--warmup 20]

One `orchestrator serve` (SQLite, fresh data dir, no warm runners), set up as `bench/burst.py` does, one
deployment created and launched whose engine never ends (a fake `terraform` that sleeps: the deployment
stays executing, its token valid), then `--requests` requests of each kind with that deployment's token,
one at a time on one keep-alive connection, after `--warmup` not counted: `GET /healthz` (the baseline: no
authentication, no database), the bundle, Terraform's state backend (`GET` and `POST` of the state, a
`LOCK` + `UNLOCK` pair). Reported per request: the server's CPU (utime + stime from /proc) and the wall
time seen here. A deployment sends about a dozen of these (Terraform alone reads the state five times).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import api
import burst
import httpx
import launch

from orchestrator import deployment_tokens
from orchestrator.secretbox import load_or_create_key


def _cpu(pid: int) -> float:
    fields = api._stat_fields(Path(f"/proc/{pid}/stat").read_text())
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _kill_runs(runs: Path) -> None:
    """End the measured deployment's run (its fake engine sleeps): a local run outlives its server by
    design, and each run leads a process group of its own (``runner.pid``: ``local:vm:<pid>:...``)."""
    for pid_file in runs.glob("*/runner.pid"):
        with contextlib.suppress(ValueError, IndexError, ProcessLookupError, PermissionError):
            os.killpg(int(pid_file.read_text().split(":")[2]), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300, help="requests measured per kind (default 300)")
    parser.add_argument("--warmup", type=int, default=20, help="requests per kind before those (default 20)")
    options = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="po-bench-gateway-") as directory:
        tmp = Path(directory)
        fake = tmp / "bin"
        fake.mkdir()
        (fake / "terraform").write_text(  # sleeps while its runner lives (_kill_runs ends that)
            "#!/bin/sh\nwhile kill -0 $PPID 2>/dev/null; do sleep 1; done\n"
        )
        (fake / "terraform").chmod(0o755)
        bootstrap = "po_bench_" + os.urandom(16).hex()
        server = launch.LaunchServer(
            data_dir=tmp / "data",
            database_url=None,
            bootstrap_token=bootstrap,
            environment={
                "PO_ALLOW_LOCAL_RUNNERS": "true",
                "PO_LOCAL_RUN_USER": "",
                "PO_LOCAL_RUNS_DIR": str(tmp / "runs"),
                "PO_RUNNER_DENIED_NETWORKS": "",
                "PO_LOCAL_WARM_RUNNERS": "0",
                "MANAGED_RUNNER_SECRET": burst.SECRET,
            },
        )
        server.start()
        try:
            rows = _measure(server, bootstrap, fake, options.requests, options.warmup)
        finally:
            server.stop()
            _kill_runs(tmp / "runs")
    print(f"{'request':28s} {'server CPU ms':>13s} {'x baseline':>10s} {'wall ms':>8s}")
    baseline = rows[0][1]
    for name, cpu_ms, wall_ms in rows:
        # /proc counts CPU in clock ticks (10 ms): with few requests the baseline can read zero, and a
        # ratio to zero means nothing, so it is shown as n/a (more requests give a reading).
        ratio = f"{cpu_ms / baseline:10.1f}" if baseline > 0 else f"{'n/a':>10s}"
        print(f"{name:28s} {cpu_ms:13.2f} {ratio} {wall_ms:8.2f}")
    print(
        f"load average (1/5/15 min) before {api._load(load_before)}, after {api._load(os.getloadavg())}; "
        f"{options.requests} requests of each kind, one at a time"
    )
    return 0


def _measure(
    server: launch.LaunchServer, bootstrap: str, fake: Path, requests: int, warmup: int
) -> list[tuple[str, float, float]]:
    client = httpx.Client(base_url=server.base_url, timeout=60)
    options = burst.Options(
        databases=("sqlite",),
        deployments=1,
        concurrency=1,
        creates=1,
        floor_runs=1,
        only="burst",
        replicas=1,
        local_run_limit=None,
        json=False,
    )
    burst.set_up(client, bootstrap, options, {"IAC_BACKEND": "terraform", "PATH": f"{fake}:/usr/bin:/bin"})
    body = {"project_id": burst.PROJECT, "env_id": "e0", "mode": "deploy", "manifest": burst.manifest("x")}
    created = client.post(f"/orgs/{burst.ORG}/deployments", json=body)
    if created.status_code != 201:
        raise api.BenchError(f"POST deployments: {created.status_code} {created.text[:300]}")
    deployment_id = created.json()["id"]
    for _ in range(300):
        found = client.get(f"/orgs/{burst.ORG}/deployments/{deployment_id}").json()
        if found.get("launched_at"):
            break
        time.sleep(0.1)
    else:
        raise api.BenchError("the deployment was not launched")
    env_uuid = client.get(f"/orgs/{burst.ORG}/projects/{burst.PROJECT}/envs/e0").json()["uuid"]
    key = deployment_tokens.token_key(load_or_create_key(server.data_dir))
    token = deployment_tokens.deployment_token(key, burst.ORG, deployment_id)
    gateway = httpx.Client(base_url=server.base_url, timeout=60)
    base = f"/runner-gateway/v1/orgs/{burst.ORG}"
    state = f"{base}/environments/{env_uuid}/state"
    bundle = f"{base}/runners/{burst.RUNNER}/deployments/{deployment_id}/bundle"
    basic = {"Authorization": "Basic " + base64.b64encode(f"{deployment_id}:{token}".encode()).decode()}
    serial = [0]

    def post_state() -> httpx.Response:
        serial[0] += 1
        document = {
            "version": 4,
            "terraform_version": "1.15.5",
            "serial": serial[0],
            "lineage": "1b2c3d4e-0000-4000-8000-000000000000",
            "outputs": {"value": {"value": "x", "type": "string"}},
            "resources": [
                {
                    "mode": "managed",
                    "type": "terraform_data",
                    "name": "one",
                    "provider": 'provider["terraform.io/builtin/terraform"]',
                    "instances": [{"schema_version": 0, "attributes": {"id": str(uuid.uuid4())}}],
                }
            ],
        }
        return gateway.post(
            state, content=json.dumps(document), headers={**basic, "Content-Type": "application/json"}
        )

    def lock_unlock() -> httpx.Response:
        gateway.request("LOCK", f"{state}/lock", content=b'{"ID": "bench"}', headers=basic)
        return gateway.request("UNLOCK", f"{state}/lock", content=b'{"ID": "bench"}', headers=basic)

    kinds: list[tuple[str, Callable[[], httpx.Response]]] = [
        ("GET /healthz (baseline)", lambda: gateway.get("/healthz")),
        ("GET bundle", lambda: gateway.get(bundle, headers={"X-Deployment-Token": token})),
        ("POST state", post_state),
        ("GET state", lambda: gateway.get(state, headers=basic)),
        ("LOCK + UNLOCK state (pair)", lock_unlock),
    ]
    rows = []
    for name, send in kinds:
        for _ in range(warmup):
            send()
        cpu, started = _cpu(server.pid), time.perf_counter()
        for _ in range(requests):
            answer = send()
            if answer.status_code not in (200, 204):
                raise api.BenchError(f"{name}: {answer.status_code} {answer.text[:300]}")
        rows.append(
            (
                name,
                1000 * (_cpu(server.pid) - cpu) / requests,
                1000 * (time.perf_counter() - started) / requests,
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
