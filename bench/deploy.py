"""Deployment benchmark: orchestration overhead of `octl deploy`, and dispatch latency.

    uv run python bench/deploy.py [--runs 20] [--resources 20] [--engine embedded|path|both]
                                  [--dispatch-deployments 100] [--dispatch-envs 1,4]
                                  [--only overhead|dispatch]

It starts `orchestrator serve` as a child process (fresh SQLite data dir, local runners allowed), sets up
an org through the API (env type, project, environments, a local `vm` runner, a runner rule, resource
types, inline modules and module rules), then measures:

1. overhead: `octl deploy` of a module of N `terraform_data` resources (a tree: each depends on its
   parent), whose inputs change on every run, against the same compiled code applied by the same engine
   with `init` + `apply -auto-approve` on a `local` backend, interleaved run by run;
2. dispatch: `launched_at - created_at` of plan-only deployments of a small module, run back to back in
   one environment, then in several at once.

It prints a table and writes bench/results/deploy.json (embedded engine) or deploy-path.json (`terraform`
on PATH).
See bench/README.md for how to read it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import api
import httpx
import loadgen
import yaml

from orchestrator.dispatch import bundles
from orchestrator.protocol import age
from orchestrator.runner import engine as engines
from orchestrator.runner import iac, logs
from orchestrator.runner.bundle import extract_bundle
from orchestrator.secretbox import SecretBox, load_or_create_key

ROOT = api.ROOT
RESULTS_DIR = api.RESULTS_DIR
EXAMPLES = ROOT / "examples" / "demo"
ORG = "bench"
PROJECT = "bench"
ENV_TYPE = "bench-env"
OVERHEAD_ENV = "overhead"
TREE_TYPE = "bench-tree"
SMALL_TYPE = "demo-app"
RUNNER = "local"
#: Targets the results are compared against (the overhead: issue 27).
TARGET_OVERHEAD_MEDIAN_S = 0.3
TARGET_DISPATCH_P99_MS = 200.0
COMMAND_TIMEOUT_S = 600.0
WAIT_TIMEOUT_S = 600.0
#: Variables a local run inherits from the server (orchestrator.launchers.local.INHERITED); the baseline
#: gets the same, so both engines see the same environment.
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR", "TZ")


@dataclass(frozen=True, kw_only=True)
class Options:
    engines: tuple[str, ...]
    runs: int
    resources: int
    dispatch_deployments: int
    dispatch_envs: tuple[int, ...]
    only: str | None
    results_dir: Path = RESULTS_DIR


# --- the server ------------------------------------------------------------------------------------


class DeployServer(api.ServerProcess):
    """`api.ServerProcess` with local runners allowed and the public URL set to its own address.

    ``api.ServerProcess.start`` has no hook for extra environment (and drops inherited ``PO_*``), so
    this ``start`` repeats its few lines of process start; health wait, stop and log come from it.
    """

    def start(self) -> str:
        executable = shutil.which("orchestrator", path=str(Path(sys.executable).parent))
        if executable is None:
            raise api.BenchError(f"no `orchestrator` console script next to {sys.executable}: run `uv sync`")
        port = api.free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PO_")}
        env |= {
            "PO_DATA_DIR": str(self.data_dir),
            "PO_LISTEN": f"127.0.0.1:{port}",
            "PO_PUBLIC_URL": self.base_url,
            "PO_ALLOW_LOCAL_RUNNERS": "true",
            # Runs as the benchmark's user, as the figures in README were measured: its temporary
            # directory (the Terraform CLI config) is out of an unprivileged run user's reach.
            "PO_LOCAL_RUN_USER": "",
            "PO_BOOTSTRAP_TOKEN": self._bootstrap_token,
            "PO_LOG_LEVEL": "warning",
        }
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [executable, "serve"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_healthy()
        return self.base_url


# --- what is deployed ------------------------------------------------------------------------------


def tree_module(resources: int) -> str:
    """N terraform_data resources in a binary tree: r0 takes the trigger, r<i> its parent r<(i-1)//2>."""
    lines = ['variable "trigger" {', "  type = string", "}", ""]
    for i in range(resources):
        source = '"${var.trigger}-0"' if i == 0 else f'"${{terraform_data.r{(i - 1) // 2}.output}}-{i}"'
        lines += [f'resource "terraform_data" "r{i}" {{', f"  input = {source}", "}", ""]
    leaves = [f"terraform_data.r{i}.output" for i in range(resources) if 2 * i + 1 >= resources]
    lines += ['output "last" {', f"  value = terraform_data.r{resources - 1}.output", "}", ""]
    lines += ['output "leaves" {', f"  value = length([{', '.join(leaves)}])", "}"]
    return "\n".join(lines) + "\n"


