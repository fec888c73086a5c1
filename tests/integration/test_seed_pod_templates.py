"""The pod templates of seeds 000 and 001, merged into the Job of every Kubernetes runner type: a table.

Rows: each example pod template of the seeds (as the CLI YAML and as the Terraform provider's
``jsonencode`` string sends it), crossed with each way a Job comes to exist:

- ``kubernetes``, ``kubernetes-gke``, ``kubernetes-eks``, ``kubernetes-aks``: the orchestrator's launcher
  creates it. The runner configuration of that type (``tests/data/runners/``) with the example as its
  ``job.pod_template`` goes the API's way (``read_runner_configuration``, ``parse_runner_configuration``,
  stored as JSON) into the run spec; the launcher (``KubernetesLauncher``; for the cloud types
  ``CloudKubernetesLauncher`` over a fixed cluster access, the cloud exchanges being tested in
  ``test_{gke,eks,aks}_launcher.py``) sends the Job to the stand-in API server, which keeps what it got.
- ``kubernetes-agent`` through our agent: the ``create-job`` command as the dispatcher builds it
  (``envelope_for``) and the gateway delivers it (``with_deployment_token``), the agent's additions
  (``job_with_agent_additions``: the gateway CA, the command id), then the agent's launcher.
- ``kubernetes-agent`` through upstream's agent: the JobSpec in that command's ``configuration``, made the
  Job ``job_id`` in ``namespace`` as upstream's agent creates it.

Each Job must hold the example's container ``main`` fields (image, imagePullPolicy, env entries by name,
after the runner's own environment, which stays whole), its pod labels and imagePullSecrets, the job
configuration's namespace and service account, and pass ``kubernetes-validate --strict`` (newest
Kubernetes and 1.30). Seed 001's CLI example writes ``env`` as one mapping, not a list: the API reads it as
a list of that one variable, with a warning (``read_runner_configuration``), and refuses it without that
step.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml
from pydantic import SecretStr

from orchestrator.agent.kubernetes import COMMAND_ANNOTATION, AgentCluster, job_with_agent_additions
from orchestrator.dispatch.agent_commands import envelope_for
from orchestrator.domain.deployments import Deployment
from orchestrator.domain.runner_types import (
    K8sRunnerJobConfig,
    parse_runner_configuration,
    read_runner_configuration,
    runner_configuration_to_dict,
)
from orchestrator.errors import InvalidInputError
from orchestrator.launchers.base import launched
from orchestrator.launchers.kubernetes import ClusterAccess, KubernetesLauncher
from orchestrator.launchers.kubernetes_cloud import AccessCache, CloudKubernetesLauncher, ExpiringAccess
from orchestrator.launchers.kubernetes_job import DEFAULT_RUNNER_IMAGE, job_labels, token_secret_name
from orchestrator.protocol import commands as protocol
from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import RunnerMode
from tests.support.cloud_launchers import STAND_IN_EGRESS
from tests.support.kube_api import CertificateAuthority, KubeApiServer
from tests.support.kube_schema import assert_valid

DATA = Path(__file__).resolve().parents[1] / "data"
ORG, RUNNER = "acme", "my-runner"
TOKEN = "po-deployment-token-of-the-seed-table"
GATEWAY_URL = "https://orchestrator.example.com/runner-gateway"
#: The gateway CA our agent passes to its Jobs (a CA certificate: public).
GATEWAY_CA = CertificateAuthority("seed-table-gateway-ca").pem.decode()


def runner_file(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DATA / "runners" / name).read_text())
    return data


def seed_file(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DATA / "seeds" / name).read_text())
    return data


def pod_template_of(data: dict[str, Any]) -> Any:
    return copy.deepcopy(data["runner_configuration"]["job"]["pod_template"])


# --- the examples -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One example pod template of a seed and what it must put into the Job."""

    id: str
    #: The pod template as the user's client sends it (a mapping, or the provider's JSON string).
    template: Callable[[], Any]
    labels: dict[str, str] = field(default_factory=dict)
    image: str | None = None  # None: the launcher's (DEFAULT_RUNNER_IMAGE)
    pull_policy: str = "IfNotPresent"
    pull_secrets: list[dict[str, str]] | None = None
    #: Environment entries of container ``main`` besides the runner's own, by name, in this order.
    env: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Warnings the API gives when it reads the configuration.
    warnings: int = 0


