"""What the AWS runner types (``kubernetes-eks``, ``serverless-ecs``) share: the orchestrator's botocore
clients on configurable endpoints, temporary role credentials by web identity (cached per runner), EKS
bearer tokens, and AWS errors translated into :class:`LaunchError`\\ s that name the cause and hold no
secret.

- ``AwsClients.role_credentials``: ``AssumeRoleWithWebIdentity`` with the orchestrator's OIDC token for
  the runner (audience ``sts.amazonaws.com``, subject ``{org_id}+{runner_id}``), the role's session named
  ``auth.session_name`` (default ``{org_id}-{runner_id}``), at STS in ``auth.sts_region`` (default: the
  cluster's or job's region). The request is unsigned, as STS wants it: the server's own AWS credentials
  (for its object store, say) are never used for a runner. The credentials are cached per runner, role,
  session name and STS region until ``refresh_margin_seconds`` before they expire.
- ``AwsClients.eks_token``: the ``k8s-aws-v1.`` token that EKS (aws-iam-authenticator) accepts: a
  presigned STS ``GetCallerIdentity`` URL, signed with the role's credentials and carrying the signed
  header ``x-k8s-aws-id: <cluster name>``, base64url without padding. It is made locally; nothing is sent.
- ``AwsClients.call``: one API operation of a service with the role's credentials.

botocore is synchronous: every call runs in a worker thread (``asyncio.to_thread``), never on the event
loop. Clients are cached per service, region and credentials (botocore clients are thread-safe; their
creation is not, so it is serialized).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import botocore
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    ParamValidationError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)
from botocore.parsers import ResponseParserError

from orchestrator.domain.runner_types import AwsTemporaryAuth
from orchestrator.launchers.base import MAX_QUOTED, LaunchTarget, WorkloadIdentity, fail, shortened, transient

__all__ = [
    "AUDIENCE",
    "EKS_TOKEN_PREFIX",
    "AwsClients",
    "AwsEndpoints",
    "TemporaryCredentials",
    "default_session_name",
    "fail",
    "translated",
]

#: The audience of the web identity token (what the IAM OIDC identity provider lists as its client id).
AUDIENCE: Final = "sts.amazonaws.com"
EKS_TOKEN_PREFIX: Final = "k8s-aws-v1."
#: The header naming the cluster in an EKS token's presigned request.
EKS_CLUSTER_HEADER: Final = "x-k8s-aws-id"
#: aws-iam-authenticator's (and ``aws eks get-token``'s) presigned URL lifetime; EKS accepts a token for
#: 15 minutes after its signing time anyway.
EKS_TOKEN_EXPIRES_SECONDS: Final = 60
#: Renew cached role credentials this long before they expire.
DEFAULT_REFRESH_MARGIN_SECONDS: Final = 300.0
#: AWS error codes that mean "ask again later".
RETRYABLE_CODES: Final = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "IDPCommunicationError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "InternalFailure",
        "InternalError",
        "ServerException",
    }
)
_MAX_CLIENTS: Final = 64


@dataclass(frozen=True, kw_only=True)
class AwsEndpoints:
    """Endpoint overrides per service (``PO_AWS_*_URL``); None: AWS's own (regional) endpoint."""

    sts: str | None = None
    eks: str | None = None
    ecs: str | None = None

    def url(self, service: str) -> str | None:
        value: str | None = getattr(self, service)
        return value


@dataclass(frozen=True, kw_only=True)
class TemporaryCredentials:
    """A role session's credentials, as STS answered them."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str = field(repr=False)
    expires_at: datetime
    #: ``arn:aws:sts::<account>:assumed-role/<role>/<session>``.
    assumed_role_arn: str

    def secrets(self) -> tuple[str, ...]:
        """What must never appear in a message or a log line."""
        return (self.secret_access_key, self.session_token)


def default_session_name(org_id: str, runner_id: str) -> str:
    """Upstream's ``{org_id}-{runner_id}``, cut to STS's 64 characters."""
    return f"{org_id}-{runner_id}"[:64]


def scrubbed(text: str, secrets: Iterable[str], *, limit: int = MAX_QUOTED) -> str:
    """``text`` shortened to one printable line of at most ``limit`` characters, every secret in it
    replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return shortened(text, limit)


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or "")


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def answer_summary(exc: ClientError, secrets: Iterable[str] = ()) -> str:
    """``Code: message`` of an AWS error answer (the HTTP status when the answer names no code)."""
    error = exc.response.get("Error", {})
    code = str(error.get("Code") or "")
    message = str(error.get("Message") or "")
    if not code or code.isdigit():
        status = _status(exc)
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        return f"{status} {phrase}".strip() + " (not an AWS error answer; the answer is not shown)"
    return f"{code}: {scrubbed(message, secrets)}" if message else code


