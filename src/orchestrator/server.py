"""The server's composition root: ``create_app(settings)`` mounts the API (and later the gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import pydantic
import structlog
import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from orchestrator import console, data_dir, deployment_tokens
from orchestrator.api import (
    deployment_logs,
    deployments,
    docs,
    health,
    methods,
    module_providers,
    module_rules,
    modules,
    orgs,
    projects,
    resource_types,
    runner_rules,
    runners,
    state_versions,
    usage,
    well_known,
)
from orchestrator.api.context import api_token_key, hash_token
from orchestrator.api.limits import BodyLimitMiddleware
from orchestrator.blobs.location import open_blob_store
from orchestrator.dispatch import catalogue, creation, gauges, log_followers, log_writer, retention
from orchestrator.dispatch import managed as managed_policy
from orchestrator.dispatch.dispatcher import Dispatcher, DispatchSettings
from orchestrator.domain.runner_types import (
    K8sAksRunnerConfiguration,
    K8sEksRunnerConfiguration,
    K8sGkeRunnerConfiguration,
    K8sRunnerConfiguration,
    VmRunnerConfiguration,
)
from orchestrator.errors import ConfigurationError
from orchestrator.gateway import commands as gateway_commands
from orchestrator.gateway import deployments as gateway_deployments
from orchestrator.gateway import managed as gateway_managed
from orchestrator.gateway import receipts
from orchestrator.gateway import state as gateway_state
from orchestrator.gateway.agent_gateway import AgentGateway
from orchestrator.gateway.long_poll import LongPollMiddleware
from orchestrator.identity import documents as identity_documents
from orchestrator.identity.issuer import WorkloadIssuer
from orchestrator.launchers import availability, run_user, zygote
from orchestrator.launchers.base import Launcher, LaunchError, LaunchTarget
from orchestrator.launchers.local import LocalLauncher
from orchestrator.launchers.run_cgroups import RunCgroups
from orchestrator.launchers.run_uids import RunUids
from orchestrator.launchers.run_user import RunUser
from orchestrator.notify import Notifier
from orchestrator.secretbox import KEY_FILE_NAME, SecretBox, decode_key, key_check_value, load_or_create_key
from orchestrator.settings import ServerSettings
from orchestrator.store import agent_commands as command_store
from orchestrator.store import db, key_checks, listener, migrate
from orchestrator.store import managed_runners as managed_store
from orchestrator.store import orgs as org_store
from orchestrator.web import errors, openapi
from orchestrator.web import metrics as web_metrics
from orchestrator.web.input_checks import InputCheckMiddleware
from orchestrator.web.request_ids import RequestIdMiddleware
from orchestrator.web.services import Services
from orchestrator.web.tls import ClientCertificateMiddleware, ServerTls, own_certificate

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from orchestrator.launchers import aws as aws_launchers
    from orchestrator.launchers.kubernetes_cloud import AccessCache

log = structlog.get_logger(__name__)

_Config = TypeVar("_Config", bound=pydantic.BaseModel)

#: The signals that stop ``orchestrator serve`` gracefully.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

API_DESCRIPTION = (
    "The orchestrator's API (`/orgs/...`) and its runner gateway (`/runner-gateway/v1/...`). Each operation "
    "names the credentials it needs (Authorize: an API token for the API; a deployment token, the state "
    "backend's basic auth or an agent JWT for the gateway) and the error answers it can give, all with the "
    "body `{error, message, details?}`. `/healthz`, `/readyz`, `/metrics`, `/runner-compatibility`, "
    "`/openapi.json`, "
    "`/docs`, the web console (`/console/`, where `/` redirects) and the OIDC issuer's documents "
    "(`/.well-known/openid-configuration`, `/.well-known/jwks`) "
    "need no credentials. Every answer, error answers included, carries `X-Request-ID`: the request's own "
    "when it sent a sane one (1 to 128 letters, digits and `._:+=@/-`), else a new one; the server's log "
    "lines about the request carry it as `request_id`."
)

METRICS_DESCRIPTION = (
    "The server's metrics in Prometheus' text format (requests, deployments, dispatch, agent commands, "
    "database pools, retention; docs/operate/metrics.md). Needs no credentials and shows no ids, names or "
    "secrets: route templates, runner types, statuses and counts only."
)

#: Fixed id of the bootstrap token's row, so a changed PO_BOOTSTRAP_TOKEN replaces the old one.
BOOTSTRAP_TOKEN_ID = uuid.UUID("00000000-0000-0000-0000-0000000000b0")


def launcher_for(
    settings: ServerSettings,
    local: LocalLauncher,
    issuer: WorkloadIssuer,
    target: LaunchTarget,
    *,
    access_cache: AccessCache | None = None,
    aws: aws_launchers.AwsClients | None = None,
) -> Launcher | None:
    """The launcher of a direct runner; None for a runner an agent launches. Which runners this server can
    launch is ``launchers.availability``'s table, which GET runner answers from too: for any other,
    LauncherUnavailableError with the message GET shows (the extra to install, PO_ALLOW_LOCAL_RUNNERS).

    The cloud types authenticate with the runner's workload identity, ``issuer.identity(target.subject)``
    (short-lived OIDC tokens exchanged at the cloud's STS): no long-lived cloud credential is stored. Their
    cluster accesses are kept in ``access_cache`` (one per server, :func:`cloud_access_cache`) between the
    launchers made for one run's launch, status checks and cancel; the AWS types' credentials in ``aws``
    (one per server, :func:`aws_clients`; without it, clients for this call only)."""
    kind = availability.launcher_kind(target.runner_type, target.configuration)
    if kind is None:
        return None
    # Raises unless the table's libraries and launcher modules import (they are imported below).
    availability.require(kind, allow_local_runners=settings.allow_local_runners)
    if kind == availability.LOCAL_KIND:
        return local
    if kind == "vm:ssh":
        return _ssh_launcher(settings, target)
    if kind == "kubernetes":
        return _kubernetes_launcher(settings, target)
    if kind in ("kubernetes-gke", "kubernetes-aks"):
        return _cloud_kubernetes_launcher(settings, issuer, target, access_cache)
    if kind in ("kubernetes-eks", "serverless-ecs"):
        clients = aws if aws is not None else aws_clients(settings)
        if clients is not None:
            return _aws_launcher(settings, issuer, clients, target)
    # A row of the table without its branch here (tests/unit/test_launcher_availability.py).
    raise availability.LauncherUnavailableError(
        f"this orchestrator cannot launch {kind} runners: it has no launcher for them"
    )


def _parsed(model: type[_Config], target: LaunchTarget) -> _Config:
    """The runner's stored configuration as its type's model; LauncherUnavailableError naming the fields
    that no longer validate (never their values: the configuration holds the runner's secrets)."""
    try:
        return model.model_validate(target.configuration)
    except pydantic.ValidationError as exc:
        fields = sorted({".".join(str(part) for part in error["loc"]) for error in exc.errors()})
        raise availability.LauncherUnavailableError(
            f"the configuration of runner '{target.runner_id}' is not valid for its type "
            f"{target.runner_type} (fields: {', '.join(fields)}): update the runner"
        ) from None


def cloud_access_cache() -> AccessCache | None:
    """The server's cache of cloud cluster accesses; None without the ``kubernetes`` extra."""
    try:
        from orchestrator.launchers.kubernetes_cloud import AccessCache  # the optional extra
    except ImportError:
        return None
    return AccessCache()


def aws_clients(settings: ServerSettings) -> aws_launchers.AwsClients | None:
    """The server's AWS clients (one credential cache for all its runners), on the endpoints of the
    ``PO_AWS_*_URL`` settings; None without botocore (the ``server`` extra)."""
    try:
        from orchestrator.launchers import aws  # botocore: imported only when the server runs
    except ImportError:
        return None
    endpoints = aws.AwsEndpoints(sts=settings.aws_sts_url, eks=settings.aws_eks_url, ecs=settings.aws_ecs_url)
    return aws.AwsClients(endpoints)


def _aws_launcher(
    settings: ServerSettings, issuer: WorkloadIssuer, clients: aws_launchers.AwsClients, target: LaunchTarget
) -> Launcher:
    """The launcher of a ``kubernetes-eks`` or ``serverless-ecs`` runner, with its workload identity."""
    identity = issuer.identity(target.subject)
    if target.runner_type == "serverless-ecs":
        from orchestrator.launchers import ecs  # botocore: the server extra (availability checked it)

        return ecs.EcsLauncher(target, identity=identity, clients=clients)
    from orchestrator.launchers import eks  # lightkube: the kubernetes extra (availability checked it)

    parsed = _parsed(K8sEksRunnerConfiguration, target)
    return eks.eks_launcher(
        target, parsed.cluster, identity=identity, clients=clients, egress=settings.runner_egress
    )


def local_launcher(settings: ServerSettings) -> LocalLauncher:
    """The launcher of local runs, with its runs dir ready when local runners are allowed."""
    user = (
        RunUser.resolve(settings.local_run_user, setting="PO_LOCAL_RUN_USER")
        if settings.allow_local_runners
        else None
    )
    uids = None
    if settings.allow_local_runners:
        run_user.prepare_runs_dir(settings.local_runs_dir, user, setting="PO_LOCAL_RUNS_DIR")
        if user is not None:
            uids = RunUids.from_setting(
                settings.local_run_uids, settings.local_runs_dir, setting="PO_LOCAL_RUN_UIDS"
            )
    cgroups = (
        RunCgroups.from_setting(
            settings.local_run_cgroups, settings.local_runs_dir, setting="PO_LOCAL_RUN_CGROUPS"
        )
        if settings.allow_local_runners
        else None
    )
    return LocalLauncher(
        settings.local_runs_dir,
        environ=os.environ,
        run_user=user,
        run_uids=uids,
        run_cgroups=cgroups,
        run_limit=settings.local_run_limit,
        warm_runners=settings.local_warm_runners if settings.allow_local_runners else 0,
        fork_server=settings.allow_local_runners
        and zygote.enabled(settings.local_zygote, setting="PO_LOCAL_ZYGOTE"),
        gateway_ca=partial(own_certificate, settings.tls_cert_file) if settings.tls_cert_file else None,
    )


async def _check_run_user(local: LocalLauncher) -> None:
    """Tell the operator at start, not at the first deployment, that the run user cannot run the runner
    (local launches fail with the same message until it is fixed)."""
    try:
        await local.check_runnable()
    except LaunchError as exc:
        log.warning("local runs cannot start", problem=exc.message)


def _kubernetes_launcher(settings: ServerSettings, target: LaunchTarget) -> Launcher:
    """The cluster's launcher."""
    from orchestrator.launchers import kubernetes  # lightkube: the kubernetes extra (availability checked it)

    parsed = _parsed(K8sRunnerConfiguration, target)
    return kubernetes.KubernetesLauncher(
        kubernetes.ClusterAccess.from_cluster(parsed.cluster), egress=settings.runner_egress
    )


def _ssh_launcher(settings: ServerSettings, target: LaunchTarget) -> Launcher:
    """The machine's launcher."""
    from orchestrator.launchers import ssh  # asyncssh: the server extra (availability checked it)

    return ssh.SshLauncher.from_configuration(
        _parsed(VmRunnerConfiguration, target), egress=settings.runner_egress
    )


def _cloud_kubernetes_launcher(
    settings: ServerSettings, issuer: WorkloadIssuer, target: LaunchTarget, cache: AccessCache | None
) -> Launcher:
    """A GKE or AKS runner's launcher (lightkube and google-auth or azure-identity: the kubernetes and
    cloud extras, which availability checked)."""
    from orchestrator.launchers import kubernetes_cloud

    identity, key = issuer.identity(target.subject), kubernetes_cloud.access_key(target)
    # The two differ in their configuration model, their launcher and the cloud's endpoints only.
    cloud: tuple[type[pydantic.BaseModel], Callable[..., Launcher | None], object]
    if target.runner_type == "kubernetes-gke":
        from orchestrator.launchers import gke

        cloud = (K8sGkeRunnerConfiguration, gke.gke_launcher, settings.google_endpoints)
    else:
        from orchestrator.launchers import aks

        cloud = (K8sAksRunnerConfiguration, aks.aks_launcher, settings.azure_endpoints)
    model, make, endpoints = cloud
    _parsed(model, target)
    made: Launcher | None = make(
        target.configuration,
        identity,
        egress=settings.runner_egress,
        endpoints=endpoints,
        cache=cache,
        cache_key=key,
    )
    if made is None:  # _parsed refused what they refuse
        raise availability.LauncherUnavailableError(f"runner '{target.runner_id}' has no valid configuration")
    return made


def _server_key(settings: ServerSettings) -> bytes:
    data_dir.prepare(settings.data_dir)
    if settings.encryption_key:
        return decode_key(settings.encryption_key.get_secret_value())
    return load_or_create_key(settings.data_dir)


async def _check_server_key(engine: AsyncEngine, key: bytes, settings: ServerSettings) -> None:
    """Refuse a key other than the one the database's sealed values are sealed under (its check value is
    recorded by the first start); ConfigurationError saying which key is wrong."""
    expected = key_check_value(key)
    async with engine.begin() as conn:
        recorded = await key_checks.record_once(conn, expected, now=datetime.now(UTC))
    if recorded != expected:
        source = "PO_ENCRYPTION_KEY" if settings.encryption_key else str(settings.data_dir / KEY_FILE_NAME)
        raise ConfigurationError(
            f"{source} is not the key this database was created with: runner secrets and Terraform "
            "states sealed under the original key would not open; start with the original key "
            "(PO_ENCRYPTION_KEY, or the server.key file of the original data dir)"
        )


async def prepare(settings: ServerSettings) -> None:
    """Everything at start that can refuse a configuration: the server key, the database (migrations,
    the key check) and the object store. ``orchestrator serve`` runs it before serving, so that a wrong
    configuration ends with a one-line error instead of a traceback from the app's lifespan."""
    key = _server_key(settings)
    data_dir.private_sqlite_file(settings.resolved_database_url)
    engine = db.create_engine(settings.resolved_database_url)
    try:
        await migrate.upgrade(engine)
        await _check_server_key(engine, key, settings)
    finally:
        await db.dispose(engine)
    blobs = await open_blob_store(
        settings.object_store_url, data_dir=settings.data_dir, endpoint_url=settings.object_store_endpoint
    )
    close = getattr(blobs, "close", None)
    if close is not None:
        close()


def _measure_engine(app: FastAPI, engine: AsyncEngine, settings: ServerSettings) -> None:
    """Pool metrics of the engine (``main``) and, on SQLite, of its readers' engine (``readers``); the
    gauges ``/metrics`` reads from the database."""
    if not settings.metrics_enabled:
        return
    app.state.metrics_refresh = gauges.DatabaseGauges(reader=db.readonly(engine)).refresh
    web_metrics.instrument_pool(engine, "main")
    reader = db.readonly(engine)
    if reader is not engine and reader.sync_engine.pool is not engine.sync_engine.pool:
        web_metrics.instrument_pool(reader, "readers")


def _install_metrics(app: FastAPI, settings: ServerSettings) -> None:
    """Unless ``PO_METRICS_ENABLED`` is false: the requests' metrics middleware (call it after every other
    middleware is added: it is then the outermost of ours, and counts their answers too), and
    ``GET /metrics``, documented as a plain-text answer without credentials."""
    if not settings.metrics_enabled:
        return
    app.add_middleware(web_metrics.MetricsMiddleware)
    app.add_api_route(
        "/metrics",
        web_metrics.metrics_endpoint,
        methods=["GET"],
        tags=["Meta"],
        summary="Metrics",
        description=METRICS_DESCRIPTION,
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )


def _managed_worker(
    settings: ServerSettings,
    engine: AsyncEngine,
    notifier: Notifier,
    managed: gateway_managed.ManagedGateway,
) -> managed_policy.ManagedWorker:
    """The managed runners' worker (lapsed leases, pruning, and the timeout of deployments no managed
    runner claimed: it runs with managed runners off too, so that those of environments still linked to
    the pool end)."""
    return managed_policy.ManagedWorker(
        engine=engine,
        prune_after=timedelta(seconds=settings.managed_prune_after_seconds),
        interval_seconds=min(5.0, settings.managed_lease_seconds / 4),
        on_final=notifier.notify,
        on_requeued=managed.waker.notify,
        online_within=timedelta(seconds=settings.managed_lease_seconds),
        started_at=datetime.now(UTC),
    )


async def _prepare_rows(engine: AsyncEngine, box: SecretBox, settings: ServerSettings) -> None:
    """Rows every start puts right: provider configurations sealed; with managed runners on, the pool's
    runner ``managed`` in every organization."""
    async with engine.begin() as conn:
        await catalogue.seal_clear_provider_configurations(conn, box)
        if settings.managed_runners_enabled:
            await managed_store.ensure_pool_rows(conn, now=datetime.now(UTC))


def _wake_all(dispatcher: Dispatcher, managed: gateway_managed.ManagedGateway) -> None:
    """A deployment was committed: the dispatcher looks for work, waiting managed claims look again."""
    dispatcher.wake()
    managed.waker.notify()


def stop_long_polls(app: FastAPI) -> None:
    """The server is stopping: open long polls answer now (agents' ``commands/next`` 204,
    ``wait-for-complete`` 408: call again) instead of holding the shutdown for their whole wait."""
    services: Services | None = getattr(app.state, "services", None)
    if services is not None:
        services.notifier.close()
    gateway: AgentGateway | None = getattr(app.state, "agent_gateway", None)
    if gateway is not None:
        gateway.stop_polls()
    managed: gateway_managed.ManagedGateway | None = getattr(app.state, "managed_gateway", None)
    if managed is not None:
        managed.stop_polls()


async def close_live_logs(app: FastAPI) -> None:
    """The server is stopping and its requests have ended: the chunk writer stores what still waits, the
    followers' poll ends."""
    services: Services | None = getattr(app.state, "services", None)
    if services is not None:
        await services.log_writer.close()
        await services.log_followers.close()


async def hand_back_leases(app: FastAPI) -> None:
    """The server is stopping and its requests have ended: the agent commands it delivered that no answer
    closed are deliverable again at once (``AgentGateway.hand_back_leases``)."""
    gateway: AgentGateway | None = getattr(app.state, "agent_gateway", None)
    if gateway is not None:
        await gateway.hand_back_leases(app.state.services)


def _require_client_certificates(app: FastAPI, settings: ServerSettings) -> None:
    """PO_TLS_CLIENT_AUTH=gateway: runner gateway requests need a verified client certificate."""
    if settings.tls_client_ca_file is not None and settings.tls_client_auth == "gateway":
        # Outermost: the long poll's middleware answers before routing.
        app.add_middleware(ClientCertificateMiddleware)


class TlsH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, whose requests carry the connection's verified client certificate in
    the ASGI ``tls`` extension (``client_cert_chain``, one PEM certificate or none), which uvicorn does
    not fill in; ``web.tls.ClientCertificateMiddleware`` reads it. Used when PO_TLS_CLIENT_CA_FILE is
    set; asyncio calls ``connection_made`` once the handshake is done, so the certificate is known."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        tls = {"server_cert": None, "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else []}
        app = self.app

        async def with_tls(scope: Scope, receive: Receive, send: Send) -> None:
            scope.setdefault("extensions", {})["tls"] = tls
            await app(scope, receive, send)

        self.app = with_tls


def uvicorn_config(
    settings: ServerSettings, app: FastAPI, tls: ServerTls | None, *, log_level: int
) -> uvicorn.Config:
    """How ``orchestrator serve`` runs ``app``: HTTPS with ``tls``'s live context when it is given, requests
    in flight at a stop cut after ``PO_SHUTDOWN_GRACE_SECONDS``, and uvicorn's own lines at ``log_level``
    through the root logger's handler (``logs.configure``, which the CLI ran: one format)."""
    if tls is None:
        return uvicorn.Config(
            app,
            host=settings.listen_host,
            port=settings.listen_port,
            log_level=log_level,
            access_log=settings.log_level.lower() == "debug",
            log_config=None,
            lifespan="on",
            timeout_graceful_shutdown=settings.shutdown_grace_seconds,
        )
    return uvicorn.Config(
        app,
        host=settings.listen_host,
        port=settings.listen_port,
        log_level=log_level,
        access_log=settings.log_level.lower() == "debug",
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=settings.shutdown_grace_seconds,
        # uvicorn builds a context from files once; this one is reloaded in place (web.tls).
        ssl_context_factory=lambda _config, _default: tls.context,
        http=TlsH11Protocol if tls.client_ca_file is not None else "auto",
    )


class Server(uvicorn.Server):
    """uvicorn's server, which tells the app when it begins to stop, and exits normally after a stop; and
    which reloads its TLS files (``web.tls.ServerTls``) on SIGHUP and when they change.

    uvicorn's graceful shutdown closes the listening sockets, then waits for every open request before
    the lifespan's shutdown: the app hears of it only after the last long poll has ended (up to
    ``PO_AGENT_FETCH_WAIT_SECONDS`` and 60 s). Here the long polls are told first, and requests still
    open after ``PO_SHUTDOWN_GRACE_SECONDS`` are cut; the lifespan's shutdown then hands back the leases
    this server gave out (``hand_back_leases``). And after a graceful stop on SIGTERM or SIGINT, uvicorn
    raises the signal again, which kills the process with it (exit 143, or a KeyboardInterrupt); a server
    that stopped as asked exits with 0."""

    def __init__(
        self,
        config: uvicorn.Config,
        app: FastAPI,
        *,
        tls: ServerTls | None = None,
        tls_reload_interval_seconds: float = 10.0,
    ) -> None:
        super().__init__(config)
        self.app = app
        self.tls = tls
        self.tls_reload_interval_seconds = tls_reload_interval_seconds
        self._tls_watch: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Signals can only be handled in the main thread (tests serve in others).
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {signum: signal.signal(signum, self.handle_exit) for signum in STOP_SIGNALS}
        if self.tls is not None:
            previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._hangup)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _hangup(self, _signum: int, _frame: object) -> None:
        """SIGHUP: reload the TLS files now (in the event loop, where the handshakes run)."""
        if self.tls is not None and self._tls_watch is not None:
            self._tls_watch.get_loop().call_soon_threadsafe(self.tls.request_reload)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.tls is not None:
            self._tls_watch = asyncio.create_task(
                self.tls.watch(self.tls_reload_interval_seconds), name="tls-reload"
            )
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        stop_long_polls(self.app)
        if self._tls_watch is not None:
            self._tls_watch.cancel()
        await super().shutdown(sockets)


