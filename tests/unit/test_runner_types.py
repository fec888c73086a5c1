"""Runner configurations: the seed examples, refusals naming the field, compatibility, launch mode, PATCH."""

from __future__ import annotations

import base64
import copy
import datetime
import json
import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from orchestrator.domain.pod_template import RESERVED_ENV_VARS
from orchestrator.domain.runner_requests import RunnerCreateBody, RunnerUpdateBody, apply_runner_patch
from orchestrator.domain.runner_types import (
    COMPATIBILITY,
    K8sAgentRunnerConfiguration,
    K8sGkeRunnerConfiguration,
    K8sRunnerConfiguration,
    RunnerType,
    StateStorageType,
    VmRunnerConfiguration,
    check_compatibility,
    compatibility_matrix,
    launched_by,
    parse_runner_configuration,
    runner_configuration_to_dict,
)
from orchestrator.domain.state_storage import K8sStorageConfiguration
from orchestrator.domain.validation import format_validation_error
from orchestrator.errors import InvalidInputError

DATA = Path(__file__).resolve().parent.parent / "data" / "runners"
EXAMPLES = sorted(path.name for path in DATA.glob("*.yaml"))
DELETE = object()


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((DATA / name).read_text())
    assert isinstance(data, dict)
    return data


def body(name: str) -> dict[str, Any]:
    return {"id": "test-runner", **load(name)}