def expected_last(trigger: str, resources: int) -> str:
    path = [resources - 1]
    while path[-1] > 0:
        path.append((path[-1] - 1) // 2)
    return trigger + "".join(f"-{i}" for i in reversed(path))


def tree_manifest(trigger: str) -> dict[str, Any]:
    return {
        "workloads": {
            "tree": {
                "resources": {"nodes": {"type": TREE_TYPE, "params": {"trigger": trigger}}},
                "outputs": {"last": "${resources.nodes.outputs.last}"},
            }
        }
    }


def small_manifest(name: str) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load((EXAMPLES / "manifest.yaml").read_text())
    manifest["workloads"]["shop"]["resources"]["app"]["params"]["name"] = name
    return manifest


def runner_body(engine: str, tf_config: Path) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / "runner.yaml").read_text())
    environment = body["runner_configuration"]["job"]["environment"]
    environment |= {
        "IAC_BACKEND": "embedded" if engine == "embedded" else "terraform",
        "TF_CLI_CONFIG_FILE": str(tf_config),
        "CHECKPOINT_DISABLE": "1",
    }
    return {"id": RUNNER, **body}


def set_up(
    client: httpx.Client, bootstrap_token: str, options: Options, engine: str, tf_config: Path
) -> None:
    """Org, admin token (kept in ``client``), env type, project, environments, runner, modules, rules."""

    def post(path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> Any:
        response = client.post(path, json=body, headers=headers)
        if response.status_code != 201:
            raise api.BenchError(f"POST {path}: {response.status_code} {response.text[:300]}")
        return response.json()

    post("/orgs", {"id": ORG}, {"authorization": f"Bearer {bootstrap_token}"})
    token = post(f"/orgs/{ORG}/tokens", {"role": "admin"}, {"authorization": f"Bearer {bootstrap_token}"})
    client.headers["authorization"] = f"Bearer {token['token']}"
    base = f"/orgs/{ORG}"
    post(f"{base}/env-types", {"id": ENV_TYPE})
    post(f"{base}/projects", {"id": PROJECT})
    for env in [OVERHEAD_ENV, *dispatch_env_ids(max(options.dispatch_envs))]:
        post(f"{base}/projects/{PROJECT}/envs", {"id": env, "env_type_id": ENV_TYPE})
    # A runner with a local connection is the platform admin's to create.
    post(f"{base}/runners", runner_body(engine, tf_config), {"authorization": f"Bearer {bootstrap_token}"})
    post(f"{base}/runner-rules", {"runner_id": RUNNER})
    post(
        f"{base}/resource-types",
        {
            "id": TREE_TYPE,
            "description": f"{options.resources} terraform_data resources in a tree",
            "output_schema": {"type": "object", "properties": {"last": {"type": "string"}}},
        },
    )
    post(
        f"{base}/modules",
        {
            "id": TREE_TYPE,
            "description": f"{options.resources} terraform_data resources, each depending on its parent",
            "resource_type": TREE_TYPE,
            "module_source": "inline",
            "module_params": {"trigger": {"type": "string", "description": "changes every input"}},
            "module_source_code": tree_module(options.resources),
        },
    )
    post(f"{base}/module-rules", {"module_id": TREE_TYPE})
    post(
        f"{base}/resource-types",
        {"id": SMALL_TYPE, **yaml.safe_load((EXAMPLES / "resource-type.yaml").read_text())},
    )
    post(f"{base}/modules", {"id": SMALL_TYPE, **yaml.safe_load((EXAMPLES / "module.yaml").read_text())})
    post(f"{base}/module-rules", {"module_id": SMALL_TYPE})


def dispatch_env_ids(environments: int) -> list[str]:
    return [f"dispatch-{n}" for n in range(environments)]


# --- engines ---------------------------------------------------------------------------------------


def engine_command(engine: str) -> tuple[str, ...]:
    """The argv prefix of the engine, resolved as the runner resolves it."""
    backend = (
        engines.IacBackend(engine) if engine in ("embedded", "opentofu") else engines.IacBackend.TERRAFORM
    )
    return engines.select_engine(backend, search_path=os.environ.get("PATH")).command


def engine_version(command: Sequence[str], env: Mapping[str, str]) -> str:
    done = subprocess.run([*command, "version"], env=dict(env), capture_output=True, text=True, timeout=60)
    return next((line.strip() for line in done.stdout.splitlines() if line.strip()), "?")


def engine_env(tf_config: Path) -> dict[str, str]:
    """What the runner's engine sees: the inherited variables and the runner's job environment."""
    env = {k: os.environ[k] for k in INHERITED if k in os.environ}
    return env | {"TF_CLI_CONFIG_FILE": str(tf_config), "CHECKPOINT_DISABLE": "1"}


_BACKEND_BLOCK = re.compile(r'backend\s+"http"\s*\{[^{}]*\}', re.S)


def to_local_backend(main_tf: str, state_path: Path) -> str:
    """``main_tf`` with its ``backend "http"`` block (the orchestrator's state) replaced by a local one."""
    local = f'backend "local" {{\n    path = {json.dumps(str(state_path))}\n  }}'
    replaced, count = _BACKEND_BLOCK.subn(local, main_tf)
    if count != 1:
        raise api.BenchError(f'expected one backend "http" block in main.tf, found {count}')
    return replaced


def unpack_bundle(bundle: Path, destination: Path) -> list[str]:
    """Unpack as the runner does (its checks; the "data" filter where this Python has it: 3.11.4 and on)."""
    return extract_bundle(bundle.read_bytes(), destination)


@dataclass(frozen=True, kw_only=True)
class Timed:
    seconds: float
    stdout: str
    stderr: str


def timed(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None) -> Timed:
    """Run ``argv`` to completion; its wall time. A non-zero exit stops the benchmark."""
    started = time.perf_counter()
    done = subprocess.run(
        list(argv), env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise api.BenchError(
            f"`{' '.join(argv)}` exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return Timed(seconds=seconds, stdout=done.stdout, stderr=done.stderr)


_APPLY_SUMMARY = re.compile(r"Apply complete! Resources: (\d+) added, (\d+) changed, (\d+) destroyed")
_APPLY_SUMMARY_JSON = re.compile(r'"changes":\{"add":(\d+),"change":(\d+),"import":\d+,"remove":(\d+)')


def applied_counts(output: str) -> tuple[int, int, int]:
    found = _APPLY_SUMMARY.findall(output) or _APPLY_SUMMARY_JSON.findall(output)
    if not found:
        raise api.BenchError(f"no apply summary in:\n{output[-1500:]}")
    added, changed, destroyed = (int(n) for n in found[-1])
    return added, changed, destroyed


def baseline_apply(
    command: Sequence[str], code: Path, env: Mapping[str, str]
) -> tuple[float, tuple[int, int, int]]:
    """Plain `init` then `apply -auto-approve`: the wall time of both, and what apply did."""
    init = timed([*command, "init", "-input=false", "-no-color"], env=env, cwd=code)
    apply = timed([*command, "apply", "-auto-approve", "-input=false", "-no-color"], env=env, cwd=code)
    return init.seconds + apply.seconds, applied_counts(apply.stdout)


def runner_steps(
    command: Sequence[str], code: Path, env: Mapping[str, str]
) -> tuple[float, tuple[int, int, int]]:
    """The engine commands the runner runs for a deploy on the orchestrator's state
    (orchestrator.runner.standard), here on a local backend: `init`, then `apply`, run as the runner runs
    them (``runner.iac.IacCli``: the embedded engine in one ``po-terraform`` session, another engine one
    process a command). The outputs and counts come from the state the orchestrator holds: no `show`."""
    backend = (
        engines.IacBackend.EMBEDDED
        if Path(command[0]).name == "po-terraform"
        else engines.IacBackend.TERRAFORM
    )
    cli = iac.IacCli(
        engines.Engine(backend=backend, command=tuple(command)),
        workdir=code,
        environ=env,
        sink=logs.LogBuffer(max_bytes=1 << 20),
    )
    started = time.perf_counter()
    try:
        for step in (
            ("init", "-no-color", "-input=false", "-json"),
            ("apply", "-auto-approve", "-no-color", "-input=false", "-json"),
        ):
            done = cli.run(*step)
            if not done.ok:
                raise api.BenchError(
                    f"runner step {step[0]} exited {done.exit_code}:\n" + "\n".join(done.stderr[-20:])
                )
    finally:
        # The session ends (an older runner, measured with this script, has none: one process a command).
        close = getattr(cli, "close", None)
        if close is not None:
            close()
    seconds = time.perf_counter() - started
    return seconds, applied_counts("\n".join(done.stdout))


# --- statistics ------------------------------------------------------------------------------------


def pct(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (same unit)."""
    return loadgen.percentile_ms(list(values), fraction) / 1000.0


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    def number(value: float) -> float | None:
        return None if math.isnan(value) else round(value, 4)

    return {
        "count": len(values),
        "median": number(statistics.median(values) if values else math.nan),
        "p50": number(pct(values, 0.5)),
        "p90": number(pct(values, 0.9)),
        "p99": number(pct(values, 0.99)),
        "min": number(min(values, default=math.nan)),
        "max": number(max(values, default=math.nan)),
        "mean": number(statistics.fmean(values) if values else math.nan),
    }


def parse_time(value: str | None) -> float:
    if not value:
        return math.nan
    return datetime.fromisoformat(value).timestamp()


# --- 1. overhead -----------------------------------------------------------------------------------


@dataclass(kw_only=True)
class OverheadRun:
    trigger: str
    deployment_id: str = ""
    octl_s: float = math.nan
    baseline_s: float = math.nan
    runner_steps_s: float = math.nan
    #: Same clock (this host's wall clock) for both: octl start -> created_at -> launched_at ->
    #: completed_at -> octl exit.
    octl_to_created_s: float = math.nan
    created_to_launched_s: float = math.nan
    launched_to_completed_s: float = math.nan
    completed_to_exit_s: float = math.nan
    changed: dict[str, Any] = field(default_factory=dict)


class Overhead:
    def __init__(
        self,
        *,
        server: DeployServer,
        client: httpx.Client,
        token: str,
        work: Path,
        command: tuple[str, ...],
        env: dict[str, str],
        options: Options,
    ) -> None:
        self.server = server
        self.client = client
        self.work = work
        self.command = command
        self.env = env
        self.options = options
        octl = shutil.which("octl", path=str(Path(sys.executable).parent))
        if octl is None:
            raise api.BenchError(f"no `octl` console script next to {sys.executable}: run `uv sync`")
        self.octl = octl
        self.octl_env = {k: v for k, v in os.environ.items() if not k.startswith(("PO_", "OCTL_"))}
        self.octl_env |= {
            "PO_API_URL": server.base_url,
            "PO_AUTH_TOKEN": token,
            "PO_ORG_ID": ORG,
            "OCTL_CONFIG": str(work / "octl-config.yaml"),  # absent: no user config file is read
            "OCTL_KEYS_DIR": str(work / "keys"),  # the deployments' keys, not in the user's home
        }
        self.baseline_state = work / "baseline.tfstate"
        self.steps_state = work / "runner-steps.tfstate"

    def octl_startup(self, times: int = 5) -> list[float]:
        """Wall time of `octl --help`: the Python start-up and imports every octl command pays."""
        return [timed([self.octl, "--help"], env=self.octl_env).seconds for _ in range(times)]

    def one(self, n: int) -> OverheadRun:
        run = OverheadRun(trigger=f"run-{n}-{os.urandom(3).hex()}")
        manifest = self.work / f"manifest-{n}.yaml"
        manifest.write_text(yaml.safe_dump(tree_manifest(run.trigger)))
        wall_start = time.time()
        done = timed(
            [self.octl, "deploy", PROJECT, OVERHEAD_ENV, str(manifest), "-o", "json"], env=self.octl_env
        )
        wall_end = time.time()
        run.octl_s = done.seconds
        found = re.search(r"Deployment ([0-9a-f-]{36}) created", done.stderr)
        if found is None:
            raise api.BenchError(f"no deployment id in octl's stderr:\n{done.stderr}")
        run.deployment_id = found.group(1)
        outputs = json.loads(done.stdout)
        want = expected_last(run.trigger, self.options.resources)
        if outputs.get("tree", {}).get("last") != want:
            raise api.BenchError(f"octl printed {outputs!r}; expected tree.last = {want!r}")
        deployment = self._get(run.deployment_id)
        created, launched = parse_time(deployment["created_at"]), parse_time(deployment["launched_at"])
        completed = parse_time(deployment["completed_at"])
        run.octl_to_created_s = created - wall_start
        run.created_to_launched_s = launched - created
        run.launched_to_completed_s = completed - launched
        run.completed_to_exit_s = wall_end - completed
        metrics = deployment["metrics"]
        run.changed["orchestrated"] = [
            metrics.get("num_tf_resources_added"),
            metrics.get("num_tf_resources_changed"),
            metrics.get("num_tf_resources_removed"),
        ]
        # The same compiled code, from the bundle the runner got, on a local backend: stored sealed with
        # the server key (dispatch/bundles.py), opened here with the key file of the server's data dir.
        sealed = self.server.data_dir / "objects" / "bundles" / ORG / f"{run.deployment_id}.tar.gz.sealed"
        if not sealed.is_file():
            raise api.BenchError(f"no bundle at {sealed} (is the object store the default file store?)")
        bundle = self.work / f"bundle-{n}.tar.gz"
        box = SecretBox(load_or_create_key(self.server.data_dir))
        bundle.write_bytes(bundles.opened(box, ORG, run.deployment_id, sealed.read_bytes()))
        for name, state, measure in (
            ("baseline", self.baseline_state, baseline_apply),
            ("runner_steps", self.steps_state, runner_steps),
        ):
            code = self.work / f"{name}-{n}"
            unpack_bundle(bundle, code)
            main_tf = code / "main.tf"
            main_tf.write_text(to_local_backend(main_tf.read_text(), state))
            seconds, counts = measure(self.command, code, self.env)
            setattr(run, f"{name}_s", seconds)
            run.changed[name] = list(counts)
            shutil.rmtree(code)
        return run

    def _get(self, deployment_id: str) -> dict[str, Any]:
        response = self.client.get(f"/orgs/{ORG}/deployments/{deployment_id}")
        if response.status_code != 200:
            raise api.BenchError(
                f"GET deployment {deployment_id}: {response.status_code} {response.text[:300]}"
            )
        deployment: dict[str, Any] = response.json()
        if deployment["status"] != "succeeded":
            raise api.BenchError(
                f"deployment {deployment_id} {deployment['status']}: {deployment['status_message']}"
            )
        return deployment


def measure_overhead(overhead: Overhead, options: Options) -> dict[str, Any]:
    startup = overhead.octl_startup()
    print(f"  octl --help: median {statistics.median(startup):.2f} s", flush=True)
    warm = overhead.one(0)
    print(
        f"  warm-up: octl {warm.octl_s:.2f} s, baseline {warm.baseline_s:.2f} s, "
        f"runner steps {warm.runner_steps_s:.2f} s (creates {warm.changed})",
        flush=True,
    )
    runs: list[OverheadRun] = []
    for n in range(1, options.runs + 1):
        run = overhead.one(n)
        runs.append(run)
        print(
            f"  run {n}/{options.runs}: octl {run.octl_s:.2f} s, baseline {run.baseline_s:.2f} s, "
            f"runner steps {run.runner_steps_s:.2f} s; "
            f"created->launched {run.created_to_launched_s * 1000:.0f} ms, "
            f"launched->completed {run.launched_to_completed_s:.2f} s, completed->exit "
            f"{run.completed_to_exit_s * 1000:.0f} ms",
            flush=True,
        )
        expected = [0, options.resources, 0]
        for name, counts in run.changed.items():
            if counts != expected:
                raise api.BenchError(f"run {n}: {name} added/changed/removed {counts}, expected {expected}")
    octl = [r.octl_s for r in runs]
    baseline = [r.baseline_s for r in runs]
    steps = [r.runner_steps_s for r in runs]
    return {
        "octl_startup_s": summary(startup),
        "warmup": warm.__dict__,
        "octl_deploy_s": summary(octl),
        "baseline_init_apply_s": summary(baseline),
        "runner_steps_local_s": summary(steps),
        "overhead_median_s": round(statistics.median(octl) - statistics.median(baseline), 4),
        "ratio_median": round(statistics.median(octl) / statistics.median(baseline), 4),
        "paired_difference_s": summary([r.octl_s - r.baseline_s for r in runs]),
        "octl_minus_runner_steps_s": summary([r.octl_s - r.runner_steps_s for r in runs]),
        "phases_s": {
            "octl_start_to_created": summary([r.octl_to_created_s for r in runs]),
            "created_to_launched": summary([r.created_to_launched_s for r in runs]),
            "launched_to_completed": summary([r.launched_to_completed_s for r in runs]),
            "completed_to_octl_exit": summary([r.completed_to_exit_s for r in runs]),
        },
        "runs": [r.__dict__ for r in runs],
    }


# --- 2. dispatch latency ---------------------------------------------------------------------------


async def measure_dispatch(base_url: str, token: str, deployments: int, environments: int) -> dict[str, Any]:
    """Plan-only deployments of the small module, one worker per environment, back to back.

    Besides the server's timestamps, each worker notes this host's wall clock (the server's clock too)
    just before it sends the POST and when the answer arrives; the answer is sent once the deployment is
    committed and the dispatcher woken, so ``launched_at - answered`` is the dispatcher's share alone.
    """
    _, recipient = age.generate_identity()
    numbers = iter(range(deployments))
    finished: list[dict[str, Any]] = []
    sent: dict[str, tuple[float, float]] = {}

    async def worker(client: httpx.AsyncClient, env: str) -> None:
        for n in numbers:
            body = {
                "project_id": PROJECT,
                "env_id": env,
                "mode": "plan_only",
                "manifest": small_manifest(f"d{n}"),
                "encrypted_outputs_recipient": recipient,
                "encrypted_logs_recipient": recipient,
            }
            before = time.time()
            created = await client.post(f"/orgs/{ORG}/deployments", json=body)
            answered = time.time()
            if created.status_code != 201:
                raise api.BenchError(f"POST deployment: {created.status_code} {created.text[:300]}")
            deployment_id = created.json()["id"]
            sent[deployment_id] = (before, answered)
            finished.append(await wait(client, deployment_id))

    async def wait(client: httpx.AsyncClient, deployment_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        url = f"/orgs/{ORG}/deployments/{deployment_id}/actions/wait-for-complete"
        while time.monotonic() < deadline:
            response = await client.get(url, params={"timeout_in_seconds": 30}, timeout=60)
            if response.status_code == 200:
                done: dict[str, Any] = response.json()
                return done
            if response.status_code != 408:
                raise api.BenchError(f"wait {deployment_id}: {response.status_code} {response.text[:300]}")
        raise api.BenchError(f"deployment {deployment_id} did not complete in {WAIT_TIMEOUT_S:.0f} s")

    headers = {"authorization": f"Bearer {token}"}
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as client:
        await asyncio.gather(*(worker(client, env) for env in dispatch_env_ids(environments)))
    seconds = time.perf_counter() - started
    failed = [d for d in finished if d["status"] != "succeeded"]
    if failed:
        raise api.BenchError(f"{len(failed)} dispatch deployments failed, e.g. {failed[0]['status_message']}")
    detail = []
    for d in finished:
        before, answered = sent[d["id"]]
        created, launched = parse_time(d["created_at"]), parse_time(d["launched_at"])
        completed = parse_time(d["completed_at"])
        detail.append(
            {
                "id": d["id"],
                "env_id": d["env_id"],
                "created_at": d["created_at"],
                "launched_at": d["launched_at"],
                "completed_at": d["completed_at"],
                "post_sent": before,
                "post_answered": answered,
                "created_to_launched_s": launched - created,
                "post_latency_s": answered - before,
                "answered_to_launched_s": launched - answered,
                "sent_to_created_s": created - before,
                "sent_to_launched_s": launched - before,
                "created_to_completed_s": completed - created,
                "launched_to_completed_s": completed - launched,
            }
        )

    def of(key: str) -> dict[str, Any]:
        return summary([row[key] for row in detail])

    return {
        "deployments": len(finished),
        "environments": environments,
        "seconds": round(seconds, 2),
        "created_to_launched_s": of("created_to_launched_s"),
        "post_latency_s": of("post_latency_s"),
        "answered_to_launched_s": of("answered_to_launched_s"),
        "sent_to_created_s": of("sent_to_created_s"),
        "sent_to_launched_s": of("sent_to_launched_s"),
        "created_to_completed_s": of("created_to_completed_s"),
        "launched_to_completed_s": of("launched_to_completed_s"),
        "deployments_detail": detail,
    }


# --- report ----------------------------------------------------------------------------------------


def _ms(value: float | int | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _s(value: float | int | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        lines.append(
            "  ".join([r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True))])
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report(result: dict[str, Any], options: Options) -> str:
    out: list[str] = []
    overhead = result.get("overhead")
    if overhead:
        rows: list[tuple[str, ...]] = [("overhead (seconds)", "runs", "median", "p90", "min", "max")]
        for label, key in (
            ("octl deploy (whole command)", "octl_deploy_s"),
            ("baseline: init + apply, local backend", "baseline_init_apply_s"),
            ("runner's engine steps (init, apply), local", "runner_steps_local_s"),
            ("octl --help (start-up only)", "octl_startup_s"),
        ):
            s = overhead[key]
            rows.append((label, str(s["count"]), _s(s["median"]), _s(s["p90"]), _s(s["min"]), _s(s["max"])))
        for label, key in (
            ("  octl start -> created_at", "octl_start_to_created"),
            ("  created_at -> launched_at", "created_to_launched"),
            ("  launched_at -> completed_at (runner)", "launched_to_completed"),
            ("  completed_at -> octl exit", "completed_to_octl_exit"),
        ):
            s = overhead["phases_s"][key]
            rows.append((label, str(s["count"]), _s(s["median"]), _s(s["p90"]), _s(s["min"]), _s(s["max"])))
        out.append(table(rows))
        verdict = "met" if overhead["overhead_median_s"] <= TARGET_OVERHEAD_MEDIAN_S else "NOT met"
        out.append(
            f"overhead = median(octl) - median(baseline) = {overhead['overhead_median_s']:.2f} s "
            f"(target <= {TARGET_OVERHEAD_MEDIAN_S:.1f} s: {verdict}); "
            f"ratio {overhead['ratio_median']:.2f}x; "
            f"paired per-run difference median {overhead['paired_difference_s']['median']:.2f} s, "
            f"p90 {overhead['paired_difference_s']['p90']:.2f} s; octl - runner steps median "
            f"{overhead['octl_minus_runner_steps_s']['median']:.2f} s"
        )
    for dispatch in result.get("dispatch", []):
        envs = dispatch["environments"]
        title = f"dispatch, {envs} env{'s' if envs > 1 else ''} (ms)"
        rows = [(title, "count", "p50", "p90", "p99", "max")]
        for label, key in (
            ("created_at -> launched_at", "created_to_launched_s"),
            ("  POST /deployments (client)", "post_latency_s"),
            ("  POST answered -> launched_at", "answered_to_launched_s"),
            ("POST sent (client) -> created_at", "sent_to_created_s"),
            ("POST sent (client) -> launched_at", "sent_to_launched_s"),
            ("created_at -> completed_at", "created_to_completed_s"),
            ("launched_at -> completed_at", "launched_to_completed_s"),
        ):
            s = dispatch[key]
            rows.append((label, str(s["count"]), _ms(s["p50"]), _ms(s["p90"]), _ms(s["p99"]), _ms(s["max"])))
        out.append(table(rows))
        p99 = dispatch["created_to_launched_s"]["p99"] * 1000
        verdict = "met" if p99 <= TARGET_DISPATCH_P99_MS else "NOT met"
        out.append(
            f"dispatch p99 {p99:.0f} ms with {envs} environment(s) deploying at once "
            f"(target <= {TARGET_DISPATCH_P99_MS:.0f} ms on SQLite: {verdict}); "
            f"{dispatch['deployments']} plan-only deployments in {dispatch['seconds']:.0f} s"
        )
    return "\n\n".join(out)


def run_engine(engine: str, options: Options) -> None:
    bootstrap_token = "po_bench_" + os.urandom(16).hex()
    command = engine_command(engine)
    print(f"\n== engine {engine}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    load_before = os.getloadavg()
    code = code_version()
    print(f"   commit {code['commit']}, {len(code['uncommitted_src_files'])} uncommitted file(s) in src/")
    result: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="po-bench-deploy-")))
        tf_config = tmp / "terraformrc"
        tf_config.touch()
        env = engine_env(tf_config)
        version = engine_version(command, env)
        print(
            f"   {version}; {os.cpu_count()} CPUs shared by octl, the server, the runners and the engine",
            flush=True,
        )
        server = DeployServer(data_dir=tmp / "data", database_url=None, bootstrap_token=bootstrap_token)
        stack.callback(_keep_log, server, engine, options.results_dir)
        stack.callback(server.stop)
        server.start()
        client = stack.enter_context(httpx.Client(base_url=server.base_url, timeout=60))
        set_up(client, bootstrap_token, options, engine, tf_config)
        token = client.headers["authorization"].removeprefix("Bearer ")
        if options.only in (None, "overhead"):
            print(
                f"-- overhead: {options.resources} resources, {options.runs} runs after 1 warm-up", flush=True
            )
            work = tmp / "work"
            work.mkdir()
            overhead = Overhead(
                server=server,
                client=client,
                token=token,
                work=work,
                command=command,
                env=env,
                options=options,
            )
            result["overhead"] = measure_overhead(overhead, options)
        if options.only in (None, "dispatch"):
            result["dispatch"] = []
            for environments in options.dispatch_envs:
                print(
                    f"-- dispatch: {options.dispatch_deployments} plan-only deployments, "
                    f"{environments} environment(s) at once",
                    flush=True,
                )
                measured = asyncio.run(
                    measure_dispatch(server.base_url, token, options.dispatch_deployments, environments)
                )
                result["dispatch"].append(measured)
    load_after = os.getloadavg()
    print()
    print(report(result, options))
    print(f"load average (1/5/15 min) before {api._load(load_before)}, after {api._load(load_after)}")
    document = {
        "engine": engine,
        "engine_command": list(command),
        "engine_version": version,
        "database": "sqlite",
        "code": code,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - started, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1_5_15_min_before": load_before,
            "load_average_1_5_15_min_after": load_after,
        },
        "options": {k: v for k, v in options.__dict__.items() if k not in ("engines", "results_dir")},
        "targets": {"overhead_median_s": TARGET_OVERHEAD_MEDIAN_S, "dispatch_p99_ms": TARGET_DISPATCH_P99_MS},
        **result,
    }
    options.results_dir.mkdir(parents=True, exist_ok=True)
    path = options.results_dir / ("deploy.json" if engine == "embedded" else f"deploy-{engine}.json")
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")


def code_version() -> dict[str, Any]:
    """The commit measured, and the files of src/ that differ from it (others may be editing them)."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
        except OSError:
            return ""
        return done.stdout.strip()

    changed = [line[3:] for line in git("status", "--porcelain", "--", "src").splitlines()]
    return {"commit": git("rev-parse", "--short", "HEAD"), "uncommitted_src_files": changed}


def _keep_log(server: DeployServer, engine: str, results_dir: Path) -> None:
    if server.log_path.exists():
        results_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(server.log_path, results_dir / f"deploy-{engine}-server.log")


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20, help="measured deploys, after 1 warm-up (default 20)")
    parser.add_argument("--resources", type=int, default=20, help="terraform_data resources (default 20)")
    parser.add_argument(
        "--engine",
        choices=["embedded", "path", "both"],
        default="embedded",
        help="embedded (po-terraform, as on CI), path (terraform on PATH) or both (default embedded)",
    )
    parser.add_argument(
        "--dispatch-deployments", type=int, default=100, help="per dispatch phase (default 100)"
    )
    parser.add_argument(
        "--dispatch-envs",
        default="1,4",
        help="environments deploying at once, comma-separated: one dispatch phase each (default 1,4)",
    )
    parser.add_argument("--only", choices=["overhead", "dispatch"], help="run one part only")
    parser.add_argument(
        "--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON and the server log go"
    )
    args = parser.parse_args(argv)
    try:
        dispatch_envs = tuple(int(n) for n in str(args.dispatch_envs).split(","))
    except ValueError:
        parser.error("--dispatch-envs: comma-separated numbers, e.g. 1,4")
    if args.runs < 1 or args.resources < 1 or args.dispatch_deployments < 1 or min(dispatch_envs) < 1:
        parser.error("--runs, --resources, --dispatch-deployments and --dispatch-envs must be >= 1")
    engines_ = ("embedded", "path") if args.engine == "both" else (args.engine,)
    return Options(
        engines=engines_,
        runs=args.runs,
        resources=args.resources,
        dispatch_deployments=args.dispatch_deployments,
        dispatch_envs=dispatch_envs,
        only=args.only,
        results_dir=args.results_dir,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, api._stop_on_sigterm)
    try:
        for engine in options.engines:
            run_engine(engine, options)
    except api.BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the server was stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
