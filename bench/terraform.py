"""The Terraform provider's cost: seed 000's example (a GKE runner and its rule) by Terraform and by octl.

    uv run python bench/terraform.py [--runs 5] [--starts 10] [--engine embedded|path] [--json]
                                     [--results-dir bench/results]

It starts `orchestrator serve` as a child process (fresh SQLite data dir), makes an org and an admin
token, installs the provider with `octl terraform install-provider` into a temporary mirror and runs
`init` once (reported, not compared). Then:

1. provider start-up, on its own: `--starts` times, the mirror's executable started as Terraform starts it
   (its environment: magic cookie, protocol 6, a client certificate for automatic mTLS), timed from exec
   to the handshake line, to the `GetProviderSchema` answer, and to its exit after go-plugin's `Shutdown`,
   with the process's CPU time;
2. provider starts per command: one plan and apply with `TF_LOG=trace` (not timed), counting "starting
   plugin" lines;
3. run by run and interleaved:
   - terraform: `plan -out=plan` then `apply plan` of seed 000's "TF" block as copied verbatim in
     tests/data/terraform/seed000_gke_runner_and_rule.tf (with the `terraform`/`provider` block users add);
   - octl (the baseline): `octl create runner my-gke-runner --set-yaml=@seed000-gke-tf.yaml` then
     `octl create runner-rule` with the same runner and project, the seed's CLI tab;
   after each, the two objects are deleted through the API (not timed) and the Terraform state removed.

It prints the medians (wall clock and CPU of the commands and their children), their ratio (terraform /
octl) and the start-up figures, with the load average, and writes bench/results/terraform.json.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import resource
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import api
import grpc
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
#: go-plugin's cookie for Terraform's providers.
MAGIC_COOKIE = "d602bf8f470bc67ca7faa0386276bbdd4330efaf76d1a219cb4d6991ca9872b2"


@dataclass(frozen=True)
class Options:
    runs: int
    starts: int
    engine: str
    as_json: bool
    results_dir: Path


@dataclass
class Startup:
    """Medians over `starts` provider starts, in seconds."""

    starts: int
    handshake_median: float
    schema_median: float
    exit_median: float
    cpu_median: float


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
    terraform_cpu_seconds: list[float]
    octl_cpu_seconds: list[float]
    cpu_ratio: float
    startup: Startup
    #: Provider starts Terraform made for one plan and one apply.
    provider_starts: dict[str, int]
    load_average_before: tuple[float, float, float]
    load_average_after: tuple[float, float, float]


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


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall-clock seconds and CPU seconds (the command and the children it waited for)."""
    cpu = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise api.BenchError(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return elapsed, _children_cpu() - cpu


def _clean(client: httpx.Client) -> None:
    for rule in client.get(f"/orgs/{ORG}/runner-rules").json().get("items", []):
        client.delete(f"/orgs/{ORG}/runner-rules/{rule['id']}").raise_for_status()
    answer = client.delete(f"/orgs/{ORG}/runners/{RUNNER}")
    if answer.status_code not in (204, 404):
        raise api.BenchError(f"delete runner: {answer.status_code} {answer.text}")


def _client_certificate() -> str:
    """What go-plugin's client puts in PLUGIN_CLIENT_CERT (an ECDSA P-521 certificate)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP521R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA512())
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def _one_start(executable: Path, env: dict[str, str]) -> tuple[float, float, float, float]:
    """Seconds from exec to the handshake line, to the schema's answer, to the exit; CPU seconds."""
    cpu = _children_cpu()
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(executable)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode().strip()
        handshake = time.perf_counter() - started
        parts = line.split("|")
        if len(parts) != 6 or parts[:3] != ["1", "6", "unix"]:
            _, err = process.communicate(timeout=60)
            raise api.BenchError(f"unexpected handshake {line!r}: {err.decode()[-2000:]}")
        der = base64.b64decode(parts[5] + "=" * (-len(parts[5]) % 4))
        credentials = grpc.ssl_channel_credentials(root_certificates=ssl.DER_cert_to_PEM_cert(der).encode())
        with grpc.secure_channel(
            f"unix:{parts[3]}", credentials, options=[("grpc.ssl_target_name_override", "localhost")]
        ) as channel:
            channel.unary_unary("/tfplugin6.Provider/GetProviderSchema")(b"", timeout=60)
            schema = time.perf_counter() - started
            channel.unary_unary("/plugin.GRPCController/Shutdown")(b"", timeout=60)
        _, err = process.communicate(timeout=60)
        exited = time.perf_counter() - started
        if process.returncode != 0:
            raise api.BenchError(f"the provider exited {process.returncode}: {err.decode()[-2000:]}")
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return handshake, schema, exited, _children_cpu() - cpu


def measure_startup(mirror: Path, env: dict[str, str], starts: int) -> Startup:
    (executable,) = mirror.glob("registry.terraform.io/*/*/*/*/terraform-provider-*")
    start_env = {
        **env,
        "TF_PLUGIN_MAGIC_COOKIE": MAGIC_COOKIE,
        "PLUGIN_PROTOCOL_VERSIONS": "6",
        "PLUGIN_CLIENT_CERT": _client_certificate(),
    }
    samples = [_one_start(executable, start_env) for _ in range(starts)]
    handshake, schema, exited, cpu = (list(column) for column in zip(*samples, strict=True))
    return Startup(
        starts=starts,
        handshake_median=statistics.median(handshake),
        schema_median=statistics.median(schema),
        exit_median=statistics.median(exited),
        cpu_median=statistics.median(cpu),
    )


def count_starts(engine: str, config: Path, env: dict[str, str], work: Path) -> dict[str, int]:
    """Provider starts of one plan and one apply, from Terraform's trace log (not timed)."""
    counts: dict[str, int] = {}
    for name, args in (
        ("plan", ["plan", "-no-color", "-input=false", "-out=plan"]),
        ("apply", ["apply", "-no-color", "-input=false", "plan"]),
    ):
        log = work / f"{name}.trace"
        traced = {**env, "TF_LOG": "trace", "TF_LOG_PATH": str(log)}
        _timed([engine, *args], cwd=config, env=traced)
        text = log.read_text(encoding="utf-8", errors="replace")
        counts[name] = sum(
            1 for line in text.splitlines() if "starting plugin" in line and "platform-orchestrator" in line
        )
        log.unlink()
    return counts


def benchmark(base_url: str, options: Options, work: Path) -> Result:
    load_before = os.getloadavg()
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}) as boot:
        boot.post("/orgs", json={"id": ORG}).raise_for_status()
        token = boot.post(f"/orgs/{ORG}/tokens", json={"role": "admin", "description": "bench"}).json()[
            "token"
        ]
        boot.post(f"/orgs/{ORG}/projects", json={"id": PROJECT}).raise_for_status()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PO_", "TF_", "PLUGIN_"))}
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
    mirror = work / "mirror"
    subprocess.run(
        [octl, "terraform", "install-provider", str(mirror), "--cli-config", str(work / "cli.tfrc")],
        env=env,
        check=True,
        capture_output=True,
    )
    config = work / "config"
    config.mkdir()
    (config / "providers.tf").write_text(PROVIDERS_TF, encoding="utf-8")
    shutil.copy(SEED_TF, config / "main.tf")
    engine = _engine(options.engine)
    init_seconds, _ = _timed([engine, "init", "-no-color", "-input=false"], cwd=config, env=env)
    runner_yaml = work / "seed000-gke-tf.yaml"
    shutil.copy(SEED_CLI, runner_yaml)
    startup = measure_startup(mirror, env, options.starts)
    terraform_times: list[float] = []
    octl_times: list[float] = []
    terraform_cpu: list[float] = []
    octl_cpu: list[float] = []

    def forget(client: httpx.Client) -> None:
        _clean(client)
        for name in ("terraform.tfstate", "terraform.tfstate.backup", "plan"):
            (config / name).unlink(missing_ok=True)

    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}) as client:
        provider_starts = count_starts(engine, config, env, work)
        forget(client)
        for run in range(options.runs):
            plan = _timed([engine, "plan", "-no-color", "-input=false", "-out=plan"], cwd=config, env=env)
            apply = _timed([engine, "apply", "-no-color", "-input=false", "plan"], cwd=config, env=env)
            terraform_times.append(plan[0] + apply[0])
            terraform_cpu.append(plan[1] + apply[1])
            forget(client)
            runner = _timed(
                [octl, "create", "runner", RUNNER, f"--set-yaml=@{runner_yaml}"], cwd=work, env=env
            )
            rule = _timed(
                [octl, "create", "runner-rule", f"--set=runner_id={RUNNER}", f"--set=project_id={PROJECT}"],
                cwd=work,
                env=env,
            )
            octl_times.append(runner[0] + rule[0])
            octl_cpu.append(runner[1] + rule[1])
            _clean(client)
            if not options.as_json:
                print(
                    f"run {run + 1}: terraform {terraform_times[-1]:.2f} s ({terraform_cpu[-1]:.2f} CPU-s), "
                    f"octl {octl_times[-1]:.2f} s ({octl_cpu[-1]:.2f} CPU-s)"
                )
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
        terraform_cpu_seconds=terraform_cpu,
        octl_cpu_seconds=octl_cpu,
        cpu_ratio=statistics.median(terraform_cpu) / statistics.median(octl_cpu),
        startup=startup,
        provider_starts=provider_starts,
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
    )


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--starts", type=int, default=10, help="provider starts timed on their own")
    parser.add_argument("--engine", choices=["embedded", "path"], default="embedded")
    parser.add_argument("--json", action="store_true", help="print the result as JSON only")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.starts < 1:
        parser.error("need --runs >= 1 and --starts >= 1")
    return Options(
        runs=args.runs,
        starts=args.starts,
        engine=args.engine,
        as_json=args.json,
        results_dir=args.results_dir,
    )


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def report(result: Result) -> None:
    startup = result.startup
    starts = result.provider_starts
    print()
    print(
        f"engine: {result.engine}; init once: {result.init_seconds:.2f} s; load average (1/5/15 min) "
        f"before {api._load(result.load_average_before)}, after {api._load(result.load_average_after)}"
    )
    print(
        f"provider start-up (median of {startup.starts}): exec -> handshake "
        f"{startup.handshake_median:.3f} s, -> schema answered {startup.schema_median:.3f} s, "
        f"-> exited {startup.exit_median:.3f} s; "
        f"{startup.cpu_median:.3f} CPU-s per start"
    )
    print(f"provider starts: plan {starts['plan']}, apply {starts['apply']}")
    print(f"{'':24}{'median s':>10}{'ratio':>8}{'CPU-s':>8}{'ratio':>8}")
    octl_cpu = statistics.median(result.octl_cpu_seconds)
    terraform_cpu = statistics.median(result.terraform_cpu_seconds)
    print(f"{'octl (baseline)':24}{result.octl_median:>10.2f}{1.0:>8.2f}{octl_cpu:>8.2f}{1.0:>8.2f}")
    print(
        f"{'terraform plan+apply':24}{result.terraform_median:>10.2f}{result.ratio:>8.2f}"
        f"{terraform_cpu:>8.2f}{result.cpu_ratio:>8.2f}"
    )


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
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