def is_retryable(exc: ClientError) -> bool:
    return error_code(exc) in RETRYABLE_CODES or transient(_status(exc))


@contextlib.contextmanager
def translated(action: str, *, service: str, url: str | None, secrets: Iterable[str] = ()) -> Iterator[None]:
    """botocore's errors to :class:`LaunchError` ``"cannot <action>: ..."``, secrets scrubbed;
    ``retryable`` False when asking again cannot help."""
    hidden = tuple(secrets)
    where = url or f"AWS's {service.upper()} endpoint"
    try:
        yield
    except ClientError as exc:
        fail(
            f"cannot {action}: {service.upper()} refused: {answer_summary(exc, hidden)}",
            retryable=is_retryable(exc),
            cause=exc,
        )
    except ParamValidationError as exc:
        fail(f"cannot {action}: {scrubbed(str(exc), hidden)}", retryable=False, cause=exc)
    except ResponseParserError as exc:
        # Its text quotes the body: whatever answered there is not shown.
        fail(f"cannot {action}: {where} did not answer like AWS {service.upper()}", retryable=True, cause=exc)
    except (BotoConnectionError, HTTPClientError) as exc:
        fail(
            f"cannot {action}: {service.upper()} at {where} is unreachable: {scrubbed(str(exc), hidden)}",
            retryable=True,
            cause=exc,
        )
    except BotoCoreError as exc:
        fail(
            f"cannot {action}: {type(exc).__name__}: {scrubbed(str(exc), hidden)}", retryable=True, cause=exc
        )


_CacheKey = tuple[str, str, str, str]
#: One botocore session per process (loading its data files takes a while); its ``create_client`` is not
#: thread-safe, so client creation is serialized.
_SESSION: botocore.session.Session | None = None
_CREATING: Final = threading.Lock()


def _session() -> botocore.session.Session:
    global _SESSION
    if _SESSION is None:
        _SESSION = botocore.session.Session()
    return _SESSION


