"""Upstream's agent protocol, spoken by an agent written only from the upstream documents.

``UpstreamAgent`` follows ``shared/reference/upstream-notes.md`` §4 ("Agent authentication", "Command
envelope", "Agent loop") and nothing of our own agent: an EdDSA JWT per request (header
``{alg, typ, kid}``, claims ``{aud, org_id, runner_id, iat, exp}`` with ``exp - iat = 300``, no ``jti``),
``POST commands/next``, the envelope validated (v1, this org and runner, not expired, ``create-job``),
``payload.configuration`` taken as a Kubernetes JobSpec with ``RUNNER_GATEWAY_URL``, ``ORG_ID`` and
``RUNNER_ID`` injected into container ``main``, Job ``job_id`` "created" in ``namespace``, then event
``job-created`` in the upstream envelope (event id ``<command_id>:job-created``) and the ack with the
receipt.

``Kubelet`` stands in for the cluster: it runs the Job's container ``main`` as a local process the way a
kubelet runs a container (the image's entry point unless ``command`` is set, then ``args``; the container's
``env`` over the image's, ``$(VAR)`` expanded; emptyDir mounts and ``workingDir`` as temp dirs). The runner
image (§5: entry point ``/opt/runner/runner``, default mode ``standard``, ``IAC_CODE_DIR`` defaulting to
the ``/opt/runner/tofu`` mount) maps to our local runner entry point, ``po-runner``.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import kubernetes_validate
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kubernetes_validate.utils import latest_version

from orchestrator.launchers.images import RUNNER_IMAGE_REPOSITORY
from orchestrator.protocol import age
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.live_server import serve_in_thread
from tests.support.outages import ServerProcess
from tests.support.stack import Stack, build_stack, demo_manifest

ORG = "acme"
#: ``build_stack`` names the organization's runner ``local``, whatever its type.
RUNNER = "local"
NAMESPACE = "platform-orchestrator-runner"
#: The image the JobSpec names: upstream's data plane names its own (§5); ours names our runner image, which
#: keeps §5's contract (entry point, default mode, code dir: tests/unit/test_images.py), so upstream's agent
#: runs it unchanged.
RUNNER_IMAGE = RUNNER_IMAGE_REPOSITORY
#: §4 "Agent authentication".
AUDIENCE = "platform-orchestrator-runner-gateway"
TOKEN_LIFETIME_SECONDS = 300
#: §4 "Transport": the gateway's default base path.
GATEWAY_BASE_PATH = "/runner-gateway"


# --- the agent -------------------------------------------------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def generate_keys() -> tuple[Ed25519PrivateKey, str, str]:
    """``openssl genpkey -algorithm ed25519`` (PKCS#8 PEM) and ``openssl pkey -pubout`` (PKIX PEM)."""
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return key, private_pem, public_pem


@dataclass
class UpstreamAgent:
    gateway_url: str
    key: Ed25519PrivateKey
    org_id: str = ORG
    runner_id: str = RUNNER
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=60))

    def jwt(self) -> str:
        """A fresh compact JWS, exactly as §4 "Agent authentication" describes it."""
        raw = self.key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        header = {"alg": "EdDSA", "typ": "JWT", "kid": hashlib.sha256(raw).hexdigest()}
        iat = int(time.time())
        claims = {
            "aud": AUDIENCE,
            "org_id": self.org_id,
            "runner_id": self.runner_id,
            "iat": iat,
            "exp": iat + TOKEN_LIFETIME_SECONDS,
        }
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        return f"{signing_input}.{_b64url(self.key.sign(signing_input.encode()))}"

    def close(self) -> None:
        self.http.close()

    def post(self, path: str, body: Mapping[str, Any] | None = None) -> httpx.Response:
        url = f"{self.gateway_url}/v1/orgs/{self.org_id}/runners/{self.runner_id}{path}"
        return self.http.post(url, json=body, headers={"Authorization": f"Bearer {self.jwt()}"})

    def next_command(self, timeout_seconds: float = 60) -> dict[str, Any]:
        """Long-poll ``commands/next`` until a command comes (200); 204 means "poll again"."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            answer = self.post("/commands/next")
            if answer.status_code == 200:
                delivered: dict[str, Any] = answer.json()
                assert {"command", "receipt", "attempt", "lease_expires_at"} <= set(delivered)
                return delivered
            assert answer.status_code == 204, answer.text
        raise AssertionError(f"no command within {timeout_seconds} s")

    def validate(self, envelope: Mapping[str, Any]) -> dict[str, Any]:
        """Agent loop step 2; the ``create-job`` payload."""
        assert envelope["protocol_version"] == "v1"
        assert (envelope["organization_id"], envelope["runner_id"]) == (self.org_id, self.runner_id)
        assert datetime.fromisoformat(envelope["expires_at"]) > datetime.now(UTC)
        assert envelope["type"] == "create-job"
        assert envelope["command_id"].startswith(f"create-job:{envelope['deployment_id']}:")
        payload: dict[str, Any] = envelope["payload"]
        assert payload["job_id"] == envelope["deployment_id"]
        return payload

    def job(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Agent loop steps 3 and 4: the Job ``job_id`` in ``namespace`` from the JobSpec in
        ``configuration``, with the agent's ``RUNNER_GATEWAY_URL``, ``ORG_ID`` and ``RUNNER_ID``."""
        spec = copy.deepcopy(payload["configuration"])
        assert isinstance(spec, dict), "configuration must be a JobSpec (a JSON object)"
        injected = {
            "RUNNER_GATEWAY_URL": self.gateway_url,
            "ORG_ID": self.org_id,
            "RUNNER_ID": self.runner_id,
        }
        main = container(spec, "main")
        main["env"] = [e for e in main.get("env") or [] if e["name"] not in injected]
        main["env"] += [{"name": name, "value": value} for name, value in injected.items()]
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": payload["job_id"], "namespace": payload["namespace"]},
            "spec": spec,
        }

    def event(
        self,
        envelope: Mapping[str, Any],
        event_type: str,
        payload: Mapping[str, Any],
        *,
        protocol_version: str = "v1",
    ) -> httpx.Response:
        body = {
            "protocol_version": protocol_version,
            "event_id": f"{envelope['command_id']}:{event_type}",
            "organization_id": self.org_id,
            "runner_id": self.runner_id,
            "deployment_id": envelope["deployment_id"],
            "type": event_type,
            "created_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "payload": dict(payload),
        }
        return self.post("/events", body)

    def ack(self, delivered: Mapping[str, Any]) -> httpx.Response:
        command_id = quote(delivered["command"]["command_id"], safe="")
        return self.post(f"/commands/{command_id}/ack", {"receipt": delivered["receipt"]})


