"""Runner types and their ``runner_configuration``: models, compatibility with state storage, launch mode.

The five upstream types (``kubernetes``, ``kubernetes-gke``, ``kubernetes-eks``, ``kubernetes-agent``,
``serverless-ecs``) follow the upstream schema (CPSPEC ``*RunnerConfiguration``) and its validation
(``CP:internal/api/runners_utils.go``). ``kubernetes-aks`` and ``vm`` are ours (seed 000).

Decoding is strict: every model forbids unknown fields. Pure code, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Final, Literal, TypeVar
from urllib.parse import urlsplit

import pydantic
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    field_validator,
)

from orchestrator.domain.key_material import (
    AGENT_KEY_MAX_LENGTH,
    check_agent_public_key,
    check_base64_pem_certificates,
    check_base64_pem_private_key,
    check_ssh_private_key,
    check_ssh_public_key,
)
from orchestrator.domain.pod_template import (
    check_pod_template,
    decode_pod_template,
    env_mappings_as_lists,
    reserved_env_problem,
)
from orchestrator.domain.state_storage import DNS_LABEL_PATTERN, StateStorageType
from orchestrator.domain.validation import (
    Loc,
    go_list,
    invalid_input,
    nested_error,
    register_discriminated_union,
    render_loc,
)
from orchestrator.errors import InvalidInputError

__all__ = [
    "COMPATIBILITY",
    "RUNNER_CONFIGURATION_ADAPTER",
    "SECRET_PLACEHOLDER",
    "AksClusterData",
    "AwsTemporaryAuth",
    "AzureWorkloadIdentityAuth",
    "K8sAgentRunnerConfiguration",
    "K8sAksRunnerConfiguration",
    "K8sEksRunnerConfiguration",
    "K8sGkeRunnerConfiguration",
    "K8sRunnerAksCluster",
    "K8sRunnerConfiguration",
    "K8sRunnerEksCluster",
    "K8sRunnerGcpTemporaryAuth",
    "K8sRunnerGkeCluster",
    "K8sRunnerJobConfig",
    "K8sRunnerK8sCluster",
    "K8sRunnerK8sClusterAuth",
    "K8sRunnerK8sClusterClusterData",
    "RunnerConfiguration",
    "RunnerType",
    "ServerlessEcsRunnerConfiguration",
    "ServerlessEcsRunnerJob",
    "StateStorageType",
    "VmAgentConnection",
    "VmConnection",
    "VmLocalConnection",
    "VmRunnerConfiguration",
    "VmRunnerJob",
    "VmSshConnection",
    "check_compatibility",
    "compatibility_matrix",
    "launched_by",
    "parse_runner_configuration",
    "read_runner_configuration",
    "runner_configuration_to_dict",
]


class RunnerType(StrEnum):
    """The runner type: upstream's five, and ``kubernetes-aks`` and ``vm``, which are ours."""

    KUBERNETES = "kubernetes"
    KUBERNETES_AGENT = "kubernetes-agent"
    KUBERNETES_AKS = "kubernetes-aks"
    KUBERNETES_EKS = "kubernetes-eks"
    KUBERNETES_GKE = "kubernetes-gke"
    SERVERLESS_ECS = "serverless-ecs"
    VM = "vm"


#: What the API answers in place of a sensitive value; sent back on update it means "keep the stored value".
SECRET_PLACEHOLDER: Final = "SECRET"


