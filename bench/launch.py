"""Launch latency per runner type: deployment created → runner process started, against the test stand-ins.

    uv run python bench/launch.py [--types vm-ssh,kubernetes,...] [--runs 8] [--warmup 1]
                                  [--database sqlite|postgresql] [--max-seconds 900] [--json]

One `orchestrator serve` (a child process, fresh data dir; SQLite or a throwaway PostgreSQL) and, in this
process, the stand-ins the acceptance tests deploy through (tests/support): a real sshd on loopback, the
stand-in Kubernetes API whose kubelet runs the runner image as a local process, the Google, Azure and AWS
stand-ins (the server's own OIDC tokens exchanged as the clouds do), the AWS stand-in's Fargate, and
`po-runner remote` agents. One runner per type, each in its own project; the same module (one
`terraform_data` resource) deployed round-robin over the types, one deployment at a time.

Measured per deployment, on this host's clock:

- started: the `POST /deployments` answer → the runner's first request (its bundle download), as seen by
  a recording reverse proxy in front of the server that is the server's `PO_PUBLIC_URL` (the gateway URL
  every runner and agent is given). It includes the runner's own start-up (Python imports), the same
  program on every type;
- completed: the `POST /deployments` answer → the deployment's `completed_at`;
- launch call: `created_at` → `launched_at`, the server's own stamps around the launcher's call.

Every type's medians are printed as ratios to the local launcher's (`vm-local`, always measured) in the
same run. The exit status is 1 when any deployment failed or a stand-in could not be set up.
See bench/README.md for how to read it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import api
import deploy
import httpx
import loadgen
import pytest
import repo_path
import uvicorn
import yaml
from starlette.types import Receive, Scope, Send

from orchestrator.launchers import processes
from orchestrator.launchers.kubernetes_job import DEFAULT_RUNNER_IMAGE
from orchestrator.protocol import agent_auth
from tests.support import aws_launcher, azure_standin, gcp_standin
from tests.support.agent_process import AgentProcess
from tests.support.aws_standin import AwsStandIn, OidcProvider, Role
from tests.support.azure_standin import AzureStandIn
from tests.support.gcp_standin import GcpStandIn
from tests.support.kube_api import CertificateAuthority, KubeApiServer, runner_image
from tests.support.oidc_relying_party import RelyingParty
from tests.support.sshd import running_sshd

ROOT = repo_path.ROOT
ORG = "bench"
ENV = "dev"
ENV_TYPE = "bench-env"
RESOURCE_TYPE = "launch-one"
NAMESPACE = "platform-orchestrator-runner"
SERVICE_ACCOUNT = "platform-orchestrator-runner"
BASELINE = "vm-local"
VENV_BIN = str(Path(sys.executable).parent)
#: A deployment not completed by then counts as failed (and the next one starts).
DEPLOY_TIMEOUT_S = 180.0
#: How long runs on this host may take to exit once their deployments completed, before SIGKILL.
RUN_EXIT_TIMEOUT_S = 30.0
MAX_RUNS = 200
BUNDLE_PATH = re.compile(
    r"^/runner-gateway/v1/orgs/[^/]+/runners/[^/]+/deployments/(?P<deployment>[0-9a-f-]{36})/bundle$"
)
#: Not forwarded by the proxy (hop-by-hop, or set by the client for the body it sends).
HOP_HEADERS = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
MODULE = """\
variable "trigger" {
  type = string
}

resource "terraform_data" "one" {
  input = var.trigger
}