def edit(data: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """Set (or with DELETE remove) the value at a dotted path; digits index lists."""
    data = copy.deepcopy(data)
    *parents, last = [int(part) if part.isdigit() else part for part in path.split(".")]
    node: Any = data
    for part in parents:
        node = node[part]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


def refusal(data: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    with pytest.raises(pydantic.ValidationError) as info:
        RunnerCreateBody.model_validate(data)
    return format_validation_error(info.value)


# --- key material ---------------------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.fixture(scope="module")
def kubeconfig_data() -> dict[str, str]:
    """A fresh CA, a client certificate it signed and the client's RSA key, base64 PEM like kubeconfig."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("fixture-ca"))
        .issuer_name(_name("fixture-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    client_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    client = (
        x509.CertificateBuilder()
        .subject_name(_name("fixture-client"))
        .issuer_name(ca.subject)
        .public_key(client_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())
    )
    pkcs8 = client_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    encrypted = client_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    return {
        "ca": _b64(ca.public_bytes(serialization.Encoding.PEM)),
        "cert": _b64(client.public_bytes(serialization.Encoding.PEM)),
        "key": _b64(pkcs8),
        "encrypted_key": _b64(encrypted),
    }


def _public_pem(key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


# --- the seed examples and the per-type examples, accepted as written -----------------------------


def test_every_runner_type_has_an_example() -> None:
    types = {load(name)["runner_configuration"]["type"] for name in EXAMPLES}
    assert types == set(RunnerType)
    connections = {
        load(name)["runner_configuration"]["connection"]["type"]
        for name in EXAMPLES
        if load(name)["runner_configuration"]["type"] == "vm"
    }
    assert connections == {"ssh", "agent", "local"}


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_is_accepted_and_round_trips(name: str) -> None:
    raw = body(name)
    created = RunnerCreateBody.model_validate(raw)
    assert created.runner_configuration.type == raw["runner_configuration"]["type"]
    assert created.state_storage_configuration.type == raw["state_storage_configuration"]["type"]
    assert created.description == raw.get("description")
    dumped = runner_configuration_to_dict(created.runner_configuration)
    assert parse_runner_configuration(dumped) == created.runner_configuration
    # Every value given is kept as given (dumping only adds defaults).
    _assert_contains(dumped, raw["runner_configuration"])


def _assert_contains(actual: Any, expected: Any, path: str = "") -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), path
        for key, value in expected.items():
            assert key in actual, f"{path}.{key} dropped"
            _assert_contains(actual[key], value, f"{path}.{key}")
    else:
        assert actual == expected, path


def test_seed000_gke_example() -> None:
    created = RunnerCreateBody.model_validate({"id": "my-gke-runner", **load("seed000-gke.yaml")})
    config = created.runner_configuration
    assert isinstance(config, K8sGkeRunnerConfiguration)
    assert config.cluster.internal_ip is False
    assert config.cluster.location == "europe-west3"
    assert config.job.namespace == "platform-orchestrator-runner"
    assert config.job.pod_template is None
    assert created.state_storage_configuration == K8sStorageConfiguration(
        namespace="platform-orchestrator-runner"
    )
    tf = RunnerCreateBody.model_validate({"id": "my-gke-runner", **load("seed000-gke-tf.yaml")})
    assert tf.runner_configuration == config


def test_seed000_agent_pod_template_as_mapping_and_as_terraform_json_string() -> None:
    raw = load("seed000-agent.yaml")["runner_configuration"]
    config = parse_runner_configuration(raw)
    assert isinstance(config, K8sAgentRunnerConfiguration)
    expected = {"metadata": {"labels": {"app.kubernetes.io/name": "platform-orchestrator-runner"}}}
    assert config.job.pod_template == expected
    # The TF provider sends jsonencode({...}): a string, decoded to the same mapping.
    as_tf = edit(raw, "job.pod_template", json.dumps(expected))
    assert parse_runner_configuration(as_tf) == config
    assert runner_configuration_to_dict(parse_runner_configuration(as_tf))["job"]["pod_template"] == expected


def test_seed000_custom_image_pod_template_kept_verbatim() -> None:
    raw = load("seed000-custom-image.yaml")["runner_configuration"]
    config = parse_runner_configuration(raw)
    assert isinstance(config, K8sGkeRunnerConfiguration)
    assert config.job.pod_template == raw["job"]["pod_template"]
    assert config.job.pod_template is not None
    assert config.job.pod_template["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_seed001_secret_env_example_written_as_a_list() -> None:
    config = parse_runner_configuration(load("seed001-pod-template.yaml")["runner_configuration"])
    assert isinstance(config, K8sRunnerConfiguration)
    assert config.job.pod_template is not None
    env = config.job.pod_template["spec"]["containers"][0]["env"]
    assert env == [{"name": "TF_EXAMPLE", "valueFrom": {"secretKeyRef": {"name": "my-secret", "key": "key"}}}]


ENV = "runner_configuration.job.pod_template.spec.containers.0.env"


def _env_as_one_mapping() -> dict[str, Any]:
    """Seed 001's kubernetes runner with its secret variable written as in its CLI tab (tests/data/seeds)."""
    data = body("seed001-pod-template.yaml")
    variable = data["runner_configuration"]["job"]["pod_template"]["spec"]["containers"][0]["env"][0]
    return edit(data, ENV, variable)


@pytest.mark.parametrize(
    "storage",
    [
        {"type": "kubernetes", "kubernetes_configuration": {"namespace": "platform-orchestrator"}},
        {
            "type": "kubernetes",
            "kubernetes_configuration": {"namespace": "platform-orchestrator"},
            "s3_configuration": None,
            "gcs_configuration": None,
            "azurerm_configuration": None,
        },
        {"type": "kubernetes", "namespace": "platform-orchestrator"},
    ],
    ids=["nested", "nested with the other blocks null", "flat"],
)
def test_state_storage__the_terraform_providers_nested_shape_is_read_as_the_flat_one(
    storage: dict[str, Any],
) -> None:
    """Seed 000's agent runner (TF tab) writes ``kubernetes_configuration = {namespace = ...}``."""
    created = RunnerCreateBody.model_validate(
        {**body("seed000-agent.yaml"), "state_storage_configuration": storage}
    )

    assert K8sStorageConfiguration(namespace="platform-orchestrator") == created.state_storage_configuration


def test_seed001_env_as_one_mapping_is_read_as_a_list_of_one_with_a_warning() -> None:
    """Seed 001 prints the secret variable's env as one mapping: it is read as a list of that variable."""
    data = _env_as_one_mapping()

    created = RunnerCreateBody.model_validate(data)

    config = created.runner_configuration
    assert isinstance(config, K8sRunnerConfiguration)
    assert config.job.pod_template is not None
    env = config.job.pod_template["spec"]["containers"][0]["env"]
    assert env == [{"name": "TF_EXAMPLE", "valueFrom": {"secretKeyRef": {"name": "my-secret", "key": "key"}}}]
    assert created.warnings == [
        "runner_configuration.job.pod_template.spec.containers[0].env: a single mapping, read as a list of "
        "this one variable; write env as a list ('- name: TF_EXAMPLE')"
    ]


def test_env_mapping_of_names_to_values_is_refused_naming_the_field() -> None:
    """Only one variable written as a mapping (with its name) is read leniently, a name-to-value map not."""
    data = edit(body("seed001-pod-template.yaml"), ENV, {"TF_EXAMPLE": "value"})
    message, details = refusal(data)
    field = "runner_configuration.job.pod_template.spec.containers[0].env"
    assert message.startswith(f"{field}: must be a list of environment variables")
    assert "not a mapping" in message
    assert details == [{"field": field, "message": message.removeprefix(f"{field}: ")}]


def test_env_mapping_in_a_terraform_json_pod_template_is_read_as_a_list_too() -> None:
    data = _env_as_one_mapping()
    template = data["runner_configuration"]["job"]["pod_template"]
    data = edit(data, "runner_configuration.job.pod_template", json.dumps(template))

    created = RunnerCreateBody.model_validate(data)

    assert isinstance(created.runner_configuration, K8sRunnerConfiguration)
    assert created.runner_configuration.job.pod_template is not None
    assert isinstance(created.runner_configuration.job.pod_template["spec"]["containers"][0]["env"], list)
    assert 1 == len(created.warnings)


def test_create_without_lenient_reading_has_no_warnings() -> None:
    assert [] == RunnerCreateBody.model_validate(body("seed001-pod-template.yaml")).warnings


def test_freshly_generated_kubeconfig_material_is_accepted(kubeconfig_data: dict[str, str]) -> None:
    raw = load("seed001-kubernetes.yaml")["runner_configuration"]
    raw = edit(raw, "cluster.cluster_data.certificate_authority_data", kubeconfig_data["ca"])
    raw = edit(raw, "cluster.auth.client_certificate_data", kubeconfig_data["cert"])
    raw = edit(raw, "cluster.auth.client_key_data", kubeconfig_data["key"])
    config = parse_runner_configuration(raw)
    assert isinstance(config, K8sRunnerConfiguration)
    assert config.cluster.auth.client_key_data == kubeconfig_data["key"]


def test_encrypted_client_key_is_refused(kubeconfig_data: dict[str, str]) -> None:
    path = "runner_configuration.cluster.auth.client_key_data"
    data = edit(body("seed001-kubernetes.yaml"), path, kubeconfig_data["encrypted_key"])
    message, _ = refusal(data)
    assert message.startswith("runner_configuration.cluster.auth.client_key_data: ")
    assert "must not be encrypted" in message


def test_agent_keys_of_other_algorithms_are_refused() -> None:
    ec_pem = _public_pem(ec.generate_private_key(ec.SECP256R1()))
    assert len(ec_pem) <= 200
    message, _ = refusal(edit(body("seed000-agent.yaml"), "runner_configuration.key", ec_pem))
    assert message.startswith("runner_configuration.key: does not look like an ed25519 public key")
    assert "not an Ed25519 key" in message
    rsa_pem = _public_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    message, _ = refusal(edit(body("seed000-agent.yaml"), "runner_configuration.key", rsa_pem))
    assert message.startswith("runner_configuration.key: ")
    assert "200" in message


def test_fresh_ed25519_agent_key_is_accepted() -> None:
    pem = _public_pem(ed25519.Ed25519PrivateKey.generate())
    config = parse_runner_configuration(
        edit(load("vm-agent.yaml")["runner_configuration"], "connection.key", pem)
    )
    assert isinstance(config, VmRunnerConfiguration)


# --- refusals naming the field --------------------------------------------------------------------

RC = "runner_configuration"
POD = f"{RC}.job.pod_template"
CONTAINER = f"{POD}.spec.containers.0"
SSS = "state_storage_configuration"
BAD_PEM = "-----BEGIN PUBLIC KEY-----\nnot base64 at all\n-----END PUBLIC KEY-----\n"
PRIVATE_PEM_LABEL = (
    "-----BEGIN PRIVATE KEY-----\n"
    "MCowBQYDK2VwAyEAc5dgCx4ano39JT0XgTsHnts3jej+5xl7ZAwSIrKpef0=\n"
    "-----END PRIVATE KEY-----\n"
)
BAD_OPENSSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
ENCRYPTED_PEM_KEY = (
    ed25519.Ed25519PrivateKey.generate()
    .private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    .decode()
)
NOT_A_CERT = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").decode()
SSM_ARN = "arn:aws:ssm:us-west-2:123456789012:parameter/t"
GIT_KEYS = "RUNNER_GIT_SSH_KEYS"


def _field_of(path: str) -> str:
    """The field name the formatter gives a dotted edit path: list indices in brackets."""
    return re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", path)


def refuse(
    case: str,
    example: str,
    path: str,
    value: object,
    text: str,
    *,
    field: str | None = None,
    before: tuple[tuple[str, object], ...] = (),
) -> Any:
    """A refusal case: ``example`` with ``path`` set to ``value`` (after the ``before`` edits) is refused
    with a message for ``field`` (default: the edited path) containing ``text``."""
    return pytest.param(example, (*before, (path, value)), field or _field_of(path), text, id=case)


REFUSALS = [
    # unknown and missing fields, ids, types
    refuse("unknown top-level field", "seed000-gke.yaml", "labels", {"a": "b"}, "unknown field"),
    refuse("unknown runner field", "seed000-gke.yaml", f"{RC}.foo", 1, "unknown field"),
    refuse("unknown cluster field", "seed000-gke.yaml", f"{RC}.cluster.foo", 1, "unknown field"),
    refuse("unknown auth field", "seed000-gke.yaml", f"{RC}.cluster.auth.x", "y", "unknown field"),
    refuse("unknown job field", "seed000-gke.yaml", f"{RC}.job.image", "x", "unknown field"),
    refuse(
        "TF-style storage of another type",
        "seed000-gke.yaml",
        f"{SSS}.s3_configuration",
        {"bucket": "b-1"},
        "does not match type 'kubernetes': give the block of that type, or none",
    ),
    refuse(
        "TF-style storage and the flat field",
        "seed000-gke.yaml",
        f"{SSS}.kubernetes_configuration",
        {"namespace": "other"},
        "also given as state_storage_configuration.namespace; give one",
        field=f"{SSS}.kubernetes_configuration.namespace",
    ),
    refuse("orchestrator storage fields", "vm-local.yaml", f"{SSS}.bucket", "x", "unknown field"),
    refuse("missing id", "seed000-gke.yaml", "id", DELETE, "field required"),
    refuse("missing runner configuration", "seed000-gke.yaml", RC, DELETE, "field required"),
    refuse("missing storage", "seed000-gke.yaml", SSS, DELETE, "field required"),
    refuse("missing cluster name", "seed000-gke.yaml", f"{RC}.cluster.name", DELETE, "field required"),
    refuse(
        "missing audience", "seed000-gke.yaml", f"{RC}.cluster.auth.gcp_audience", DELETE, "field required"
    ),
    refuse("missing job", "seed000-gke.yaml", f"{RC}.job", DELETE, "field required"),
    refuse("missing namespace", "seed000-gke.yaml", f"{RC}.job.namespace", DELETE, "field required"),
    refuse("missing service account", "seed000-agent.yaml", f"{RC}.job.service_account", DELETE, "required"),
    refuse("namespace not a DNS label", "seed000-gke.yaml", f"{RC}.job.namespace", "My_NS", "pattern"),
    refuse("missing agent key", "seed000-agent.yaml", f"{RC}.key", DELETE, "field required"),
    refuse("unknown runner type", "seed000-gke.yaml", f"{RC}.type", "k8s", "unknown runner type 'k8s'"),
    refuse("missing runner type", "seed000-gke.yaml", f"{RC}.type", DELETE, "field required"),
    refuse("unknown storage type", "seed000-gke.yaml", f"{SSS}.type", "consul", "unknown state storage type"),
    refuse("id with capitals", "seed000-gke.yaml", "id", "My-runner", "pattern"),
    refuse("id starting with a digit", "seed000-gke.yaml", "id", "1runner", "pattern"),
    refuse("id of one character", "seed000-gke.yaml", "id", "r", "pattern"),
    # agent key
    refuse("key not PEM", "seed000-agent.yaml", f"{RC}.key", "ssh-ed25519 AAAA", "not look like an ed25519"),
    refuse("key bad base64", "seed000-agent.yaml", f"{RC}.key", BAD_PEM, "not look like an ed25519"),
    refuse(
        "key private label", "seed000-agent.yaml", f"{RC}.key", PRIVATE_PEM_LABEL, "not look like an ed25519"
    ),
    refuse("key too long", "seed000-agent.yaml", f"{RC}.key", "x" * 201, "200"),
    # pod template
    refuse("pod namespace", "seed000-agent.yaml", f"{POD}.metadata.namespace", "x", "must not be set"),
    refuse(
        "pod service account",
        "seed000-agent.yaml",
        f"{POD}.spec",
        {"serviceAccountName": "root"},
        "must not be set",
        field=f"{POD}.spec.serviceAccountName",
    ),
    refuse("unnamed container", "seed000-custom-image.yaml", f"{CONTAINER}.name", DELETE, "needs a name"),
    refuse(
        "unnamed init container",
        "seed000-custom-image.yaml",
        f"{POD}.spec.initContainers",
        [{"image": "busybox"}],
        "needs a name",
        field=f"{POD}.spec.initContainers[0].name",
    ),
    refuse(
        "duplicate container name",
        "seed000-custom-image.yaml",
        f"{POD}.spec.initContainers",
        [{"name": "main"}],
        "duplicate container name 'main'",
        field=f"{POD}.spec.initContainers[0].name",
    ),
    refuse(
        "containers as a mapping",
        "seed000-custom-image.yaml",
        f"{POD}.spec.containers",
        {"name": "main"},
        "must be a list",
    ),
    refuse("containers outside spec", "seed000-custom-image.yaml", f"{POD}.containers", [], "unknown field"),
    refuse("label not a string", "seed000-agent.yaml", f"{POD}.metadata.labels.tier", 3, "must be a string"),
    refuse(
        "label key quoted",
        "seed000-agent.yaml",
        f"{POD}.metadata.labels",
        {"app.kubernetes.io/x": True},
        "must be a string",
        field=f'{POD}.metadata.labels["app.kubernetes.io/x"]',
    ),
    refuse("pod template bad JSON", "seed000-agent.yaml", POD, "{not json", "JSON"),
    refuse("pod template JSON list", "seed000-agent.yaml", POD, "[1, 2]", "JSON"),
    refuse(
        "git keys literal",
        "seed001-pod-template.yaml",
        f"{CONTAINER}.env.0",
        {"name": GIT_KEYS, "value": "k"},
        "must come from a secret (valueFrom)",
    ),
    refuse(
        "reserved env in legacy container",
        "seed001-pod-template.yaml",
        f"{CONTAINER}.env.0.name",
        "TOKEN",
        "TOKEN is reserved",
        before=((f"{CONTAINER}.name", "platform-orchestrator-runner"),),
    ),
    refuse(
        "env entry without name", "seed001-pod-template.yaml", f"{CONTAINER}.env.0.name", DELETE, "required"
    ),
    refuse(
        "env value and valueFrom",
        "seed001-pod-template.yaml",
        f"{CONTAINER}.env.0.value",
        "x",
        "must not be set together with valueFrom",
    ),
    refuse(
        "command not a list", "seed000-custom-image.yaml", f"{CONTAINER}.command", "sh", "list of strings"
    ),
    # kubernetes
    refuse(
        "key without certificate",
        "seed001-kubernetes.yaml",
        f"{RC}.cluster.auth.client_certificate_data",
        DELETE,
        "go together",
    ),
    refuse("no auth method", "seed001-kubernetes.yaml", f"{RC}.cluster.auth", {}, "service_account_token"),
    refuse(
        "CA not base64",
        "seed001-kubernetes.yaml",
        f"{RC}.cluster.cluster_data.certificate_authority_data",
        "LS0t...",
        "base64",
    ),
    refuse(
        "CA not a certificate",
        "seed001-kubernetes.yaml",
        f"{RC}.cluster.cluster_data.certificate_authority_data",
        NOT_A_CERT,
        "PEM certificate",
    ),
    refuse(
        "client key is a certificate",
        "seed001-kubernetes.yaml",
        f"{RC}.cluster.auth.client_key_data",
        NOT_A_CERT,
        "PEM private key",
    ),
    refuse(
        "server not a URL", "seed001-kubernetes.yaml", f"{RC}.cluster.cluster_data.server", "k8s.local", "URL"
    ),
    refuse(
        "missing cluster_data", "seed001-kubernetes.yaml", f"{RC}.cluster.cluster_data", DELETE, "required"
    ),
    refuse(
        "placeholder on create",
        "kubernetes-token.yaml",
        f"{RC}.cluster.auth.service_account_token",
        "SECRET",
        "placeholder",
    ),
    # kubernetes-eks
    refuse(
        "EKS session name short", "kubernetes-eks.yaml", f"{RC}.cluster.auth.session_name", "ab", "at least 3"
    ),
    refuse(
        "EKS session name long",
        "kubernetes-eks.yaml",
        f"{RC}.cluster.auth.session_name",
        "s" * 65,
        "at most 64",
    ),
    refuse("EKS role not an ARN", "kubernetes-eks.yaml", f"{RC}.cluster.auth.role_arn", "my-role", "pattern"),
    refuse(
        "EKS bad sts region",
        "kubernetes-eks.yaml",
        f"{RC}.cluster.auth.sts_region",
        "Frankfurt",
        "must be a region name",
    ),
    refuse("EKS missing region", "kubernetes-eks.yaml", f"{RC}.cluster.region", DELETE, "field required"),
    # kubernetes-aks
    refuse(
        "AKS subscription not a GUID",
        "kubernetes-aks.yaml",
        f"{RC}.cluster.subscription_id",
        "prod",
        "must be a UUID",
    ),
    refuse("AKS missing auth", "kubernetes-aks.yaml", f"{RC}.auth", DELETE, "field required"),
    refuse("AKS missing client id", "kubernetes-aks.yaml", f"{RC}.auth.client_id", DELETE, "field required"),
    refuse(
        "AKS server missing", "kubernetes-aks.yaml", f"{RC}.cluster.cluster_data.server", DELETE, "required"
    ),
    refuse(
        "AKS unknown field", "kubernetes-aks.yaml", f"{RC}.cluster.location", "westeurope", "unknown field"
    ),
    # serverless-ecs
    refuse(
        "ECS 17 subnets",
        "serverless-ecs.yaml",
        f"{RC}.job.subnets",
        [f"subnet-{i}" for i in range(17)],
        "at most 16",
    ),
    refuse("ECS no subnets", "serverless-ecs.yaml", f"{RC}.job.subnets", [], "at least 1"),
    refuse(
        "ECS 6 security groups",
        "serverless-ecs.yaml",
        f"{RC}.job.security_groups",
        [f"sg-{i}" for i in range(6)],
        "at most 5",
    ),
    refuse(
        "ECS long env value",
        "serverless-ecs.yaml",
        f"{RC}.job.environment.TF_LOG",
        "x" * 1025,
        "at most 1024",
    ),
    refuse(
        "ECS reserved env", "serverless-ecs.yaml", f"{RC}.job.environment.DEPLOYMENT_ID", "x", "is reserved"
    ),
    refuse(
        "ECS git keys literal",
        "serverless-ecs.yaml",
        f"{RC}.job.environment.{GIT_KEYS}",
        "x",
        "from a secret",
    ),
    refuse(
        "ECS reserved secret", "serverless-ecs.yaml", f"{RC}.job.secrets.TOKEN", SSM_ARN, "TOKEN is reserved"
    ),
    refuse(
        "ECS secret not an ARN", "serverless-ecs.yaml", f"{RC}.job.secrets.DB_PASSWORD", "hunter2", "pattern"
    ),
    refuse(
        "ECS secret ARN without suffix",
        "serverless-ecs.yaml",
        f"{RC}.job.secrets.DB_PASSWORD",
        "arn:aws:secretsmanager:us-west-2:123456789012:secret:db",
        "pattern",
    ),
    refuse("ECS bad region", "serverless-ecs.yaml", f"{RC}.job.region", "uswest2", "must be a region name"),
    refuse(
        "ECS bad execution role",
        "serverless-ecs.yaml",
        f"{RC}.job.execution_role_arn",
        "arn:aws:iam::1:role/x",
        "pattern",
    ),
    refuse("ECS bad image", "seed000-ecs-image.yaml", f"{RC}.job.image", "my image", "pattern"),
    refuse("ECS missing auth", "serverless-ecs.yaml", f"{RC}.auth", DELETE, "field required"),
    refuse(
        "ECS kubernetes job field", "serverless-ecs.yaml", f"{RC}.job.namespace", "default", "unknown field"
    ),
    # vm
    refuse(
        "vm docker without image",
        "vm-local.yaml",
        f"{RC}.job.image",
        DELETE,
        "runtime 'docker' runs an image",
    ),
    refuse(
        "vm podman without image", "vm-ssh.yaml", f"{RC}.job.image", DELETE, "runtime 'podman' runs an image"
    ),
    refuse(
        "vm process with image", "vm-agent.yaml", f"{RC}.job.image", "ghcr.io/x/y:1", "only used with runtime"
    ),
    refuse(
        "vm unknown runtime", "vm-agent.yaml", f"{RC}.job.runtime", "lxc", "'process', 'docker' or 'podman'"
    ),
    refuse("vm relative work_dir", "vm-ssh.yaml", f"{RC}.job.work_dir", "runs", "absolute path"),
    refuse("vm reserved env", "vm-agent.yaml", f"{RC}.job.environment.ORG_ID", "x", "ORG_ID is reserved"),
    refuse("vm reserved secret", "vm-ssh.yaml", f"{RC}.job.secrets.ENCRYPTING_KEY", "x", "is reserved"),
    refuse("vm git keys in env", "vm-agent.yaml", f"{RC}.job.environment.{GIT_KEYS}", "x", "from a secret"),
    refuse(
        "vm bad env name",
        "vm-agent.yaml",
        f"{RC}.job.environment.MY-VAR",
        "x",
        "must be an environment variable name",
    ),
    refuse("vm ssh port 0", "vm-ssh.yaml", f"{RC}.connection.port", 0, "greater than or equal to 1"),
    refuse("vm ssh port 65536", "vm-ssh.yaml", f"{RC}.connection.port", 65536, "less than or equal to 65535"),
    refuse("vm ssh missing username", "vm-ssh.yaml", f"{RC}.connection.username", DELETE, "field required"),
    refuse(
        "vm ssh missing host key", "vm-ssh.yaml", f"{RC}.connection.host_public_key", DELETE, "field required"
    ),
    refuse(
        "vm ssh bad host key", "vm-ssh.yaml", f"{RC}.connection.host_public_key", "ssh-ed25519 x", "OpenSSH"
    ),
    refuse(
        "vm ssh bad private key",
        "vm-ssh.yaml",
        f"{RC}.connection.private_key",
        BAD_OPENSSH_KEY,
        "must be an SSH private key",
    ),
    refuse(
        "vm ssh encrypted key",
        "vm-ssh.yaml",
        f"{RC}.connection.private_key",
        ENCRYPTED_PEM_KEY,
        "must not be encrypted",
    ),
    refuse("vm ssh unknown field", "vm-ssh.yaml", f"{RC}.connection.password", "x", "unknown field"),
    refuse("vm agent bad key", "vm-agent.yaml", f"{RC}.connection.key", BAD_PEM, "ed25519"),
    refuse("vm local with host", "vm-local.yaml", f"{RC}.connection.host", "x", "unknown field"),
    refuse(
        "vm unknown connection",
        "vm-local.yaml",
        f"{RC}.connection.type",
        "winrm",
        "unknown connection type 'winrm', must be one of [agent local ssh]",
    ),
    refuse(
        "vm connection without type",
        "vm-local.yaml",
        f"{RC}.connection",
        {},
        "field required",
        field=f"{RC}.connection.type",
    ),
    refuse("vm missing connection", "vm-local.yaml", f"{RC}.connection", DELETE, "field required"),
    # state storage
    refuse("s3 bucket with capitals", "kubernetes-eks.yaml", f"{SSS}.bucket", "My-Bucket", "pattern"),
    refuse("s3 bucket with underscore", "kubernetes-eks.yaml", f"{SSS}.bucket", "my_bucket", "pattern"),
    refuse("s3 bucket ending in hyphen", "kubernetes-eks.yaml", f"{SSS}.bucket", "bucket-", "pattern"),
    refuse("s3 missing bucket", "kubernetes-eks.yaml", f"{SSS}.bucket", DELETE, "field required"),
    refuse("s3 bad path prefix", "kubernetes-eks.yaml", f"{SSS}.path_prefix", "/abs//path", "pattern"),
    refuse("gcs bad bucket", "vm-ssh.yaml", f"{SSS}.bucket", "-x-", "pattern"),
    refuse(
        "azurerm missing container", "kubernetes-aks.yaml", f"{SSS}.container_name", DELETE, "field required"
    ),
    refuse(
        "azurerm bad account", "kubernetes-aks.yaml", f"{SSS}.storage_account_name", "St-TfState", "pattern"
    ),
    refuse("kubernetes storage namespace", "seed000-gke.yaml", f"{SSS}.namespace", DELETE, "field required"),
]


@pytest.mark.parametrize(("name", "edits", "field", "text"), REFUSALS)
def test_refused_with_a_message_naming_the_field(
    name: str, edits: tuple[tuple[str, object], ...], field: str, text: str
) -> None:
    data = body(name)
    RunnerCreateBody.model_validate(data)  # the unedited example is valid
    for path, value in edits:
        data = edit(data, path, value)
    message, details = refusal(data)
    assert message.startswith(f"{field}: "), message
    assert text in message, message
    assert details[0]["field"] == field
    assert "\n" not in message


@pytest.mark.parametrize("name", sorted(RESERVED_ENV_VARS))
def test_every_reserved_env_var_is_refused_in_the_main_container(name: str) -> None:
    path = "runner_configuration.job.pod_template.spec.containers.0.env.0"
    data = edit(body("seed001-pod-template.yaml"), path, {"name": name, "value": "x"})
    message, _ = refusal(data)
    field = "runner_configuration.job.pod_template.spec.containers[0].env[0].name"
    assert message.startswith(f"{field}: environment variable {name} is reserved")
    from_secret = edit(body("seed001-pod-template.yaml"), f"{path}.name", name)
    assert refusal(from_secret)[0].startswith(f"{field}: ")


def test_upstream_and_our_reserved_names() -> None:
    upstream = {
        "ORG_ID",
        "DEPLOYMENT_ID",
        "MODE",
        "TOKEN",
        "ENCRYPTING_KEY",
        "PLATFORM_ORCHESTRATOR_BASE_URL",
    }
    ours = {"RUNNER_ID", "DEPLOYMENT_ENV_UUID", "ENCRYPTING_LOGS_KEY", "RUNNER_GATEWAY_URL"}
    assert upstream | ours == RESERVED_ENV_VARS


def test_reserved_names_are_allowed_in_other_containers_and_git_keys_from_a_secret() -> None:
    pod = "runner_configuration.job.pod_template.spec"
    data = edit(
        body("seed001-pod-template.yaml"),
        f"{pod}.containers",
        [
            {
                "name": "main",
                "env": [
                    {"name": "RUNNER_GIT_SSH_KEYS", "valueFrom": {"secretKeyRef": {"name": "g", "key": "k"}}}
                ],
            },
            {"name": "sidecar", "image": "busybox", "env": [{"name": "TOKEN", "value": "x"}]},
        ],
    )
    data = edit(
        data,
        f"{pod}.initContainers",
        [{"name": "init", "image": "busybox", "env": [{"name": "MODE", "value": "x"}]}],
    )
    RunnerCreateBody.model_validate(data)


def test_all_errors_are_listed_in_the_details() -> None:
    data = edit(
        body("seed000-custom-image.yaml"),
        "runner_configuration.job.pod_template.metadata",
        {"namespace": "x"},
    )
    data = edit(data, "runner_configuration.job.pod_template.spec.containers.0.name", DELETE)
    message, details = refusal(data)
    assert [d["field"] for d in details] == [
        "runner_configuration.job.pod_template.metadata.namespace",
        "runner_configuration.job.pod_template.spec.containers[0].name",
    ]
    assert message.endswith("(and 1 more error)")


def test_parse_runner_configuration_raises_invalid_input_with_details() -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_runner_configuration({"type": "kubernetes-gke", "cluster": {}, "job": {}})
    assert info.value.message.startswith("runner_configuration.cluster.name: field required")
    assert info.value.details is not None
    fields = {e["field"] for e in info.value.details["errors"]}
    assert {"runner_configuration.job.namespace", "runner_configuration.cluster.auth"} <= fields


# --- compatibility matrix -------------------------------------------------------------------------

K8S = {"kubernetes": True, "s3": True, "gcs": True, "azurerm": True, "orchestrator": True}
EXPECTED_MATRIX: dict[str, dict[str, bool]] = {
    "kubernetes": K8S,
    "kubernetes-agent": K8S,
    "kubernetes-aks": K8S,
    "kubernetes-eks": K8S,
    "kubernetes-gke": K8S,
    "serverless-ecs": {"kubernetes": False, "s3": True, "gcs": False, "azurerm": False, "orchestrator": True},
    "vm": {"kubernetes": False, "s3": True, "gcs": True, "azurerm": True, "orchestrator": True},
}
STORAGE_EXAMPLES: dict[str, dict[str, Any]] = {
    "kubernetes": {"type": "kubernetes", "namespace": "runner"},
    "s3": {"type": "s3", "bucket": "my-bucket", "path_prefix": "state"},
    "gcs": {"type": "gcs", "bucket": "my-bucket"},
    "azurerm": {"type": "azurerm", "storage_account_name": "sttf001", "container_name": "tfstate"},
    "orchestrator": {"type": "orchestrator"},
}
RUNNER_EXAMPLE = {
    "kubernetes": "seed001-kubernetes.yaml",
    "kubernetes-agent": "seed000-agent.yaml",
    "kubernetes-aks": "kubernetes-aks.yaml",
    "kubernetes-eks": "kubernetes-eks.yaml",
    "kubernetes-gke": "seed000-gke.yaml",
    "serverless-ecs": "serverless-ecs.yaml",
    "vm": "vm-ssh.yaml",
}
PAIRS = [(runner, storage) for runner in EXPECTED_MATRIX for storage in EXPECTED_MATRIX[runner]]


def test_matrix_covers_every_type() -> None:
    assert set(EXPECTED_MATRIX) == {t.value for t in RunnerType} == set(COMPATIBILITY)
    assert set(STORAGE_EXAMPLES) == {t.value for t in StateStorageType}


@pytest.mark.parametrize(("runner", "storage"), PAIRS)
def test_compatibility_pair(runner: str, storage: str) -> None:
    compatible = EXPECTED_MATRIX[runner][storage]
    data = {**body(RUNNER_EXAMPLE[runner]), "state_storage_configuration": STORAGE_EXAMPLES[storage]}
    if compatible:
        check_compatibility(runner, storage)
        RunnerCreateBody.model_validate(data)
        return
    allowed = " ".join(sorted(s for s, ok in EXPECTED_MATRIX[runner].items() if ok))
    expected = (
        f"state storage type '{storage}' is not compatible with runner type '{runner}', "
        f"it must be one of [{allowed}]"
    )
    with pytest.raises(InvalidInputError) as info:
        check_compatibility(runner, storage)
    assert info.value.message == expected
    message, details = refusal(data)
    assert message == f"state_storage_configuration.type: {expected}"
    assert details == [{"field": "state_storage_configuration.type", "message": expected}]


def test_compatibility_error_text_for_ecs() -> None:
    with pytest.raises(InvalidInputError) as info:
        check_compatibility("serverless-ecs", "gcs")
    assert str(info.value) == (
        "state storage type 'gcs' is not compatible with runner type 'serverless-ecs', "
        "it must be one of [orchestrator s3]"
    )


def test_compatibility_of_unknown_runner_type() -> None:
    with pytest.raises(InvalidInputError, match="unknown runner type 'nomad'"):
        check_compatibility("nomad", "s3")


def test_published_matrix() -> None:
    expected = {
        runner: sorted(storage for storage, ok in row.items() if ok)
        for runner, row in EXPECTED_MATRIX.items()
    }
    assert compatibility_matrix() == expected
    assert list(compatibility_matrix()) == sorted(expected)


# --- direct or agent ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("seed000-gke.yaml", "orchestrator"),
        ("seed000-agent.yaml", "agent"),
        ("seed001-kubernetes.yaml", "orchestrator"),
        ("kubernetes-aks.yaml", "orchestrator"),
        ("kubernetes-eks.yaml", "orchestrator"),
        ("serverless-ecs.yaml", "orchestrator"),
        ("vm-ssh.yaml", "orchestrator"),
        ("vm-agent.yaml", "agent"),
        ("vm-local.yaml", "orchestrator"),
    ],
)
def test_launched_by(name: str, expected: str) -> None:
    raw = load(name)["runner_configuration"]
    assert launched_by(raw["type"], parse_runner_configuration(raw)) == expected
    assert launched_by(raw["type"], raw) == expected


