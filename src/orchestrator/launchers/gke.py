"""``kubernetes-gke``: the Job of ``kubernetes`` on a GKE cluster, reached by workload identity federation.

For each access (``kubernetes_cloud`` caches it until shortly before it expires):

1. the orchestrator's OIDC token for the runner (audience ``cluster.auth.gcp_audience``, the workload
   identity pool provider) goes to Google STS, which exchanges it for a federated token;
2. IAM ``generateAccessToken`` turns that into an access token of ``cluster.auth.gcp_service_account``
   (the pool's principal for the subject ``{org_id}+{runner_id}`` needs ``roles/iam.workloadIdentityUser``
   on it);
3. the GKE API's ``projects.locations.clusters.get`` gives the cluster's endpoint (``endpoint``, or its
   private endpoint when ``cluster.internal_ip``) and CA (``masterAuth.clusterCaCertificate``);
4. the Kubernetes API is called with the service account's access token as bearer.

Steps 1 and 2 are google-auth's external account credentials (``identity_pool.Credentials`` with a
programmatic subject token supplier and service account impersonation); step 3 is one GET. google-auth
is synchronous (requests), so the exchange runs in a worker thread. The CA bundle requests trusts is the
process's (``REQUESTS_CA_BUNDLE`` overrides it).

Errors name the step that refused and quote only the structured error of Google's answer (its code,
status and message, shortened), never a token.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any, Final

import google.auth.exceptions
import requests
from google.auth import identity_pool
from google.auth.transport.requests import Request

from orchestrator.domain.runner_types import K8sGkeRunnerConfiguration, configuration_as
from orchestrator.launchers.base import WorkloadIdentity, fail, shortened, transient
from orchestrator.launchers.cloud_endpoints import GoogleEndpoints
from orchestrator.launchers.cloud_http import bearer_request, error_object, json_object, refused
from orchestrator.launchers.egress import EgressPolicy
from orchestrator.launchers.kubernetes import ClusterAccess
from orchestrator.launchers.kubernetes_cloud import (
    AccessCache,
    CloudKubernetesLauncher,
    ExpiringAccess,
    redacted,
)

__all__ = ["GkeAccessSource", "gke_launcher"]

SUBJECT_TOKEN_TYPE: Final = "urn:ietf:params:oauth:token-type:jwt"
CLOUD_PLATFORM_SCOPE: Final = "https://www.googleapis.com/auth/cloud-platform"
_IMPERSONATION_FAILED: Final = "Unable to acquire impersonated credentials"


class _Supplier(identity_pool.SubjectTokenSupplier):
    """Hands google-auth the orchestrator's token, minted before the exchange (the supplier is sync)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def get_subject_token(self, context: Any, request: Any) -> str:
        return self._token