output "value" {
  value = terraform_data.one.output
}
"""


@dataclass(frozen=True, kw_only=True)
class Options:
    types: tuple[str, ...]
    runs: int
    warmup: int
    database: str
    max_seconds: float
    json: bool
    results_dir: Path


# --- the recording proxy ---------------------------------------------------------------------------


class RecordingProxy:
    """An ASGI reverse proxy to ``target`` that notes when each deployment's bundle is first requested.

    Requests are forwarded as they came (method, path, query, headers with ``Host``, body) and answers
    streamed back as they are (raw bytes, ``Content-Encoding`` kept); only hop-by-hop headers are dropped.
    """

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        #: Deployment id -> this host's wall clock when its runner's first bundle request arrived.
        self.bundle_requested: dict[str, float] = {}
        self.forwarded = 0
        self._client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._forward(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # Agents' long polls last up to a minute; nothing else takes long.
                self._client = httpx.AsyncClient(timeout=httpx.Timeout(120.0), trust_env=False)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived = time.time()
        found = BUNDLE_PATH.match(scope["path"])
        if found is not None and scope["method"] == "GET":
            self.bundle_requested.setdefault(found["deployment"], arrived)
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in scope["headers"]
            if name.lower() not in HOP_HEADERS and name.lower() != b"content-length"
        ]
        url = self.target + scope["raw_path"].decode("latin-1")
        if scope["query_string"]:
            url += "?" + scope["query_string"].decode("latin-1")
        assert self._client is not None
        request = self._client.build_request(scope["method"], url, headers=headers, content=bytes(body))
        # A client gone before the answer (an agent stopped during its long poll) ends the upstream request.
        upstream = asyncio.ensure_future(self._client.send(request, stream=True))
        disconnect = asyncio.ensure_future(receive())
        await asyncio.wait({upstream, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        disconnect.cancel()
        if not upstream.done():
            upstream.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await upstream
            return
        try:
            response = upstream.result()
        except httpx.TransportError as exc:
            text = f"bench proxy: the server did not answer: {type(exc).__name__}".encode()
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": text})
            return
        self.forwarded += 1
        try:
            raw = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_HEADERS]
            await send({"type": "http.response.start", "status": response.status_code, "headers": raw})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()


def bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def serving(app: RecordingProxy, sock: socket.socket) -> Iterator[None]:
    """Serve ``app`` on the already bound ``sock`` (uvicorn in a thread) until the block ends."""
    config = uvicorn.Config(
        app,
        lifespan="on",
        log_level="warning",
        access_log=False,
        http="h11",
        ws="none",
        loop="asyncio",
        timeout_graceful_shutdown=3,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="proxy")
    thread.start()
    deadline = time.monotonic() + api.STARTUP_TIMEOUT_SECONDS
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise api.BenchError("the recording proxy did not start")
        time.sleep(0.02)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(30)


# --- the server ------------------------------------------------------------------------------------


class LaunchServer(api.ServerProcess):
    """`api.ServerProcess` with an environment of its own: the proxy as its public URL, local runners,
    loopback allowed for runners' APIs and hosts, the stand-ins' endpoints and CA."""

    def __init__(self, *, environment: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.environment = dict(environment)

    def start(self) -> str:
        executable = shutil.which("orchestrator", path=VENV_BIN)
        if executable is None:
            raise api.BenchError(f"no `orchestrator` console script in {VENV_BIN}: run `uv sync`")
        port = api.free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PO_")}
        env |= {
            "PO_DATA_DIR": str(self.data_dir),
            "PO_LISTEN": f"127.0.0.1:{port}",
            "PO_BOOTSTRAP_TOKEN": self._bootstrap_token,
            "PO_LOG_LEVEL": "warning",
            **self.environment,
        }
        if self._database_url is not None:
            env["PO_DATABASE_URL"] = self._database_url
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


# --- the runner types ------------------------------------------------------------------------------


@dataclass
class Shared:
    """What several types share: the work directory, the public URL, the clouds' CA, the AWS stand-in."""

    tmp: Path
    public_url: str
    engine_env: dict[str, str]
    ca_file: Path | None = None
    aws: AwsStandIn | None = None
    aws_trusts_server: bool = False
    _ca: CertificateAuthority | None = None

    def cloud_ca(self) -> CertificateAuthority:
        """The CA of the Google and Azure stand-ins' TLS certificates; the server trusts it only."""
        if self._ca is None:
            self._ca = CertificateAuthority("bench-cloud-stand-ins")
            self.ca_file = self.tmp / "cloud-ca.pem"
            self.ca_file.write_bytes(self._ca.pem)
        return self._ca

    def aws_standin(self, stack: contextlib.ExitStack) -> AwsStandIn:
        """STS, EKS and ECS (and its Fargate), trusting the EKS and ECS runners' subjects."""
        if self.aws is None:
            subjects = frozenset(subject(name) for name in ("kubernetes-eks", "serverless-ecs"))
            roles = [
                Role("platform-orchestrator", subjects),
                Role(
                    "runner-execution", allowed=frozenset({"secretsmanager:GetSecretValue"}), ecs_tasks=True
                ),
                Role("runner-task", allowed=frozenset(), ecs_tasks=True),
            ]
            images = {DEFAULT_RUNNER_IMAGE: runner_image()}
            self.aws = stack.enter_context(AwsStandIn(self.tmp / "aws", roles=roles, images=images))
        return self.aws

    def server_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.ca_file is not None:
            env["REQUESTS_CA_BUNDLE"] = str(self.ca_file)  # google-auth and azure-identity use requests
        if self.aws is not None:
            env |= {
                "PO_AWS_STS_URL": self.aws.url,
                "PO_AWS_EKS_URL": self.aws.url,
                "PO_AWS_ECS_URL": self.aws.url,
            }
        return env


def subject(runner_id: str) -> str:
    """The ``sub`` of the server's workload identity tokens for a runner of the benchmark's org."""
    return f"{ORG}+{runner_id}"