# --- PATCH ----------------------------------------------------------------------------------------


def test_patch_without_type_merges_onto_the_stored_configuration() -> None:
    """Seed 000's image override sets only job.pod_template: type may be left out, the rest is kept."""
    existing = load("seed000-gke.yaml")["runner_configuration"]
    template = load("seed000-custom-image.yaml")["runner_configuration"]["job"]["pod_template"]

    patched, warnings = apply_runner_patch("kubernetes-gke", existing, {"job": {"pod_template": template}})

    assert isinstance(patched, K8sGkeRunnerConfiguration)
    assert patched.job.pod_template == template
    assert patched.job.namespace == existing["job"]["namespace"]
    assert patched.job.service_account == existing["job"]["service_account"]
    assert patched.cluster.name == existing["cluster"]["name"]
    assert [] == warnings


def test_patch_with_type_null_is_refused() -> None:
    existing = load("seed000-agent.yaml")["runner_configuration"]
    with pytest.raises(InvalidInputError) as info:
        apply_runner_patch("kubernetes-agent", existing, {"type": None})
    assert info.value.message == (
        "runner_configuration.type: cannot be removed: leave it out, or give the runner's type "
        "'kubernetes-agent'"
    )


def test_patch_changing_type_is_refused() -> None:
    existing = load("seed000-agent.yaml")["runner_configuration"]
    with pytest.raises(InvalidInputError) as info:
        apply_runner_patch("kubernetes-agent", existing, {"type": "kubernetes-gke"})
    assert info.value.message == (
        "runner_configuration.type: "
        "the runner type cannot be changed from 'kubernetes-agent' to 'kubernetes-gke'"
    )
    assert info.value.details == {
        "errors": [
            {
                "field": "runner_configuration.type",
                "message": "the runner type cannot be changed from 'kubernetes-agent' to 'kubernetes-gke'",
            }
        ]
    }


