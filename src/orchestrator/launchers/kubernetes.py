"""Runs ``po-runner standard`` as a Kubernetes Job: the direct ``kubernetes`` runner type.

The orchestrator talks to the cluster's API itself (upstream's DP does the same for ``kubernetes``), with
the kubeconfig-style values of the runner configuration (``ClusterAccess``). Client: lightkube (async,
typed models, httpx2 transport; we hand it our own TLS context so key material never lands in a file that
outlives the call).

- ``launch`` creates the Job (``render_job_manifest``), then the Secret holding the runner's ``TOKEN``,
  owned by the Job. AlreadyExists counts as success, so launching twice creates one Job. Where the Role
  allows no Secrets (seed 001's has only ``batch/jobs`` create, get: a dry-run create of the Secret is
  refused with 403), ``TOKEN`` goes into the Job's spec as a plain value, as upstream does, and the
  launch answers a note saying so and what to allow (``Launched.note``: the deployment's status message).
  A pod template field of the wrong type (a toleration's ``value: 1``; the runner's validation checks
  only part of a pod template) fails the launch for good, naming the field: lightkube's Job model refuses
  it before the Job is sent.
- ``status`` reads the Job, its pods (label ``batch.kubernetes.io/controller-uid``) and their Warning
  events: a finished Job or a terminated ``main`` container is EXITED with the container's exit code; a
  run that has not started after ``scheduling_delay_seconds`` (upstream ``K8S_RUNNER_POD_SCHEDULING_DELAY``,
  5 min) and has Warning events is EXITED with the warnings joined as detail. API errors give UNKNOWN.
- ``cancel`` deletes the Job with ``propagationPolicy: Background`` (its pods and Secret are
  garbage-collected; the pods get their own ``terminationGracePeriodSeconds``).

The server passes its egress policy (``launchers.egress``): the cluster URL must be https unless plain
http is allowed, and every address the API's host (or the proxy's, and through a proxy the API's too)
resolves to is checked against the denied networks when connecting; the connection goes to the address
that was checked. Errors never carry a body the cluster URL answered: only its HTTP status, and the
``message`` of a real Kubernetes ``Status`` (``kind: Status``, ``apiVersion: v1``), shortened.

RBAC the orchestrator needs in ``job.namespace``: ``batch/jobs`` create, get (seed 001's Role). Each
extra permission buys something: ``secrets`` create, get, update keep ``TOKEN`` out of the Job's spec;
``pods`` and ``events`` list let a stuck run be diagnosed (without them a status check still works from
the Job alone: a run that never starts is only ended by the deployment timeout, an exit code is known only
as the Job's Complete or Failed); ``batch/jobs`` delete lets a failed or timed-out run be stopped.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import http
import os
import re
import socket
import ssl
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, cast

import anyio
import httpcore2
import httpx2
import pydantic
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.models.core_v1 import ContainerStateTerminated
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, Pod, Secret
from lightkube.types import CascadeType

from orchestrator.domain.runner_types import K8sRunnerJobConfig, K8sRunnerK8sCluster
from orchestrator.launchers import kubernetes_job
from orchestrator.launchers.base import Launched, LaunchError, RunState, RunStatus, fail
from orchestrator.launchers.egress import EgressDeniedError, EgressPolicy
from orchestrator.protocol.launch import RunSpec

__all__ = [
    "DEFAULT_SCHEDULING_DELAY_SECONDS",
    "ClusterAccess",
    "KubernetesLauncher",
    "answer_summary",
    "parse_handle",
]

#: Upstream ``K8S_RUNNER_POD_SCHEDULING_DELAY``.
DEFAULT_SCHEDULING_DELAY_SECONDS: Final = 300.0
#: Answers that retrying the same request cannot change.
NOT_RETRYABLE: Final = frozenset({400, 401, 403, 404, 422})
FIELD_MANAGER: Final = "platform-orchestrator"
CONTROLLER_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"
MAX_WARNINGS: Final = 5
#: Longest ``Status.message`` of an API answer quoted in an error.
MAX_STATUS_MESSAGE: Final = 300
_STATUS_REASON: Final = re.compile(r"^[A-Za-z]{1,64}$")
#: Waiting reasons that mean the container will not start by itself.
FAILED_WAITING: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)


@dataclass(frozen=True, kw_only=True)
class ClusterAccess:
    """How to reach a cluster's API: the values of a kubeconfig (``*_data`` are base64 PEM, as there)."""

    server: str
    certificate_authority_data: str | None = None
    client_certificate_data: str | None = field(default=None, repr=False)
    client_key_data: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    proxy_url: str | None = None
    timeout_seconds: float = 30.0

    @classmethod
    def from_cluster(cls, cluster: K8sRunnerK8sCluster) -> ClusterAccess:
        """From the ``cluster`` of a ``kubernetes`` runner configuration."""
        return cls(
            server=cluster.cluster_data.server,
            certificate_authority_data=cluster.cluster_data.certificate_authority_data,
            client_certificate_data=cluster.auth.client_certificate_data,
            client_key_data=cluster.auth.client_key_data,
            token=cluster.auth.service_account_token,
            proxy_url=cluster.cluster_data.proxy_url,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """Trusts only the cluster CA (when given) and presents the client certificate (when given)."""
        try:
            if self.certificate_authority_data:
                context = ssl.create_default_context(cadata=_pem(self.certificate_authority_data))
            else:
                context = ssl.create_default_context()
            if self.client_certificate_data and self.client_key_data:
                _load_client_certificate(
                    context, _pem(self.client_certificate_data), _pem(self.client_key_data)
                )
        except (ssl.SSLError, ValueError) as exc:
            fail(f"the cluster's TLS configuration is unusable: {exc}", retryable=False, cause=exc)
        return context


def _pem(data: str) -> str:
    try:
        return base64.b64decode(data, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError("a *_data value is not base64-encoded PEM") from exc


def _load_client_certificate(context: ssl.SSLContext, certificate: str, key: str) -> None:
    """``load_cert_chain`` only reads files: write both to a private directory and remove it at once."""
    with tempfile.TemporaryDirectory(prefix="po-kube-") as directory:
        cert_path = os.path.join(directory, "client.crt")
        key_path = os.path.join(directory, "client.key")
        for path, text in ((cert_path, certificate), (key_path, key)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(text)
        context.load_cert_chain(cert_path, key_path)


def parse_handle(handle: str) -> tuple[str, str]:
    """``k8s:<namespace>:<job name>`` to (namespace, name)."""
    kind, namespace, name = handle.split(":", 2)
    if kind != "k8s" or not namespace or not name:
        raise ValueError(f"not a Kubernetes run handle: {handle}")
    return namespace, name


def _is_certificate_problem(exc: BaseException) -> bool:
    """A TLS failure about certificates (ours refused, theirs untrusted): retrying cannot help."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return True
        if isinstance(current, ssl.SSLError) and "CERTIFICATE" in str(current).upper():
            return True
        if isinstance(current, ssl.SSLError) and "UNKNOWN_CA" in str(current).upper():
            return True
        current = current.__cause__ or current.__context__
    return "CERTIFICATE" in str(exc).upper() or "UNKNOWN_CA" in str(exc).upper()


def _status_code(exc: ApiError) -> int:
    """The HTTP status of the answer (not a ``code`` its body claims)."""
    if exc.response is not None:
        return int(exc.response.status_code)
    return int(exc.status.code or 0)


def answer_summary(exc: ApiError) -> str:
    """``403 Forbidden: <Status.message>`` for an API error, never echoing a body that is not a Kubernetes
    ``Status``: whatever the cluster URL answered (an HTML page of some internal service, say) stays out of
    status messages and logs. The reason phrase is the standard one for the code, not the server's."""
    code = _status_code(exc)
    try:
        phrase = http.HTTPStatus(code).phrase
    except ValueError:
        phrase = ""
    status = _kubernetes_status(exc.response) if exc.response is not None else None
    if status is None:
        return f"{code} {phrase}".strip() + " (not a Kubernetes Status; the answer is not shown)"
    reason = status.get("reason")
    message = status.get("message")
    parts = [str(code), reason if isinstance(reason, str) and _STATUS_REASON.match(reason) else phrase]
    text = " ".join(part for part in parts if part)
    if isinstance(message, str) and message.strip():
        return f"{text}: {_shortened(message)}"
    return f"{text}: no message"


def _phrase(code: int) -> str:
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return ""


def _kubernetes_status(response: httpx2.Response) -> dict[str, Any] | None:
    """The body if it is a ``metav1.Status`` (``kind: Status``, ``apiVersion: v1``)."""
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError, httpx2.ResponseNotRead):
        return None
    if isinstance(body, dict) and body.get("kind") == "Status" and body.get("apiVersion") == "v1":
        return body
    return None


def _shortened(text: str) -> str:
    cleaned = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    if len(cleaned) <= MAX_STATUS_MESSAGE:
        return cleaned
    return cleaned[: MAX_STATUS_MESSAGE - 1] + "…"


class _GuardedBackend(httpcore2.AsyncNetworkBackend):
    """Connects only to addresses the egress policy allows: resolves the host, checks every address, then
    connects to a checked address (never resolving the name again). ``also`` are host names checked at
    every connection too (the API server's, when the connection goes to a proxy)."""

    def __init__(self, policy: EgressPolicy, *, also: Iterable[str] = ()) -> None:
        self._policy = policy
        self._also = tuple(also)
        self._inner = httpcore2.AnyIOBackend()

    async def _checked(self, host: str, port: int, deadline_seconds: float | None) -> list[str]:
        try:
            with anyio.fail_after(deadline_seconds):
                found = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except TimeoutError as exc:
            raise httpcore2.ConnectTimeout(f"resolving {host} timed out") from exc
        except OSError as exc:
            raise httpcore2.ConnectError(f"cannot resolve {host}: {exc}") from exc
        addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
        if not addresses:
            raise httpcore2.ConnectError(f"{host} resolves to no address")
        for address in addresses:
            self._policy.check_address(host, address)
        return addresses

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's AsyncNetworkBackend signature)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        addresses = await self._checked(host, port, timeout)
        for other in self._also:
            await self._checked(other, port, timeout)
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's AsyncNetworkBackend signature)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise EgressDeniedError("runners may not target unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport over a connection pool whose network backend is :class:`_GuardedBackend`.

    httpx2 takes no network backend, so the pool it builds is replaced by the same pool with ours (the
    lockfile pins httpx2; the SSRF tests fail if this stops taking effect)."""

    def __init__(self, policy: EgressPolicy, *, verify: ssl.SSLContext, server: str, proxy: str | None):
        super().__init__(verify=verify, trust_env=False)
        if proxy is None:
            self._pool = httpcore2.AsyncConnectionPool(
                ssl_context=verify, network_backend=_GuardedBackend(policy)
            )
            return
        proxy_url = httpx2.URL(proxy)
        target = httpx2.URL(server).host
        self._pool = httpcore2.AsyncHTTPProxy(
            proxy_url=httpcore2.URL(
                scheme=proxy_url.raw_scheme,
                host=proxy_url.raw_host,
                port=proxy_url.port,
                target=proxy_url.raw_path,
            ),
            ssl_context=verify,
            network_backend=_GuardedBackend(policy, also=[target] if target else []),
        )


class TypedErrors(httpx2.AsyncBaseTransport):
    """``inner`` whose error answers always carry a ``Content-Type``: lightkube reads the header of an error
    answer by indexing (a ``KeyError`` without it, issue 26). One without gets ``application/json`` when
    its body is a Kubernetes ``Status`` (lightkube then raises its ``ApiError`` with the message) and
    ``text/plain`` otherwise (an ``HTTPStatusError``: the answer is not shown)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.status_code >= 400 and "content-type" not in response.headers:
            await response.aread()
            typed = _kubernetes_status(response) is not None
            response.headers["Content-Type"] = "application/json" if typed else "text/plain"
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class KubernetesLauncher:
    """Launcher for one cluster; any namespace (each run's comes from its ``job`` configuration)."""

    def __init__(
        self,
        api: ClusterAccess,
        *,
        egress: EgressPolicy | None,
        image: str = kubernetes_job.DEFAULT_RUNNER_IMAGE,
        scheduling_delay_seconds: float = DEFAULT_SCHEDULING_DELAY_SECONDS,
        token_in_secret: bool = True,
    ) -> None:
        self.api = api
        #: What the server may connect to (``launchers.egress``); None for an agent in its own cluster.
        self.egress = egress
        self.image = image
        self.scheduling_delay_seconds = scheduling_delay_seconds
        #: False puts ``TOKEN`` in the Job as a plain value (for RBAC without ``secrets`` access).
        self.token_in_secret = token_in_secret
        self._ssl: ssl.SSLContext | None = None

    # --- plumbing -----------------------------------------------------------------------------------

    def _client(self) -> AsyncClient:
        transport = self._transport()
        config = KubeConfig.from_one(
            cluster=Cluster(server=self.api.server), user=User(token=self.api.token), namespace="default"
        )
        return AsyncClient(
            config,
            timeout=httpx2.Timeout(self.api.timeout_seconds),
            field_manager=FIELD_MANAGER,
            trust_env=False,
            transport=TypedErrors(transport),
        )

    def _transport(self) -> httpx2.AsyncHTTPTransport:
        """Our own transport: lightkube's would write the CA and key to temporary files for its lifetime;
        with an egress policy, one that connects only where the policy allows (a LaunchError if the URLs
        themselves are refused)."""
        if self.egress is not None:
            try:
                self.egress.check_url(self.api.server)
                if self.api.proxy_url:
                    self.egress.check_url(self.api.proxy_url, plain_http=True)
            except EgressDeniedError as exc:
                fail(f"the Kubernetes API of this runner is not reachable: {exc.message}", retryable=False)
        if self._ssl is None:
            self._ssl = self.api.ssl_context()
        if self.egress is None:
            return httpx2.AsyncHTTPTransport(verify=self._ssl, proxy=self.api.proxy_url)
        return _GuardedTransport(
            self.egress, verify=self._ssl, server=self.api.server, proxy=self.api.proxy_url
        )

    @contextlib.contextmanager
    def _translated(self, action: str) -> Iterator[None]:
        """Client errors to :class:`LaunchError`, ``retryable`` False when asking again cannot help."""
        try:
            yield
        except ApiError as exc:
            fail(
                f"the Kubernetes API refused to {action}: {answer_summary(exc)}",
                retryable=_status_code(exc) not in NOT_RETRYABLE,
                cause=exc,
            )
        except EgressDeniedError as exc:
            fail(f"cannot {action}: {exc.message}", retryable=False, cause=exc)
        except httpx2.HTTPStatusError as exc:
            # An error answer that is not a Kubernetes Status (never quoted).
            code = exc.response.status_code
            fail(
                f"the Kubernetes API refused to {action}: {code} {_phrase(code)} (not a Kubernetes Status; "
                "the answer is not shown)",
                retryable=code not in NOT_RETRYABLE,
                cause=exc,
            )
        except httpx2.HTTPError as exc:
            fail(
                f"cannot {action}: the Kubernetes API at {self.api.server} is unreachable: {exc}",
                retryable=not _is_certificate_problem(exc),
                cause=exc,
            )
        except ValueError as exc:
            # Not JSON, or JSON that is not the object asked for (lightkube's decoding): never quoted.
            fail(
                f"cannot {action}: {self.api.server} did not answer like a Kubernetes API",
                retryable=True,
                cause=exc,
            )

    # --- Launcher -------------------------------------------------------------------------------------

    async def launch(self, spec: RunSpec) -> Launched:
        try:
            job_config = K8sRunnerJobConfig.model_validate(spec.runner_configuration.get("job"))
        except pydantic.ValidationError as exc:
            # Without the input values: a pod template may hold secrets.
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            fail(
                f"invalid job configuration of runner '{spec.runner_id}': {problems}",
                retryable=False,
                cause=exc,
            )
        namespace, name = job_config.namespace, kubernetes_job.job_name(spec)
        async with self._client() as client:
            refusal = await self._secrets_refused(client, spec, namespace) if self.token_in_secret else None
            secret = kubernetes_job.token_secret_name(spec) if self.token_in_secret and not refusal else None
            manifest = kubernetes_job.render_job_manifest(spec, job_config, self.image, token_secret=secret)
            body = _job_object(manifest, spec.runner_id)
            with self._translated(f"create Job {namespace}/{name}"):
                try:
                    job = await client.create(body)
                except ApiError as exc:
                    if _status_code(exc) != 409:
                        raise
                    # Launched before (the orchestrator restarted in between): the same run.
                    job = await client.get(Job, name, namespace=namespace)
            # The Job that exists decides: a second launch adopts whatever the first one created.
            if _token_secret_of(job) is not None:
                uid = job.metadata.uid if job.metadata and job.metadata.uid else ""
                await self._ensure_token_secret(client, spec, namespace, uid)
                note = None
            else:
                note = _plain_token_note(namespace, refusal) if self.token_in_secret else None
        return Launched(handle=f"k8s:{namespace}:{name}", note=note)

    async def _secrets_refused(self, client: AsyncClient, spec: RunSpec, namespace: str) -> str | None:
        """Why the orchestrator may not create the token Secret here (its Role allows no ``secrets``
        create), or None when it may: asked with a dry-run create, which the API server authorizes (and
        admits) exactly as the real one, and stores nothing. An existing Secret (409) means it may."""
        body = kubernetes_job.render_token_secret(spec, namespace, job_uid="")
        del body["metadata"]["ownerReferences"]  # the Job does not exist yet; nothing is stored anyway
        with self._translated(f"check that Secrets can be created in namespace {namespace}"):
            try:
                await client.create(cast(Secret, Secret.from_dict(body)), dry_run=True)
            except ApiError as exc:
                if _status_code(exc) == 409:
                    return None
                if _status_code(exc) == 403:
                    return answer_summary(exc)
                raise
        return None

    async def _ensure_token_secret(
        self, client: AsyncClient, spec: RunSpec, namespace: str, job_uid: str
    ) -> None:
        body = kubernetes_job.render_token_secret(spec, namespace, job_uid=job_uid)
        name = body["metadata"]["name"]
        try:
            with self._translated(f"create Secret {namespace}/{name}"):
                try:
                    await client.create(cast(Secret, Secret.from_dict(body)))
                except ApiError as exc:
                    if _status_code(exc) != 409:
                        raise
                    existing = await client.get(Secret, name, namespace=namespace)
                    if existing.data == body["data"] and _owned_by(existing, job_uid):
                        return
                    body["metadata"]["resourceVersion"] = (
                        existing.metadata.resourceVersion if existing.metadata else None
                    )
                    await client.replace(cast(Secret, Secret.from_dict(body)))
        except LaunchError as error:
            if error.retryable:
                raise
            # The pod would wait for its token forever: take the Job away rather than leave it pending
            # (a Role without jobs delete, as seed 001's, leaves it: its pod cannot start, and runs nothing).
            with contextlib.suppress(ApiError, httpx2.HTTPError):
                await client.delete(
                    Job, kubernetes_job.job_name(spec), namespace=namespace, cascade=CascadeType.BACKGROUND
                )
            hint = "the orchestrator needs create, get and update on secrets in this namespace"
            fail(f"{error.message} ({hint})", retryable=False, cause=error)

    async def status(self, handle: str) -> RunStatus:
        namespace, name = parse_handle(handle)
        try:
            async with self._client() as client:
                with self._translated(f"read Job {namespace}/{name}"):
                    return await self._status(client, namespace, name)
        except LaunchError as exc:
            return RunStatus(state=RunState.UNKNOWN, detail=exc.message)

    async def _status(self, client: AsyncClient, namespace: str, name: str) -> RunStatus:
        try:
            job = await client.get(Job, name, namespace=namespace)
        except ApiError as exc:
            if _status_code(exc) == 404:
                return RunStatus(
                    state=RunState.EXITED, detail=f"the Kubernetes Job {namespace}/{name} is gone"
                )
            raise
        uid = job.metadata.uid if job.metadata else None
        unseen: list[str] = []  # what the Role does not let the orchestrator list: the diagnosis degrades
        pods = await self._pods(client, namespace, uid, unseen)
        pod = max(pods, key=_created, default=None)
        terminated = _main_terminated(pod)
        if terminated is not None:
            return RunStatus(
                state=RunState.EXITED, exit_code=terminated.exitCode, detail=_exit_detail(terminated)
            )
        finished = _finished_condition(job)
        if finished is not None:
            succeeded = finished.type == "Complete"
            detail = None if succeeded else _join(finished.reason, finished.message)
            if detail and unseen:
                detail += (
                    f" ({_unseen(namespace, unseen)}: the exit code and the runner's last words are unknown)"
                )
            return RunStatus(state=RunState.EXITED, exit_code=0 if succeeded else None, detail=detail)
        if pod is not None and pod.status is not None and pod.status.phase == "Failed":
            return RunStatus(state=RunState.EXITED, detail=_join(pod.status.reason, pod.status.message))
        if _started(job, pod):
            return RunStatus(state=RunState.RUNNING)
        waited = (datetime.now(UTC) - _created(job)).total_seconds()
        if waited < self.scheduling_delay_seconds:
            return RunStatus(state=RunState.RUNNING, detail="waiting for the runner pod to start")
        problems = await self._warnings(
            client, namespace, [uid, *(p.metadata.uid for p in pods if p.metadata)], unseen
        )
        problems += [w for w in _failed_waiting(pod) if w not in problems]
        if not problems:
            detail = f"the runner pod has not started after {waited:.0f} s"
            if unseen:
                detail += f" ({_unseen(namespace, unseen)}: why is not known; the deployment timeout ends it)"
            return RunStatus(state=RunState.RUNNING, detail=detail)
        return RunStatus(
            state=RunState.EXITED,
            detail=f"the runner pod did not start within {self.scheduling_delay_seconds:g} s: "
            + "; ".join(problems[:MAX_WARNINGS]),
        )

    async def _pods(
        self, client: AsyncClient, namespace: str, job_uid: str | None, unseen: list[str]
    ) -> list[Pod]:
        if not job_uid:
            return []
        try:
            return [
                pod
                async for pod in client.list(Pod, namespace=namespace, labels={CONTROLLER_UID_LABEL: job_uid})
            ]
        except ApiError as exc:
            if _status_code(exc) == 403:  # degraded: no permission to list pods
                unseen.append("pods")
                return []
            raise

    async def _warnings(
        self, client: AsyncClient, namespace: str, uids: list[str | None], unseen: list[str]
    ) -> list[str]:
        """``reason: message`` of the Warning events of the Job and its pods, oldest first, once each."""
        events: list[Event] = []
        for uid in uids:
            if not uid:
                continue
            try:
                fields: dict[str, Any] = {"involvedObject.uid": uid, "type": "Warning"}
                events += [event async for event in client.list(Event, namespace=namespace, fields=fields)]
            except ApiError as exc:
                if _status_code(exc) == 403:  # degraded: no permission to list events
                    unseen.append("events")
                    return []
                raise
        events.sort(key=_event_time)
        problems: list[str] = []
        for event in events:
            text = _join(event.reason, event.message)
            if text and text not in problems:
                problems.append(text)
        return problems

    async def cancel(self, handle: str, *, grace_seconds: float) -> None:
        """Delete the Job and, in the background, its pods; a Job already gone is fine."""
        namespace, name = parse_handle(handle)
        async with self._client() as client:
            with self._translated(f"delete Job {namespace}/{name}"):
                try:
                    await client.delete(Job, name, namespace=namespace, cascade=CascadeType.BACKGROUND)
                except ApiError as exc:
                    if _status_code(exc) != 404:
                        raise


def _job_object(manifest: dict[str, Any], runner_id: str) -> Job:
    """lightkube's Job of ``manifest``. Its model checks the type of every field it knows (and drops the
    fields it does not know, as the API server does by default): a field of the wrong type can come only
    from the pod template, which the runner's validation checks only in part, so it fails the launch for
    good, naming the field (never its value)."""
    try:
        return cast(Job, Job.from_dict(manifest))
    except ValueError as exc:  # msgspec.ValidationError: "Expected `str | null`, got `int` - at `$.a.b`"
        problem, _, where = str(exc).partition(" - at ")
        field = where.strip("`").replace("$.spec.template.", "job.pod_template.", 1).removeprefix("$.")
        fail(
            f"invalid job configuration of runner '{runner_id}': the Job it makes is not a Kubernetes Job: "
            + (f"{field}: {problem}" if field else problem),
            retryable=False,
            cause=exc,
        )


# --- reading objects ----------------------------------------------------------------------------------

_EPOCH: Final = datetime.min.replace(tzinfo=UTC)


def _created(obj: Job | Pod) -> datetime:
    stamp = obj.metadata.creationTimestamp if obj.metadata else None
    return stamp if stamp is not None else _EPOCH


def _event_time(event: Event) -> datetime:
    return event.lastTimestamp or event.eventTime or event.firstTimestamp or _EPOCH


def _token_secret_of(job: Job) -> str | None:
    """The Secret the Job's ``main`` container reads ``TOKEN`` from; None when it is a plain value."""
    spec = job.spec.template.spec if job.spec and job.spec.template else None
    containers = spec.containers if spec else []
    main = next((c for c in containers if c.name == kubernetes_job.CONTAINER_NAME), None)
    for var in (main.env or []) if main else []:
        if var.name == kubernetes_job.TOKEN_ENV and var.valueFrom and var.valueFrom.secretKeyRef:
            return var.valueFrom.secretKeyRef.name
    return None


def _plain_token_note(namespace: str, refusal: str | None) -> str:
    """The deployment's note when ``TOKEN`` went into the Job's spec (upstream's way) for lack of RBAC."""
    why = (
        f"the orchestrator may not create Secrets in namespace {namespace} ({refusal})"
        if refusal
        else "the Job was created so by an earlier launch"
    )
    return (
        "the runner's TOKEN is a plain value in the Job's spec, as upstream puts it, not in a Secret: "
        f"{why}; to keep it out of the Job's spec (readable by anyone who may get Jobs), allow the "
        f"orchestrator create, get and update on secrets in namespace {namespace} (its Role)"
    )


def _owned_by(obj: Secret, uid: str) -> bool:
    owners = obj.metadata.ownerReferences if obj.metadata else None
    return any(owner.uid == uid for owner in owners or [])


def _unseen(namespace: str, resources: list[str]) -> str:
    listed = " and ".join(resources)
    return (
        f"the orchestrator may not list {listed} in namespace {namespace} (allow {listed} list in its Role)"
    )


def _join(reason: str | None, message: str | None) -> str:
    return ": ".join(part for part in (reason, message) if part)


def _finished_condition(job: Job) -> Any:
    conditions = job.status.conditions if job.status else None
    for condition in conditions or []:
        if condition.type in ("Complete", "Failed") and condition.status == "True":
            return condition
    return None


def _main_container(pod: Pod | None) -> Any:
    statuses = pod.status.containerStatuses if pod is not None and pod.status else None
    return next((s for s in statuses or [] if s.name == kubernetes_job.CONTAINER_NAME), None)


def _main_terminated(pod: Pod | None) -> ContainerStateTerminated | None:
    status = _main_container(pod)
    if status is None or status.state is None:
        return None
    terminated: ContainerStateTerminated | None = status.state.terminated
    return terminated


def _started(job: Job, pod: Pod | None) -> bool:
    if job.status is not None and (job.status.ready or 0) > 0:
        return True
    if pod is None or pod.status is None:
        return False
    if pod.status.phase in ("Running", "Succeeded", "Failed"):
        return True
    status = _main_container(pod)
    return status is not None and status.state is not None and status.state.running is not None


def _failed_waiting(pod: Pod | None) -> list[str]:
    status = _main_container(pod)
    waiting = status.state.waiting if status is not None and status.state is not None else None
    if waiting is None or waiting.reason not in FAILED_WAITING:
        return []
    return [_join(waiting.reason, waiting.message)]


def _exit_detail(terminated: ContainerStateTerminated) -> str | None:
    """The last line of the termination message (the runner's last words), with an unusual reason."""
    lines = [line.strip() for line in (terminated.message or "").splitlines() if line.strip()]
    last = lines[-1] if lines else None
    if terminated.reason in (None, "Completed", "Error"):
        return last
    return _join(terminated.reason, last)