def container(job_spec: Mapping[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in job_spec["template"]["spec"]["containers"] if c["name"] == name)
    return found


# --- the cluster -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalImage:
    """An image as a local program: its entry point, default args and ENV (paths inside the container)."""

    entrypoint: list[str]
    args: list[str]
    env: dict[str, str]


#: §5: ``ENTRYPOINT ["/opt/runner/runner"]``, no argument means ``standard``, ``IAC_CODE_DIR`` defaults to
#: ``/opt/runner/tofu``; here our runner's entry point stands in for the image's (which runs it).
IMAGES = {
    RUNNER_IMAGE: LocalImage(
        entrypoint=[str(Path(sys.executable).parent / "po-runner")],
        args=["standard"],
        env={"IAC_CODE_DIR": "/opt/runner/tofu"},
    )
}

_VARIABLE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, ``$$`` is a literal ``$``."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VARIABLE.sub(replace, text)


class Kubelet:
    """Runs a Job's container ``main`` as a process, in a pod directory of its own."""

    def __init__(self, work: Path) -> None:
        self.work = work

    def start(self, job: Mapping[str, Any]) -> tuple[subprocess.Popen[bytes], Path]:
        pod_spec = job["spec"]["template"]["spec"]
        spec = container(job["spec"], "main")
        pod_dir = self.work / f"pod-{job['metadata']['name']}"
        image = IMAGES[spec["image"].rsplit(":", 1)[0]]
        empty_dirs = {v["name"] for v in pod_spec.get("volumes") or [] if "emptyDir" in v}
        mounts: dict[str, Path] = {}
        for mount in spec.get("volumeMounts") or []:
            assert mount["name"] in empty_dirs, f"only emptyDir volumes are stood in for: {mount}"
            local = pod_dir / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = local

        def local_path(path: str) -> str:
            for mount_path, local in mounts.items():
                if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
                    return str(local / os.path.relpath(path, mount_path))
            return path

        home = pod_dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {k: os.environ[k] for k in ("PATH", "LANG", "SSL_CERT_FILE", "SSL_CERT_DIR") if k in os.environ}
        env["HOME"] = str(home)
        env.update({name: local_path(value) for name, value in image.env.items()})
        for var in spec.get("env") or []:
            assert "valueFrom" not in var, f"the JobSpec must carry literal values: {var['name']}"
            env[var["name"]] = expand(var.get("value", ""), env)
        command = spec.get("command") or image.entrypoint
        args = spec.get("args") if "args" in spec or "command" in spec else image.args
        argv = [expand(part, env) for part in [*command, *(args or [])]]
        cwd = Path(local_path(spec["workingDir"])) if spec.get("workingDir") else pod_dir
        cwd.mkdir(parents=True, exist_ok=True)
        log = pod_dir / "main.log"
        with open(log, "wb") as output:
            process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=output, stderr=subprocess.STDOUT)
        return process, log