def test_patch_merges_job_key_by_key() -> None:
    existing = load("seed000-agent.yaml")["runner_configuration"]
    assert existing["job"]["pod_template"]
    patched, _ = apply_runner_patch(
        "kubernetes-agent",
        existing,
        {"type": "kubernetes-agent", "job": {"namespace": "runners", "service_account": "runner"}},
    )
    assert isinstance(patched, K8sAgentRunnerConfiguration)
    assert patched.job.namespace == "runners"
    assert patched.job.pod_template == existing["job"]["pod_template"]  # merged: kept from the stored job
    assert patched.key == existing["key"]


def test_patch_null_removes_a_key_and_a_list_replaces_the_stored_list() -> None:
    existing = load("seed000-custom-image.yaml")["runner_configuration"]
    patch = {
        "job": {
            "pod_template": {
                "spec": {"containers": [{"name": "main", "image": "registry.example.com/runner:2.0.0"}]},
                "metadata": {"labels": {"team": "a"}},
            }
        }
    }
    with_labels, _ = apply_runner_patch("kubernetes-gke", existing, patch)
    without_template, _ = apply_runner_patch("kubernetes-gke", existing, {"job": {"pod_template": None}})

    assert isinstance(with_labels, K8sGkeRunnerConfiguration)
    assert with_labels.job.pod_template == {
        "spec": {
            "containers": [{"name": "main", "image": "registry.example.com/runner:2.0.0"}],  # replaced whole
            "imagePullSecrets": [{"name": "regcred"}],  # kept
        },
        "metadata": {"labels": {"team": "a"}},
    }
    assert isinstance(without_template, K8sGkeRunnerConfiguration)
    assert without_template.job.pod_template is None