class _Strict(BaseModel):
    """A runner configuration or a part of one: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


# --- field types ----------------------------------------------------------------------------------


def _not_placeholder(value: str) -> str:
    if value == SECRET_PLACEHOLDER:
        raise ValueError(
            f"the placeholder '{SECRET_PLACEHOLDER}' stands for a stored value and is only accepted on update"
        )
    return value


def _check_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise ValueError("must be an http(s) URL, e.g. https://kubernetes.example.com:6443")
    return value


def _check_absolute_path(value: str) -> str:
    if not PurePosixPath(value).is_absolute() or "\x00" in value:
        raise ValueError("must be an absolute path")
    return value


NonEmptyStr = Annotated[str, Field(min_length=1)]
DnsLabel = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]
DnsSubdomain = Annotated[
    str,
    Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", max_length=253),
]
HttpUrl = Annotated[str, AfterValidator(_check_url)]
#: A sensitive string: stored apart from the configuration (see ``runner_secrets``), never the placeholder.
SensitiveStr = Annotated[str, Field(min_length=1), AfterValidator(_not_placeholder)]
Base64PemCertificates = Annotated[str, Field(min_length=1), AfterValidator(check_base64_pem_certificates)]
Guid = Annotated[
    str, Field(pattern=r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
]
AgentPublicKey = Annotated[
    str, Field(min_length=1, max_length=AGENT_KEY_MAX_LENGTH), AfterValidator(check_agent_public_key)
]
AwsRoleArn = Annotated[str, Field(pattern=r"^arn:aws:iam::[0-9]{12}:role/[a-zA-Z_0-9+=,.@\-/]+$")]
AwsRegion = Annotated[str, Field(pattern=r"^[a-z]{2}-[a-z]+-\d$", min_length=1, max_length=24)]
ContainerImage = Annotated[
    str, Field(pattern=r"^[a-zA-Z0-9._:/-]+(?:@[a-z0-9]+:[a-fA-F0-9]+)?$", min_length=1, max_length=255)
]
EnvVarName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=255)]
PodTemplate = Annotated[
    Annotated[dict[str, Any], AfterValidator(check_pod_template)] | None,
    BeforeValidator(decode_pod_template),
]


def _env_problems(names: Mapping[str, object], *, literal: bool) -> list[tuple[Loc, str]]:
    problems: list[tuple[Loc, str]] = []
    for name in names:
        problem = reserved_env_problem(name, literal=literal)
        if problem is not None:
            problems.append(((name,), problem))
    return problems


class _JobEnvironment(_Strict):
    """A runner job with ``environment`` and ``secrets``: the runner's own variable names are refused in
    both. An error repeats the secrets only where ``secrets_in_errors`` says they are not sensitive."""

    secrets_in_errors: ClassVar[bool] = False

    @field_validator("environment", check_fields=False)
    @classmethod
    def _environment_names(cls, value: dict[str, str]) -> dict[str, str]:
        problems = _env_problems(value, literal=True)
        if problems:
            raise nested_error(problems, value=value)
        return value

    @field_validator("secrets", check_fields=False)
    @classmethod
    def _secret_names(cls, value: dict[str, str]) -> dict[str, str]:
        problems = _env_problems(value, literal=False)
        if problems:
            raise nested_error(problems, value=value if cls.secrets_in_errors else None)
        return value


# --- Kubernetes -----------------------------------------------------------------------------------


class K8sRunnerJobConfig(_Strict):
    """The Kubernetes Job of the Kubernetes runner types."""

    namespace: DnsLabel
    service_account: DnsSubdomain
    #: A PodTemplateSpec fragment, strategic-merge-patched onto the default job pod; a JSON string is decoded.
    pod_template: PodTemplate = None


class K8sRunnerK8sClusterClusterData(_Strict):
    certificate_authority_data: Base64PemCertificates
    server: HttpUrl
    proxy_url: HttpUrl | None = None


class K8sRunnerK8sClusterAuth(_Strict):
    """Client certificate (kubeconfig ``client-*-data``) or service account token; all sensitive."""

    client_certificate_data: Annotated[SensitiveStr, AfterValidator(check_base64_pem_certificates)] | None = (
        None
    )
    client_key_data: Annotated[SensitiveStr, AfterValidator(check_base64_pem_private_key)] | None = None
    service_account_token: SensitiveStr | None = None

    @pydantic.model_validator(mode="after")
    def _one_method(self) -> K8sRunnerK8sClusterAuth:
        if (self.client_certificate_data is None) != (self.client_key_data is None):
            missing = "client_key_data" if self.client_key_data is None else "client_certificate_data"
            message = "field required: client_certificate_data and client_key_data go together"
            raise nested_error([((missing,), message)])
        if self.client_certificate_data is None and self.service_account_token is None:
            raise ValueError("set client_certificate_data and client_key_data, or service_account_token")
        return self


class K8sRunnerK8sCluster(_Strict):
    cluster_data: K8sRunnerK8sClusterClusterData
    auth: K8sRunnerK8sClusterAuth


class K8sRunnerConfiguration(_Strict):
    """Any Kubernetes cluster whose API the orchestrator reaches, with values from a kubeconfig."""

    type: Literal["kubernetes"] = "kubernetes"
    cluster: K8sRunnerK8sCluster
    job: K8sRunnerJobConfig


class K8sRunnerGcpTemporaryAuth(_Strict):
    gcp_audience: NonEmptyStr
    gcp_service_account: NonEmptyStr


class K8sRunnerGkeCluster(_Strict):
    name: NonEmptyStr
    project_id: NonEmptyStr
    location: NonEmptyStr
    internal_ip: bool = False
    proxy_url: HttpUrl | None = None
    auth: K8sRunnerGcpTemporaryAuth


class K8sGkeRunnerConfiguration(_Strict):
    type: Literal["kubernetes-gke"] = "kubernetes-gke"
    cluster: K8sRunnerGkeCluster
    job: K8sRunnerJobConfig


class AwsTemporaryAuth(_Strict):
    """Temporary AWS credentials by assuming an IAM role with the orchestrator's OIDC token."""

    role_arn: AwsRoleArn
    #: Default ``"{org_id}-{runner_id}"``.
    session_name: (
        Annotated[str, Field(pattern=r"^[a-zA-Z0-9+=,.@\-_/]+$", min_length=3, max_length=64)] | None
    ) = None
    #: Default: the cluster's (or job's) region.
    sts_region: Annotated[str, Field(pattern=r"^[a-z]{2}-[a-z]+-\d$")] | None = None