# --- the orchestrator ------------------------------------------------------------------------------------


def runner_body(public_pem: str, tf_config: Path) -> dict[str, Any]:
    """A ``kubernetes-agent`` runner whose runs use the embedded Terraform engine (set in the pod
    template, as a user would pin any runner setting), state kept by the orchestrator."""
    engine_env = {"IAC_BACKEND": "embedded", "TF_CLI_CONFIG_FILE": str(tf_config), "CHECKPOINT_DISABLE": "1"}
    return {
        "runner_configuration": {
            "type": "kubernetes-agent",
            "key": public_pem,
            "job": {
                "namespace": NAMESPACE,
                "service_account": "platform-orchestrator-runner",
                "pod_template": {
                    "spec": {
                        "containers": [
                            {"name": "main", "env": [{"name": k, "value": v} for k, v in engine_env.items()]}
                        ]
                    }
                },
            },
        },
        "state_storage_configuration": {"type": "orchestrator"},
    }


def start_deployment(stack: Stack) -> tuple[str, str]:
    """A deployment of the demo manifest; its id and the age identity its outputs decrypt with."""
    identity, recipient = age.generate_identity()
    created = stack.client.post(
        f"/orgs/{stack.org}/deployments",
        json={
            "project_id": "shop",
            "env_id": "dev",
            "mode": "deploy",
            "manifest": demo_manifest(),
            "encrypted_outputs_recipient": recipient,
        },
    )
    assert created.status_code == 201, created.text
    deployment_id: str = created.json()["id"]
    return deployment_id, identity


def assert_valid_job(job: dict[str, Any]) -> None:
    """The real Kubernetes schemas (unknown fields refused), newest and 1.30."""
    for version in (latest_version(), "1.30.0"):
        kubernetes_validate.validate(job, version, strict=True)


@pytest.fixture
def live_url(settings: ServerSettings) -> Iterator[str]:
    with serve_in_thread(
        factory=lambda url: create_app(settings.model_copy(update={"public_url": url}))
    ) as url:
        yield url


@pytest.fixture
def keys() -> tuple[Ed25519PrivateKey, str, str]:
    return generate_keys()


