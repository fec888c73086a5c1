"""A stand-in for the AWS APIs the ``kubernetes-eks`` and ``serverless-ecs`` runner types use. It is NOT
AWS: moto's STS accepts any web identity token unchecked and any signature, so the exchanges that decide
who may do what are played here, with AWS's wire formats and error codes, for the real client (botocore):

- **STS** (query protocol; XML, or JSON when asked with ``Accept: application/json``):
  ``AssumeRoleWithWebIdentity`` verifies the token with the OIDC provider registered for its ``iss``
  (``OidcProvider``: signature, expiry, audience ``sts.amazonaws.com``), then the role's trust (its
  ``subjects``: the ``sub`` values the trust policy allows), and answers temporary credentials;
  ``GetCallerIdentity`` (header-signed or presigned, as EKS tokens are) answers the caller's ARN.
- **EKS** (REST-JSON): ``DescribeCluster`` of the clusters added with ``add_eks_cluster`` (per region).
- **ECS** (JSON 1.1): the actions of tests/support/ecs_standin.py, whose "Fargate" runs the tasks.

Every signed request is checked like AWS checks it (tests/support/sigv4.py): the access key must be one
this stand-in issued and not expired, the session token the one issued with it, and the SigV4 signature
is recomputed with the issued secret key. Each action is then checked against the role's ``allowed``
actions (an IAM stand-in: ``"service:Action"`` strings, ``"*"`` for all).

``token_review(cluster)`` is what EKS's aws-iam-authenticator does with a ``k8s-aws-v1.`` bearer token,
for ``KubeApiServer(auth="token", token_review=...)``: decode the presigned URL, check that it is a
``GetCallerIdentity`` of this STS with ``x-k8s-aws-id`` signed and at most 15 minutes old, send it with the
header ``x-k8s-aws-id: <cluster>``, and accept the caller if its role has an access entry on the cluster. An
accepted token is remembered for 2 minutes, as kube-apiserver caches webhook answers.

Usage::

    with AwsStandIn(tmp_path, providers=[OidcProvider.of(issuer)], roles=[Role("deployer", {sub})]) as aws:
        aws.url                                     # endpoint of STS, EKS and ECS
        aws.add_eks_cluster("prod", "eu-west-1", endpoint=api.url, ca_data=api.ca_data, access=[arn])
        aws.calls                                   # (service, action, HTTP status) of every request
"""

from __future__ import annotations

import base64
import binascii
import calendar
import json
import secrets
import string
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit
from xml.sax.saxutils import escape

import httpx
import jwt

from tests.support import sigv4
from tests.support.ecs_standin import EcsError, EcsStandIn
from tests.support.kube_api import LocalImage
from tests.support.workload_identity import TestIssuer

ACCOUNT = "123456789012"
AUDIENCE = "sts.amazonaws.com"
STS_NAMESPACE = "https://sts.amazonaws.com/doc/2011-06-15/"
ECS_TARGET_PREFIX = "AmazonEC2ContainerServiceV20141113."
#: aws-iam-authenticator refuses tokens signed longer ago than this.
EKS_TOKEN_MAX_AGE_SECONDS = 15 * 60
#: How long a cluster remembers a token it accepted (kube-apiserver's
#: ``--authentication-token-webhook-cache-ttl``, 2 minutes).
TOKEN_REVIEW_CACHE_SECONDS = 120.0


