"""Server-side request forgery through ``kubernetes`` runners: where the server connects for a runner, and
what of the answer reaches the deployment's status message.

The stand-in Kubernetes API (tests/support/kube_api.py, not Kubernetes) records every request it answers;
the "foreign service" below is a small server that answers anything but Kubernetes, with a canary string.
Both listen on 127.0.0.1, which the server's default policy refuses: tests that need to reach them say so
in their settings.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from orchestrator.launchers.base import LaunchError
from orchestrator.launchers.egress import EgressPolicy
from orchestrator.launchers.kubernetes import ClusterAccess, KubernetesLauncher
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.kube_api import CertificateAuthority, KubeApiServer
from tests.support.kube_launcher import IMAGE, NAMESPACE, kube_api, make_spec
from tests.support.live_server import serve_in_thread
from tests.support.orgs import BOOTSTRAP_TOKEN, Org, make_org

EXAMPLES = Path(__file__).parent.parent.parent / "examples" / "demo"
CANARY = "canary-7f3a9c-internal-secret"


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


# --- a service that is not Kubernetes -------------------------------------------------------------------


class Foreign:
    """Answers every request (but ``/healthz``) with ``status`` and ``body``; records the paths asked."""

    def __init__(self, status: int, body: Any, media_type: str) -> None:
        self.status, self.body, self.media_type = status, body, media_type
        self.requests: list[str] = []

    async def handle(self, request: Request) -> Response:
        if request.url.path == "/healthz":
            return PlainTextResponse("ok")
        self.requests.append(f"{request.method} {request.url.path}")
        if self.media_type == "application/json":
            return JSONResponse(self.body, status_code=self.status)
        return Response(self.body, status_code=self.status, media_type=self.media_type)

    def app(self) -> Starlette:
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        return Starlette(routes=[Route("/{path:path}", self.handle, methods=methods)])


@contextlib.contextmanager
def foreign_service(status: int, body: Any, media_type: str) -> Iterator[tuple[str, Foreign]]:
    service = Foreign(status, body, media_type)
    with serve_in_thread(service.app()) as url:
        yield url, service


HTML = f"<html><body><h1>Admin console</h1><p>{CANARY}</p></body></html>"
FOREIGN_ANSWERS = {
    "html-page": (403, HTML, "text/html"),
    "json-with-a-message": (403, {"message": CANARY, "code": 403, "reason": "Forbidden"}, "application/json"),
    "json-error-500": (500, {"error": CANARY, "message": CANARY}, "application/json"),
    "json-not-an-object": (403, [CANARY], "application/json"),
}


# --- the launcher: refused before any request -----------------------------------------------------------


def default_launcher(server: str, api: KubeApiServer, **settings: Any) -> KubernetesLauncher:
    """The launcher as the server builds it, with the server's egress settings (defaults unless given)."""
    access = ClusterAccess(
        server=server,
        certificate_authority_data=api.ca_data,
        client_certificate_data=api.client_certificate_data,
        client_key_data=api.client_key_data,
        timeout_seconds=5.0,
    )
    egress = ServerSettings(**settings).runner_egress
    return KubernetesLauncher(access, egress=egress, image=IMAGE)


@pytest.mark.parametrize(
    "host",
    ["localhost", "127.0.0.1", "127.3.2.1", "[::1]", "[::ffff:127.0.0.1]", "0.0.0.0"],
)
async def test_egress__loopback_targets_refused_before_any_request(
    tmp_path: Path, host: str, out_dir: Path
) -> None:
    """Loopback (by name, by address, IPv4-mapped, "this host") is refused with a message naming the
    setting; the API server sees no request at all."""
    with kube_api(tmp_path) as api:
        port = api.url.rsplit(":", 1)[1]
        k8s = default_launcher(f"https://{host}:{port}", api)

        with pytest.raises(LaunchError) as caught:
            await k8s.launch(make_spec(out_dir))
        status = await k8s.status(f"k8s:{NAMESPACE}:whatever")
        with pytest.raises(LaunchError):
            await k8s.cancel(f"k8s:{NAMESPACE}:whatever", grace_seconds=1)
        calls = list(api.calls)

    assert [] == calls
    assert caught.value.retryable is False
    assert "which runners may not target (PO_RUNNER_DENIED_NETWORKS)" in caught.value.message
    assert status.detail is not None and "PO_RUNNER_DENIED_NETWORKS" in status.detail


async def test_egress__link_local_metadata_address_refused(tmp_path: Path, out_dir: Path) -> None:
    with kube_api(tmp_path) as api:
        k8s = default_launcher("https://169.254.169.254", api)

        with pytest.raises(LaunchError) as caught:
            await k8s.launch(make_spec(out_dir))

    assert "169.254.169.254 is in the network 169.254.0.0/16" in caught.value.message


