"""``kubernetes-agent`` runs: the Job goes into the agent's own cluster, through ``KubernetesLauncher``.

Cluster access (``cluster_access``), read afresh for every command (service account tokens rotate):

1. ``KUBECONFIG`` set → that kubeconfig (the first file of a ``:``-separated list), its current context:
   server, CA (``certificate-authority-data`` or ``certificate-authority`` file), client certificate and key
   (``*-data`` or files) or ``token``/``tokenFile``. ``exec`` and ``auth-provider`` users are not supported;
2. else in cluster: the service account token and CA under ``/var/run/secrets/kubernetes.io/serviceaccount``
   and ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``;
3. else ``~/.kube/config``.

The Job spec is the command's ``job`` (namespace, service account, pod template). After launch, the agent
watches the run (``stuck_detail``): a pod still not started after ``K8S_RUNNER_POD_SCHEDULING_DELAY`` with
Warning events becomes a terminal ``runner-error`` carrying those warnings.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from lightkube import ConfigError, KubeConfig
from lightkube.config.kubeconfig import SERVICE_ACCOUNT, SingleConfig

from orchestrator.agent.launchers import LauncherFactory, PermanentLaunchError
from orchestrator.launchers.base import Launcher, RunState, RunStatus
from orchestrator.launchers.kubernetes import ClusterAccess, KubernetesLauncher
from orchestrator.protocol.commands import CreateJobPayload

__all__ = ["STUCK_PREFIX", "cluster_access", "kubernetes_launchers", "stuck_detail"]

DEFAULT_KUBECONFIG: Final = "~/.kube/config"
#: How ``KubernetesLauncher.status`` starts the detail of a run whose pod did not start in time.
STUCK_PREFIX: Final = "the runner pod did not start"


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


def kubernetes_launchers(environ: Mapping[str, str], *, scheduling_delay_seconds: float) -> LauncherFactory:
    """The factory ``AgentLaunchers(kubernetes=...)`` calls for each ``kubernetes-agent`` command."""

    def make(payload: CreateJobPayload) -> Launcher:
        return KubernetesLauncher(cluster_access(environ), scheduling_delay_seconds=scheduling_delay_seconds)

    return make


def stuck_detail(status: RunStatus) -> str | None:
    """The warnings of a run whose pod did not start within the scheduling delay, else None."""
    if status.state is RunState.EXITED and status.detail and status.detail.startswith(STUCK_PREFIX):
        return status.detail
    return None
