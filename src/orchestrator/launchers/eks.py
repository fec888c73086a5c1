"""The ``kubernetes-eks`` runner type: the same Job as ``kubernetes``, in an EKS cluster found and
entered with the runner's IAM role.

For every launch, status check and cancel, ``EksClusterAccess.access`` gives a fresh
:class:`~orchestrator.launchers.kubernetes.ClusterAccess`:

1. the role's credentials (``AssumeRoleWithWebIdentity``, cached; ``launchers.aws``);
2. ``DescribeCluster`` (``cluster.name`` in ``cluster.region``) for the API server's endpoint and CA;
3. a ``k8s-aws-v1.`` bearer token (a presigned ``GetCallerIdentity``, made locally, valid 15 minutes),
   which EKS maps to a Kubernetes user through an access entry or the ``aws-auth`` ConfigMap.

``CloudKubernetesLauncher`` then hands the call to a :class:`KubernetesLauncher` for that access, with
the server's egress policy: the Job, its token Secret, its status and cancel are exactly those of the
``kubernetes`` type.
"""

from __future__ import annotations

from typing import Final, Protocol

from lightkube import ApiError

from orchestrator.domain.runner_types import K8sRunnerEksCluster
from orchestrator.launchers import aws, kubernetes_job
from orchestrator.launchers.base import (
    Launched,
    LaunchError,
    LaunchTarget,
    RunState,
    RunStatus,
    WorkloadIdentity,
)
from orchestrator.launchers.egress import EgressPolicy
from orchestrator.launchers.kubernetes import ClusterAccess, KubernetesLauncher
from orchestrator.protocol.launch import RunSpec

__all__ = ["CloudKubernetesLauncher", "ClusterAccessSource", "EksClusterAccess"]

#: Cluster states in which the API server answers.
SERVING: Final = frozenset({"ACTIVE", "UPDATING"})
#: Cluster states that pass by themselves.
TRANSIENT: Final = frozenset({"CREATING", "UPDATING", "PENDING"})


class ClusterAccessSource(Protocol):
    """Where a cluster's API is and fresh credentials for it, looked up at each call."""

    async def access(self) -> ClusterAccess: ...


class EksClusterAccess:
    """An EKS cluster reached with the runner's IAM role (``cluster.auth``)."""

    def __init__(
        self,
        target: LaunchTarget,
        cluster: K8sRunnerEksCluster,
        *,
        identity: WorkloadIdentity,
        clients: aws.AwsClients,
    ) -> None:
        self.target = target
        self.cluster = cluster
        self.identity = identity
        self.clients = clients

    async def access(self) -> ClusterAccess:
        name, region = self.cluster.name, self.cluster.region
        credentials = await self.clients.role_credentials(
            self.target, self.cluster.auth, identity=self.identity, region=region
        )
        with aws.translated(
            f"describe EKS cluster {name} in {region}",
            service="eks",
            url=self.clients.endpoints.eks,
            secrets=credentials.secrets(),
        ):
            answer = await self.clients.call("eks", region, credentials, "describe_cluster", name=name)
        described = answer.get("cluster") or {}
        status = str(described.get("status") or "")
        endpoint = described.get("endpoint")
        if status not in SERVING or not endpoint:
            aws.fail(
                f"EKS cluster {name} in {region} is {status or 'without an endpoint'}: its API cannot be "
                "reached now",
                retryable=status in TRANSIENT,
            )
        authority = (described.get("certificateAuthority") or {}).get("data")
        with aws.translated(
            f"sign an EKS token for cluster {name}",
            service="sts",
            url=self.clients.endpoints.sts,
            secrets=credentials.secrets(),
        ):
            token = await self.clients.eks_token(
                credentials, cluster_name=name, region=self.cluster.auth.sts_region or region
            )
        return ClusterAccess(server=str(endpoint), certificate_authority_data=authority or None, token=token)


class CloudKubernetesLauncher:
    """The ``kubernetes`` launcher on a cluster whose access is looked up (and its token minted) afresh
    for every call; status reports a failed look-up as UNKNOWN, as it does an unreachable API."""

    def __init__(
        self,
        source: ClusterAccessSource,
        *,
        egress: EgressPolicy | None,
        image: str = kubernetes_job.DEFAULT_RUNNER_IMAGE,
        hint_on_unauthorized: str | None = None,
    ) -> None:
        self.source = source
        self.egress = egress
        self.image = image
        #: Appended to a 401 of the cluster API: how the cloud maps the identity to a Kubernetes user.
        self.hint_on_unauthorized = hint_on_unauthorized

    async def _cluster(self) -> KubernetesLauncher:
        return KubernetesLauncher(await self.source.access(), egress=self.egress, image=self.image)

    def _hinted(self, error: LaunchError) -> LaunchError:
        cause = error.__cause__
        if not isinstance(cause, ApiError) or not self.hint_on_unauthorized:
            return error
        code = cause.response.status_code if cause.response is not None else cause.status.code
        if code != 401:
            return error
        hinted = LaunchError(f"{error.message} ({self.hint_on_unauthorized})")
        hinted.retryable = error.retryable
        return hinted

    async def launch(self, spec: RunSpec) -> str | Launched:
        cluster = await self._cluster()
        try:
            return await cluster.launch(spec)
        except LaunchError as error:
            raise self._hinted(error) from error.__cause__

    async def status(self, handle: str) -> RunStatus:
        try:
            cluster = await self._cluster()
        except LaunchError as error:
            return RunStatus(state=RunState.UNKNOWN, detail=error.message)
        return await cluster.status(handle)

    async def cancel(self, handle: str, *, grace_seconds: float) -> None:
        cluster = await self._cluster()
        try:
            await cluster.cancel(handle, grace_seconds=grace_seconds)
        except LaunchError as error:
            raise self._hinted(error) from error.__cause__


def eks_launcher(
    target: LaunchTarget,
    cluster: K8sRunnerEksCluster,
    *,
    identity: WorkloadIdentity,
    clients: aws.AwsClients,
    egress: EgressPolicy | None,
    image: str = kubernetes_job.DEFAULT_RUNNER_IMAGE,
) -> CloudKubernetesLauncher:
    """The launcher of a ``kubernetes-eks`` runner."""
    source = EksClusterAccess(target, cluster, identity=identity, clients=clients)
    hint = (
        "EKS did not map the role's session to a Kubernetes user: give "
        f"{cluster.auth.role_arn} an access entry on cluster {cluster.name} (or an aws-auth mapping)"
    )
    return CloudKubernetesLauncher(source, egress=egress, image=image, hint_on_unauthorized=hint)
