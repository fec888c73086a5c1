"""The Terraform provider's cost: seed 000's example (a GKE runner and its rule) by Terraform and by octl.

    uv run python bench/terraform.py [--runs 5] [--engine embedded|path] [--json]
                                     [--results-dir bench/results]

It starts `orchestrator serve` as a child process (fresh SQLite data dir), makes an org and an admin
token, installs the provider with `octl terraform install-provider` into a temporary mirror and runs
`init` once (reported, not compared). Then, run by run and interleaved:

- terraform: `plan -out=plan` then `apply plan` of seed 000's "TF" block as copied verbatim in
  tests/data/terraform/seed000_gke_runner_and_rule.tf (with the `terraform`/`provider` block users add);
- octl (the baseline): `octl create runner my-gke-runner --set-yaml=@seed000-gke-tf.yaml` then
  `octl create runner-rule` with the same runner and project, the seed's CLI tab;

after each, the two objects are deleted through the API (not timed) and the Terraform state removed.
It prints the medians and their ratio (terraform / octl) and writes bench/results/terraform.json.
Where the time goes: Terraform starts the provider (a Python process) for each command at least twice
(the schema, then the work); octl is one process per command.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import api
import httpx

ROOT = api.ROOT
RESULTS_DIR = api.RESULTS_DIR
SEED_TF = ROOT / "tests" / "data" / "terraform" / "seed000_gke_runner_and_rule.tf"
SEED_CLI = ROOT / "tests" / "data" / "runners" / "seed000-gke-tf.yaml"
ORG = "bench"
BOOTSTRAP_TOKEN = "bench-bootstrap-token-terraform"
RUNNER = "my-gke-runner"
PROJECT = "my-project"
COMMAND_TIMEOUT_S = 300.0
PROVIDERS_TF = """terraform {
  required_providers {
    platform-orchestrator = {
      source = "stellwerk-labs/platform-orchestrator"
    }
  }
}

provider "platform-orchestrator" {}
"""


@dataclass(frozen=True)
class Options:
    runs: int
    engine: str
    as_json: bool
    results_dir: Path


@dataclass
class Result:
    engine: str
    runs: int
    init_seconds: float
    terraform_seconds: list[float]
    octl_seconds: list[float]
    terraform_median: float
    octl_median: float
    ratio: float


def _bin(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise api.BenchError(f"no `{name}` next to {sys.executable}: run `uv sync --all-extras`")
    return found


def _engine(choice: str) -> str:
    if choice == "embedded":
        return _bin("po-terraform")
    found = shutil.which("terraform") or shutil.which("tofu")
    if found is None:
        raise api.BenchError("--engine path: no terraform or tofu on PATH")
    return found


def _timed(command: list[str], *, cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise api.BenchError(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return elapsed


def _clean(client: httpx.Client) -> None:
    for rule in client.get(f"/orgs/{ORG}/runner-rules").json().get("items", []):
        client.delete(f"/orgs/{ORG}/runner-rules/{rule['id']}").raise_for_status()
    answer = client.delete(f"/orgs/{ORG}/runners/{RUNNER}")
    if answer.status_code not in (204, 404):
        raise api.BenchError(f"delete runner: {answer.status_code} {answer.text}")


def benchmark(base_url: str, options: Options, work: Path) -> Result:
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}) as boot:
        boot.post("/orgs", json={"id": ORG}).raise_for_status()
        token = boot.post(f"/orgs/{ORG}/tokens", json={"role": "admin", "description": "bench"}).json()[
            "token"
        ]
        boot.post(f"/orgs/{ORG}/projects", json={"id": PROJECT}).raise_for_status()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PO_", "TF_"))}
    env |= {
        "PO_API_URL": base_url,
        "PO_AUTH_TOKEN": token,
        "PO_ORG_ID": ORG,
        "OCTL_CONFIG": str(work / "octl.yaml"),
        "TF_CLI_CONFIG_FILE": str(work / "cli.tfrc"),
        "TF_IN_AUTOMATION": "1",
        "CHECKPOINT_DISABLE": "1",
    }
    octl = _bin("octl")
    subprocess.run(
        [octl, "terraform", "install-provider", str(work / "mirror"), "--cli-config", str(work / "cli.tfrc")],
        env=env,
        check=True,
        capture_output=True,
    )
    config = work / "config"
    config.mkdir()
    (config / "providers.tf").write_text(PROVIDERS_TF, encoding="utf-8")
    shutil.copy(SEED_TF, config / "main.tf")
    engine = _engine(options.engine)
    init_seconds = _timed([engine, "init", "-no-color", "-input=false"], cwd=config, env=env)
    runner_yaml = work / "seed000-gke-tf.yaml"
    shutil.copy(SEED_CLI, runner_yaml)
    terraform_times: list[float] = []
    octl_times: list[float] = []
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}) as client:
        for run in range(options.runs):
            seconds = _timed([engine, "plan", "-no-color", "-input=false", "-out=plan"], cwd=config, env=env)
            seconds += _timed([engine, "apply", "-no-color", "-input=false", "plan"], cwd=config, env=env)
            terraform_times.append(seconds)
            _clean(client)
            for name in ("terraform.tfstate", "terraform.tfstate.backup", "plan"):
                (config / name).unlink(missing_ok=True)
            seconds = _timed(
                [octl, "create", "runner", RUNNER, f"--set-yaml=@{runner_yaml}"], cwd=work, env=env
            )
            seconds += _timed(
                [octl, "create", "runner-rule", f"--set=runner_id={RUNNER}", f"--set=project_id={PROJECT}"],
                cwd=work,
                env=env,
            )
            octl_times.append(seconds)
            _clean(client)
            if not options.as_json:
                print(f"run {run + 1}: terraform {terraform_times[-1]:.2f} s, octl {octl_times[-1]:.2f} s")
    terraform_median = statistics.median(terraform_times)
    octl_median = statistics.median(octl_times)
    return Result(
        engine=options.engine,
        runs=options.runs,
        init_seconds=init_seconds,
        terraform_seconds=terraform_times,
        octl_seconds=octl_times,
        terraform_median=terraform_median,
        octl_median=octl_median,
        ratio=terraform_median / octl_median,
    )


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--engine", choices=["embedded", "path"], default="embedded")
    parser.add_argument("--json", action="store_true", help="print the result as JSON only")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("need --runs >= 1")
    return Options(runs=args.runs, engine=args.engine, as_json=args.json, results_dir=args.results_dir)


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    with tempfile.TemporaryDirectory(prefix="bench-terraform-") as temporary:
        work = Path(temporary)
        server = api.ServerProcess(data_dir=work / "data", database_url=None, bootstrap_token=BOOTSTRAP_TOKEN)
        try:
            base_url = server.start()
            result = benchmark(base_url, options, work)
        except api.BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted; the server was stopped", file=sys.stderr)
            return 130
        finally:
            server.stop()
    options.results_dir.mkdir(parents=True, exist_ok=True)
    document = asdict(result)
    (options.results_dir / "terraform.json").write_text(
        json.dumps(document, indent=2) + "\n", encoding="utf-8"
    )
    if options.as_json:
        print(json.dumps(document))
        return 0
    print()
    print(f"engine: {options.engine}; init once: {result.init_seconds:.2f} s")
    print(f"{'':24}{'median s':>10}{'ratio':>8}")
    print(f"{'octl (baseline)':24}{result.octl_median:>10.2f}{1.0:>8.2f}")
    print(f"{'terraform plan+apply':24}{result.terraform_median:>10.2f}{result.ratio:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