CUSTOM_IMAGE = "my-own-registry.com/platform-orchestrator/platform-orchestrator-runner:vx.y.z"
TF_EXAMPLE = {"name": "TF_EXAMPLE", "valueFrom": {"secretKeyRef": {"name": "my-secret", "key": "key"}}}
EXAMPLES = [
    # Seed 000, "Configuration" (TF tab): the agent runner's pod_template = jsonencode({metadata = {labels
    # = {"app.kubernetes.io/name" = "platform-orchestrator-runner"}}}); the provider sends the JSON text.
    Example(
        "seed000-agent-labels-jsonencode",
        lambda: json.dumps(pod_template_of(runner_file("seed000-agent.yaml"))),
        labels={"app.kubernetes.io/name": "platform-orchestrator-runner"},
    ),
    Example(
        "seed000-agent-labels-yaml",
        lambda: pod_template_of(runner_file("seed000-agent.yaml")),
        labels={"app.kubernetes.io/name": "platform-orchestrator-runner"},
    ),
    # Seed 000, "Runner image": the custom image with its pull policy and the image pull secret regcred.
    Example(
        "seed000-custom-image-cli",
        lambda: pod_template_of(seed_file("000-runner-image-pod-template.yaml")),
        image=CUSTOM_IMAGE,
        pull_secrets=[{"name": "regcred"}],
    ),
    Example(
        "seed000-custom-image-jsonencode",
        lambda: json.dumps(pod_template_of(seed_file("000-runner-image-pod-template.yaml"))),
        image=CUSTOM_IMAGE,
        pull_secrets=[{"name": "regcred"}],
    ),
    # Seed 001, "Setting sensitive environment variables": TF_EXAMPLE from the secret my-secret. The CLI
    # tab writes env as one mapping (read as a list of it, with a warning); the TF tab as a list.
    Example(
        "seed001-secret-env-cli",
        lambda: pod_template_of(seed_file("001-sensitive-env-pod-template.yaml")),
        env={"TF_EXAMPLE": TF_EXAMPLE},
        warnings=1,
    ),
    Example(
        "seed001-secret-env-jsonencode",
        lambda: json.dumps(pod_template_of(runner_file("seed001-pod-template.yaml"))),
        env={"TF_EXAMPLE": TF_EXAMPLE},
    ),
]

#: The ways a Job comes to exist, and the runner configuration each starts from.
PATHS = {
    "kubernetes": "seed001-kubernetes.yaml",
    "kubernetes-gke": "seed000-gke.yaml",
    "kubernetes-eks": "kubernetes-eks.yaml",
    "kubernetes-aks": "kubernetes-aks.yaml",
    "kubernetes-agent-our-agent": "seed000-agent.yaml",
    "kubernetes-agent-command-payload": "seed000-agent.yaml",
}
NAMESPACES = sorted(
    {"default"} | {runner_file(name)["runner_configuration"]["job"]["namespace"] for name in PATHS.values()}
)


# --- the cluster ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    """One stand-in cluster for the whole table (no kubelet: nothing runs); leaving it checks every object
    sent against Kubernetes' schemas once more."""
    with KubeApiServer(
        tmp_path_factory.mktemp("seed-table") / "kube", namespaces=NAMESPACES, kubelet=False
    ) as server:
        yield server


def cluster_access(api: KubeApiServer) -> ClusterAccess:
    return ClusterAccess(
        server=api.url,
        certificate_authority_data=api.ca_data,
        client_certificate_data=api.client_certificate_data,
        client_key_data=api.client_key_data,
        timeout_seconds=10.0,
    )


@dataclass(frozen=True)
class FixedAccess:
    """A cluster access source that exchanges nothing: the cloud types' launcher over the stand-in."""

    access: ClusterAccess

    async def cluster_access(self) -> ExpiringAccess:
        return ExpiringAccess(access=self.access, expires_at=time.time() + 3600)