def test_upstream_agent__gets_a_valid_job_spec_without_its_key_and_v2_events_are_refused(
    live_url: str, tmp_path: Path, keys: tuple[Ed25519PrivateKey, str, str]
) -> None:
    key, private_pem, public_pem = keys
    stack = build_stack(live_url, tmp_path, runner=runner_body(public_pem, tmp_path / "terraformrc"))
    agent = UpstreamAgent(f"{live_url}{GATEWAY_BASE_PATH}", key)
    try:
        deployment_id, _ = start_deployment(stack)
        delivered = agent.next_command()
        envelope = delivered["command"]
        payload = agent.validate(envelope)
        job = agent.job(payload)
        newer = agent.event(
            envelope, "job-created", {"job_id": deployment_id, "namespace": NAMESPACE}, protocol_version="v2"
        )
    finally:
        agent.close()
        stack.client.close()

    assert_valid_job(job)
    main = container(job["spec"], "main")
    env = {e["name"]: e["value"] for e in main["env"]}
    assert (deployment_id, NAMESPACE) == (job["metadata"]["name"], job["metadata"]["namespace"])
    assert ["standard"] == main["args"] and main["image"].startswith(f"{RUNNER_IMAGE}:")
    assert {"DEPLOYMENT_ID", "DEPLOYMENT_ENV_UUID", "MODE", "TOKEN", "ENCRYPTING_KEY"} <= set(env)
    assert (deployment_id, "deploy") == (env["DEPLOYMENT_ID"], env["MODE"])
    # The agent's key stays with the agent.
    text = json.dumps(payload)
    assert private_pem.strip() not in text and "PRIVATE KEY" not in text and "PRIVATE_KEY" not in env
    assert 400 == newer.status_code
    assert "protocol_version" in newer.json()["message"] and "'v1'" in newer.json()["message"]
    assert ["protocol_version"] == [e["field"] for e in newer.json()["details"]["errors"]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_upstream_agent__drives_a_deployment_to_success(
    database_url: str, tmp_path: Path, keys: tuple[Ed25519PrivateKey, str, str]
) -> None:
    key, _, public_pem = keys
    server = ServerProcess(database_url, tmp_path / "data", PO_AGENT_FETCH_WAIT_SECONDS="5")
    server.start()
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    agent = UpstreamAgent(f"{server.url}{GATEWAY_BASE_PATH}", key)
    process: subprocess.Popen[bytes] | None = None
    try:
        stack = build_stack(server.url, tmp_path, runner=runner_body(public_pem, tf_config))
        deployment_id, identity = start_deployment(stack)
        delivered = agent.next_command()
        envelope = delivered["command"]
        payload = agent.validate(envelope)
        job = agent.job(payload)
        process, log = Kubelet(tmp_path / "kubelet").start(job)
        created = agent.event(envelope, "job-created", {"job_id": payload["job_id"], "namespace": NAMESPACE})
        acked = agent.ack(delivered)
        code = process.wait(180)
        assert 0 == code, log.read_text()[-3000:]
        deployment = stack.wait(deployment_id)
        raw = stack.client.get(f"/orgs/{ORG}/deployments/{deployment_id}/encrypted-outputs").json()["raw"]
        outputs = json.loads(age.decrypt_b64(raw, identity))
        again = agent.post("/commands/next")
        stack.client.close()
    finally:
        if process is not None and process.poll() is None:
            process.kill()
        agent.close()
        server.stop()

    assert (202, 204) == (created.status_code, acked.status_code), (created.text, acked.text)
    assert "succeeded" == deployment["status"], deployment["status_message"]
    # Keyed by workload (the name is another test's); the demo module's bucket output came through.
    assert [{"bucket": "bucket-shop"}] == [
        {"bucket": value["bucket"]}
        for value in outputs.values()
        if isinstance(value, dict) and "bucket" in value
    ]
    # Acked: the command is not delivered again.
    assert 204 == again.status_code
