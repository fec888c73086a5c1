"""Server settings: one object per process, built at the edge (``cli``) and passed down.

Nothing below ``cli/`` and ``server.py`` reads ``os.environ``; tests build settings directly.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchestrator.blobs.location import parse_object_store_url
from orchestrator.launchers import cloud_endpoints
from orchestrator.launchers.egress import DEFAULT_DENIED_NETWORKS, EgressPolicy, parse_networks


def default_data_dir() -> Path:
    """The per-user data directory (XDG on Linux)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "platform-orchestrator"


def default_local_runs_dir() -> Path:
    """Working directories of local runs: in the system temp dir, one per server user, outside the data
    dir (which the run user must not reach)."""
    return Path(tempfile.gettempdir()) / f"platform-orchestrator-runs-{os.geteuid()}"


#: The shortest MANAGED_RUNNER_SECRET the server starts with.
MANAGED_RUNNER_SECRET_MIN_LENGTH = 48


class ServerSettings(BaseSettings):
    """Settings of ``orchestrator serve`` (API, gateway and background workers in one process)."""

    model_config = SettingsConfigDict(env_prefix="PO_", extra="ignore")

    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Directory for the default SQLite database, the server key and stored objects.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+asyncpg://user@host/db. Default: SQLite in data dir.",
    )
    listen: str = Field(default="127.0.0.1:8080", description="host:port the HTTP server binds.")
    public_url: str | None = Field(
        default=None,
        description="URL runners and agents use to reach this server. Default: http(s)://<listen>.",
    )
    bootstrap_token: SecretStr | None = Field(
        default=None,
        description="When set, accepted as a platform-admin bearer token (stored hashed).",
    )
    encryption_key: SecretStr | None = Field(
        default=None,
        description="Base64 32-byte key encrypting secrets at rest. Default: generated once in data dir.",
    )
    allow_local_runners: bool = Field(
        default=False,
        description="Accept `vm` runners with connection type `local` (runs deployments on this host); "
        "only platform admins may create or change them.",
    )
    local_run_user: str = Field(
        default="nobody",
        description="When the server runs as root, local runs (runtime `process`) execute as this "
        "unprivileged user, its primary group only, without capabilities. Empty: as the server's user.",
    )
    local_run_uids: str = Field(
        default="2100000-2100999",
        description="When the server runs as root, each local run (runtime `process`) and each warm runner "
        "executes as a uid of its own from this range START-END (no account; group of the same number), "
        "never reused while anything of it is left; every process of the uid is killed when its run ends. "
        "Empty: every run as PO_LOCAL_RUN_USER (no isolation between runs).",
    )
    local_run_cgroups: str = Field(
        default="auto",
        description="auto: each local run (runtime `process`) and each warm runner gets a cgroup v2 of its "
        "own where this host lets the server make one (root, or a delegated cgroup; cgroup.kill, Linux "
        "5.14+), and every process in it is killed when its run ends, whatever its session or uid; "
        "elsewhere runs rely on their uid (PO_LOCAL_RUN_UIDS). off: no cgroups.",
    )
    local_run_limit: int | None = Field(
        default=None,
        ge=1,
        description="At most this many local runs (vm runners with connection `local`) execute at once "
        "on this host; further deployments stay `executing`, their status message saying they are queued, "
        "and start in creation order as runs end. Default: four per CPU.",
    )
    local_zygote: str = Field(
        default="auto",
        description="auto: local runs (runtime `process`) are forked from one runner process per server "
        "that imported the runner once (a fork server, started at the first local run), instead of each "
        "starting Python and importing it (about 0.5 s of CPU per deployment); each forked runner still "
        "serves one deployment as its own user, session, cgroup, environment and directory. Linux only; "
        "while it cannot be used, runs start as with off. off: warm runners (PO_LOCAL_WARM_RUNNERS), else "
        "a new runner process per deployment.",
    )
    local_warm_runners: int = Field(
        default=2,
        ge=0,
        description="With PO_LOCAL_ZYGOTE off (or unusable): runner processes for local runs (runtime "
        "`process`) started and imported ahead, each waiting for one deployment (moves the runner's "
        "start-up off the deployment's path, not off the CPU); refilled as they are used, none started "
        "before the first local run. 0: every run starts its own runner.",
    )
    local_runs_dir: Path = Field(
        default_factory=default_local_runs_dir,
        description="Working directories of local runs; outside the data dir. "
        "Default: <temp dir>/platform-orchestrator-runs-<server uid>.",
    )
    deployment_timeout_seconds: float = Field(
        default=3600.0, gt=0, description="A deployment whose runner has not reported by then fails."
    )
    deployment_token_grace_seconds: float = Field(
        default=300.0,
        ge=0,
        description=(
            "A deployment token opens its deployment's gateway routes while the deployment executes and "
            "this long after it finished (the runner's last log upload or result retry); never after."
        ),
    )
    runner_allow_plain_http: bool = Field(
        default=False,
        description="Let the server reach a runner's cluster API over plain http (default: https only).",
    )
    runner_denied_networks: str = Field(
        default=DEFAULT_DENIED_NETWORKS,
        description=(
            "Comma-separated networks (CIDR) the server never connects to for a runner (its cluster API, "
            "its proxy): every address a host resolves to is checked when connecting; IPv4-mapped IPv6 "
            "addresses count as IPv4. Empty: none."
        ),
    )
    status_check_interval_seconds: float = Field(
        default=5.0, gt=0, description="How often launched runners are checked on."
    )
    dispatch_lease_seconds: float = Field(
        default=60.0,
        ge=3,
        le=3600,
        description="A deployment a server's dispatcher works on (its launch, a status check) is leased to "
        "that server this long, renewed every third of it while the work goes on: when the server dies "
        "(kill -9, a lost host), another replica on the same database takes the work over once the lease has "
        "run out, at most this long after the server's last renewal.",
    )
    cancel_grace_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="A cancelled or timed-out run: how long its runner gets after SIGTERM (it interrupts "
        "Terraform, which saves its state; then it reports) before it is killed. As Kubernetes' default "
        "terminationGracePeriodSeconds; keep it above the runner's RUNNER_STOP_GRACE_SECONDS (20 s).",
    )
    object_store_url: str | None = Field(
        default=None,
        description=(
            "Where deployment bundles and logs are stored: file:///abs/dir or s3://bucket[/prefix] "
            "(credentials and region from the standard AWS variables). Default: <data dir>/objects."
        ),
    )
    object_store_endpoint: str | None = Field(
        default=None,
        description="Endpoint of an S3-compatible object store, e.g. http://minio:9000 (path-style).",
    )
    db_pool_size: int = Field(default=20, ge=1, description="PostgreSQL connection pool size.")
    object_retention_days: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Deployment bundles and logs are deleted from the object store this many days after the "
            "deployment finished, or at the next cleanup once its environment is deleted; the rows stay."
        ),
    )
    cleanup_interval_seconds: float = Field(
        default=3600.0, gt=0, description="How often expired deployment objects are looked for and deleted."
    )
    outputs_retention_seconds: float = Field(
        default=300.0,
        gt=0,
        description=(
            "A deployment's encrypted outputs are answered this long after it finished (upstream's "
            "DEPLOYMENTS_COMPLETED_BEFORE, 5 minutes), then 404; the next cleanup deletes the ciphertext."
        ),
    )

    state_versions_kept: int = Field(
        default=100,
        ge=1,
        description=(
            "Terraform state versions kept per environment (state storage orchestrator): after each new "
            "version, the older ones beyond the newest N are deleted; the current one always stays."
        ),
    )

    # The command protocol of agent runners (runner gateway).
    agent_fetch_wait_seconds: float = Field(
        default=25.0, gt=0, le=60, description="Longest wait of an agent's commands/next long poll."
    )
    agent_lease_seconds: float = Field(
        default=90.0, gt=0, description="How long a delivered command stays with its agent unanswered."
    )
    agent_command_ttl_seconds: float = Field(
        default=24 * 3600.0, gt=0, description="A command no agent picked up by then fails its deployment."
    )
    agent_poll_fallback_seconds: float = Field(
        default=1.0,
        gt=0,
        description="How often waiting long polls look for commands no notification told them of.",
    )
    agent_public_key_cache_seconds: float = Field(
        default=60.0, ge=0, description="How long a runner's agent public key is cached."
    )
    agent_presence_interval_seconds: float = Field(
        default=15.0, ge=0, description="How often agents' last poll times are written (GET runner status)."
    )
    # Workload identity: the server as an OIDC issuer (``identity/``).
    oidc_key_rotation_seconds: float = Field(
        default=86400.0,
        ge=3600,
        description=(
            "A new signing key of the OIDC issuer signs this often; it is published in the JWKS an hour "
            "before (or half this period if shorter), and a retired key stays published until every token "
            "it signed has expired."
        ),
    )
    workload_token_lifetime_seconds: int = Field(
        default=600,
        ge=60,
        le=3600,
        description="Lifetime of the OIDC tokens minted for the cloud runner types (GKE, EKS, AKS, ECS).",
    )
    # The clouds' endpoints of the cloud Kubernetes runner types, for tests and sovereign clouds.
    gcp_sts_url: str = Field(
        default=cloud_endpoints.GOOGLE_STS_URL,
        description="Google STS token exchange endpoint (kubernetes-gke).",
    )
    gcp_iam_credentials_url: str = Field(
        default=cloud_endpoints.GOOGLE_IAM_CREDENTIALS_URL,
        description="Base URL of the IAM Service Account Credentials API (kubernetes-gke impersonation).",
    )
    gcp_container_api_url: str = Field(
        default=cloud_endpoints.GOOGLE_CONTAINER_API_URL,
        description="Base URL of the GKE API (kubernetes-gke cluster endpoint and CA).",
    )
    azure_authority_host: str = Field(
        default=cloud_endpoints.AZURE_AUTHORITY_HOST,
        description="Microsoft Entra ID (Azure AD) authority host (kubernetes-aks).",
    )
    azure_resource_manager_url: str = Field(
        default=cloud_endpoints.AZURE_RESOURCE_MANAGER_URL,
        description="Azure Resource Manager base URL (kubernetes-aks without cluster_data); its tokens "
        "are requested for <this URL>/.default.",
    )
    # The AWS runner types (kubernetes-eks, serverless-ecs): endpoints for tests and private endpoints.
    aws_sts_url: str | None = Field(
        default=None,
        description="Endpoint of AWS STS (role assumption by web identity, EKS tokens). Default: STS's "
        "regional endpoint.",
    )
    aws_eks_url: str | None = Field(
        default=None, description="Endpoint of the EKS API (DescribeCluster). Default: EKS's regional one."
    )
    aws_ecs_url: str | None = Field(
        default=None, description="Endpoint of the ECS API (tasks). Default: ECS's regional one."
    )
    # Managed runners (``po-runner managed``): the platform's own runners, serving every organization.
    managed_runner_secret: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("MANAGED_RUNNER_SECRET", "managed_runner_secret"),
        description=(
            "MANAGED_RUNNER_SECRET (no PO_ prefix, seed 004's name): the shared secret managed runners "
            "register with (at least 48 characters); it only mints per-runner tokens. Unset: managed "
            "runners are off."
        ),
    )
    managed_lease_seconds: float = Field(
        default=60.0, ge=1, description="A managed runner's claim lasts this long after its last heartbeat."
    )
    managed_heartbeat_seconds: float = Field(
        default=15.0, ge=1, description="How often managed runners are told to send a heartbeat."
    )
    managed_secret_tags: str = Field(
        default="linux,docker",
        description=(
            "Comma-separated tags a managed runner registering with MANAGED_RUNNER_SECRET may serve (besides "
            "'managed'); any other tag it declares is dropped. Other tags only through a registration "
            "credential a platform admin creates (POST /managed-runner-registrations)."
        ),
    )
    managed_prune_after_seconds: float = Field(
        default=86400.0,
        gt=0,
        description="Managed runners not seen for this long are removed (never busy ones).",
    )
    # TLS of ``orchestrator serve`` itself (without: plain HTTP, e.g. behind a TLS-terminating ingress).
    tls_cert_file: Path | None = Field(
        default=None,
        description="PEM certificate chain the server presents (with PO_TLS_KEY_FILE: serve HTTPS). "
        "Reloaded on SIGHUP and when the file changes (cert-manager rotation).",
    )
    tls_key_file: Path | None = Field(default=None, description="PEM private key of PO_TLS_CERT_FILE.")
    tls_client_ca_file: Path | None = Field(
        default=None,
        description="PEM CA that client certificates are verified with; a presented certificate it did "
        "not sign fails the TLS handshake. Reloaded with the certificate.",
    )
    tls_client_auth: Literal["gateway", "optional"] = Field(
        default="gateway",
        description="With PO_TLS_CLIENT_CA_FILE: `gateway` requires a verified client certificate on the "
        "runner gateway (/runner-gateway/...; 401 without), `optional` verifies it when presented only. "
        "The API, /healthz and /readyz never require one.",
    )
    tls_reload_interval_seconds: float = Field(
        default=10.0, gt=0, description="How often the TLS files are checked for a change."
    )
    shutdown_grace_seconds: int = Field(
        default=20,
        ge=0,
        description="On SIGTERM, how long requests in flight may take to finish before they are cut "
        "(long polls answer at once); then the leases this server handed out are handed back.",
    )
    metrics_enabled: bool = Field(
        default=True,
        description="Serve GET /metrics (Prometheus' text format, no credentials) and count requests for it; "
        "false: no /metrics route and no per-request metrics (the benchmark's baseline).",
    )
    log_level: str = Field(default="info", description="debug, info, warning or error.")
    log_format: Literal["json", "console"] | None = Field(
        default=None, description="json or console; default: json unless stderr is a terminal."
    )

    @field_validator("managed_runner_secret")
    @classmethod
    def _check_managed_runner_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        length = len(value.get_secret_value())
        if length < MANAGED_RUNNER_SECRET_MIN_LENGTH:
            # Never the value: only its length.
            raise PydanticCustomError(
                "managed_runner_secret_too_short",
                "MANAGED_RUNNER_SECRET must be at least {minimum} characters (it has {length})",
                {"minimum": MANAGED_RUNNER_SECRET_MIN_LENGTH, "length": length},
            )
        return value

    @property
    def managed_secret_tag_set(self) -> frozenset[str]:
        """``managed_secret_tags`` as a set (blank items skipped)."""
        return frozenset(t.strip() for t in self.managed_secret_tags.split(",") if t.strip())

    @property
    def managed_runners_enabled(self) -> bool:
        return self.managed_runner_secret is not None

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError("PO_LISTEN must be host:port")
        return value

    @field_validator("runner_denied_networks")
    @classmethod
    def _check_denied_networks(cls, value: str) -> str:
        try:
            parse_networks(value)
        except ValueError as exc:
            raise ValueError(f"PO_RUNNER_DENIED_NETWORKS: {exc}") from exc
        return value

    @field_validator(
        "gcp_sts_url",
        "gcp_iam_credentials_url",
        "gcp_container_api_url",
        "azure_authority_host",
        "azure_resource_manager_url",
    )
    @classmethod
    def _check_cloud_endpoint(cls, value: str, info: ValidationInfo) -> str:
        parts = urlsplit(value)
        if parts.scheme != "https" or not parts.netloc:
            raise ValueError(f"PO_{str(info.field_name).upper()} must be an https URL")
        return value.rstrip("/")

    @field_validator("object_store_url")
    @classmethod
    def _check_object_store_url(cls, value: str | None) -> str | None:
        if value:
            parse_object_store_url(value)
        return value or None

    @field_validator("aws_sts_url", "aws_eks_url", "aws_ecs_url")
    @classmethod
    def _check_aws_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"PO_{str(info.field_name).upper()} must be an http(s) URL")
        return value or None

    @field_validator("object_store_endpoint")
    @classmethod
    def _check_object_store_endpoint(cls, value: str | None) -> str | None:
        if value:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError("PO_OBJECT_STORE_ENDPOINT must be an http(s) URL")
        return value or None

    @model_validator(mode="after")
    def _runs_outside_data_dir(self) -> ServerSettings:
        runs, data = self.local_runs_dir.absolute(), self.data_dir.absolute()
        if runs == data or data in runs.parents or runs in data.parents:
            raise ValueError(
                f"PO_LOCAL_RUNS_DIR ({runs}) must be outside PO_DATA_DIR ({data}): local runs must not "
                "reach the server's key and database"
            )
        return self

    @model_validator(mode="after")
    def _tls_files_paired(self) -> ServerSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("PO_TLS_CERT_FILE and PO_TLS_KEY_FILE must be set together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("PO_TLS_CLIENT_CA_FILE needs PO_TLS_CERT_FILE and PO_TLS_KEY_FILE (HTTPS)")
        return self

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def runner_egress(self) -> EgressPolicy:
        """Where the server may connect for a runner (``launchers.egress``)."""
        return EgressPolicy(
            allow_plain_http=self.runner_allow_plain_http,
            denied_networks=parse_networks(self.runner_denied_networks),
        )

    @property
    def google_endpoints(self) -> cloud_endpoints.GoogleEndpoints:
        return cloud_endpoints.GoogleEndpoints(
            sts_url=self.gcp_sts_url,
            iam_credentials_url=self.gcp_iam_credentials_url,
            container_api_url=self.gcp_container_api_url,
        )

    @property
    def azure_endpoints(self) -> cloud_endpoints.AzureEndpoints:
        return cloud_endpoints.AzureEndpoints(
            authority_host=self.azure_authority_host, resource_manager_url=self.azure_resource_manager_url
        )

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{self.data_dir / 'orchestrator.db'}"

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0]

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def resolved_public_url(self) -> str:
        scheme = "https" if self.tls_enabled else "http"
        return (self.public_url or f"{scheme}://{self.listen}").rstrip("/")
