"""The server's Prometheus metric families (``GET /metrics``), in one registry per process.

Names follow Prometheus' conventions: prefix ``po_``, base units (seconds), ``_total`` for counters. No label
holds an unbounded value: routes are templates (``/orgs/{org_id}/runners/{runner_id}``), never paths, and
no label carries an id (deployment, organization, runner, command); runner types, statuses and reasons are
small fixed sets. The code that does the work counts it (``web.metrics`` the requests, ``dispatch`` the
deployments, launches and retention, ``gateway`` the agent commands); gauges of rows (deployments running,
commands pending) are read from the database when scraped (``dispatch.gauges``), so every replica reports
the same cluster-wide value there.

``orchestrator serve`` runs one process: its families are this module's, and each replica is scraped on
its own. Counters of work done in a transaction are counted when the change is made: a transaction rolled
back afterwards (a database fault) may have been counted.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

REGISTRY: Final = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

#: Latency buckets of HTTP requests (seconds); long polls fall in the last ones.
REQUEST_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Buckets of the dispatch latency and of database pool waits (seconds).
SHORT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: The route label of a request no route matched (404, OPTIONS and 405 answers of ``api.methods``).
UNMATCHED_ROUTE: Final = "unmatched"
#: The methods named in the method label; any other is ``other``.
METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

HTTP_REQUESTS: Final = Counter(
    "po_http_requests",
    "HTTP requests answered, by route template, method and status code.",
    ["route", "method", "status"],
    registry=REGISTRY,
)
HTTP_REQUEST_DURATION: Final = Histogram(
    "po_http_request_duration_seconds",
    "Time from a request's arrival to the end of its answer, by route template, method and status code.",
    ["route", "method", "status"],
    buckets=REQUEST_BUCKETS,
    registry=REGISTRY,
)

#: Runner types as labels: the domain's types, ``managed``, and ``unknown`` (a runner deleted meanwhile).
DEPLOYMENTS_CREATED: Final = Counter(
    "po_deployments_created",
    "Deployments created (deploy and destroy), by runner type.",
    ["runner_type"],
    registry=REGISTRY,
)
DEPLOYMENTS_FINISHED: Final = Counter(
    "po_deployments_finished",
    "Deployments that became final, by runner type and status (succeeded, failed, cancelled).",
    ["runner_type", "status"],
    registry=REGISTRY,
)
DEPLOYMENTS_RUNNING: Final = Gauge(
    "po_deployments_running",
    "Deployments executing now (all replicas: read from the database when scraped), by runner type.",
    ["runner_type"],
    registry=REGISTRY,
)
DISPATCH_LATENCY: Final = Histogram(
    "po_dispatch_latency_seconds",
    "From a deployment's creation to its launch (its runner started, or its agent command queued), by "
    "runner type.",
    ["runner_type"],
    buckets=SHORT_BUCKETS,
    registry=REGISTRY,
)
#: Why a launch failed (``reason``): the runner is gone or cannot be launched by this server
#: (``runner_unavailable``), the launcher refused for good or its attempts ran out (``launch_error``), it
#: refused for now and is retried (``launch_error_retried``), a dependency (database, object store) was
#: unavailable and it is retried (``dependency_unavailable``), the deployment timed out before its launch
#: (``timeout``), anything else (``internal_error``; the log has the error id).
LAUNCH_FAILURE_REASONS: Final = (
    "runner_unavailable",
    "launch_error",
    "launch_error_retried",
    "dependency_unavailable",
    "timeout",
    "internal_error",
)
LAUNCH_FAILURES: Final = Counter(
    "po_dispatch_launch_failures",
    "Launches that failed, by reason (runner_unavailable, launch_error, launch_error_retried, "
    "dependency_unavailable, timeout, internal_error).",
    ["reason"],
    registry=REGISTRY,
)

AGENT_LONG_POLLS: Final = Gauge(
    "po_agent_long_polls",
    "Agents' commands/next long polls held open by this process now.",
    registry=REGISTRY,
)
AGENT_COMMANDS_QUEUED: Final = Counter(
    "po_agent_commands_queued",
    "Agent commands queued (one per deployment on an agent runner).",
    registry=REGISTRY,
)
AGENT_COMMANDS_DELIVERED: Final = Counter(
    "po_agent_commands_delivered",
    "Agent commands handed to an agent's long poll (each delivery, redeliveries included).",
    registry=REGISTRY,
)
AGENT_COMMAND_REDELIVERIES: Final = Counter(
    "po_agent_command_redeliveries",
    "Agent commands delivered again after their lease ran out or their agent asked to retry.",
    registry=REGISTRY,
)
AGENT_COMMANDS_EXPIRED: Final = Counter(
    "po_agent_commands_expired",
    "Agent commands no agent took up within their TTL (their deployment failed, COMMAND_EXPIRED).",
    registry=REGISTRY,
)
AGENT_COMMANDS_PENDING: Final = Gauge(
    "po_agent_commands_pending",
    "Agent commands not yet acknowledged, rejected or expired (all replicas: read when scraped).",
    registry=REGISTRY,
)

#: ``pool``: ``main`` (PostgreSQL: the one engine; SQLite: the writers' single connection) or ``readers``
#: (SQLite's engine of reading transactions).
DB_POOL_IN_USE: Final = Gauge(
    "po_db_pool_connections_in_use",
    "Database connections checked out of the pool now, by pool (main; readers on SQLite).",
    ["pool"],
    registry=REGISTRY,
)
DB_POOL_SIZE: Final = Gauge(
    "po_db_pool_size",
    "Connections the pool keeps (without overflow), by pool.",
    ["pool"],
    registry=REGISTRY,
)
DB_POOL_WAIT: Final = Histogram(
    "po_db_pool_wait_seconds",
    "Time taken to get a connection from the pool (waiting for a free one, or opening one), by pool. On "
    "SQLite the main pool's single connection is the write lock: this is the writers' queue.",
    ["pool"],
    buckets=SHORT_BUCKETS,
    registry=REGISTRY,
)

RETENTION_DELETED: Final = Counter(
    "po_retention_deleted",
    "What the retention worker deleted, by kind: object (a bundle or logs blob), outputs (a deployment's "
    "encrypted outputs), log_chunks (chunks of live logs).",
    ["kind"],
    registry=REGISTRY,
)
DATABASE_GAUGE_ERRORS: Final = Counter(
    "po_metrics_database_errors",
    "Scrapes whose database gauges could not be read (the gauges then keep their last values).",
    registry=REGISTRY,
)

LOG_CHUNKS_RECEIVED: Final = Counter(
    "po_log_chunks_received",
    "Live log chunks runners sent that were stored (a repeat of a stored chunk is not counted).",
    registry=REGISTRY,
)
LOG_CHUNK_BYTES_RECEIVED: Final = Counter(
    "po_log_chunk_bytes_received",
    "Bytes of ciphertext of the live log chunks stored.",
    registry=REGISTRY,
)
LOG_CHUNK_WRITE_DURATION: Final = Histogram(
    "po_log_chunk_write_seconds",
    "Transactions of the chunk writer (one per batch of chunks uploaded together): from waiting for a "
    "database connection to the commit.",
    buckets=SHORT_BUCKETS,
    registry=REGISTRY,
)
LOG_CHUNK_BATCH_SIZE: Final = Histogram(
    "po_log_chunk_batch_chunks",
    "Chunks stored by one transaction of the chunk writer.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    registry=REGISTRY,
)
LOG_FOLLOWERS: Final = Gauge(
    "po_log_followers",
    "Followers of live logs (GET .../logs?follow=true) this process serves now.",
    registry=REGISTRY,
)