def test_patch_env_as_one_mapping_is_read_as_a_list_with_a_warning() -> None:
    existing = load("seed001-pod-template.yaml")["runner_configuration"]
    env = {"name": "TF_OTHER", "value": "x"}
    patch = {"job": {"pod_template": {"spec": {"containers": [{"name": "main", "env": env}]}}}}

    patched, warnings = apply_runner_patch("kubernetes", existing, patch)

    assert isinstance(patched, K8sRunnerConfiguration)
    assert patched.job.pod_template == {"spec": {"containers": [{"name": "main", "env": [env]}]}}
    assert warnings == [
        "runner_configuration.job.pod_template.spec.containers[0].env: a single mapping, read as a list of "
        "this one variable; write env as a list ('- name: TF_OTHER')"
    ]


def test_patch_unknown_field_kept_from_the_stored_configuration_says_how_to_remove_it() -> None:
    """Switching a vm runner from agent to local: the stored connection.key is merged in, unless nulled."""
    existing = load("vm-agent.yaml")["runner_configuration"]
    with pytest.raises(InvalidInputError) as info:
        apply_runner_patch("vm", existing, {"connection": {"type": "local"}})
    switched, _ = apply_runner_patch("vm", existing, {"connection": {"type": "local", "key": None}})

    assert info.value.message == (
        "runner_configuration.connection.key: unknown field; kept from the stored configuration, which an "
        "update is merged onto (JSON Merge Patch, RFC 7396): send key: null to remove it"
    )
    assert isinstance(switched, VmRunnerConfiguration)
    assert "local" == switched.connection.type


