"""A real server (uvicorn on 127.0.0.1, ``running_server``) and an organization ready to deploy on it
(``build_stack``, a :class:`Stack`): the demo module of examples/demo, a local vm runner."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

from orchestrator.protocol import age
from orchestrator.server import Server, create_app
from orchestrator.settings import ServerSettings
from tests.support.orgs import BOOTSTRAP_TOKEN

EXAMPLES = Path(__file__).parent.parent.parent / "examples" / "demo"


@contextmanager
def running_server(make_settings: Callable[[int], ServerSettings]) -> Iterator[str]:
    """Bind a free port, build the settings for it (public_url!), serve until the block ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(make_settings(port))
    server = Server(uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False), app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    else:
        raise RuntimeError("server did not start")
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@dataclass
class Stack:
    """An organization ready to deploy: env shop/dev, a local vm runner, the demo module."""

    client: httpx.Client
    org: str
    tf_config: Path

    def deploy(self, manifest: dict[str, Any] | None = None, **body: Any) -> dict[str, Any]:
        identity, recipient = age.generate_identity()
        payload = {
            "project_id": "shop",
            "env_id": "dev",
            "mode": "deploy",
            "manifest": manifest if manifest is not None else demo_manifest(),
            "encrypted_outputs_recipient": recipient,
            "encrypted_logs_recipient": recipient,
            **body,
        }
        if payload["mode"] == "rollback":
            del payload["manifest"]
        created = self.client.post(f"/orgs/{self.org}/deployments", json=payload)
        assert created.status_code in (200, 201), created.text
        deployment: dict[str, Any] = created.json()
        if "id" in deployment:
            deployment = self.wait(deployment["id"])
        deployment["_identity"] = identity
        return deployment

    def wait(self, deployment_id: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = self.client.get(
                f"/orgs/{self.org}/deployments/{deployment_id}/actions/wait-for-complete",
                params={"timeout_in_seconds": 10},
                timeout=30,
            )
            if response.status_code == 200:
                result: dict[str, Any] = response.json()
                return result
            assert response.status_code == 408, response.text
        raise AssertionError(f"deployment {deployment_id} did not complete in {timeout} s")

    def outputs(self, deployment: dict[str, Any], identity: str | None = None) -> dict[str, Any]:
        raw = self.client.get(f"/orgs/{self.org}/deployments/{deployment['id']}/encrypted-outputs").json()[
            "raw"
        ]
        decrypted: dict[str, Any] = yaml.safe_load(age.decrypt_b64(raw, identity or deployment["_identity"]))
        return decrypted


def demo_manifest(name: str = "shop") -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load((EXAMPLES / "manifest.yaml").read_text())
    manifest["workloads"]["shop"]["resources"]["app"]["params"]["name"] = name
    return manifest


def runner_body(tf_config: Path, state: dict[str, Any] | None = None, **environment: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / "runner.yaml").read_text())
    body["runner_configuration"]["job"]["environment"].update(
        {"IAC_BACKEND": "embedded", "TF_CLI_CONFIG_FILE": str(tf_config), **environment}
    )
    if state is not None:
        body["state_storage_configuration"] = state
    return body


def build_stack(
    base_url: str,
    tmp_path: Path,
    *,
    org: str = "acme",
    runner: dict[str, Any] | None = None,
    verify: ssl.SSLContext | bool = True,
) -> Stack:
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    base = f"/orgs/{org}"
    with httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}, verify=verify
    ) as admin:
        assert admin.post("/orgs", json={"id": org}).status_code == 201
        token = admin.post(f"/orgs/{org}/tokens", json={"role": "admin"}).json()["token"]
        # A runner with a local connection is the platform admin's to create.
        created = admin.post(f"{base}/runners", json={"id": "local", **(runner or runner_body(tf_config))})
        assert created.status_code == 201, created.text
    client = httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=60, verify=verify
    )
    for path, body in [
        ("/env-types", {"id": "development"}),
        ("/projects", {"id": "shop"}),
        ("/projects/shop/envs", {"id": "dev", "env_type_id": "development"}),
        ("/runner-rules", {"runner_id": "local"}),
        (
            "/resource-types",
            {"id": "demo-app", **yaml.safe_load((EXAMPLES / "resource-type.yaml").read_text())},
        ),
        ("/modules", {"id": "demo-app", **yaml.safe_load((EXAMPLES / "module.yaml").read_text())}),
        ("/module-rules", {"module_id": "demo-app"}),
    ]:
        response = client.post(base + path, json=body)
        assert response.status_code == 201, (path, response.text)
    return Stack(client=client, org=org, tf_config=tf_config)