class AwsError(Exception):
    """An AWS error answer: HTTP status, error code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Role:
    """An IAM role: who may assume it by web identity, and what its policies allow."""

    name: str
    #: ``sub`` values its trust policy accepts for ``AssumeRoleWithWebIdentity`` (with aud sts.amazonaws.com).
    subjects: frozenset[str] = frozenset()
    #: ``"service:Action"`` its policies allow (``"*"``: everything, ``"ecs:*"``: a whole service).
    allowed: frozenset[str] = frozenset({"*"})
    #: Whether ``ecs-tasks.amazonaws.com`` may assume it (execution and task roles).
    ecs_tasks: bool = False
    account: str = ACCOUNT

    @property
    def arn(self) -> str:
        return f"arn:aws:iam::{self.account}:role/{self.name}"

    def allows(self, action: str) -> bool:
        service = action.split(":", 1)[0]
        return bool({"*", f"{service}:*", action} & self.allowed)


@dataclass(frozen=True)
class OidcProvider:
    """An IAM OIDC identity provider: the issuer URL and how its tokens are verified (signature, ``iss``,
    ``exp``, ``aud`` = ``sts.amazonaws.com``); ``verify`` raises ``jwt.InvalidTokenError``."""

    issuer: str
    verify: Callable[[str], Mapping[str, Any]]

    @classmethod
    def of(cls, issuer: TestIssuer) -> OidcProvider:
        return cls(issuer.issuer, lambda token: issuer.verify(token, audience=AUDIENCE))

    @classmethod
    def discovered(cls, issuer_url: str) -> OidcProvider:
        """A provider for a real issuer: its keys from ``jwks_uri`` of its discovery document, as STS
        fetches them."""
        document = httpx.get(f"{issuer_url.rstrip('/')}/.well-known/openid-configuration", timeout=10).json()
        keys = jwt.PyJWKClient(document["jwks_uri"], cache_keys=False)

        def verify(token: str) -> Mapping[str, Any]:
            key = keys.get_signing_key_from_jwt(token).key
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=["RS256", "ES256"], audience=AUDIENCE, issuer=document["issuer"]
            )
            return claims

        return cls(document["issuer"], verify)


@dataclass
class Issued:
    """Temporary credentials this STS answered."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str = field(repr=False)
    role: Role
    session_name: str
    subject: str
    expires_at: float

    @property
    def assumed_arn(self) -> str:
        return f"arn:aws:sts::{self.role.account}:assumed-role/{self.role.name}/{self.session_name}"


@dataclass
class EksCluster:
    name: str
    region: str
    endpoint: str
    ca_data: str
    status: str = "ACTIVE"
    #: IAM role ARNs with an access entry: aws-iam-authenticator maps their sessions to a Kubernetes user.
    access_entries: set[str] = field(default_factory=set)
    account: str = ACCOUNT

    @property
    def arn(self) -> str:
        return f"arn:aws:eks:{self.region}:{self.account}:cluster/{self.name}"


@dataclass(frozen=True)
class Call:
    service: str
    action: str
    status: int
    #: The assumed-role ARN of a signed request that authenticated.
    caller: str | None = None


@dataclass(frozen=True)
class Review:
    """One ``token_review`` of a bearer token by a cluster."""

    cluster: str
    caller: str | None
    accepted: bool
    why: str