def kubeconfig(api: KubeApiServer, path: Path) -> Path:
    """The agent's kubeconfig for the stand-in (its client certificate)."""
    user = {"client-certificate-data": api.client_certificate_data, "client-key-data": api.client_key_data}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": api.url, "certificate-authority-data": api.ca_data}}
                ],
                "users": [{"name": "agent", "user": user}],
                "contexts": [{"name": "agent", "context": {"cluster": "c", "user": "agent"}}],
                "current-context": "agent",
            }
        )
    )
    return path


def sent_object(api: KubeApiServer, plural: str, name: str) -> dict[str, Any]:
    """The one object of ``plural`` named ``name`` a client sent to create (not a dry run)."""
    found = [
        s.manifest()
        for s in api.sent
        if s.plural == plural and s.method == "POST" and not s.dry_run and s.body["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"{plural}/{name}: {len(found)} sent"
    return found[0]


# --- the runs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Made:
    """The Job of one row, the spec whose environment it carries, and how TOKEN reaches it."""

    job: dict[str, Any]
    spec: RunSpec
    token: dict[str, Any]
    #: What the path adds to container ``main`` besides the example (our agent: the gateway CA).
    extra_env: dict[str, dict[str, Any]]


def run_spec(path: str, template: Any) -> tuple[RunSpec, K8sRunnerJobConfig, list[str]]:
    """The run spec of a deployment on the runner of ``path`` whose pod template is ``template``, its
    configuration having gone the API's way; and the API's warnings."""
    configuration = runner_file(PATHS[path])["runner_configuration"]
    configuration["job"]["pod_template"] = template
    read, warnings = read_runner_configuration(configuration)
    stored = runner_configuration_to_dict(parse_runner_configuration(read))
    spec = RunSpec(
        org_id=ORG,
        runner_id=RUNNER,
        deployment_id=str(uuid.uuid4()),
        env_uuid=str(uuid.uuid4()),
        mode=RunnerMode.DEPLOY,
        token=SecretStr(TOKEN),
        gateway_url=GATEWAY_URL,
        encrypting_key="age1encryptingkeyoftheseedtable",
        runner_configuration=stored,
    )
    return spec, K8sRunnerJobConfig.model_validate(stored["job"]), warnings


def delivered_payload(spec: RunSpec) -> tuple[protocol.CommandEnvelope, dict[str, Any]]:
    """The ``create-job`` command of ``spec`` as the dispatcher stores it, and its payload as the gateway
    delivers it (the deployment token added)."""
    deployment = cast(
        Deployment, SimpleNamespace(id=uuid.UUID(spec.deployment_id), org_id=ORG, runner_id=RUNNER)
    )
    now = datetime.now(UTC)
    envelope = envelope_for(
        deployment, spec, runner_type="kubernetes-agent", now=now, ttl=timedelta(minutes=5)
    )
    return envelope, protocol.with_deployment_token(envelope.payload, TOKEN)


async def make_job(path: str, spec: RunSpec, api: KubeApiServer, tmp_path: Path) -> Made:
    secret_ref = {
        "name": "TOKEN",
        "valueFrom": {"secretKeyRef": {"name": token_secret_name(spec), "key": "TOKEN"}},
    }
    if path == "kubernetes":
        launcher = KubernetesLauncher(cluster_access(api), egress=STAND_IN_EGRESS)
        launched(await launcher.launch(spec))
        return Made(sent_object(api, "jobs", spec.deployment_id), spec, secret_ref, {})
    if path in ("kubernetes-gke", "kubernetes-eks", "kubernetes-aks"):
        cloud = CloudKubernetesLauncher(
            FixedAccess(cluster_access(api)), egress=STAND_IN_EGRESS, cache=AccessCache(), cache_key=path
        )
        launched(await cloud.launch(spec))
        return Made(sent_object(api, "jobs", spec.deployment_id), spec, secret_ref, {})
    envelope, delivered = delivered_payload(spec)
    if path == "kubernetes-agent-command-payload":
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": delivered["job_id"], "namespace": delivered["namespace"]},
            "spec": delivered["configuration"],
        }
        return Made(job, spec, {"name": "TOKEN", "value": TOKEN}, {})
    assert path == "kubernetes-agent-our-agent"
    payload = protocol.CreateJobPayload.model_validate(delivered)
    job_config = job_with_agent_additions(
        payload.spec.job, command_id=envelope.command_id, environment={"RUNNER_GATEWAY_CA": GATEWAY_CA}
    )
    agent_spec = payload.spec.model_copy(update={"job": job_config}).to_run_spec(ORG, RUNNER)
    cluster = AgentCluster(
        {"KUBECONFIG": str(kubeconfig(api, tmp_path / "kubeconfig"))}, scheduling_delay_seconds=300
    )
    launched(await cluster.launcher().launch(agent_spec))
    job = sent_object(api, "jobs", spec.deployment_id)
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations[COMMAND_ANNOTATION] == envelope.command_id
    ca = {"RUNNER_GATEWAY_CA": {"name": "RUNNER_GATEWAY_CA", "value": GATEWAY_CA}}
    return Made(job, agent_spec, secret_ref, ca)


def main_container(job: dict[str, Any]) -> dict[str, Any]:
    (main,) = [c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "main"]
    result: dict[str, Any] = main
    return result


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
@pytest.mark.parametrize("path", list(PATHS))
async def test_seed_pod_template__merged_into_the_job(
    path: str, example: Example, api: KubeApiServer, tmp_path: Path
) -> None:
    spec, job_config, warnings = run_spec(path, example.template())

    made = await make_job(path, spec, api, tmp_path)

    job = made.job
    assert_valid(job)
    assert len(warnings) == example.warnings, warnings
    assert job["metadata"]["namespace"] == job_config.namespace
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == job_config.service_account
    assert pod.get("imagePullSecrets") == example.pull_secrets
    assert job["spec"]["template"]["metadata"]["labels"] == {**job_labels(spec), **example.labels}
    assert [c["name"] for c in pod["containers"]] == ["main"]
    main = main_container(job)
    assert main["image"] == (example.image or DEFAULT_RUNNER_IMAGE)
    assert main["imagePullPolicy"] == example.pull_policy
    assert main["args"] == ["standard"]
    # The runner's own environment, whole and first (TOKEN as the path passes it), then the example's.
    own = {name: {"name": name, "value": value} for name, value in made.spec.runner_environment().items()}
    own["TOKEN"] = made.token
    names = [e["name"] for e in main["env"]]
    assert len(names) == len(set(names)), names
    assert {e["name"]: e for e in main["env"]} == {**own, **example.env, **made.extra_env}
    assert set(names[: len(own)]) == set(own), names
    assert names[len(own) :] == [*example.env, *made.extra_env]
    if made.token.get("valueFrom"):
        # The token Secret the Job reads TOKEN from was sent too, and holds what the schemas allow.
        assert TOKEN not in json.dumps(job)
        assert_valid(sent_object(api, "secrets", token_secret_name(spec)))


def test_seed001_cli_env_mapping__refused_without_the_lenient_read() -> None:
    """Seed 001's CLI example as validation alone sees it: ``env`` one mapping is refused, naming the field;
    the API reads it first (``read_runner_configuration``), which makes it a list of that variable."""
    configuration = runner_file("seed001-kubernetes.yaml")["runner_configuration"]
    configuration["job"]["pod_template"] = pod_template_of(seed_file("001-sensitive-env-pod-template.yaml"))

    with pytest.raises(InvalidInputError) as refused:
        parse_runner_configuration(configuration)
    read, warnings = read_runner_configuration(configuration)

    assert "runner_configuration.job.pod_template.spec.containers[0].env" in str(refused.value.details)
    assert warnings == [
        "runner_configuration.job.pod_template.spec.containers[0].env: a single mapping, read as a list of "
        "this one variable; write env as a list ('- name: TF_EXAMPLE')"
    ]
    template = cast(dict[str, Any], read)["job"]["pod_template"]
    assert template["spec"]["containers"][0]["env"] == [TF_EXAMPLE]