def k8s_job(engine_env: Mapping[str, str]) -> dict[str, Any]:
    env = [{"name": k, "value": v} for k, v in engine_env.items()]
    return {
        "namespace": NAMESPACE,
        "service_account": SERVICE_ACCOUNT,
        "pod_template": {"spec": {"containers": [{"name": "main", "env": env}]}},
    }


class Target:
    """One runner type: its stand-ins, its runner, and what it leaves running on this host."""

    name: ClassVar[str]
    #: One line for the report: what stands in for the type's infrastructure.
    stand_in: ClassVar[str]

    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def start(self, stack: contextlib.ExitStack) -> dict[str, str]:
        """Start the stand-ins the server's settings name; answers the server's extra environment."""
        return {}

    def server_up(self, stack: contextlib.ExitStack) -> None:
        """Once the server answers through the public URL (cloud trust of its OIDC issuer)."""

    def runner_configuration(self) -> dict[str, Any]:
        raise NotImplementedError

    def runner_up(self, stack: contextlib.ExitStack) -> None:
        """Once the runner exists (agents)."""

    def run_dirs(self) -> list[Path]:
        """Directories whose ``*/runner.pid`` name runs started on this host as plain processes."""
        return []

    def kube(self, stack: contextlib.ExitStack, **options: Any) -> KubeApiServer:
        options.setdefault("namespaces", ("default", NAMESPACE))
        options.setdefault("images", {DEFAULT_RUNNER_IMAGE: runner_image()})
        return stack.enter_context(KubeApiServer(self.shared.tmp / f"kube-{self.name}", **options))


class VmLocal(Target):
    name = "vm-local"
    stand_in = "none: `po-runner standard` started by the server on its own host (the baseline)"

    def runner_configuration(self) -> dict[str, Any]:
        return {
            "type": "vm",
            "connection": {"type": "local"},
            "job": {"runtime": "process", "environment": self.shared.engine_env},
        }

    def run_dirs(self) -> list[Path]:
        return [self.shared.tmp / "runs"]


class VmSsh(Target):
    name = "vm-ssh"
    stand_in = "OpenSSH sshd on 127.0.0.1 (tests/support/sshd.py), logging in as this user"

    def start(self, stack: contextlib.ExitStack) -> dict[str, str]:
        self.sshd = stack.enter_context(running_sshd(self.shared.tmp / "sshd"))
        self.work_dir = self.shared.tmp / "ssh-runs"
        return {}

    def runner_configuration(self) -> dict[str, Any]:
        environment = {"PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin", **self.shared.engine_env}
        return {
            "type": "vm",
            "connection": self.sshd.connection(),
            "job": {"work_dir": str(self.work_dir), "environment": environment},
        }

    def run_dirs(self) -> list[Path]:
        return [self.work_dir]


class Kubernetes(Target):
    name = "kubernetes"
    stand_in = (
        "stand-in Kubernetes API (tests/support/kube_api.py), client certificate; kubelet runs a process"
    )

    def start(self, stack: contextlib.ExitStack) -> dict[str, str]:
        self.api = self.kube(stack)
        return {}

    def runner_configuration(self) -> dict[str, Any]:
        return {
            "type": "kubernetes",
            "cluster": {
                "cluster_data": {"server": self.api.url, "certificate_authority_data": self.api.ca_data},
                "auth": {
                    "client_certificate_data": self.api.client_certificate_data,
                    "client_key_data": self.api.client_key_data,
                },
            },
            "job": k8s_job(self.shared.engine_env),
        }


class Gke(Target):
    name = "kubernetes-gke"
    stand_in = "Google STS, IAM and GKE stand-ins (TLS) + stand-in Kubernetes API taking their tokens"

    def start(self, stack: contextlib.ExitStack) -> dict[str, str]:
        gcp = GcpStandIn(RelyingParty(self.shared.public_url))
        stack.enter_context(gcp.serving(self.shared.cloud_ca(), self.shared.tmp / "gcp"))
        api_ = self.kube(stack, auth="token", token_review=gcp.token_review)
        gcp.add_cluster(
            "my-gcp-project",
            "europe-west3",
            "my-cluster",
            endpoint=api_.url.removeprefix("https://"),
            ca_data=api_.ca_data,
            readers={gcp_standin.SERVICE_ACCOUNT},
        )
        gcp.allow_impersonation(gcp_standin.SERVICE_ACCOUNT, subject(self.name))
        return {
            "PO_GCP_STS_URL": f"{gcp.url}/v1/token",
            "PO_GCP_IAM_CREDENTIALS_URL": gcp.url,
            "PO_GCP_CONTAINER_API_URL": gcp.url,
        }

    def runner_configuration(self) -> dict[str, Any]:
        auth = {"gcp_audience": gcp_standin.AUDIENCE, "gcp_service_account": gcp_standin.SERVICE_ACCOUNT}
        return {
            "type": "kubernetes-gke",
            "cluster": {
                "name": "my-cluster",
                "project_id": "my-gcp-project",
                "location": "europe-west3",
                "auth": auth,
            },
            "job": k8s_job(self.shared.engine_env),
        }