class K8sRunnerEksCluster(_Strict):
    name: NonEmptyStr
    region: NonEmptyStr
    auth: AwsTemporaryAuth


class K8sEksRunnerConfiguration(_Strict):
    type: Literal["kubernetes-eks"] = "kubernetes-eks"
    cluster: K8sRunnerEksCluster
    job: K8sRunnerJobConfig


class AksClusterData(_Strict):
    """Explicit API server and CA, for private clusters; without it they are looked up through Azure."""

    server: HttpUrl
    certificate_authority_data: Base64PemCertificates


class K8sRunnerAksCluster(_Strict):
    name: NonEmptyStr
    resource_group: Annotated[str, Field(min_length=1, max_length=90)]
    subscription_id: Guid
    cluster_data: AksClusterData | None = None
    proxy_url: HttpUrl | None = None


class AzureWorkloadIdentityAuth(_Strict):
    """Azure workload identity federation: the app registration trusting the orchestrator's OIDC token."""

    tenant_id: Guid
    client_id: Guid


class K8sAksRunnerConfiguration(_Strict):
    """An AKS cluster reached with Azure workload identity federation (ours; upstream has no such type)."""

    type: Literal["kubernetes-aks"] = "kubernetes-aks"
    cluster: K8sRunnerAksCluster
    auth: AzureWorkloadIdentityAuth
    job: K8sRunnerJobConfig


class K8sAgentRunnerConfiguration(_Strict):
    """A Kubernetes cluster the orchestrator does not reach; an agent in it launches the jobs."""

    type: Literal["kubernetes-agent"] = "kubernetes-agent"
    #: The agent's Ed25519 public key (PKIX PEM); the agent signs its requests with the private key.
    key: AgentPublicKey
    job: K8sRunnerJobConfig


# --- serverless ECS -------------------------------------------------------------------------------

_ECS_SECRET_ARN: Final = (
    r"^arn:aws:((secretsmanager:[^:]+:[^:]+:secret:[^:]+-[a-zA-Z0-9]{6})|(ssm:[^:]+:[^:]+:parameter/.+))$"
)


class ServerlessEcsRunnerJob(_JobEnvironment):
    secrets_in_errors: ClassVar[bool] = True  # ARNs, not the secrets themselves

    region: AwsRegion
    cluster: Annotated[str, Field(min_length=1, max_length=255)]
    subnets: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=24)]], Field(min_length=1, max_length=16)
    ]
    security_groups: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=255)]], Field(max_length=5)
    ] = Field(default_factory=list)
    is_public_ip_enabled: bool = False
    execution_role_arn: AwsRoleArn
    image: ContainerImage | None = None
    task_role_arn: AwsRoleArn | None = None
    environment: dict[str, Annotated[str, Field(max_length=1024)]] = Field(default_factory=dict)
    #: Variable name to the ARN of a Secrets Manager secret or an SSM parameter.
    secrets: dict[str, Annotated[str, Field(pattern=_ECS_SECRET_ARN)]] = Field(default_factory=dict)


class ServerlessEcsRunnerConfiguration(_Strict):
    """AWS ECS Fargate tasks, started by the orchestrator with a role it assumes."""

    type: Literal["serverless-ecs"] = "serverless-ecs"
    auth: AwsTemporaryAuth
    job: ServerlessEcsRunnerJob


# --- vm -------------------------------------------------------------------------------------------


