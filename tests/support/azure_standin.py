"""A stand-in for the Azure services a ``kubernetes-aks`` runner uses: Microsoft Entra ID (Azure AD)'s
token endpoint and Azure Resource Manager's managed clusters. It is NOT Azure; it checks what it receives
as they do:

- Azure AD (``POST /{tenant}/oauth2/v2.0/token``, client credentials with a JWT client assertion): the
  tenant and the app registration exist, the assertion verifies with the issuer's ``verify``
  (``TestIssuer``, or the real server's issuer through ``RelyingParty``: signature, expiry, audience
  ``api://AzureADTokenExchange``) and its issuer and subject match one of the app's
  federated credentials (``add_app``), the scope is ``<resource>/.default`` of a known resource (the AKS
  AAD server application, or ARM: this stand-in's URL). It answers an access token for that resource.
  Errors are AAD's ``{error, error_description: "AADSTS...: ..."}``.
- ARM (``GET .../managedClusters/{name}``, ``POST .../listClusterUserCredential``, ``api-version``
  required): an ARM token as bearer, the cluster known (``add_cluster``) and readable by the app.
  Errors are ARM's ``{"error": {code, message}}``.

``token_review`` is the stand-in cluster's webhook (tests/support/kube_api.py): it accepts only unexpired
tokens this stand-in issued for the AKS AAD server application. ``calls`` records (step, HTTP status).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jwt
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.launchers.cloud_endpoints import AKS_AAD_SERVER_APPLICATION, AzureEndpoints
from tests.support.https_standin import serve_tls
from tests.support.kube_api import CertificateAuthority
from tests.support.oidc_relying_party import Verifier

TENANT = "0f9e8d7c-6b5a-4c3d-8e2f-1a0b9c8d7e6f"
CLIENT = "3c2b1a09-8f7e-4d6c-9b5a-4e3d2c1b0a9f"
SUBSCRIPTION = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d"
EXCHANGE_AUDIENCE = "api://AzureADTokenExchange"
JWT_BEARER = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
_TOKEN = re.compile(r"^/(?P<tenant>[^/]+)/oauth2/v2\.0/token$")
_CLUSTER = re.compile(
    r"^/subscriptions/(?P<subscription>[^/]+)/resourceGroups/(?P<group>[^/]+)"
    r"/providers/Microsoft\.ContainerService/managedClusters/(?P<name>[^/]+)"
    r"(?P<action>/listClusterUserCredential)?$"
)


@dataclass
class Grant:
    """A token this stand-in issued: for which resource, to which app, until when."""

    resource: str
    client_id: str
    expires_at: float


@dataclass
class App:
    #: (issuer, subject) of its federated credentials, audience api://AzureADTokenExchange.
    federated: set[tuple[str, str]] = field(default_factory=set)


@dataclass
class AksCluster:
    fqdn: str
    ca_data: str
    #: App client ids with read and listClusterUserCredential on it.
    readers: set[str] = field(default_factory=set)
    aad: bool = True


def _aad_error(status: int, error: str, description: str) -> JSONResponse:
    code = re.match(r"AADSTS(\d+)", description)
    return JSONResponse(
        {"error": error, "error_description": description, "error_codes": [int(code[1])] if code else []},
        status_code=status,
    )


def _arm_error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


class AzureStandIn:
    """See the module docstring. ``with AzureStandIn(...).serving(ca, dir) as azure:`` sets ``url``."""

    def __init__(self, issuer: Verifier, *, token_lifetime_seconds: int = 3599) -> None:
        self.issuer = issuer
        self.token_lifetime_seconds = token_lifetime_seconds
        #: tenant -> client id -> app registration.
        self.tenants: dict[str, dict[str, App]] = {}
        self.clusters: dict[tuple[str, str, str], AksCluster] = {}
        self.tokens: dict[str, Grant] = {}
        #: Every assertion and bearer token a client presented.
        self.presented: list[str] = []
        self.calls: list[tuple[str, int]] = []
        self.url = ""

    # --- set-up ---------------------------------------------------------------------------------------

    def add_app(self, tenant: str, client_id: str, *, federated: set[tuple[str, str]]) -> None:
        self.tenants.setdefault(tenant, {})[client_id] = App(set(federated))

    def add_cluster(
        self,
        subscription: str,
        group: str,
        name: str,
        *,
        fqdn: str,
        ca_data: str,
        readers: set[str] | None = None,
        aad: bool = True,
    ) -> None:
        self.clusters[(subscription, group, name)] = AksCluster(fqdn, ca_data, set(readers or ()), aad)

    def endpoints(self, **changes: Any) -> AzureEndpoints:
        values: dict[str, Any] = {
            "authority_host": self.url,
            "resource_manager_url": self.url,
            "timeout_seconds": 10.0,
            **changes,
        }
        return AzureEndpoints(**values)

    @contextlib.contextmanager
    def serving(self, ca: CertificateAuthority, work_dir: Path) -> Iterator[AzureStandIn]:
        """Serve over TLS (a certificate from ``ca``) until the block ends; ``url`` is set meanwhile."""
        with serve_tls(self.app(), ca, work_dir, "azure-stand-in") as url:
            self.url = url
            yield self

    # --- the cluster's webhook ------------------------------------------------------------------------

    def token_review(self, token: str) -> bool:
        grant = self.tokens.get(token)
        return (
            grant is not None
            and grant.resource == AKS_AAD_SERVER_APPLICATION
            and grant.expires_at > time.time()
        )

    # --- the app --------------------------------------------------------------------------------------

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST"])])

    async def _handle(self, request: Request) -> Response:
        path = request.url.path
        if request.method == "POST" and (match := _TOKEN.match(path)):
            step, response = "aad", await self._token(request, match["tenant"])
        elif match := _CLUSTER.match(path):
            action = match["action"]
            step = "arm-credentials" if action else "arm-cluster"
            if (request.method == "POST") != bool(action):
                response = _arm_error(405, "MethodNotAllowed", f"{request.method} is not allowed here")
            else:
                response = self._cluster(
                    request, match["subscription"], match["group"], match["name"], action
                )
        else:
            step, response = "unknown", _arm_error(404, "NotFound", f"no such route: {path}")
        self.calls.append((step, response.status_code))
        return response

    async def _token(self, request: Request, tenant: str) -> Response:
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
        apps = self.tenants.get(tenant)
        if apps is None:
            return _aad_error(
                400,
                "invalid_request",
                f"AADSTS900023: Specified tenant identifier '{tenant}' is neither a valid "
                "DNS name, nor a valid external domain.",
            )
        if form.get("grant_type") != "client_credentials" or form.get("client_assertion_type") != JWT_BEARER:
            return _aad_error(
                400, "unsupported_grant_type", "AADSTS70003: The app requested an unsupported grant type."
            )
        client_id = form.get("client_id", "")
        app = apps.get(client_id)
        if app is None:
            return _aad_error(
                400,
                "unauthorized_client",
                f"AADSTS700016: Application with identifier '{client_id}' was not found in the directory "
                f"'{tenant}'.",
            )
        assertion = form.get("client_assertion", "")
        self.presented.append(assertion)
        # In a thread: a RelyingParty fetches the issuer's documents (blocking).
        problem = await asyncio.to_thread(self._check_assertion, app, assertion)
        if problem is not None:
            return _aad_error(400, "invalid_client", problem)
        scope = form.get("scope", "")
        resource = scope.removesuffix("/.default")
        if not scope.endswith("/.default") or resource not in (AKS_AAD_SERVER_APPLICATION, self.url):
            return _aad_error(
                400,
                "invalid_resource",
                f"AADSTS500011: The resource principal named {resource} was not found in the tenant named "
                f"{tenant}.",
            )
        token = f"aad.{secrets.token_urlsafe(32)}"
        self.tokens[token] = Grant(resource, client_id, time.time() + self.token_lifetime_seconds)
        return JSONResponse(
            {
                "token_type": "Bearer",
                "expires_in": self.token_lifetime_seconds,
                "ext_expires_in": self.token_lifetime_seconds,
                "access_token": token,
            }
        )

    def _check_assertion(self, app: App, assertion: str) -> str | None:
        try:
            claims = self.issuer.verify(assertion, audience=EXCHANGE_AUDIENCE)
        except jwt.InvalidAudienceError:
            audience = jwt.decode(assertion, options={"verify_signature": False}).get("aud")
            return (
                "AADSTS700212: No matching federated identity record found for presented assertion audience "
                f"'{audience}'."
            )
        except (jwt.ExpiredSignatureError, jwt.ImmatureSignatureError):
            return "AADSTS700024: Client assertion is not within its valid time range."
        except jwt.InvalidIssuerError:
            issuer = jwt.decode(assertion, options={"verify_signature": False}).get("iss")
            return (
                "AADSTS700211: No matching federated identity record found for presented assertion issuer "
                f"'{issuer}'."
            )
        except jwt.PyJWTError:
            return "AADSTS7000274: The signature of the client assertion could not be verified."
        if (claims["iss"], claims["sub"]) not in app.federated:
            return (
                "AADSTS700213: No matching federated identity record found for presented assertion subject "
                f"'{claims['sub']}'."
            )
        return None

    def _cluster(
        self, request: Request, subscription: str, group: str, name: str, action: str | None
    ) -> Response:
        if not request.query_params.get("api-version"):
            return _arm_error(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required.",
            )
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else ""
        self.presented.append(token)
        grant = self.tokens.get(token)
        if grant is None or grant.resource != self.url or grant.expires_at <= time.time():
            return _arm_error(401, "InvalidAuthenticationToken", "The access token is invalid.")
        cluster = self.clusters.get((subscription, group, name))
        if cluster is None:
            return _arm_error(
                404,
                "ResourceNotFound",
                f"The Resource 'Microsoft.ContainerService/managedClusters/{name}' under resource group "
                f"'{group}' was not found.",
            )
        if grant.client_id not in cluster.readers:
            verb = "listClusterUserCredential/action" if action else "read"
            return _arm_error(
                403,
                "AuthorizationFailed",
                f"The client '{grant.client_id}' does not have authorization to perform action "
                f"'Microsoft.ContainerService/managedClusters/{verb}' over scope "
                f"'/subscriptions/{subscription}/resourceGroups/{group}'.",
            )
        if action:
            return JSONResponse(
                {"kubeconfigs": [{"name": "clusterUser", "value": self._kubeconfig(name, cluster)}]}
            )
        properties: dict[str, Any] = {"provisioningState": "Succeeded", "fqdn": cluster.fqdn}
        if cluster.aad:
            properties["aadProfile"] = {"managed": True, "enableAzureRBAC": False}
        return JSONResponse(
            {"name": name, "type": "Microsoft.ContainerService/ManagedClusters", "properties": properties}
        )

    def _kubeconfig(self, name: str, cluster: AksCluster) -> str:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": name,
                    "cluster": {
                        "certificate-authority-data": cluster.ca_data,
                        "server": f"https://{cluster.fqdn}",
                    },
                }
            ],
            "users": [
                {
                    "name": f"clusterUser_{name}",
                    "user": {"exec": {"command": "kubelogin", "args": ["get-token"]}},
                }
            ],
            "contexts": [{"name": name, "context": {"cluster": name, "user": f"clusterUser_{name}"}}],
            "current-context": name,
        }
        return base64.b64encode(yaml.safe_dump(config).encode()).decode()