async def test_egress__a_host_allowed_once_its_network_is_not_denied(tmp_path: Path, out_dir: Path) -> None:
    """With loopback left off the list (another network denied), the same name connects and launches."""
    with kube_api(tmp_path) as api:
        port = api.url.rsplit(":", 1)[1]
        k8s = default_launcher(f"https://localhost:{port}", api, runner_denied_networks="10.0.0.0/8")

        handle = (await k8s.launch(make_spec(out_dir))).handle

    assert handle.startswith("k8s:")


async def test_egress__proxy_in_a_denied_network_refused(tmp_path: Path, out_dir: Path) -> None:
    """The proxy is where the server connects: a loopback proxy is refused like a loopback API."""
    with kube_api(tmp_path) as api:
        access = ClusterAccess(
            server="https://kubernetes.example.com",
            certificate_authority_data=api.ca_data,
            proxy_url="http://localhost:3128",
            timeout_seconds=5.0,
        )
        k8s = KubernetesLauncher(access, egress=EgressPolicy(), image=IMAGE)

        with pytest.raises(LaunchError) as caught:
            await k8s.launch(make_spec(out_dir))

    assert "localhost" in caught.value.message
    assert "PO_RUNNER_DENIED_NETWORKS" in caught.value.message


async def test_egress__plain_http_refused_unless_allowed(tmp_path: Path, out_dir: Path) -> None:
    with kube_api(tmp_path, tls=False, auth="token", tokens={"t0ken"}) as api:
        access = ClusterAccess(server=api.url, token="t0ken", timeout_seconds=5.0)
        https_only = KubernetesLauncher(
            access, egress=ServerSettings(runner_denied_networks="").runner_egress, image=IMAGE
        )
        allowed = KubernetesLauncher(
            access,
            egress=ServerSettings(runner_denied_networks="", runner_allow_plain_http=True).runner_egress,
            image=IMAGE,
        )

        with pytest.raises(LaunchError) as caught:
            await https_only.launch(make_spec(out_dir))
        calls_refused = list(api.calls)
        handle = (await allowed.launch(make_spec(out_dir))).handle

    assert [] == calls_refused
    assert caught.value.retryable is False
    assert "is not an https URL" in caught.value.message
    assert "PO_RUNNER_ALLOW_PLAIN_HTTP" in caught.value.message
    assert handle.startswith("k8s:")


# --- the answer: never a foreign body -------------------------------------------------------------------


@pytest.mark.parametrize("answer", list(FOREIGN_ANSWERS))
async def test_egress__foreign_answer_never_quoted(answer: str, tmp_path: Path, out_dir: Path) -> None:
    """Whatever a service that is not a Kubernetes API answers, the error gives its HTTP status only."""
    status_code, body, media_type = FOREIGN_ANSWERS[answer]
    with foreign_service(status_code, body, media_type) as (url, service):
        access = ClusterAccess(server=url, token="t", timeout_seconds=5.0)
        k8s = KubernetesLauncher(
            access, egress=EgressPolicy(allow_plain_http=True, denied_networks=()), image=IMAGE
        )

        with pytest.raises(LaunchError) as caught:
            await k8s.launch(make_spec(out_dir))
        status = await k8s.status(f"k8s:{NAMESPACE}:whatever")

    assert service.requests, "the request reached the service"
    assert CANARY not in caught.value.message
    assert CANARY not in (status.detail or "")
    assert str(status_code) in caught.value.message or "did not answer like a Kubernetes API" in (
        caught.value.message
    )


async def test_egress__kubernetes_status_message_is_quoted_shortened(tmp_path: Path, out_dir: Path) -> None:
    """A real ``metav1.Status`` is quoted: its reason and message, cut to 300 characters."""
    status_body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": "Forbidden",
        "code": 403,
        "message": 'jobs.batch is forbidden: User "x" cannot create resource "jobs" ' + "x" * 1000,
    }
    with foreign_service(403, status_body, "application/json") as (url, _service):
        access = ClusterAccess(server=url, token="t", timeout_seconds=5.0)
        k8s = KubernetesLauncher(
            access, egress=EgressPolicy(allow_plain_http=True, denied_networks=()), image=IMAGE
        )
        with pytest.raises(LaunchError) as caught:
            await k8s.launch(make_spec(out_dir))

    assert '403 Forbidden: jobs.batch is forbidden: User "x" cannot create' in caught.value.message
    assert "x" * 400 not in caught.value.message
    assert caught.value.message.endswith("…")


# --- through the server: create, deploy, what a viewer reads -------------------------------------------


def kubernetes_runner(server: str, *, ca_data: str | None = None) -> dict[str, Any]:
    ca = ca_data or base64.b64encode(CertificateAuthority("any").pem).decode()
    return {
        "runner_configuration": {
            "type": "kubernetes",
            "cluster": {
                "cluster_data": {"server": server, "certificate_authority_data": ca},
                "auth": {"service_account_token": "runner-credential"},
            },
            "job": {"namespace": NAMESPACE, "service_account": "runner"},
        },
        "state_storage_configuration": {"type": "orchestrator"},
    }