def _random(alphabet: str, length: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class AwsStandIn:
    """STS, EKS and ECS on one endpoint (a ThreadingHTTPServer on 127.0.0.1, a free port)."""

    def __init__(
        self,
        work_dir: Path,
        *,
        providers: Iterable[OidcProvider] = (),
        roles: Iterable[Role] = (),
        images: Mapping[str, LocalImage] | None = None,
        session_seconds: int = 3600,
        account: str = ACCOUNT,
    ) -> None:
        self.work_dir = work_dir
        self.providers = {p.issuer: p for p in providers}
        self.roles = {r.arn: r for r in roles}
        self.session_seconds = session_seconds
        self.account = account
        self.eks_clusters: dict[tuple[str, str], EksCluster] = {}
        self.calls: list[Call] = []
        self.reviews: list[Review] = []
        self.issued: dict[str, Issued] = {}
        #: Web identity tokens presented to AssumeRoleWithWebIdentity, in order.
        self.presented_tokens: list[str] = []
        self.lock = threading.RLock()
        self.ecs = EcsStandIn(work_dir / "ecs", images=images or {}, roles=self.roles, account=account)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # --- set-up --------------------------------------------------------------------------------------

    def add_role(self, role: Role) -> Role:
        with self.lock:
            self.roles[role.arn] = role
        return role

    def add_eks_cluster(
        self,
        name: str,
        region: str,
        *,
        endpoint: str,
        ca_data: str,
        access: Iterable[str] = (),
        status: str = "ACTIVE",
    ) -> EksCluster:
        cluster = EksCluster(name, region, endpoint, ca_data, status, set(access), self.account)
        with self.lock:
            self.eks_clusters[(region, name)] = cluster
        return cluster

    def expire_credentials(self) -> None:
        """Every issued credential expires now (as if an hour had passed)."""
        with self.lock:
            for issued in self.issued.values():
                issued.expires_at = time.time() - 1

    # --- lifecycle -----------------------------------------------------------------------------------

    def __enter__(self) -> AwsStandIn:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                standin._serve(self)

            def do_POST(self) -> None:
                standin._serve(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.ecs.start()

    def stop(self) -> None:
        self.ecs.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # --- requests ------------------------------------------------------------------------------------

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        raw_path, _, raw_query = handler.path.partition("?")
        headers = {k.lower(): v for k, v in handler.headers.items()}
        request = _Request(handler.command, raw_path, raw_query, headers, body)
        target = headers.get("x-amz-target", "")
        if target.startswith(ECS_TARGET_PREFIX):
            status, content_type, payload, extra = self._ecs_request(
                request, target[len(ECS_TARGET_PREFIX) :]
            )
        elif raw_path.startswith("/clusters/"):
            status, content_type, payload, extra = self._eks_request(request)
        elif raw_path in ("", "/"):
            status, content_type, payload, extra = self._sts_request(request)
        else:
            status, content_type, payload, extra = 404, "application/json", b'{"message": "Not Found"}', {}
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(payload)))
        handler.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        for name, value in extra.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(payload)

    def _record(self, service: str, action: str, status: int, caller: Issued | None) -> None:
        with self.lock:
            self.calls.append(Call(service, action, status, caller.assumed_arn if caller else None))

    def authenticate(self, request: _Request, service: str) -> tuple[Issued, sigv4.Signed]:
        """The issued credentials that signed the request; AwsError (in STS's codes) otherwise."""
        try:
            signed = sigv4.parse(request.method, request.raw_query, request.headers)
        except sigv4.SignatureError as exc:
            raise AwsError(403, exc.code, exc.message) from exc
        if signed.service != service:
            raise AwsError(
                403, "SignatureDoesNotMatch", f"Credential should be scoped to correct service: '{service}'."
            )
        with self.lock:
            issued = self.issued.get(signed.access_key_id)
        if issued is None:
            raise AwsError(
                403, "InvalidClientTokenId", "The security token included in the request is invalid."
            )
        if time.time() >= issued.expires_at:
            raise AwsError(400, "ExpiredToken", "The security token included in the request is expired")
        try:
            sigv4.verify(
                signed,
                secret_access_key=issued.secret_access_key,
                session_token=issued.session_token,
                method=request.method,
                host=request.headers.get("host", ""),
                raw_path=request.raw_path or "/",
                raw_query=request.raw_query,
                headers=request.headers,
                body=request.body,
            )
        except sigv4.SignatureError as exc:
            raise AwsError(403, exc.code, exc.message) from exc
        return issued, signed

    @staticmethod
    def authorize(caller: Issued, action: str, resource: str, *, status: int = 403) -> None:
        if not caller.role.allows(action):
            code = "AccessDenied" if action.startswith("sts:") else "AccessDeniedException"
            raise AwsError(
                status,
                code,
                f"User: {caller.assumed_arn} is not authorized to perform: {action} on resource: {resource} "
                f"because no identity-based policy allows the {action} action",
            )

    # --- STS -----------------------------------------------------------------------------------------

    def _sts_request(self, request: _Request) -> _Answer:
        params = dict(parse_qsl(request.raw_query, keep_blank_values=True))
        if request.method == "POST":
            params.update(parse_qsl(request.body.decode(errors="replace"), keep_blank_values=True))
        action = params.get("Action", "")
        as_json = "application/json" in request.headers.get("accept", "")
        caller: Issued | None = None
        try:
            if params.get("Version") != "2011-06-15":
                raise AwsError(400, "InvalidAction", "Version 2011-06-15 is the only one")
            if action == "AssumeRoleWithWebIdentity":
                result = self._assume_role_with_web_identity(params)
            elif action == "GetCallerIdentity":
                caller, _ = self.authenticate(request, "sts")
                result = {
                    "Arn": caller.assumed_arn,
                    "UserId": f"AROA{caller.role.name.upper()[:17]}:{caller.session_name}",
                    "Account": caller.role.account,
                }
            else:
                raise AwsError(
                    400, "InvalidAction", f"Could not find operation {action} for version 2011-06-15"
                )
        except AwsError as exc:
            self._record("sts", action, exc.status, caller)
            return _sts_error(exc, as_json)
        self._record("sts", action, 200, caller)
        return _sts_answer(action, result, as_json)

    def _assume_role_with_web_identity(self, params: Mapping[str, str]) -> dict[str, Any]:
        token = params.get("WebIdentityToken", "")
        role_arn = params.get("RoleArn", "")
        session_name = params.get("RoleSessionName", "")
        with self.lock:
            self.presented_tokens.append(token)
        if not 2 <= len(session_name) <= 64 or any(c not in _SESSION_CHARACTERS for c in session_name):
            raise AwsError(
                400, "ValidationError", "1 validation error detected: Value at 'roleSessionName' failed"
            )
        try:
            issuer = jwt.decode(token, options={"verify_signature": False}).get("iss")
        except jwt.InvalidTokenError as exc:
            raise AwsError(
                400, "InvalidIdentityToken", "The web identity token that was passed is not a valid JWT"
            ) from exc
        provider = self.providers.get(str(issuer))
        if provider is None:
            raise AwsError(
                400, "InvalidIdentityToken", f"No OpenIDConnect provider found in your account for {issuer}"
            )
        try:
            claims = provider.verify(token)
        except jwt.ExpiredSignatureError as exc:
            raise AwsError(
                400, "ExpiredTokenException", "Token expired: the token's exp is in the past"
            ) from exc
        except jwt.InvalidAudienceError as exc:
            raise AwsError(400, "InvalidIdentityToken", "Incorrect token audience") from exc
        except jwt.InvalidTokenError as exc:
            raise AwsError(
                400,
                "InvalidIdentityToken",
                "The web identity token that was passed could not be validated by AWS. Get a new identity "
                "token from the identity provider and then retry the request.",
            ) from exc
        with self.lock:
            role = self.roles.get(role_arn)
        subject = str(claims.get("sub", ""))
        if role is None or subject not in role.subjects:
            raise AwsError(403, "AccessDenied", "Not authorized to perform sts:AssumeRoleWithWebIdentity")
        seconds = int(params.get("DurationSeconds") or self.session_seconds)
        issued = Issued(
            access_key_id="ASIA" + _random(string.ascii_uppercase + string.digits, 16),
            secret_access_key=_random(string.ascii_letters + string.digits + "+/", 40),
            session_token=base64.b64encode(secrets.token_bytes(96)).decode(),
            role=role,
            session_name=session_name,
            subject=subject,
            expires_at=float(int(time.time()) + seconds),
        )
        with self.lock:
            self.issued[issued.access_key_id] = issued
        return {
            "Credentials": {
                "AccessKeyId": issued.access_key_id,
                "SecretAccessKey": issued.secret_access_key,
                "SessionToken": issued.session_token,
                "Expiration": _iso(issued.expires_at),
            },
            "SubjectFromWebIdentityToken": subject,
            "AssumedRoleUser": {
                "Arn": issued.assumed_arn,
                "AssumedRoleId": f"AROA{role.name.upper()[:17]}:{session_name}",
            },
            "Provider": str(issuer),
            "Audience": AUDIENCE,
        }

    # --- EKS -----------------------------------------------------------------------------------------

    def _eks_request(self, request: _Request) -> _Answer:
        name = request.raw_path.removeprefix("/clusters/")
        caller: Issued | None = None
        try:
            if request.method != "GET" or "/" in name or not name:
                raise AwsError(404, "ResourceNotFoundException", "Not Found")
            caller, signed = self.authenticate(request, "eks")
            with self.lock:
                cluster = self.eks_clusters.get((signed.region, name))
            arn = cluster.arn if cluster else f"arn:aws:eks:{signed.region}:{self.account}:cluster/{name}"
            self.authorize(caller, "eks:DescribeCluster", arn)
            if cluster is None:
                raise AwsError(404, "ResourceNotFoundException", f"No cluster found for name: {name}.")
        except AwsError as exc:
            self._record("eks", "DescribeCluster", exc.status, caller)
            code = {
                "InvalidClientTokenId": "UnrecognizedClientException",
                "SignatureDoesNotMatch": "InvalidSignatureException",
                "ExpiredToken": "ExpiredTokenException",
            }.get(exc.code, exc.code)
            body = json.dumps({"message": exc.message}).encode()
            return exc.status, "application/json", body, {"x-amzn-ErrorType": code}
        self._record("eks", "DescribeCluster", 200, caller)
        described = {
            "name": cluster.name,
            "arn": cluster.arn,
            "createdAt": time.time() - 3600,
            "version": "1.33",
            "endpoint": cluster.endpoint,
            "roleArn": f"arn:aws:iam::{self.account}:role/eks-cluster",
            "resourcesVpcConfig": {"subnetIds": [], "endpointPublicAccess": True},
            "certificateAuthority": {"data": cluster.ca_data},
            "status": cluster.status,
            "platformVersion": "eks.1",
            "accessConfig": {"authenticationMode": "API_AND_CONFIG_MAP"},
        }
        return 200, "application/json", json.dumps({"cluster": described}).encode(), {}

    def token_review(self, cluster_name: str) -> Callable[[str], bool]:
        """aws-iam-authenticator for the cluster named ``cluster_name`` (any region)."""

        accepted_until: dict[str, float] = {}

        def review(token: str) -> bool:
            if accepted_until.get(token, 0.0) > time.monotonic():
                return True
            caller, why = self._review(cluster_name, token)
            with self.lock:
                cluster = next((c for c in self.eks_clusters.values() if c.name == cluster_name), None)
                role_arn = _role_of(caller) if caller else None
                accepted = bool(caller and cluster and role_arn in cluster.access_entries)
                if caller and not accepted:
                    why = f"{role_arn} has no access entry on cluster {cluster_name}"
                self.reviews.append(Review(cluster_name, caller, accepted, why if not accepted else "ok"))
            if accepted:
                accepted_until[token] = time.monotonic() + TOKEN_REVIEW_CACHE_SECONDS
            return accepted

        return review

    def _review(self, cluster_name: str, token: str) -> tuple[str | None, str]:
        prefix = "k8s-aws-v1."
        if not token.startswith(prefix):
            return None, "not a k8s-aws-v1. token"
        encoded = token[len(prefix) :]
        try:
            url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None, "not base64url"
        parts = urlsplit(url)
        if f"{parts.scheme}://{parts.netloc}" != self.url or parts.path not in ("", "/"):
            return None, f"not this STS: {parts.scheme}://{parts.netloc}"
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if query.get("Action") != "GetCallerIdentity":
            return None, "not a GetCallerIdentity request"
        if "x-k8s-aws-id" not in query.get("X-Amz-SignedHeaders", "").split(";"):
            return None, "x-k8s-aws-id is not signed"
        try:
            signed_at = calendar.timegm(time.strptime(query.get("X-Amz-Date", ""), "%Y%m%dT%H%M%SZ"))
        except ValueError:
            return None, "no X-Amz-Date"
        if time.time() - signed_at > EKS_TOKEN_MAX_AGE_SECONDS:
            return None, "the token is older than 15 minutes"
        try:
            response = httpx.get(
                url, headers={"x-k8s-aws-id": cluster_name, "accept": "application/json"}, timeout=5
            )
        except httpx.HTTPError as exc:
            return None, f"STS unreachable: {exc}"
        if response.status_code != 200:
            return None, f"STS answered {response.status_code}"
        result = response.json()["GetCallerIdentityResponse"]["GetCallerIdentityResult"]
        return str(result["Arn"]), "ok"

    # --- ECS -----------------------------------------------------------------------------------------

    def _ecs_request(self, request: _Request, action: str) -> _Answer:
        caller: Issued | None = None
        try:
            try:
                caller, signed = self.authenticate(request, "ecs")
            except AwsError as exc:
                code = {
                    "InvalidClientTokenId": "UnrecognizedClientException",
                    "SignatureDoesNotMatch": "InvalidSignatureException",
                    "ExpiredToken": "ExpiredTokenException",
                }.get(exc.code, exc.code)
                raise AwsError(400, code, exc.message) from exc
            try:
                params = json.loads(request.body or b"{}")
            except ValueError as exc:
                raise AwsError(400, "SerializationException", "the body is not JSON") from exc
            result = self.ecs.handle(
                action,
                params,
                region=signed.region,
                authorize=lambda act, resource: self.authorize(caller, act, resource, status=400),
            )
        except EcsError as exc:
            self._record("ecs", action, exc.status, caller)
            body = json.dumps({"__type": exc.code, "message": exc.message}).encode()
            return exc.status, "application/x-amz-json-1.1", body, {}
        except AwsError as exc:
            self._record("ecs", action, exc.status, caller)
            body = json.dumps({"__type": exc.code, "message": exc.message}).encode()
            return exc.status, "application/x-amz-json-1.1", body, {}
        self._record("ecs", action, 200, caller)
        return 200, "application/x-amz-json-1.1", json.dumps(result).encode(), {}


