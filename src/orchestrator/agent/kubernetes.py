"""``kubernetes-agent`` runs: the Job goes into the agent's own cluster, through ``KubernetesLauncher``.

Cluster access (``cluster_access``), read afresh for every command (service account tokens rotate):

1. ``KUBECONFIG`` set → that kubeconfig (the first file of a ``:``-separated list), its current context:
   server, CA (``certificate-authority-data`` or ``certificate-authority`` file), client certificate and key
   (``*-data`` or files) or ``token``/``tokenFile``. ``exec`` and ``auth-provider`` users are not supported;
2. else in cluster: the service account token and CA under ``/var/run/secrets/kubernetes.io/serviceaccount``
   and ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``;
3. else ``~/.kube/config``.

The Job spec is the command's ``job`` (namespace, service account, pod template), with the agent's
additions merged into its pod template (``job_with_agent_additions``): the command id as the pod template's
annotation ``platform-orchestrator.io/command-id``, and the agent's runner environment (the gateway CA's PEM
text, ``RUNNER_GATEWAY_CA``) on the runner's container. After launch, the agent watches the run
(``stuck_detail``): a pod still not started after ``K8S_RUNNER_POD_SCHEDULING_DELAY`` with Warning events
becomes a terminal ``runner-error`` carrying those warnings.

When it starts, the agent finds the runner Jobs it launched that have not started yet
(``AgentCluster.unstarted_runs``: Jobs labelled ``app.kubernetes.io/managed-by=platform-orchestrator`` and
``app.kubernetes.io/name=platform-orchestrator-runner`` whose org and runner annotations are this agent's,
not finished, no pod ready) and watches them again, so a restart loses no stuck pod. It lists Jobs in
``AGENT_JOB_NAMESPACES``, else in every namespace, else (no permission to list cluster-wide) in its own.
"""

from __future__ import annotations

import base64
import copy
import json
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import httpx2
from lightkube import ALL_NS, ApiError, AsyncClient, ConfigError, KubeConfig
from lightkube.config.kubeconfig import SERVICE_ACCOUNT, SingleConfig
from lightkube.config.models import Cluster, User
from lightkube.resources.batch_v1 import Job

from orchestrator.agent.launchers import PermanentLaunchError, UnstartedRun
from orchestrator.domain.pod_template import RUNNER_CONTAINER_NAMES
from orchestrator.launchers import kubernetes_job
from orchestrator.launchers.base import Launcher, LaunchError, RunState, RunStatus
from orchestrator.launchers.kubernetes import NOT_RETRYABLE, ClusterAccess, KubernetesLauncher, TypedErrors
from orchestrator.protocol import commands as protocol
from orchestrator.protocol.commands import CreateJobPayload

__all__ = [
    "COMMAND_ANNOTATION",
    "STUCK_PREFIX",
    "AgentCluster",
    "cluster_access",
    "job_with_agent_additions",
    "kubernetes_launchers",
    "stuck_detail",
]

DEFAULT_KUBECONFIG: Final = "~/.kube/config"
#: How ``KubernetesLauncher.status`` starts the detail of a run whose pod did not start in time.
STUCK_PREFIX: Final = "the runner pod did not start"
#: Pod template annotation with the id of the command that launched the Job (the id of its events).
COMMAND_ANNOTATION: Final = "platform-orchestrator.io/command-id"


def _b64_file(path: str | os.PathLike[str]) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def _from_single(config: SingleConfig) -> ClusterAccess:
    cluster, user = config.cluster, config.user
    if cluster.insecure:
        raise PermanentLaunchError("kubeconfig: insecure-skip-tls-verify is not supported")
    ca = cluster.certificate_auth_data
    if ca is None and cluster.certificate_auth:
        ca = _b64_file(config.abs_file(cluster.certificate_auth))
    cert = key = token = None
    if user is not None:
        if user.exec is not None or user.auth_provider is not None:
            raise PermanentLaunchError(
                f"kubeconfig context '{config.context_name}': exec and auth-provider users are not "
                "supported; use a client certificate or a token"
            )
        cert = user.client_cert_data
        if cert is None and user.client_cert:
            cert = _b64_file(config.abs_file(user.client_cert))
        key = user.client_key_data
        if key is None and user.client_key:
            key = _b64_file(config.abs_file(user.client_key))
        token = user.token
        if user.token_file:
            token = Path(config.abs_file(user.token_file)).read_text().strip()
    return ClusterAccess(
        server=cluster.server,
        certificate_authority_data=ca,
        client_certificate_data=cert,
        client_key_data=key,
        token=token,
    )