async def deploy_through(org: Org, runner: dict[str, Any]) -> dict[str, Any]:
    """Deploy the demo module through ``runner``; the finished deployment as a viewer reads it."""
    base = f"/orgs/{org.id}"
    for path, body in [
        ("/env-types", {"id": "development"}),
        ("/projects", {"id": "shop"}),
        ("/projects/shop/envs", {"id": "dev", "env_type_id": "development"}),
        ("/runners", {"id": "k8s", **runner}),
        ("/runner-rules", {"runner_id": "k8s"}),
        (
            "/resource-types",
            {"id": "demo-app", **yaml.safe_load((EXAMPLES / "resource-type.yaml").read_text())},
        ),
        ("/modules", {"id": "demo-app", **yaml.safe_load((EXAMPLES / "module.yaml").read_text())}),
        ("/module-rules", {"module_id": "demo-app"}),
    ]:
        response = await org.admin.post(base + path, json=body)
        assert 201 == response.status_code, (path, response.text)
    manifest = {
        "workloads": {"shop": {"resources": {"app": {"type": "demo-app", "params": {"name": "shop"}}}}}
    }
    created = await org.admin.post(
        f"{base}/deployments",
        json={"project_id": "shop", "env_id": "dev", "mode": "deploy", "manifest": manifest},
    )
    assert 201 == created.status_code, created.text
    path = f"{base}/deployments/{created.json()['id']}/actions/wait-for-complete"
    for _ in range(10):
        done = await org.clients["viewer"].get(path, params={"timeout_in_seconds": 10})
        if done.status_code == 200:
            return dict(done.json())
    raise AssertionError("the deployment did not finish")


@contextlib.asynccontextmanager
async def server_org(settings: ServerSettings) -> AsyncIterator[Org]:
    app: FastAPI = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://po.test",
            headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"},
        ) as platform:
            made = await make_org(app, platform, "acme")
            try:
                yield made
            finally:
                for client in made.clients.values():
                    await client.aclose()


async def test_egress__deployment_to_a_loopback_cluster_fails_without_a_request(
    settings: ServerSettings, tmp_path: Path
) -> None:
    """A runner whose cluster name resolves to loopback: created (names are checked when connecting), its
    deployment fails with the reason, and the stand-in API never hears of it."""
    with kube_api(tmp_path) as api:
        port = api.url.rsplit(":", 1)[1]
        async with server_org(settings) as org:
            deployment = await deploy_through(
                org, kubernetes_runner(f"https://localhost:{port}", ca_data=api.ca_data)
            )
        calls = list(api.calls)

    assert [] == calls
    assert "failed" == deployment["status"]
    assert "which runners may not target (PO_RUNNER_DENIED_NETWORKS)" in deployment["status_message"]


async def test_egress__viewer_never_reads_a_foreign_body(settings: ServerSettings) -> None:
    """The issue's case: an admin points a runner at an internal JSON service; its answer does not reach
    the status message a viewer reads (only its HTTP status does)."""
    status_code, body, media_type = FOREIGN_ANSWERS["json-with-a-message"]
    allowed = settings.model_copy(update={"runner_allow_plain_http": True, "runner_denied_networks": ""})
    with foreign_service(status_code, body, media_type) as (url, service):
        async with server_org(allowed) as org:
            deployment = await deploy_through(org, kubernetes_runner(url))

    assert service.requests
    assert "failed" == deployment["status"]
    assert CANARY not in deployment["status_message"]
    assert "403 Forbidden (not a Kubernetes Status; the answer is not shown)" in deployment["status_message"]


@pytest.mark.parametrize(
    ("server", "proxy", "field", "problem"),
    [
        ("http://k8s.example.com", None, "server", "is not an https URL"),
        ("https://127.0.0.1:6443", None, "server", "is in the network 127.0.0.0/8"),
        ("https://[fe80::1]:6443", None, "server", "is in the network fe80::/10"),
        ("https://k8s.example.com", "http://169.254.169.254:3128", "proxy_url", "169.254.0.0/16"),
    ],
)
async def test_egress__runner_create_and_update_refuse_unreachable_urls(
    org: Org, server: str, proxy: str | None, field: str, problem: str
) -> None:
    runner = kubernetes_runner(server)
    if proxy is not None:
        runner["runner_configuration"]["cluster"]["cluster_data"]["proxy_url"] = proxy
    good = kubernetes_runner("https://k8s.example.com")

    created = await org.admin.post(f"/orgs/{org.id}/runners", json={"id": "k8s", **runner})
    await org.admin.post(f"/orgs/{org.id}/runners", json={"id": "ok", **good})
    updated = await org.admin.patch(
        f"/orgs/{org.id}/runners/ok", json={"runner_configuration": runner["runner_configuration"]}
    )

    for response in (created, updated):
        assert 400 == response.status_code, response.text
        message = response.json()["message"]
        assert message.startswith(f"runner_configuration.cluster.cluster_data.{field}: ")
        assert problem in message