class Aks(Target):
    name = "kubernetes-aks"
    stand_in = "Azure AD and ARM stand-ins (TLS) + stand-in Kubernetes API taking their tokens"

    def start(self, stack: contextlib.ExitStack) -> dict[str, str]:
        azure = AzureStandIn(RelyingParty(self.shared.public_url))
        azure.add_app(
            azure_standin.TENANT,
            azure_standin.CLIENT,
            federated={(self.shared.public_url, subject(self.name))},
        )
        stack.enter_context(azure.serving(self.shared.cloud_ca(), self.shared.tmp / "azure"))
        api_ = self.kube(stack, auth="token", token_review=azure.token_review)
        azure.add_cluster(
            azure_standin.SUBSCRIPTION,
            "platform",
            "my-aks",
            fqdn=api_.url.removeprefix("https://"),
            ca_data=api_.ca_data,
            readers={azure_standin.CLIENT},
        )
        return {"PO_AZURE_AUTHORITY_HOST": azure.url, "PO_AZURE_RESOURCE_MANAGER_URL": azure.url}

    def runner_configuration(self) -> dict[str, Any]:
        return {
            "type": "kubernetes-aks",
            "cluster": {
                "name": "my-aks",
                "resource_group": "platform",
                "subscription_id": azure_standin.SUBSCRIPTION,
            },
            "auth": {"tenant_id": azure_standin.TENANT, "client_id": azure_standin.CLIENT},
            "job": k8s_job(self.shared.engine_env),
        }


class AwsTarget(Target):
    def server_up(self, stack: contextlib.ExitStack) -> None:
        """The IAM OIDC provider for the server's issuer, set up as a user would once the server is up."""
        standin = self.shared.aws_standin(stack)
        if not self.shared.aws_trusts_server:
            provider = OidcProvider.discovered(self.shared.public_url)
            standin.providers[provider.issuer] = provider
            self.shared.aws_trusts_server = True


class Eks(AwsTarget):
    name = "kubernetes-eks"
    stand_in = "AWS STS and EKS stand-in (SigV4 checked) + stand-in Kubernetes API taking k8s-aws-v1 tokens"

    def start(self, stack: contextlib.ExitStack) -> dict[str, str]:
        standin = self.shared.aws_standin(stack)
        api_ = self.kube(stack, auth="token", token_review=standin.token_review(aws_launcher.CLUSTER))
        standin.add_eks_cluster(
            aws_launcher.CLUSTER,
            aws_launcher.REGION,
            endpoint=api_.url,
            ca_data=api_.ca_data,
            access=[aws_launcher.ROLE_ARN],
        )
        return {}

    def runner_configuration(self) -> dict[str, Any]:
        return {
            "type": "kubernetes-eks",
            "cluster": {
                "name": aws_launcher.CLUSTER,
                "region": aws_launcher.REGION,
                "auth": {"role_arn": aws_launcher.ROLE_ARN},
            },
            "job": k8s_job(self.shared.engine_env),
        }


class Ecs(AwsTarget):
    name = "serverless-ecs"
    stand_in = "AWS STS and ECS stand-in whose Fargate runs the task's command as a process (50 ms ticks)"

    def start(self, stack: contextlib.ExitStack) -> dict[str, str]:
        standin = self.shared.aws_standin(stack)
        standin.ecs.add_cluster(aws_launcher.ECS_CLUSTER, aws_launcher.REGION)
        standin.ecs.secrets[aws_launcher.SECRET_ARN] = aws_launcher.SECRET_VALUE
        return {}

    def runner_configuration(self) -> dict[str, Any]:
        return {
            "type": "serverless-ecs",
            "auth": {"role_arn": aws_launcher.ROLE_ARN},
            "job": {
                "region": aws_launcher.REGION,
                "cluster": aws_launcher.ECS_CLUSTER,
                "subnets": ["subnet-0a1b2c3d"],
                "execution_role_arn": aws_launcher.EXECUTION_ROLE_ARN,
                "environment": self.shared.engine_env,
                "secrets": {"TF_VAR_unused_secret": aws_launcher.SECRET_ARN},
            },
        }


class AgentTarget(Target):
    """A runner served by a `po-runner remote` agent (a real process), which reaches the gateway through
    the public URL too."""

    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        self.private_pem, self.public_pem = agent_auth.generate_key_pair()
        self.work = shared.tmp / self.name
        self.agent_env: dict[str, str] = {}

    def runner_up(self, stack: contextlib.ExitStack) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        agent = AgentProcess(self.shared.public_url, self.private_pem, self.work)
        agent.env.pop("KUBERNETES_SERVICE_HOST", None)  # never in-cluster: the kubeconfig, if any, says where
        agent.env |= {"ORG_ID": ORG, "RUNNER_ID": self.name, **self.agent_env}
        stack.callback(agent.stop)
        agent.start()


