"""``kubernetes-aks``: the Job of ``kubernetes`` on an AKS cluster with Microsoft Entra ID (Azure AD)
integration, reached by workload identity federation.

For each access (``kubernetes_cloud`` caches it until shortly before it expires):

1. the orchestrator's OIDC token for the runner (audience ``api://AzureADTokenExchange``, subject
   ``{org_id}+{runner_id}``) is the client assertion of the app registration ``auth.client_id`` in the
   tenant ``auth.tenant_id`` (azure-identity's ``ClientAssertionCredential``), which must hold a federated
   credential for that issuer and subject;
2. Azure AD issues a token for the AKS AAD server application (``6dae42f8-...``), which AKS clusters
   accept as a bearer token;
3. the endpoint and CA are ``cluster.cluster_data`` when given; otherwise a token for Azure Resource
   Manager reads the managed cluster (``properties.fqdn``, else ``privateFQDN``) and its
   ``listClusterUserCredential`` (a kubeconfig; only its CA is read), API version :data:`ARM_API_VERSION`.

azure-identity is used synchronously (its requests transport), so the exchange runs in a worker thread;
the CA bundle requests trusts is the process's (``REQUESTS_CA_BUNDLE`` overrides it). Errors name the step
that refused and quote only Azure AD's error description or ARM's error code and message (shortened),
never a token or an assertion.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, Final

import requests
import yaml
from azure.core.exceptions import AzureError, ClientAuthenticationError, ServiceRequestError
from azure.identity import ClientAssertionCredential

from orchestrator.domain.runner_types import K8sAksRunnerConfiguration, configuration_as
from orchestrator.launchers.base import WorkloadIdentity, fail, shortened
from orchestrator.launchers.cloud_endpoints import AKS_AAD_SERVER_APPLICATION, AzureEndpoints
from orchestrator.launchers.cloud_http import bearer_request, error_object, json_object, refused
from orchestrator.launchers.egress import EgressPolicy
from orchestrator.launchers.kubernetes import ClusterAccess
from orchestrator.launchers.kubernetes_cloud import (
    AccessCache,
    CloudKubernetesLauncher,
    ExpiringAccess,
    redacted,
)

__all__ = ["ARM_API_VERSION", "TOKEN_EXCHANGE_AUDIENCE", "AksAccessSource", "aks_launcher"]

#: The audience Azure AD expects of a federated credential's assertion.
TOKEN_EXCHANGE_AUDIENCE: Final = "api://AzureADTokenExchange"
#: The ``Microsoft.ContainerService`` API version of the managed cluster reads (GA since May 2024).
ARM_API_VERSION: Final = "2024-05-01"


@dataclass(frozen=True, eq=False, repr=False)  # repr: the identity mints tokens
class AksAccessSource:
    """Access to the AKS cluster of one ``kubernetes-aks`` runner (see the module docstring)."""

    configuration: K8sAksRunnerConfiguration
    identity: WorkloadIdentity
    endpoints: AzureEndpoints = field(default_factory=AzureEndpoints, kw_only=True)

    @property
    def _cluster_id(self) -> str:
        cluster = self.configuration.cluster
        return (
            f"/subscriptions/{cluster.subscription_id}/resourceGroups/{cluster.resource_group}"
            f"/providers/Microsoft.ContainerService/managedClusters/{cluster.name}"
        )

    async def cluster_access(self) -> ExpiringAccess:
        assertion = await self.identity.token(TOKEN_EXCHANGE_AUDIENCE)
        return await asyncio.to_thread(self._exchange, assertion)

    def _exchange(self, assertion: str) -> ExpiringAccess:
        auth = self.configuration.auth
        credential = ClientAssertionCredential(
            auth.tenant_id,
            auth.client_id,
            lambda: assertion,
            authority=self.endpoints.authority_host,
            connection_timeout=self.endpoints.timeout_seconds,
            read_timeout=self.endpoints.timeout_seconds,
        )
        with credential:
            token, expires_on = self._token(credential, f"{AKS_AAD_SERVER_APPLICATION}/.default", assertion)
            data = self.configuration.cluster.cluster_data
            if data is not None:
                server, ca = str(data.server).rstrip("/"), data.certificate_authority_data
            else:
                arm = self.endpoints.resource_manager_url.rstrip("/")
                arm_token, _ = self._token(credential, f"{arm}/.default", assertion)
                with requests.Session() as session:
                    server, ca = self._discover(session, arm_token, [assertion, arm_token, token])
        proxy = self.configuration.cluster.proxy_url
        access = ClusterAccess(
            server=server,
            certificate_authority_data=ca,
            token=token,
            proxy_url=str(proxy) if proxy is not None else None,
        )
        return ExpiringAccess(access=access, expires_at=float(expires_on))

    def _token(self, credential: ClientAssertionCredential, scope: str, assertion: str) -> tuple[str, int]:
        auth = self.configuration.auth
        try:
            token = credential.get_token(scope)
        except ServiceRequestError as exc:
            fail(
                f"cannot reach Azure AD at {self.endpoints.authority_host}: "
                f"{shortened(redacted(str(exc.message), [assertion]))}",
                retryable=True,
                cause=exc,
            )
        except ClientAuthenticationError as exc:
            answer = shortened(redacted(str(exc.message), [assertion]))
            fail(
                "Azure AD refused the workload identity token as the client assertion of app "
                f"{auth.client_id} in tenant {auth.tenant_id} (for {scope}): {answer}",
                retryable=False,
                cause=exc,
            )
        except AzureError as exc:
            fail(
                f"Azure AD's token exchange failed: {shortened(redacted(str(exc.message), [assertion]))}",
                retryable=True,
                cause=exc,
            )
        return token.token, token.expires_on

    def _discover(self, session: requests.Session, arm_token: str, secrets: list[str]) -> tuple[str, str]:
        """The cluster's API server URL and CA through Azure Resource Manager."""
        cluster = self._arm(session, "GET", "", arm_token, secrets)
        properties = cluster.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        fqdn = properties.get("fqdn") or properties.get("privateFQDN")
        if not isinstance(fqdn, str) or not fqdn:
            state = properties.get("provisioningState", "unknown")
            fail(f"AKS cluster {self._cluster_id} has no API server address (state {state})", retryable=False)
        if not properties.get("aadProfile"):
            fail(
                f"AKS cluster {self._cluster_id} has no Microsoft Entra ID integration (aadProfile): it "
                "cannot accept the orchestrator's Azure AD tokens (enable AKS-managed Entra ID integration)",
                retryable=False,
            )
        credentials = self._arm(session, "POST", "/listClusterUserCredential", arm_token, secrets)
        return f"https://{fqdn}", self._kubeconfig_ca(credentials)

    def _arm(
        self, session: requests.Session, method: str, action: str, token: str, secrets: list[str]
    ) -> dict[str, Any]:
        url = f"{self.endpoints.resource_manager_url.rstrip('/')}{self._cluster_id}{action}"
        what = "list the user credentials of" if action else "read"
        response = bearer_request(
            session,
            method,
            url,
            token=token,
            timeout=self.endpoints.timeout_seconds,
            api="Azure Resource Manager",
            where=self.endpoints.resource_manager_url,
            secrets=secrets,
            params={"api-version": ARM_API_VERSION},
        )
        if response.status_code == 200:
            return json_object(
                response,
                not_json="Azure Resource Manager did not answer JSON",
                not_object="Azure Resource Manager did not answer an object",
            )
        code = response.status_code
        summary = shortened(redacted(_arm_error(response.text, code), secrets))
        refused(
            code,
            not_found=f"AKS cluster {self._cluster_id} not found: {summary}",
            refusal=f"Azure Resource Manager refused to {what} AKS cluster {self._cluster_id}: {summary}",
            denied=(
                f" (app {self.configuration.auth.client_id} needs Microsoft.ContainerService/managedClusters/"
                "read and listClusterUserCredential/action on it, e.g. the Azure Kubernetes Service Cluster "
                "User Role; or give cluster.cluster_data)"
            ),
        )

    def _kubeconfig_ca(self, credentials: dict[str, Any]) -> str:
        """The CA of the first kubeconfig ``listClusterUserCredential`` answered (its users are not read:
        for clusters with local accounts they hold credentials)."""
        problem = f"the user credentials of AKS cluster {self._cluster_id} hold no kubeconfig with a CA"
        try:
            encoded = credentials["kubeconfigs"][0]["value"]
            config = yaml.safe_load(base64.b64decode(encoded, validate=True))
            ca = config["clusters"][0]["cluster"]["certificate-authority-data"]
        except (KeyError, IndexError, TypeError, binascii.Error, yaml.YAMLError) as exc:
            fail(problem, retryable=False, cause=exc)
        if not isinstance(ca, str) or not ca:
            fail(problem, retryable=False)
        return ca


def _arm_error(body: str, code: int) -> str:
    """``403 AuthorizationFailed: message`` from an ARM error body ``{"error": {code, message}}``; any
    other body is not quoted."""
    error = error_object(body)
    if error is not None and isinstance(error.get("code"), str):
        message = error.get("message")
        text = f"{code} {error['code']}"
        return f"{text}: {message}" if isinstance(message, str) and message else text
    return f"{code} (not an Azure Resource Manager error; the answer is not shown)"


def aks_launcher(
    configuration: dict[str, Any],
    identity: WorkloadIdentity,
    *,
    egress: EgressPolicy | None,
    endpoints: AzureEndpoints | None = None,
    cache: AccessCache | None = None,
    cache_key: str = "",
    **options: Any,
) -> CloudKubernetesLauncher | None:
    """The launcher of a ``kubernetes-aks`` runner; None for a configuration that is not one."""
    parsed = configuration_as(K8sAksRunnerConfiguration, configuration)
    if parsed is None:
        return None
    source = AksAccessSource(parsed, identity, endpoints=endpoints or AzureEndpoints())
    return CloudKubernetesLauncher(source, egress=egress, cache=cache, cache_key=cache_key, **options)