class VmSshConnection(_Strict):
    """The orchestrator connects to the machine over SSH, pinning its host key."""

    type: Literal["ssh"] = "ssh"
    host: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:\[\]-]+$", max_length=253)]
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    username: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=32)]
    #: The server's host key in OpenSSH format (``ssh-ed25519 AAAA...``).
    host_public_key: Annotated[str, AfterValidator(check_ssh_public_key)]
    #: Unencrypted, OpenSSH or PEM format; sensitive.
    private_key: Annotated[SensitiveStr, AfterValidator(check_ssh_private_key)]


class VmAgentConnection(_Strict):
    """An agent on the machine connects out to the runner gateway, like ``kubernetes-agent``."""

    type: Literal["agent"] = "agent"
    key: AgentPublicKey


class VmLocalConnection(_Strict):
    """The machine the orchestrator runs on."""

    type: Literal["local"] = "local"


VmConnection = Annotated[VmSshConnection | VmAgentConnection | VmLocalConnection, Field(discriminator="type")]


class VmRunnerJob(_JobEnvironment):
    #: Where runs get their working directories; default: chosen by the runner.
    work_dir: Annotated[str, AfterValidator(_check_absolute_path)] | None = None
    runtime: Literal["process", "docker", "podman"] = "process"
    #: The runner image; required for the ``docker`` and ``podman`` runtimes.
    image: ContainerImage | None = None
    environment: dict[EnvVarName, str] = Field(default_factory=dict)
    #: Sensitive values, passed to the runner as environment variables.
    secrets: dict[EnvVarName, SensitiveStr] = Field(default_factory=dict)

    @pydantic.model_validator(mode="after")
    def _image_for_runtime(self) -> VmRunnerJob:
        if self.runtime != "process" and self.image is None:
            raise nested_error([(("image",), f"field required: runtime '{self.runtime}' runs an image")])
        if self.runtime == "process" and self.image is not None:
            raise nested_error([(("image",), "only used with runtime 'docker' or 'podman'")])
        return self


class VmRunnerConfiguration(_Strict):
    """A virtual or physical machine, reached over SSH, through an agent, or the orchestrator's own host
    (ours; upstream has no such type)."""

    type: Literal["vm"] = "vm"
    connection: VmConnection
    job: VmRunnerJob = Field(default_factory=VmRunnerJob)


# --- the union ------------------------------------------------------------------------------------

RunnerConfiguration = Annotated[
    K8sRunnerConfiguration
    | K8sAgentRunnerConfiguration
    | K8sAksRunnerConfiguration
    | K8sEksRunnerConfiguration
    | K8sGkeRunnerConfiguration
    | ServerlessEcsRunnerConfiguration
    | VmRunnerConfiguration,
    Field(discriminator="type"),
]

#: Errors do not repeat the input in ``str(exc)``: configurations hold keys and tokens.
RUNNER_CONFIGURATION_ADAPTER: Final[TypeAdapter[RunnerConfiguration]] = TypeAdapter(
    RunnerConfiguration, config=ConfigDict(hide_input_in_errors=True)
)

register_discriminated_union("runner type", (t.value for t in RunnerType), fields=("runner_configuration",))
register_discriminated_union("connection type", ("ssh", "agent", "local"), fields=("connection",))


def parse_runner_configuration(data: object, *, prefix: str = "runner_configuration") -> RunnerConfiguration:
    """Validate a ``runner_configuration``; :class:`InvalidInputError` naming the field otherwise."""
    try:
        return RUNNER_CONFIGURATION_ADAPTER.validate_python(data)
    except pydantic.ValidationError as exc:
        raise invalid_input(exc, prefix=prefix) from exc


def read_runner_configuration(
    data: object, *, prefix: str = "runner_configuration"
) -> tuple[object, list[str]]:
    """A raw ``runner_configuration`` as users write it, in the shape validation expects, and a warning
    (naming the field) for each shape that was read leniently.

    So far one: a pod template container's ``env`` written as one mapping (seed 001's example) is read as
    a list of that one variable. Everything else is left to :func:`parse_runner_configuration`.
    """
    if not isinstance(data, Mapping):
        return data, []
    job = data.get("job")
    template = job.get("pod_template") if isinstance(job, Mapping) else None
    if isinstance(template, str):
        try:
            template = decode_pod_template(template)
        except ValueError:
            return data, []  # refused by validation, with the reason
    if not isinstance(job, Mapping) or not isinstance(template, Mapping):
        return data, []
    read, problems = env_mappings_as_lists(template)
    if not problems:
        return data, []
    head: Loc = (*(part for part in prefix.split(".") if part), "job", "pod_template")
    warnings = [f"{render_loc((*head, *loc))}: {message}" for loc, message in problems]
    return {**data, "job": {**job, "pod_template": read}}, warnings