@dataclass(frozen=True)
class _Request:
    method: str
    raw_path: str
    raw_query: str
    headers: Mapping[str, str]
    body: bytes


_Answer = tuple[int, str, bytes, dict[str, str]]
_SESSION_CHARACTERS = frozenset(string.ascii_letters + string.digits + "+=,.@-_/")


def _role_of(assumed_arn: str) -> str:
    """``arn:aws:sts::A:assumed-role/R/S`` to the IAM role ``arn:aws:iam::A:role/R``."""
    head, _, rest = assumed_arn.partition(":assumed-role/")
    account = head.rsplit(":", 1)[-1]
    return f"arn:aws:iam::{account}:role/{rest.split('/', 1)[0]}"


def _xml(value: Any, tag: str) -> str:
    if isinstance(value, dict):
        return f"<{tag}>" + "".join(_xml(v, k) for k, v in value.items()) + f"</{tag}>"
    return f"<{tag}>{escape(str(value))}</{tag}>"


def _sts_answer(action: str, result: dict[str, Any], as_json: bool) -> _Answer:
    request_id = str(uuid.uuid4())
    if as_json:
        body = {
            f"{action}Response": {f"{action}Result": result, "ResponseMetadata": {"RequestId": request_id}}
        }
        return 200, "application/json", json.dumps(body).encode(), {}
    inner = _xml(result, f"{action}Result") + _xml({"RequestId": request_id}, "ResponseMetadata")
    text = f'<{action}Response xmlns="{STS_NAMESPACE}">{inner}</{action}Response>'
    return 200, "text/xml", text.encode(), {}


def _sts_error(exc: AwsError, as_json: bool) -> _Answer:
    error = {"Type": "Sender", "Code": exc.code, "Message": exc.message}
    request_id = str(uuid.uuid4())
    if as_json:
        return (
            exc.status,
            "application/json",
            json.dumps({"Error": error, "RequestId": request_id}).encode(),
            {},
        )
    inner = _xml(error, "Error") + _xml(request_id, "RequestId")
    text = f'<ErrorResponse xmlns="{STS_NAMESPACE}">{inner}</ErrorResponse>'
    return exc.status, "text/xml", text.encode(), {}