def cluster_access(
    environ: Mapping[str, str], *, service_account: str | os.PathLike[str] = SERVICE_ACCOUNT
) -> ClusterAccess:
    """The agent's cluster, from ``KUBECONFIG``, the in-cluster service account, or ``~/.kube/config``;
    ``PermanentLaunchError`` if none is usable."""
    try:
        kubeconfig = environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        if not kubeconfig:
            account = Path(service_account)
            host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
            if host and port and (account / "token").is_file():
                host = f"[{host}]" if ":" in host else host
                return ClusterAccess(
                    server=f"https://{host}:{port}",
                    certificate_authority_data=_b64_file(account / "ca.crt"),
                    token=(account / "token").read_text().strip(),
                )
            kubeconfig = os.path.expanduser(DEFAULT_KUBECONFIG)
        config = KubeConfig.from_file(kubeconfig).get()
        if config is None:
            raise PermanentLaunchError(f"kubeconfig {kubeconfig} has no current context")
        return _from_single(config)
    except (ConfigError, OSError, ValueError) as exc:
        raise PermanentLaunchError(
            f"cannot reach the agent's cluster: no usable configuration: {exc}"
        ) from exc


def own_namespace(
    environ: Mapping[str, str], *, service_account: str | os.PathLike[str] = SERVICE_ACCOUNT
) -> str:
    """The agent's own namespace: the kubeconfig context's, else the service account's, else default."""
    kubeconfig = environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    try:
        if kubeconfig:
            config = KubeConfig.from_file(kubeconfig).get()
            return (config.namespace if config is not None else None) or "default"
        return (Path(service_account) / "namespace").read_text().strip() or "default"
    except (ConfigError, OSError, ValueError):
        return "default"


class AgentCluster:
    """The agent's own cluster: a ``KubernetesLauncher`` for each ``kubernetes-agent`` command (called as
    the ``LauncherFactory`` of ``AgentLaunchers``), and the runner Jobs launched before a restart."""

    def __init__(
        self,
        environ: Mapping[str, str],
        *,
        scheduling_delay_seconds: float,
        namespaces: Sequence[str] = (),
        service_account: str | os.PathLike[str] = SERVICE_ACCOUNT,
    ) -> None:
        self.environ = dict(environ)
        self.scheduling_delay_seconds = scheduling_delay_seconds
        self.namespaces = tuple(namespaces)
        self.service_account = service_account

    def launcher(self) -> KubernetesLauncher:
        access = cluster_access(self.environ, service_account=self.service_account)
        # No egress policy: the agent reaches its own cluster's API, where its operator pointed it (the
        # server's PO_RUNNER_DENIED_NETWORKS guard the server's network, not the agent's).
        return KubernetesLauncher(access, egress=None, scheduling_delay_seconds=self.scheduling_delay_seconds)

    def __call__(self, payload: CreateJobPayload) -> Launcher:
        return self.launcher()

    async def unstarted_runs(self, org_id: str, runner_id: str) -> list[UnstartedRun]:
        """This runner's Jobs whose pod has not started (nor finished); ``LaunchError`` if the cluster
        cannot be asked."""
        access = cluster_access(self.environ, service_account=self.service_account)
        now = datetime.now(UTC)
        jobs = await _list_runner_jobs(access, self.namespaces or None, self._own_namespace)
        return [run for job in jobs if (run := _unstarted_run(job, org_id, runner_id, now=now)) is not None]

    def _own_namespace(self) -> str:
        return own_namespace(self.environ, service_account=self.service_account)


def kubernetes_launchers(
    environ: Mapping[str, str], *, scheduling_delay_seconds: float, namespaces: Sequence[str] = ()
) -> AgentCluster:
    """The factory ``AgentLaunchers(kubernetes=...)`` calls for each ``kubernetes-agent`` command; also
    what finds the Jobs to watch again after a restart (``AgentLaunchers(cluster=...)``)."""
    return AgentCluster(environ, scheduling_delay_seconds=scheduling_delay_seconds, namespaces=namespaces)


#: The labels ``kubernetes_job.job_labels`` puts on every runner Job (ids are annotations: too long).
RUNNER_JOB_LABELS: Final[dict[str, Any]] = {
    "app.kubernetes.io/name": "platform-orchestrator-runner",
    "app.kubernetes.io/managed-by": kubernetes_job.MANAGED_BY,
}


def _client(access: ClusterAccess) -> AsyncClient:
    config = KubeConfig.from_one(
        cluster=Cluster(server=access.server), user=User(token=access.token), namespace="default"
    )
    transport = httpx2.AsyncHTTPTransport(verify=access.ssl_context(), proxy=access.proxy_url)
    return AsyncClient(
        config,
        timeout=httpx2.Timeout(access.timeout_seconds),
        trust_env=False,
        transport=TypedErrors(transport),
    )