@dataclass(frozen=True, eq=False, repr=False)  # repr: the identity mints tokens
class GkeAccessSource:
    """Access to the GKE cluster of one ``kubernetes-gke`` runner (see the module docstring)."""

    configuration: K8sGkeRunnerConfiguration
    identity: WorkloadIdentity
    endpoints: GoogleEndpoints = field(default_factory=GoogleEndpoints, kw_only=True)

    @property
    def _cluster_path(self) -> str:
        cluster = self.configuration.cluster
        return f"projects/{cluster.project_id}/locations/{cluster.location}/clusters/{cluster.name}"

    async def cluster_access(self) -> ExpiringAccess:
        audience = self.configuration.cluster.auth.gcp_audience
        subject_token = await self.identity.token(audience)
        return await asyncio.to_thread(self._exchange, subject_token)

    def _exchange(self, subject_token: str) -> ExpiringAccess:
        with requests.Session() as session:
            request = functools.partial(Request(session), timeout=self.endpoints.timeout_seconds)
            token, expires_at = self._service_account_token(request, subject_token)
            cluster = self._read_cluster(session, token, [subject_token, token])
        return ExpiringAccess(access=self._access(cluster, token), expires_at=expires_at)

    def _service_account_token(self, request: Any, subject_token: str) -> tuple[str, float]:
        """STS, then IAM impersonation: the service account's access token and its expiry."""
        auth = self.configuration.cluster.auth
        iam = self.endpoints.iam_credentials_url.rstrip("/")
        credentials = identity_pool.Credentials(  # type: ignore[no-untyped-call]
            audience=auth.gcp_audience,
            subject_token_type=SUBJECT_TOKEN_TYPE,
            token_url=self.endpoints.sts_url,
            subject_token_supplier=_Supplier(subject_token),
            service_account_impersonation_url=(
                f"{iam}/v1/projects/-/serviceAccounts/{auth.gcp_service_account}:generateAccessToken"
            ),
            scopes=[CLOUD_PLATFORM_SCOPE],
        )
        try:
            credentials.refresh(request)  # type: ignore[no-untyped-call]
        except google.auth.exceptions.GoogleAuthError as exc:
            self._refresh_failed(exc, [subject_token])
        token = credentials.token
        expiry = credentials.expiry
        if not isinstance(token, str) or not token or expiry is None:
            fail("IAM answered no access token for the service account", retryable=True)
        return token, expiry.replace(tzinfo=UTC).timestamp()

    def _refresh_failed(self, exc: google.auth.exceptions.GoogleAuthError, secrets: list[str]) -> None:
        auth = self.configuration.cluster.auth
        retryable = bool(getattr(exc, "retryable", False))
        first = str(exc.args[0]) if exc.args else ""
        body = str(exc.args[1]) if len(exc.args) > 1 else ""
        if isinstance(exc, google.auth.exceptions.TransportError):
            fail(
                f"cannot reach Google's token services: {shortened(redacted(first or str(exc), secrets))}",
                retryable=True,
                cause=exc,
            )
        if isinstance(exc, google.auth.exceptions.OAuthError):
            fail(
                "Google STS refused the workload identity token (audience "
                f"{auth.gcp_audience}): {shortened(redacted(first, secrets))}",
                retryable=retryable,
                cause=exc,
            )
        if first.startswith(_IMPERSONATION_FAILED):
            code, summary = _google_error(body)
            fail(
                f"IAM refused to impersonate the service account {auth.gcp_service_account}: "
                f"{shortened(redacted(summary, secrets))} (the pool's principal for this runner needs "
                "roles/iam.workloadIdentityUser on it)",
                retryable=retryable or transient(code),
                cause=exc,
            )
        fail(
            f"Google's token exchange failed: {shortened(redacted(first, secrets))}",
            retryable=retryable,
            cause=exc,
        )

    def _read_cluster(self, session: requests.Session, token: str, secrets: list[str]) -> dict[str, Any]:
        url = f"{self.endpoints.container_api_url.rstrip('/')}/v1/{self._cluster_path}"
        response = bearer_request(
            session,
            "GET",
            url,
            token=token,
            timeout=self.endpoints.timeout_seconds,
            api="the GKE API",
            where=self.endpoints.container_api_url,
            secrets=secrets,
        )
        if response.status_code == 200:
            return json_object(
                response,
                not_json="the GKE API did not answer JSON for the cluster",
                not_object="the GKE API did not answer a cluster object",
            )
        code, summary = _google_error(response.text, status=response.status_code)
        summary = shortened(redacted(summary, secrets))
        refused(
            code,
            not_found=f"GKE cluster {self._cluster_path} not found: {summary}",
            refusal=f"the GKE API refused to read cluster {self._cluster_path}: {summary}",
            denied=(
                f" (the service account {self.configuration.cluster.auth.gcp_service_account} needs "
                "container.clusters.get on it, e.g. roles/container.clusterViewer)"
            ),
        )

    def _access(self, cluster: dict[str, Any], token: str) -> ClusterAccess:
        internal = self.configuration.cluster.internal_ip
        host = _private_endpoint(cluster) if internal else cluster.get("endpoint")
        if not isinstance(host, str) or not host:
            which = "private endpoint (internal_ip is true)" if internal else "endpoint"
            status = cluster.get("status", "unknown")
            fail(f"GKE cluster {self._cluster_path} has no {which} (status {status})", retryable=False)
        master_auth = cluster.get("masterAuth")
        ca = master_auth.get("clusterCaCertificate") if isinstance(master_auth, dict) else None
        if not isinstance(ca, str) or not ca:
            fail(f"GKE cluster {self._cluster_path} has no CA certificate", retryable=False)
        proxy = self.configuration.cluster.proxy_url
        return ClusterAccess(
            server=f"https://{host}",
            certificate_authority_data=ca,
            token=token,
            proxy_url=str(proxy) if proxy is not None else None,
        )


def _private_endpoint(cluster: dict[str, Any]) -> Any:
    private = cluster.get("privateClusterConfig")
    if isinstance(private, dict) and private.get("privateEndpoint"):
        return private["privateEndpoint"]
    # Clusters made since GKE's DNS-based endpoints also say it here.
    endpoints = cluster.get("controlPlaneEndpointsConfig")
    ip = endpoints.get("ipEndpointsConfig") if isinstance(endpoints, dict) else None
    return ip.get("privateEndpoint") if isinstance(ip, dict) else None


def _google_error(body: str, *, status: int | None = None) -> tuple[int, str]:
    """(code, "403 PERMISSION_DENIED: message") from a Google API error body ``{"error": {code, status,
    message}}``; any other body is not quoted."""
    error = error_object(body)
    if error is not None:
        code = error.get("code")
        code = code if isinstance(code, int) else (status or 0)
        parts = [str(code), str(error.get("status") or "")]
        text = " ".join(part for part in parts if part)
        message = error.get("message")
        return code, f"{text}: {message}" if isinstance(message, str) and message else text
    code = status or 0
    if code:
        return code, f"{code} (not a Google API error; the answer is not shown)"
    return code, "an answer that is not a Google API error (not shown)"


def gke_launcher(
    configuration: dict[str, Any],
    identity: WorkloadIdentity,
    *,
    egress: EgressPolicy | None,
    endpoints: GoogleEndpoints | None = None,
    cache: AccessCache | None = None,
    cache_key: str = "",
    **options: Any,
) -> CloudKubernetesLauncher | None:
    """The launcher of a ``kubernetes-gke`` runner; None for a configuration that is not one."""
    parsed = configuration_as(K8sGkeRunnerConfiguration, configuration)
    if parsed is None:
        return None
    source = GkeAccessSource(parsed, identity, endpoints=endpoints or GoogleEndpoints())
    return CloudKubernetesLauncher(source, egress=egress, cache=cache, cache_key=cache_key, **options)