class AwsClients:
    """The orchestrator's way to AWS for its runners: one per server (the credential cache outlives the
    per-call launchers)."""

    def __init__(
        self,
        endpoints: AwsEndpoints | None = None,
        *,
        refresh_margin_seconds: float = DEFAULT_REFRESH_MARGIN_SECONDS,
        connect_timeout_seconds: float = 10.0,
        read_timeout_seconds: float = 30.0,
        max_attempts: int = 3,
    ) -> None:
        self.endpoints = endpoints or AwsEndpoints()
        self.refresh_margin = timedelta(seconds=refresh_margin_seconds)
        self._config = Config(
            connect_timeout=connect_timeout_seconds,
            read_timeout=read_timeout_seconds,
            retries={"mode": "standard", "max_attempts": max_attempts},
            user_agent_extra="platform-orchestrator",
        )
        self._clients: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
        self._credentials: dict[_CacheKey, TemporaryCredentials] = {}
        self._locks: dict[_CacheKey, asyncio.Lock] = {}

    # --- clients (worker threads) --------------------------------------------------------------------

    def _client(self, service: str, region: str, credentials: TemporaryCredentials | None) -> Any:
        kind = "presign" if service == "sts" and credentials is not None else service
        key = (kind, region, credentials.access_key_id if credentials else "")
        with _CREATING:
            client = self._clients.get(key)
            if client is not None:
                self._clients.move_to_end(key)
                return client
            if credentials is None:
                config = self._config.merge(Config(signature_version=botocore.UNSIGNED))
                client = _session().create_client(
                    service, region_name=region, endpoint_url=self.endpoints.url(service), config=config
                )
            else:
                client = _session().create_client(
                    service,
                    region_name=region,
                    endpoint_url=self.endpoints.url(service),
                    aws_access_key_id=credentials.access_key_id,
                    aws_secret_access_key=credentials.secret_access_key,
                    aws_session_token=credentials.session_token,
                    config=self._config,
                )
            if kind == "presign":
                _add_cluster_header(client)
            self._clients[key] = client
            while len(self._clients) > _MAX_CLIENTS:
                self._clients.popitem(last=False)
            return client

    def _invoke(
        self,
        service: str,
        region: str,
        credentials: TemporaryCredentials | None,
        operation: str,
        params: dict[str, Any],
    ) -> dict[str, Any]:
        answer: dict[str, Any] = getattr(self._client(service, region, credentials), operation)(**params)
        return answer

    def _presign(self, credentials: TemporaryCredentials, cluster_name: str, region: str) -> str:
        url: str = self._client("sts", region, credentials).generate_presigned_url(
            "get_caller_identity",
            Params={"ClusterName": cluster_name},
            ExpiresIn=EKS_TOKEN_EXPIRES_SECONDS,
            HttpMethod="GET",
        )
        return EKS_TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")

    # --- the API -------------------------------------------------------------------------------------

    async def call(
        self, service: str, region: str, credentials: TemporaryCredentials, operation: str, **params: Any
    ) -> dict[str, Any]:
        """One operation (botocore's snake_case name) of ``service`` in ``region``; botocore's errors."""
        return await asyncio.to_thread(self._invoke, service, region, credentials, operation, params)

    async def eks_token(self, credentials: TemporaryCredentials, *, cluster_name: str, region: str) -> str:
        """A fresh ``k8s-aws-v1.`` bearer token for EKS cluster ``cluster_name``, signed for STS in
        ``region``."""
        return await asyncio.to_thread(self._presign, credentials, cluster_name, region)

    async def role_credentials(
        self, target: LaunchTarget, auth: AwsTemporaryAuth, *, identity: WorkloadIdentity, region: str
    ) -> TemporaryCredentials:
        """The runner's role credentials, from the cache while they are fresh; a LaunchError naming the
        cause when STS refuses (or cannot be reached)."""
        session_name = auth.session_name or default_session_name(target.org_id, target.runner_id)
        sts_region = auth.sts_region or region
        key = (target.subject, auth.role_arn, session_name, sts_region)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            cached = self._credentials.get(key)
            if cached is not None and datetime.now(UTC) < cached.expires_at - self.refresh_margin:
                return cached
            self._credentials.pop(key, None)
            fresh = await self._assume(target, auth.role_arn, session_name, sts_region, identity)
            self._credentials[key] = fresh
            return fresh

    async def _assume(
        self,
        target: LaunchTarget,
        role_arn: str,
        session_name: str,
        region: str,
        identity: WorkloadIdentity,
    ) -> TemporaryCredentials:
        token = await identity.token(AUDIENCE)
        params = {"RoleArn": role_arn, "RoleSessionName": session_name, "WebIdentityToken": token}
        url = self.endpoints.sts
        with translated(f"assume role {role_arn}", service="sts", url=url, secrets=[token]):
            try:
                answer = await asyncio.to_thread(
                    self._invoke, "sts", region, None, "assume_role_with_web_identity", params
                )
            except ClientError as exc:
                fail(_refusal(exc, target, role_arn, token), retryable=is_retryable(exc), cause=exc)
        credentials = answer["Credentials"]
        expiration = credentials["Expiration"]
        if expiration.tzinfo is None:
            expiration = expiration.replace(tzinfo=UTC)
        return TemporaryCredentials(
            access_key_id=credentials["AccessKeyId"],
            secret_access_key=credentials["SecretAccessKey"],
            session_token=credentials["SessionToken"],
            expires_at=expiration,
            assumed_role_arn=answer.get("AssumedRoleUser", {}).get("Arn", ""),
        )


def _refusal(exc: ClientError, target: LaunchTarget, role_arn: str, token: str) -> str:
    summary = answer_summary(exc, [token])
    if error_code(exc) == "AccessDenied":
        return (
            f"STS refused to let {target.subject} assume role {role_arn}: {summary} (the role's trust "
            f"policy must allow sts:AssumeRoleWithWebIdentity for the orchestrator's OIDC provider with "
            f"sub {target.subject} and aud {AUDIENCE})"
        )
    return f"STS refused the web identity token for role {role_arn}: {summary}"


def _add_cluster_header(client: Any) -> None:
    """``GetCallerIdentity`` takes no parameters: ``ClusterName`` is moved from the call into the request
    context, then into the ``x-k8s-aws-id`` header before signing, so the header is signed too."""

    def take(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if "ClusterName" in params:
            context[EKS_CLUSTER_HEADER] = params.pop("ClusterName")

    def put(request: Any, **_: Any) -> None:
        name = request.context.get(EKS_CLUSTER_HEADER)
        if name is not None:
            request.headers[EKS_CLUSTER_HEADER] = name

    client.meta.events.register("provide-client-params.sts.GetCallerIdentity", take)
    client.meta.events.register("before-sign.sts.GetCallerIdentity", put)