class KubernetesAgent(AgentTarget):
    name = "kubernetes-agent"
    stand_in = "`po-runner remote` + stand-in Kubernetes API (client certificate); kubelet runs a process"

    def start(self, stack: contextlib.ExitStack) -> dict[str, str]:
        self.api = self.kube(stack)
        kubeconfig = self.shared.tmp / "kubeconfig-agent"
        kubeconfig.write_text(yaml.safe_dump(kubeconfig_of(self.api)))
        self.agent_env = {"KUBECONFIG": str(kubeconfig)}
        return {}

    def runner_configuration(self) -> dict[str, Any]:
        return {"type": "kubernetes-agent", "key": self.public_pem, "job": k8s_job(self.shared.engine_env)}


class VmAgent(AgentTarget):
    name = "vm-agent"
    stand_in = "`po-runner remote` on this host, starting `po-runner standard` as a process"

    def runner_configuration(self) -> dict[str, Any]:
        return {
            "type": "vm",
            "connection": {"type": "agent", "key": self.public_pem},
            "job": {"runtime": "process", "environment": self.shared.engine_env},
        }

    def run_dirs(self) -> list[Path]:
        return [self.work / "agent-runs"]


TARGETS: dict[str, type[Target]] = {
    t.name: t for t in (VmLocal, VmSsh, Kubernetes, Gke, Eks, Aks, Ecs, KubernetesAgent, VmAgent)
}