def runner_configuration_to_dict(config: RunnerConfiguration) -> dict[str, Any]:
    """The JSON form of a validated configuration: unset optional fields left out."""
    return config.model_dump(mode="json", exclude_none=True)


_Configuration = TypeVar("_Configuration", bound=BaseModel)


def configuration_as(model: type[_Configuration], configuration: object) -> _Configuration | None:
    """A stored configuration read as ``model`` (one runner type's); None when it is not one."""
    try:
        return model.model_validate(configuration)
    except pydantic.ValidationError:
        return None


# --- compatibility and launch ---------------------------------------------------------------------

_K8S_STORAGE: Final = frozenset(StateStorageType)

#: The state storage types each runner type can use (upstream ``stateStorageCompatibilityMatrix``).
COMPATIBILITY: Final[Mapping[RunnerType, frozenset[StateStorageType]]] = MappingProxyType(
    {
        RunnerType.KUBERNETES: _K8S_STORAGE,
        RunnerType.KUBERNETES_AGENT: _K8S_STORAGE,
        RunnerType.KUBERNETES_AKS: _K8S_STORAGE,
        RunnerType.KUBERNETES_EKS: _K8S_STORAGE,
        RunnerType.KUBERNETES_GKE: _K8S_STORAGE,
        RunnerType.SERVERLESS_ECS: frozenset({StateStorageType.S3, StateStorageType.ORCHESTRATOR}),
        RunnerType.VM: frozenset(
            {
                StateStorageType.S3,
                StateStorageType.GCS,
                StateStorageType.AZURERM,
                StateStorageType.ORCHESTRATOR,
            }
        ),
    }
)


def check_compatibility(runner_type: str, storage_type: str) -> None:
    """Raise :class:`InvalidInputError` (upstream's text) unless the runner type can use the storage type."""
    try:
        allowed = COMPATIBILITY[RunnerType(runner_type)]
    except ValueError as exc:
        raise InvalidInputError(
            f"unknown runner type '{runner_type}', must be one of {go_list(RunnerType)}"
        ) from exc
    if storage_type not in allowed:
        raise InvalidInputError(
            f"state storage type '{storage_type}' is not compatible with runner type '{runner_type}', "
            f"it must be one of {go_list(allowed)}"
        )


def compatibility_matrix() -> dict[str, list[str]]:
    """The matrix for publishing: runner type to its sorted state storage types."""
    return {str(runner): sorted(str(s) for s in COMPATIBILITY[runner]) for runner in sorted(RunnerType)}


def launched_by(
    runner_type: str, config: RunnerConfiguration | Mapping[str, Any]
) -> Literal["orchestrator", "agent"]:
    """Whether the orchestrator launches runs itself ("direct") or an agent in the target does."""
    kind = RunnerType(runner_type)
    if kind is RunnerType.KUBERNETES_AGENT:
        return "agent"
    if kind is RunnerType.VM:
        if isinstance(config, VmRunnerConfiguration):
            connection_type: object = config.connection.type
        elif isinstance(config, Mapping):
            connection = config.get("connection")
            connection_type = connection.get("type") if isinstance(connection, Mapping) else None
        else:
            raise TypeError(f"not a vm runner configuration: {type(config).__name__}")
        return "agent" if connection_type == "agent" else "orchestrator"
    return "orchestrator"


def agent_public_key(runner_type: str, config: Mapping[str, Any]) -> str | None:
    """The Ed25519 public key (PEM) registered for the runner's agent; None unless an agent launches its
    runs (``launched_by``): ``key`` of a ``kubernetes-agent`` runner, ``connection.key`` of a ``vm`` one.
    None too for a type that is not a :class:`RunnerType` (the managed pool's ``managed``)."""
    if runner_type not in RunnerType.__members__.values():
        return None
    if launched_by(runner_type, config) != "agent":
        return None
    holder = config if runner_type == RunnerType.KUBERNETES_AGENT else config.get("connection")
    key = holder.get("key") if isinstance(holder, Mapping) else None
    return key if isinstance(key, str) else None