def test_patch_error_at_a_stored_value_says_how_to_remove_it() -> None:
    existing = load("vm-local.yaml")["runner_configuration"]
    assert "docker" == existing["job"]["runtime"]
    with pytest.raises(InvalidInputError) as info:
        apply_runner_patch("vm", existing, {"job": {"runtime": "process"}})
    assert info.value.message == (
        "runner_configuration.job.image: only used with runtime 'docker' or 'podman'; kept from the stored "
        "configuration, which an update is merged onto (JSON Merge Patch, RFC 7396): send image: null to "
        "remove it"
    )


def test_patch_with_only_type_keeps_everything() -> None:
    existing = load("serverless-ecs.yaml")["runner_configuration"]
    patched, _ = apply_runner_patch("serverless-ecs", existing, {"type": "serverless-ecs"})
    assert patched == parse_runner_configuration(existing)


def test_patched_job_is_validated_whole() -> None:
    existing = load("seed000-gke.yaml")["runner_configuration"]
    with pytest.raises(InvalidInputError) as info:
        apply_runner_patch(
            "kubernetes-gke", existing, {"type": "kubernetes-gke", "job": {"service_account": None}}
        )
    assert info.value.message.startswith("runner_configuration.job.service_account: field required")


def test_patch_with_unknown_field_is_refused() -> None:
    existing = load("vm-local.yaml")["runner_configuration"]
    with pytest.raises(InvalidInputError) as info:
        apply_runner_patch("vm", existing, {"type": "vm", "cluster": {}})
    assert info.value.message == "runner_configuration.cluster: unknown field"


def test_update_body() -> None:
    assert RunnerUpdateBody.model_validate({}).model_fields_set == set()
    update = RunnerUpdateBody.model_validate(
        {"description": "d", "state_storage_configuration": {"type": "s3", "bucket": "b-1"}}
    )
    assert update.runner_configuration is None
    assert update.state_storage_configuration is not None
    assert {"job": {}} == RunnerUpdateBody.model_validate(
        {"runner_configuration": {"job": {}}}
    ).runner_configuration
    for update_body, text in [
        (
            {"runner_configuration": {"type": "swarm"}},
            "runner_configuration.type: unknown runner type 'swarm'",
        ),
        ({"runner_configuration": None}, "runner_configuration: must not be null: a runner always has one"),
        ({"state_storage_configuration": None}, "state_storage_configuration: must not be null"),
    ]:
        with pytest.raises(pydantic.ValidationError) as info:
            RunnerUpdateBody.model_validate(update_body)
        assert format_validation_error(info.value)[0].startswith(text)
    with pytest.raises(pydantic.ValidationError) as info:
        RunnerUpdateBody.model_validate({"id": "x"})
    assert format_validation_error(info.value)[0] == "id: unknown field"