def kubeconfig_of(api_: KubeApiServer) -> dict[str, Any]:
    """A kubeconfig for the stand-in API with its admin client certificate (the agent's credentials)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "stand-in", "cluster": {"server": api_.url, "certificate-authority-data": api_.ca_data}}
        ],
        "users": [
            {
                "name": "agent",
                "user": {
                    "client-certificate-data": api_.client_certificate_data,
                    "client-key-data": api_.client_key_data,
                },
            }
        ],
        "contexts": [{"name": "agent@stand-in", "context": {"cluster": "stand-in", "user": "agent"}}],
        "current-context": "agent@stand-in",
    }


# --- set-up and deployments ------------------------------------------------------------------------


def set_up(client: httpx.Client, bootstrap_token: str, targets: Sequence[Target]) -> None:
    """Org, admin token (kept in ``client``), env type, the module; per type a project, its env ``dev``,
    the runner (the platform admin's to create: local connections are) and a rule for the project."""
    admin = {"authorization": f"Bearer {bootstrap_token}"}

    def post(path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> Any:
        response = client.post(path, json=body, headers=headers)
        if response.status_code != 201:
            raise api.BenchError(f"POST {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    post("/orgs", {"id": ORG}, admin)
    token = post(f"/orgs/{ORG}/tokens", {"role": "admin"}, admin)
    client.headers["authorization"] = f"Bearer {token['token']}"
    base = f"/orgs/{ORG}"
    post(f"{base}/env-types", {"id": ENV_TYPE})
    post(
        f"{base}/resource-types",
        {
            "id": RESOURCE_TYPE,
            "description": "one terraform_data resource",
            "output_schema": {"type": "object", "properties": {"value": {"type": "string"}}},
        },
    )
    post(
        f"{base}/modules",
        {
            "id": RESOURCE_TYPE,
            "description": "one terraform_data resource whose input is the trigger",
            "resource_type": RESOURCE_TYPE,
            "module_source": "inline",
            "module_params": {"trigger": {"type": "string", "description": "changes on every deployment"}},
            "module_source_code": MODULE,
        },
    )
    post(f"{base}/module-rules", {"module_id": RESOURCE_TYPE})
    for target in targets:
        runner = {
            "id": target.name,
            "runner_configuration": target.runner_configuration(),
            "state_storage_configuration": {"type": "orchestrator"},
        }
        post(f"{base}/runners", runner, admin)
        post(f"{base}/projects", {"id": target.name})
        post(f"{base}/projects/{target.name}/envs", {"id": ENV, "env_type_id": ENV_TYPE})
        post(f"{base}/runner-rules", {"runner_id": target.name, "project_id": target.name})


@dataclass(kw_only=True)
class Sample:
    type: str
    phase: str
    deployment_id: str = ""
    status: str = ""
    message: str = ""
    #: This host's wall clock (seconds since the epoch): the POST sent and answered, the runner's first
    #: request at the proxy; the server's stamps (same host, same clock).
    post_sent: float = 0.0
    post_answered: float = 0.0
    runner_started: float | None = None
    created_at: float | None = None
    launched_at: float | None = None
    completed_at: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "succeeded" and self.runner_started is not None

    def started_s(self) -> float:
        assert self.runner_started is not None
        return self.runner_started - self.post_answered

    def completed_s(self) -> float:
        assert self.completed_at is not None
        return self.completed_at - self.post_answered

    def launch_call_s(self) -> float:
        assert self.created_at is not None and self.launched_at is not None
        return self.launched_at - self.created_at


def _stamp(value: Any) -> float | None:
    return datetime.fromisoformat(value).timestamp() if isinstance(value, str) and value else None


def deploy_one(client: httpx.Client, proxy: RecordingProxy, target: str, phase: str, n: int) -> Sample:
    sample = Sample(type=target, phase=phase)
    manifest = {
        "workloads": {
            "bench": {"resources": {"one": {"type": RESOURCE_TYPE, "params": {"trigger": f"{phase}-{n}"}}}}
        }
    }
    body = {"project_id": target, "env_id": ENV, "mode": "deploy", "manifest": manifest}
    sample.post_sent = time.time()
    created = client.post(f"/orgs/{ORG}/deployments", json=body)
    sample.post_answered = time.time()
    if created.status_code != 201:
        raise api.BenchError(f"{target}: POST deployment: {created.status_code} {created.text[:500]}")
    sample.deployment_id = created.json()["id"]
    url = f"/orgs/{ORG}/deployments/{sample.deployment_id}/actions/wait-for-complete"
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    final: dict[str, Any] | None = None
    while final is None and time.monotonic() < deadline:
        response = client.get(url, params={"timeout_in_seconds": 20}, timeout=60)
        if response.status_code == 200:
            final = response.json()
        elif response.status_code != 408:
            raise api.BenchError(f"{target}: wait: {response.status_code} {response.text[:500]}")
    if final is None:
        sample.status, sample.message = "timeout", f"not completed in {DEPLOY_TIMEOUT_S:.0f} s"
        return sample
    sample.status, sample.message = final["status"], final.get("status_message") or ""
    sample.created_at = _stamp(final.get("created_at"))
    sample.launched_at = _stamp(final.get("launched_at"))
    sample.completed_at = _stamp(final.get("completed_at"))
    sample.runner_started = proxy.bundle_requested.get(sample.deployment_id)
    if sample.status == "succeeded" and sample.runner_started is None:
        sample.message = "succeeded, but no bundle request of its runner reached the proxy"
    return sample


def wait_for_runs(directories: Sequence[Path], timeout: float = RUN_EXIT_TIMEOUT_S) -> list[int]:
    """Wait for the runs started on this host as processes to exit; SIGKILL those left after ``timeout``.

    A run is known by its ``runner.pid``: ``local:HOST:PID:START:DIR`` (local launcher) or ``PID START``
    (SSH launcher), START being the process's start time in clock ticks, so a recycled pid is never
    taken for it. Answers the pids killed.
    """
    runs: list[tuple[int, int]] = []
    for directory in directories:
        for pid_file in sorted(directory.glob("*/runner.pid")):
            with contextlib.suppress(OSError, ValueError, IndexError):
                text = pid_file.read_text().strip()
                fields = text.split(":", 4)[2:4] if text.startswith("local:") else text.split()[:2]
                runs.append((int(fields[0]), int(fields[1])))

    def alive() -> list[int]:
        return [pid for pid, start in runs if processes.start_ticks(pid) == start]

    deadline = time.monotonic() + timeout
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = alive()
    for pid in killed:
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    return killed


# --- statistics and report -------------------------------------------------------------------------


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """Seconds: median (p50), nearest-rank p90, min, max."""
    if not values:
        return {"count": 0, "p50": None, "p90": None, "min": None, "max": None}
    return {
        "count": len(values),
        "p50": round(statistics.median(values), 4),
        "p90": round(loadgen.percentile_ms(list(values), 0.9) / 1000.0, 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def ratio(value: float | int | None, baseline: float | int | None) -> float | None:
    if value is None or not baseline:
        return None
    return round(value / baseline, 3)


def analyse(samples: Sequence[Sample], types: Sequence[str]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name in types:
        measured = [s for s in samples if s.type == name and s.phase == "run"]
        good = [s for s in measured if s.ok]
        first = next((s for s in samples if s.type == name and s.phase == "warmup"), None)
        rows[name] = {
            "deployments": len(measured),
            "failed": len(measured) - len(good),
            "started_s": summary([s.started_s() for s in good]),
            "completed_s": summary([s.completed_s() for s in good if s.completed_at is not None]),
            "launch_call_s": summary(
                [s.launch_call_s() for s in good if s.created_at is not None and s.launched_at is not None]
            ),
            # The type's first launch (a warm-up): the server's caches of cloud access, its lazy imports,
            # the ECS task definition, are all cold.
            "first_launch_call_s": (
                round(first.launch_call_s(), 4)
                if first is not None and first.created_at is not None and first.launched_at is not None
                else None
            ),
        }
    base = rows.get(BASELINE)
    for row in rows.values():
        for key in ("started_s", "completed_s"):
            row[f"{key.removesuffix('_s')}_x_local"] = ratio(
                row[key]["p50"], base[key]["p50"] if base else None
            )
    return rows


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _x(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(rows: Mapping[str, Any]) -> str:
    header = (
        "type (ms)",
        "n",
        "failed",
        "started p50",
        "p90",
        "max",
        "x local",
        "completed p50",
        "p90",
        "max",
        "x local",
        "launch call p50",
        "first",
    )
    lines: list[tuple[str, ...]] = [header]
    for name, row in rows.items():
        started, completed, call = row["started_s"], row["completed_s"], row["launch_call_s"]
        lines.append(
            (
                name,
                str(row["deployments"]),
                str(row["failed"]),
                _ms(started["p50"]),
                _ms(started["p90"]),
                _ms(started["max"]),
                _x(row["started_x_local"]),
                _ms(completed["p50"]),
                _ms(completed["p90"]),
                _ms(completed["max"]),
                _x(row["completed_x_local"]),
                _ms(call["p50"]),
                _ms(row["first_launch_call_s"]),
            )
        )
    return deploy.table(lines)


MEASURED = (
    "started = POST /deployments answered -> the runner's first request (GET .../deployments/{id}/bundle) "
    "at a recording proxy that is the server's PO_PUBLIC_URL (includes the runner's start-up: Python "
    "imports, the same program on every type); completed = POST answered -> completed_at; launch call = "
    "created_at -> launched_at (server stamps around the launcher); first = the launch call of the "
    "type's first (warm-up) deployment, cold caches. p50 = median, p90 nearest rank; "
    "x local = p50 / vm-local's p50 in this run."
)


# --- the run ---------------------------------------------------------------------------------------


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(options: Options) -> dict[str, Any]:
    bootstrap_token = "po_bench_" + os.urandom(16).hex()
    started = time.monotonic()
    load_before = os.getloadavg()
    samples: list[Sample] = []
    capped = False
    killed: list[int] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="po-bench-launch-")))
        database_url = None
        if options.database == "postgresql":
            database_url, _ = stack.enter_context(api.postgres_database(tmp / "pg"))
        proxy_socket = bound_socket()
        stack.callback(proxy_socket.close)
        tf_config = tmp / "terraformrc"
        tf_config.touch()
        shared = Shared(
            tmp=tmp,
            public_url=f"http://127.0.0.1:{proxy_socket.getsockname()[1]}",
            engine_env={
                "IAC_BACKEND": "embedded",
                "TF_CLI_CONFIG_FILE": str(tf_config),
                "CHECKPOINT_DISABLE": "1",
            },
        )
        targets = [TARGETS[name](shared) for name in options.types]
        environment = {
            "PO_PUBLIC_URL": shared.public_url,
            "PO_ALLOW_LOCAL_RUNNERS": "true",
            # Local runs as this user, as the tests run them: the work directory is private to it.
            "PO_LOCAL_RUN_USER": "",
            "PO_LOCAL_RUNS_DIR": str(tmp / "runs"),
            # The stand-ins listen on 127.0.0.1, which the server refuses for runners by default.
            "PO_RUNNER_DENIED_NETWORKS": "",
        }
        for target in targets:
            say(f"-- {target.name}: {target.stand_in}")
            try:
                environment |= target.start(stack)
            except (Exception, pytest.skip.Exception) as exc:
                raise api.BenchError(f"{target.name}: its stand-ins did not start: {exc}") from exc
        environment |= shared.server_env()
        server = LaunchServer(
            data_dir=tmp / "data",
            database_url=database_url,
            bootstrap_token=bootstrap_token,
            environment=environment,
        )
        stack.callback(_keep_log, server, options)
        stack.callback(server.stop)
        server.start()
        server_cpu = api.CpuMeter(server_pid=server.pid, postmaster_pid=None)
        proxy = RecordingProxy(server.base_url)
        stack.enter_context(serving(proxy, proxy_socket))
        for target in targets:
            target.server_up(stack)
        client = stack.enter_context(httpx.Client(base_url=server.base_url, timeout=60))
        set_up(client, bootstrap_token, targets)
        for target in targets:
            target.runner_up(stack)
        run_dirs = [d for t in targets for d in t.run_dirs()]
        stack.callback(lambda: killed.extend(wait_for_runs(run_dirs)))
        say(
            f"-- {options.warmup} warm-up and {options.runs} measured deployment(s) per type, round-robin "
            f"over {len(targets)} types, one at a time ({options.database})"
        )
        cpu_before = (time.process_time(), server_cpu.read()[0], time.monotonic())
        deadline = time.monotonic() + options.max_seconds
        rounds = [("warmup", n) for n in range(options.warmup)] + [("run", n) for n in range(options.runs)]
        for phase, n in rounds:
            if time.monotonic() > deadline:
                capped = True
                say(f"-- --max-seconds {options.max_seconds:.0f} reached: stopping")
                break
            for target in targets:
                sample = deploy_one(client, proxy, target.name, phase, n)
                samples.append(sample)
                if sample.ok:
                    say(
                        f"   {phase} {n} {target.name}: started {sample.started_s() * 1000:.0f} ms, "
                        f"completed {sample.completed_s() * 1000:.0f} ms"
                    )
                else:
                    say(f"   {phase} {n} {target.name}: {sample.status.upper()}: {sample.message[:400]}")
        cpu = {
            "wall_s": round(time.monotonic() - cpu_before[2], 1),
            "bench_process_s": round(time.process_time() - cpu_before[0], 1),
            "server_s": round(server_cpu.read()[0] - cpu_before[1], 1),
        }
    rows = analyse(samples, options.types)
    failures = [asdict(s) for s in samples if not s.ok]
    return {
        "benchmark": "launch",
        "measured": MEASURED,
        "database": options.database,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - started, 1),
        "capped": capped,
        "code": deploy.code_version(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1_5_15_min_before": load_before,
            "load_average_1_5_15_min_after": os.getloadavg(),
        },
        "options": {
            "types": list(options.types),
            "runs": options.runs,
            "warmup": options.warmup,
            "max_seconds": options.max_seconds,
        },
        "cpu_while_deploying": cpu,
        "stand_ins": {name: TARGETS[name].stand_in for name in options.types},
        "types": rows,
        "failures": failures,
        "runs_killed_at_exit": killed,
        "samples": [asdict(s) for s in samples],
    }


def _keep_log(server: LaunchServer, options: Options) -> None:
    if server.log_path.exists():
        options.results_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(server.log_path, options.results_dir / f"launch-{options.database}-server.log")


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--types",
        default="all",
        help=f"comma-separated runner types, or all (default): {', '.join(TARGETS)}; "
        f"{BASELINE} (the baseline) is always measured",
    )
    parser.add_argument("--runs", type=int, default=8, help="measured deployments per type (default 8)")
    parser.add_argument("--warmup", type=int, default=1, help="deployments per type first, not counted (1)")
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=900.0,
        help="no new round of deployments starts after this (default 900); the run is marked capped",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=api.RESULTS_DIR,
        help="where launch-<database>.json and the server's log are written (default bench/results)",
    )
    args = parser.parse_args(argv)
    names = list(TARGETS) if args.types == "all" else [t.strip() for t in str(args.types).split(",") if t]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        parser.error(f"--types: unknown {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    types = tuple(dict.fromkeys([BASELINE, *names]))
    if not 1 <= args.runs <= MAX_RUNS or args.warmup < 0 or args.max_seconds <= 0:
        parser.error(f"need 1 <= --runs <= {MAX_RUNS}, --warmup >= 0, --max-seconds > 0")
    return Options(
        types=types,
        runs=args.runs,
        warmup=args.warmup,
        database=args.database,
        max_seconds=args.max_seconds,
        json=args.json,
        results_dir=args.results_dir,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, api._stop_on_sigterm)
    try:
        result = run(options)
    except api.BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the server, the stand-ins and the agents were stopped", file=sys.stderr)
        return 130
    options.results_dir.mkdir(parents=True, exist_ok=True)
    path = options.results_dir / f"launch-{options.database}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    if options.json:
        print(json.dumps(result, indent=2))
    else:
        load = result["machine"]
        print(report(result["types"]))
        print()
        print(MEASURED)
        print(
            f"{os.cpu_count()} CPUs shared by the bench (stand-ins, proxy), the server, the runners and "
            f"anything else; load average before {api._load(load['load_average_1_5_15_min_before'])}, "
            f"after {api._load(load['load_average_1_5_15_min_after'])}; {result['seconds']:.0f} s"
            + (" (capped by --max-seconds)" if result["capped"] else "")
        )
        cpu = result["cpu_while_deploying"]
        print(
            f"while deploying ({cpu['wall_s']:.0f} s): CPU of this process (stand-ins, kubelets, proxy) "
            f"{cpu['bench_process_s']:.1f} s, of the server {cpu['server_s']:.1f} s"
        )
        for failure in result["failures"]:
            what = f"{failure['type']} {failure['phase']} {failure['deployment_id']}"
            print(f"FAILED {what}: {failure['message']}")
        print(f"wrote {path}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