class _App(FastAPI):
    """FastAPI with request ids outermost: outside Starlette's last-resort handler, so that a 500 answer
    carries ``X-Request-ID`` and the lines logged about it carry ``request_id``."""

    def build_middleware_stack(self) -> ASGIApp:
        return RequestIdMiddleware(super().build_middleware_stack())


def create_app(
    settings: ServerSettings,
    *,
    run_migrations: bool = True,
    run_dispatcher: bool = True,
) -> FastAPI:
    """The whole server as one ASGI app; its lifespan opens and closes the database."""

    # A run user that does not exist, or a runs dir of someone else's, stops the server here.
    local = local_launcher(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        data_dir.private_sqlite_file(settings.resolved_database_url)
        key = _server_key(settings)
        engine = db.create_engine(settings.resolved_database_url, pool_size=settings.db_pool_size)
        _measure_engine(app, engine, settings)
        stop = asyncio.Event()
        worker: asyncio.Task[None] | None = None
        check: asyncio.Task[None] | None = None
        background: list[asyncio.Task[None]] = []
        try:
            if run_migrations:
                await migrate.upgrade(engine)
            await _check_server_key(engine, key, settings)
            api_key = api_token_key(key)
            if settings.bootstrap_token is not None:
                async with engine.begin() as conn:
                    await org_store.replace_platform_token(
                        conn,
                        token_id=BOOTSTRAP_TOKEN_ID,
                        token_hash=hash_token(api_key, settings.bootstrap_token.get_secret_value()),
                    )
            box = SecretBox(key)
            issuer = WorkloadIssuer(engine, box, settings)
            if not identity_documents.is_https(issuer.issuer):
                log.warning(
                    "the OIDC issuer's URL (PO_PUBLIC_URL) is not https: clouds refuse its tokens, so "
                    "runners of the types GKE, EKS, AKS and ECS cannot authenticate",
                    issuer=issuer.issuer,
                )
            await _prepare_rows(engine, box, settings)
            token_key = deployment_tokens.token_key(key)
            notifier = Notifier()
            blobs = await open_blob_store(
                settings.object_store_url,
                data_dir=settings.data_dir,
                endpoint_url=settings.object_store_endpoint,
            )
            managed_gateway = app.state.managed_gateway
            agent_gateway = AgentGateway(
                settings=settings, receipt_key=receipts.receipt_key(key), on_final=notifier.notify
            )
            dispatcher = Dispatcher(
                engine=engine,
                box=box,
                blobs=blobs,
                token_key=token_key,
                gateway_url=settings.resolved_public_url,
                launcher_for=partial(
                    launcher_for,
                    settings,
                    local,
                    issuer,
                    access_cache=cloud_access_cache(),
                    aws=aws_clients(settings),
                ),
                on_final=notifier.notify,
                settings=DispatchSettings(
                    check_interval_seconds=settings.status_check_interval_seconds,
                    lease_seconds=settings.dispatch_lease_seconds,
                    cancel_grace_seconds=settings.cancel_grace_seconds,
                    command_ttl_seconds=settings.agent_command_ttl_seconds,
                    state_versions_kept=settings.state_versions_kept,
                ),
                on_command=agent_gateway.waker.notify,
            )
            reader = db.readonly(engine)
            followers = log_followers.FollowHub(reader, notifier)
            chunk_writer = log_writer.ChunkWriter(
                engine, on_stored=followers.stored, concurrency=log_writer.concurrency_for(engine)
            )
            app.state.services = Services(
                settings=settings,
                engine=engine,
                reader=reader,
                box=box,
                blobs=blobs,
                token_key=token_key,
                api_token_key=api_key,
                notifier=notifier,
                log_writer=chunk_writer,
                log_followers=followers,
                creation=creation.Context(
                    blobs=blobs,
                    public_url=settings.resolved_public_url,
                    timeout=timedelta(seconds=settings.deployment_timeout_seconds),
                    box=box,
                ),
                wake_dispatcher=partial(_wake_all, dispatcher, managed_gateway),
                issuer=issuer,
            )
            app.state.dispatcher = dispatcher
            app.state.agent_gateway = agent_gateway
            background.append(
                asyncio.create_task(agent_gateway.run(app.state.services, stop), name="agent-gateway")
            )
            if engine.dialect.name == "postgresql":
                background.append(
                    asyncio.create_task(
                        listener.listen(
                            engine.url,
                            command_store.CHANNEL,
                            agent_gateway.announced,
                            stop,
                            on_connected=agent_gateway.listener_connected,
                        ),
                        name="agent-command-listener",
                    )
                )
            app.state.retention = retention.RetentionWorker(
                engine=engine,
                blobs=blobs,
                retention=timedelta(days=settings.object_retention_days),
                interval_seconds=settings.cleanup_interval_seconds,
                outputs_retention=timedelta(seconds=settings.outputs_retention_seconds),
            )
            background.append(asyncio.create_task(app.state.retention.run(stop), name="object-retention"))
            app.state.managed_worker = _managed_worker(settings, engine, notifier, managed_gateway)
            background.append(asyncio.create_task(app.state.managed_worker.run(stop), name="managed-runners"))
            if run_dispatcher:
                worker = asyncio.create_task(dispatcher.run(stop), name="dispatcher")
            if settings.allow_local_runners and local.run_user is not None:
                check = asyncio.create_task(_check_run_user(local), name="run-user-check")
            yield
        finally:
            # After the requests (uvicorn waited for them, up to PO_SHUTDOWN_GRACE_SECONDS).
            await hand_back_leases(app)
            stop.set()
            if check is not None:
                check.cancel()
            if worker is not None:
                dispatcher.wake()
                await worker
            for task in background:
                await task
            await close_live_logs(app)
            await db.dispose(engine)
            await asyncio.to_thread(local.close)

    app = _App(
        title="Platform Orchestrator",
        version="0.1.0",
        lifespan=lifespan,
        description=API_DESCRIPTION,
        openapi_url="/openapi.json",
        docs_url=None,  # served by api.docs, from the package's own assets
        redoc_url=None,
    )
    app.state.managed_gateway = gateway_managed.ManagedGateway(settings=settings)
    errors.install(app)
    app.add_middleware(BodyLimitMiddleware)
    # Agents' long polls skip the rest of the stack while they wait.
    app.add_middleware(LongPollMiddleware)
    routers = (
        orgs.router,
        projects.router,
        runners.router,
        runner_rules.router,
        resource_types.router,
        module_providers.router,
        modules.router,
        module_rules.router,
        deployments.router,
        deployment_logs.router,
        state_versions.router,
        usage.router,
        gateway_deployments.router,
        gateway_commands.router,
        gateway_state.router,
        gateway_managed.router,
        well_known.router(settings.resolved_public_url),
    )
    # Outermost of ours: text no database can hold is refused before anything reads it (authentication
    # included).
    app.add_middleware(InputCheckMiddleware, routes=[route for router in routers for route in router.routes])
    _require_client_certificates(app, settings)
    _install_metrics(app, settings)
    for router in routers:
        app.include_router(router)
    app.include_router(health.router)

    docs.install(app)
    console.install(app)
    openapi.install(app, extra_paths=[(docs.DOCS_PATH, docs.PATH_ITEM)])
    # Last: OPTIONS, and 405 for the other methods, on every path the routes above serve.
    app.router.routes.append(methods.AllowedMethodsRoute(list(app.router.routes)))
    return app
