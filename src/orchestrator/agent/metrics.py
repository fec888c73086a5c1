"""The agent's Prometheus metrics, served at ``/metrics`` on ``AGENT_METRICS_ADDR`` (off when unset).

Names follow Prometheus' conventions (``po_agent_`` prefix, ``_total`` counters); labels hold small fixed
sets only, never a command or deployment id. The families are the agent's own view: the server's
``po_agent_*`` families (``orchestrator.metrics``) count the same protocol from the gateway's side.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, PlatformCollector, ProcessCollector
from prometheus_client.exposition import start_wsgi_server

REGISTRY: Final = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

#: ``result``: command (one was delivered), empty (the wait ended without one), unauthorized (401: the
#: gateway does not know this key for this runner), error (unreachable, 429, 5xx, another 4xx).
POLLS: Final = Counter(
    "po_agent_polls",
    "Long polls of commands/next this agent made, by result (command, empty, unauthorized, error).",
    ["result"],
    registry=REGISTRY,
)
COMMANDS_RECEIVED: Final = Counter(
    "po_agent_commands_received",
    "Commands delivered to this agent (a redelivery counts again).",
    registry=REGISTRY,
)
COMMANDS_REFUSED: Final = Counter(
    "po_agent_commands_refused",
    "Delivered commands refused before any launch (invalid or expired envelope).",
    registry=REGISTRY,
)
#: ``kind``: local (a ``vm`` runner's process) or kubernetes (a ``kubernetes-agent`` runner's Job).
RUNS_LAUNCHED: Final = Counter(
    "po_agent_runs_launched",
    "Runs launched (or adopted, for a redelivered command), by kind (local, kubernetes).",
    ["kind"],
    registry=REGISTRY,
)
LAUNCH_FAILURES: Final = Counter(
    "po_agent_launch_failures",
    "Launches that failed, by whether the failure was terminal (the deployment fails) or retried.",
    ["terminal"],
    registry=REGISTRY,
)
#: ``outcome``: succeeded (exit code 0) or failed. Local runs only: a Kubernetes Job's runner reports to the
#: gateway itself, and the agent watches its Job only until its pod started.
RUNS_FINISHED: Final = Counter(
    "po_agent_runs_finished",
    "Local runs (vm) whose runner process exited, by outcome (succeeded: exit code 0, failed).",
    ["outcome"],
    registry=REGISTRY,
)
RUNS_WATCHED: Final = Gauge(
    "po_agent_runs_watched",
    "Kubernetes runs whose pod this agent watches until it starts.",
    registry=REGISTRY,
)
#: ``answer``: ack, retry, reject, or unanswered (it could not be sent; the lease runs out).
ANSWERS: Final = Counter(
    "po_agent_command_answers",
    "Answers to delivered commands, by answer (ack, retry, reject, unanswered).",
    ["answer"],
    registry=REGISTRY,
)


def run_finished(exit_code: int) -> None:
    """A local run's runner exited (``LocalLauncher``'s ``on_exit``)."""
    RUNS_FINISHED.labels("succeeded" if exit_code == 0 else "failed").inc()


def parse_address(text: str, *, any_port: bool = False) -> tuple[str, int]:
    """``host:port`` (``[::]:9090`` for IPv6) → (host, port); ValueError naming what is wrong. Port 0 (any
    free port: nothing could scrape it) only with ``any_port`` (tests)."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    lowest = 0 if any_port else 1
    if not sep or not host or not port.isdigit() or not lowest <= int(port) < 65536:
        raise ValueError(f"'{text}' is not host:port (e.g. 0.0.0.0:9090)")
    return host, int(port)


class MetricsServer:
    """``/metrics`` (any path answers the exposition) in a daemon thread."""

    def __init__(self, address: str) -> None:
        host, port = parse_address(address, any_port=True)
        self._server, self._thread = start_wsgi_server(port, addr=host, registry=REGISTRY)

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