async def _list_runner_jobs(
    access: ClusterAccess, namespaces: Sequence[str] | None, own_namespace: Callable[[], str]
) -> list[Job]:
    """The runner Jobs in ``namespaces``; None: in every namespace, or in ``own_namespace()`` when listing
    cluster-wide is forbidden."""
    try:
        async with _client(access) as client:
            if namespaces is None:
                try:
                    return [
                        job
                        async for job in client.list(Job, namespace=ALL_NS, labels=dict(RUNNER_JOB_LABELS))
                    ]
                except ApiError as exc:
                    if exc.status.code != 403:
                        raise
                    namespaces = [own_namespace()]
            jobs: list[Job] = []
            for namespace in namespaces:
                jobs += [
                    job async for job in client.list(Job, namespace=namespace, labels=dict(RUNNER_JOB_LABELS))
                ]
            return jobs
    except ApiError as exc:
        error = LaunchError(
            f"cannot list the runner Jobs: the Kubernetes API answered {exc.status.code}: "
            f"{exc.status.message or 'no message'}"
        )
        error.retryable = exc.status.code not in NOT_RETRYABLE
        raise error from exc
    except (httpx2.HTTPError, json.JSONDecodeError) as exc:
        raise LaunchError(
            f"cannot list the runner Jobs: the Kubernetes API at {access.server}: {exc}"
        ) from exc


def _unstarted_run(job: Job, org_id: str, runner_id: str, *, now: datetime) -> UnstartedRun | None:
    """The run of ``job`` if this runner launched it and its pod has neither started nor finished."""
    metadata, spec, status = job.metadata, job.spec, job.status
    if metadata is None or metadata.name is None or metadata.namespace is None:
        return None
    annotations = metadata.annotations or {}
    if (
        annotations.get(kubernetes_job.ORG_ANNOTATION) != org_id
        or annotations.get(kubernetes_job.RUNNER_ANNOTATION) != runner_id
    ):
        return None
    if status is not None and (
        (status.ready or 0) > 0
        or (status.succeeded or 0) > 0
        or (status.failed or 0) > 0
        or any(c.type in ("Complete", "Failed") and c.status == "True" for c in status.conditions or [])
    ):
        return None
    labels = metadata.labels or {}
    deployment_id = labels.get(kubernetes_job.DEPLOYMENT_LABEL) or metadata.name
    template = spec.template.metadata if spec is not None and spec.template is not None else None
    command_id = ((template.annotations if template is not None else None) or {}).get(COMMAND_ANNOTATION)
    created = metadata.creationTimestamp or now
    return UnstartedRun(
        handle=f"k8s:{metadata.namespace}:{metadata.name}",
        # A Job of an agent before the annotation existed: its command was the first (and only) one.
        command_id=command_id or protocol.command_id(deployment_id),
        deployment_id=deployment_id,
        job_id=deployment_id,
        age_seconds=max(0.0, (now - created).total_seconds()),
    )


def job_with_agent_additions(
    job: Mapping[str, Any], *, command_id: str, environment: Mapping[str, str]
) -> dict[str, Any]:
    """``job`` (a runner's Job configuration) with the agent's additions in its pod template: the command
    id as an annotation, ``environment`` on the runner's container (``main``, or its legacy name when the
    template uses only that), replacing variables of the same name. A template that is not a mapping (or
    not JSON) is left as it is, for the launcher's validation to report."""
    result = copy.deepcopy(dict(job))
    template: Any = result.get("pod_template")
    if isinstance(template, str):
        try:
            template = json.loads(template) if template.strip() else None
        except json.JSONDecodeError:
            return result
    if template is None:
        template = {}
    if not isinstance(template, dict):
        return result
    metadata = template.setdefault("metadata", {})
    if isinstance(metadata, dict) and isinstance(metadata.setdefault("annotations", {}), dict):
        metadata["annotations"][COMMAND_ANNOTATION] = command_id
    if environment:
        _add_environment(template, environment)
    result["pod_template"] = template
    return result


def _add_environment(template: dict[str, Any], environment: Mapping[str, str]) -> None:
    spec = template.setdefault("spec", {})
    if not isinstance(spec, dict) or not isinstance(spec.setdefault("containers", []), list):
        return
    containers: list[Any] = spec["containers"]
    named = {c.get("name"): c for c in containers if isinstance(c, dict)}
    container = next((named[name] for name in RUNNER_CONTAINER_NAMES if name in named), None)
    if container is None:
        container = {"name": kubernetes_job.CONTAINER_NAME}
        containers.append(container)
    env = container.setdefault("env", [])
    if not isinstance(env, list):
        return
    env[:] = [var for var in env if not (isinstance(var, dict) and var.get("name") in environment)]
    env += [{"name": name, "value": value} for name, value in environment.items()]


def stuck_detail(status: RunStatus) -> str | None:
    """The warnings of a run whose pod did not start within the scheduling delay, else None."""
    if status.state is RunState.EXITED and status.detail and status.detail.startswith(STUCK_PREFIX):
        return status.detail
    return None
