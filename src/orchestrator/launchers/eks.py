"""The ``kubernetes-eks`` runner type: the same Job as ``kubernetes``, in an EKS cluster found and
entered with the runner's IAM role.

:class:`EksAccessSource` is the ``kubernetes_cloud`` source of the type; each access is:

1. the role's credentials (``AssumeRoleWithWebIdentity``, cached; ``launchers.aws``);
2. ``DescribeCluster`` (``cluster.name`` in ``cluster.region``) for the API server's endpoint and CA;
3. a ``k8s-aws-v1.`` bearer token (a presigned ``GetCallerIdentity``, made locally, accepted by EKS for
   15 minutes), which EKS maps to a Kubernetes user through an access entry or the ``aws-auth`` ConfigMap.

:class:`~orchestrator.launchers.kubernetes_cloud.CloudKubernetesLauncher` then hands the call to a
:class:`KubernetesLauncher` for that access, with the server's egress policy: the Job, its token Secret,
its status and cancel are exactly those of the ``kubernetes`` type. The server makes a launcher per
launch, status check and cancel and gives it no shared cache, so each of them takes a fresh access.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Final

from orchestrator.domain.runner_types import K8sRunnerEksCluster
from orchestrator.launchers import aws
from orchestrator.launchers.base import LaunchTarget, WorkloadIdentity
from orchestrator.launchers.egress import EgressPolicy
from orchestrator.launchers.kubernetes import ClusterAccess
from orchestrator.launchers.kubernetes_cloud import CloudKubernetesLauncher, ExpiringAccess

__all__ = ["EksAccessSource", "eks_launcher"]

#: Cluster states in which the API server answers.
SERVING: Final = frozenset({"ACTIVE", "UPDATING"})
#: Cluster states that pass by themselves.
TRANSIENT: Final = frozenset({"CREATING", "UPDATING", "PENDING"})
#: How long an EKS token is used after its signing (EKS accepts it for 15 minutes; ``aws eks get-token``
#: says 14).
TOKEN_LIFETIME_SECONDS: Final = 14 * 60.0


@dataclass(frozen=True, eq=False, repr=False)  # repr: the identity mints tokens
class EksAccessSource:
    """An EKS cluster reached with the runner's IAM role (``cluster.auth``)."""

    target: LaunchTarget
    cluster: K8sRunnerEksCluster
    identity: WorkloadIdentity = field(kw_only=True)
    clients: aws.AwsClients = field(kw_only=True)

    async def cluster_access(self) -> ExpiringAccess:
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
        signed_at = time.time()
        with aws.translated(
            f"sign an EKS token for cluster {name}",
            service="sts",
            url=self.clients.endpoints.sts,
            secrets=credentials.secrets(),
        ):
            token = await self.clients.eks_token(
                credentials, cluster_name=name, region=self.cluster.auth.sts_region or region
            )
        access = ClusterAccess(
            server=str(endpoint), certificate_authority_data=authority or None, token=token
        )
        expires_at = min(signed_at + TOKEN_LIFETIME_SECONDS, credentials.expires_at.timestamp())
        return ExpiringAccess(access=access, expires_at=expires_at)


def eks_launcher(
    target: LaunchTarget,
    cluster: K8sRunnerEksCluster,
    *,
    identity: WorkloadIdentity,
    clients: aws.AwsClients,
    egress: EgressPolicy | None,
    **options: Any,
) -> CloudKubernetesLauncher:
    """The launcher of a ``kubernetes-eks`` runner. ``options`` go to the Kubernetes launcher."""
    source = EksAccessSource(target, cluster, identity=identity, clients=clients)
    hint = (
        "EKS did not map the role's session to a Kubernetes user: give "
        f"{cluster.auth.role_arn} an access entry on cluster {cluster.name} (or an aws-auth mapping)"
    )
    return CloudKubernetesLauncher(source, egress=egress, hint_on_unauthorized=hint, **options)
