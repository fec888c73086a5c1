"""A stand-in for the Google services a ``kubernetes-gke`` runner uses: Security Token Service, the IAM
Service Account Credentials API and the GKE API. It is NOT Google; it checks what it receives as they do:

- STS (``POST /v1/token``, RFC 8693 form): the grant and token types, that ``audience`` names the pool
  provider, and the subject token with the issuer's ``verify`` (``TestIssuer``, or the real server's
  issuer through ``RelyingParty``): signature, issuer, expiry, and an audience the provider allows (by
  default its own resource name, with or without ``https:``). It answers a federated token for the
  principal of the token's ``sub``.
- IAM (``POST /v1/projects/-/serviceAccounts/{email}:generateAccessToken``): a federated token as bearer,
  and a ``roles/iam.workloadIdentityUser`` binding of the service account for that subject
  (``allow_impersonation``); answers the service account's access token.
- GKE (``GET /v1/projects/{p}/locations/{l}/clusters/{name}``): a service account's access token as bearer,
  the cluster known (``add_cluster``) and readable by that service account.

Errors are Google's shapes: ``{"error", "error_description"}`` from STS, ``{"error": {code, message,
status}}`` from the APIs. ``token_review`` is the stand-in cluster's webhook (tests/support/kube_api.py):
it accepts only unexpired access tokens this stand-in issued. ``calls`` records (step, HTTP status).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jwt
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orchestrator.launchers.cloud_endpoints import GoogleEndpoints
from tests.support.https_standin import serve_tls
from tests.support.kube_api import CertificateAuthority
from tests.support.oidc_relying_party import Verifier

POOL = "projects/123456789012/locations/global/workloadIdentityPools/orchestrator"
AUDIENCE = f"//iam.googleapis.com/{POOL}/providers/platform-orchestrator"
SERVICE_ACCOUNT = "platform-orchestrator-runner@my-gcp-project.iam.gserviceaccount.com"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TYPE = "urn:ietf:params:oauth:token-type:jwt"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
_IMPERSONATE = re.compile(r"^/v1/projects/-/serviceAccounts/(?P<email>[^/:]+):generateAccessToken$")
_CLUSTER = re.compile(r"^/v1/(?P<path>projects/[^/]+/locations/[^/]+/clusters/[^/]+)$")


@dataclass
class Grant:
    """Whom a token this stand-in issued stands for, until when."""

    principal: str
    expires_at: float


@dataclass
class GkeCluster:
    endpoint: str
    ca_data: str
    private_endpoint: str | None = None
    #: Service accounts with ``container.clusters.get`` on it.
    readers: set[str] = field(default_factory=set)


def _oauth_error(status: int, error: str, description: str) -> JSONResponse:
    return JSONResponse({"error": error, "error_description": description}, status_code=status)


def _api_error(code: int, status: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "status": status}}, status_code=code)


def _unauthenticated() -> JSONResponse:
    return _api_error(
        401,
        "UNAUTHENTICATED",
        "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or "
        "other valid authentication credential.",
    )


class GcpStandIn:
    """See the module docstring. ``with GcpStandIn(...).serving(ca, dir) as gcp:`` sets ``gcp.url``."""

    def __init__(
        self,
        issuer: Verifier,
        *,
        audience: str = AUDIENCE,
        allowed_audiences: list[str] | None = None,
        token_lifetime_seconds: int = 3600,
    ) -> None:
        self.issuer = issuer
        self.audience = audience
        self.allowed_audiences = allowed_audiences or [audience, f"https:{audience}"]
        self.token_lifetime_seconds = token_lifetime_seconds
        #: Service account email -> subjects whose principal holds roles/iam.workloadIdentityUser on it.
        self.impersonators: dict[str, set[str]] = {}
        self.clusters: dict[str, GkeCluster] = {}
        self.federated: dict[str, Grant] = {}
        self.access_tokens: dict[str, Grant] = {}
        #: Every token a client presented to STS (subject tokens) or the APIs (bearers).
        self.presented: list[str] = []
        self.calls: list[tuple[str, int]] = []
        self.url = ""

    # --- set-up ---------------------------------------------------------------------------------------

    def allow_impersonation(self, service_account: str, subject: str) -> None:
        self.impersonators.setdefault(service_account, set()).add(subject)

    def add_cluster(
        self,
        project: str,
        location: str,
        name: str,
        *,
        endpoint: str,
        ca_data: str,
        private_endpoint: str | None = None,
        readers: set[str] | None = None,
    ) -> None:
        path = f"projects/{project}/locations/{location}/clusters/{name}"
        self.clusters[path] = GkeCluster(endpoint, ca_data, private_endpoint, set(readers or ()))

    def endpoints(self, **changes: Any) -> GoogleEndpoints:
        values: dict[str, Any] = {
            "sts_url": f"{self.url}/v1/token",
            "iam_credentials_url": self.url,
            "container_api_url": self.url,
            "timeout_seconds": 10.0,
            **changes,
        }
        return GoogleEndpoints(**values)

    @contextlib.contextmanager
    def serving(self, ca: CertificateAuthority, work_dir: Path) -> Iterator[GcpStandIn]:
        """Serve over TLS (a certificate from ``ca``) until the block ends; ``url`` is set meanwhile."""
        with serve_tls(self.app(), ca, work_dir, "gcp-stand-in") as url:
            self.url = url
            yield self

    # --- the cluster's webhook ------------------------------------------------------------------------

    def token_review(self, token: str) -> bool:
        grant = self.access_tokens.get(token)
        return grant is not None and grant.expires_at > time.time()

    # --- the app --------------------------------------------------------------------------------------

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST"])])

    async def _handle(self, request: Request) -> Response:
        path = request.url.path
        if request.method == "POST" and path == "/v1/token":
            step, response = "sts", await self._sts(request)
        elif request.method == "POST" and (match := _IMPERSONATE.match(path)):
            step, response = "iam", await self._impersonate(request, match["email"])
        elif request.method == "GET" and (match := _CLUSTER.match(path)):
            step, response = "gke", self._cluster(request, match["path"])
        else:
            step, response = "unknown", _api_error(404, "NOT_FOUND", f"no such method: {path}")
        self.calls.append((step, response.status_code))
        return response

    def _bearer(self, request: Request, grants: dict[str, Grant]) -> Grant | None:
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer "):
            return None
        token = header.removeprefix("Bearer ")
        self.presented.append(token)
        grant = grants.get(token)
        return grant if grant is not None and grant.expires_at > time.time() else None

    def _mint(self, prefix: str, principal: str, grants: dict[str, Grant]) -> tuple[str, float]:
        token = f"{prefix}{secrets.token_urlsafe(32)}"
        expires_at = time.time() + self.token_lifetime_seconds
        grants[token] = Grant(principal, expires_at)
        return token, expires_at

    async def _sts(self, request: Request) -> Response:
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
        if form.get("grant_type") != TOKEN_EXCHANGE:
            return _oauth_error(400, "unsupported_grant_type", "The grant type is not supported.")
        if form.get("audience") != self.audience:
            return _oauth_error(
                400,
                "invalid_target",
                'The target service indicated by the "audience" parameters is invalid. This might either be '
                "because the pool or provider is disabled or deleted or because it doesn't exist.",
            )
        if (
            form.get("subject_token_type") != JWT_TYPE
            or form.get("requested_token_type") != ACCESS_TOKEN_TYPE
        ):
            return _oauth_error(400, "invalid_request", "Invalid subject_token_type or requested_token_type.")
        subject_token = form.get("subject_token", "")
        self.presented.append(subject_token)
        # In a thread: a RelyingParty fetches the issuer's documents (blocking).
        claims, problem = await asyncio.to_thread(self._verify, subject_token)
        if claims is None:
            return _oauth_error(400, "invalid_grant", problem)
        token, expires_at = self._mint("sts.", str(claims["sub"]), self.federated)
        return JSONResponse(
            {
                "access_token": token,
                "issued_token_type": ACCESS_TOKEN_TYPE,
                "token_type": "Bearer",
                "expires_in": int(expires_at - time.time()),
            }
        )

    def _verify(self, token: str) -> tuple[dict[str, Any] | None, str]:
        problem = "Invalid ID Token."
        for audience in self.allowed_audiences:
            try:
                return self.issuer.verify(token, audience=audience), ""
            except jwt.InvalidAudienceError:
                unverified = jwt.decode(token, options={"verify_signature": False})
                audience_seen = unverified.get("aud")
                problem = f"The audience in ID Token [{audience_seen}] does not match the expected audience."
            except jwt.InvalidIssuerError:
                return None, "The issuer in ID Token does not match the expected issuer."
            except jwt.ExpiredSignatureError:
                return None, "ID Token expired."
            except jwt.PyJWTError:
                return None, "Invalid ID Token: the signature could not be verified."
        return None, problem

    async def _impersonate(self, request: Request, email: str) -> Response:
        grant = self._bearer(request, self.federated)
        if grant is None:
            return _unauthenticated()
        if grant.principal not in self.impersonators.get(email, set()):
            return _api_error(
                403,
                "PERMISSION_DENIED",
                "Permission 'iam.serviceAccounts.getAccessToken' denied on resource (or it may not exist).",
            )
        body = await request.json()
        if CLOUD_PLATFORM not in body.get("scope", []):
            return _api_error(400, "INVALID_ARGUMENT", "Scope is required.")
        token, expires_at = self._mint("ya29.stand-in.", email, self.access_tokens)
        expire_time = datetime.fromtimestamp(expires_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return JSONResponse({"accessToken": token, "expireTime": expire_time})

    def _cluster(self, request: Request, path: str) -> Response:
        grant = self._bearer(request, self.access_tokens)
        if grant is None:
            return _unauthenticated()
        cluster = self.clusters.get(path)
        if cluster is None:
            return _api_error(404, "NOT_FOUND", f"Not found: {path}.")
        if grant.principal not in cluster.readers:
            return _api_error(
                403, "PERMISSION_DENIED", f'Required "container.clusters.get" permission(s) for "{path}".'
            )
        body: dict[str, Any] = {
            "name": path.rsplit("/", 1)[1],
            "status": "RUNNING",
            "endpoint": cluster.endpoint,
            "masterAuth": {"clusterCaCertificate": cluster.ca_data},
        }
        if cluster.private_endpoint is not None:
            body["privateClusterConfig"] = {
                "enablePrivateNodes": True,
                "privateEndpoint": cluster.private_endpoint,
            }
        return JSONResponse(body)
