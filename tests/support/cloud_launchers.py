"""What the GKE and AKS launcher tests share: the stand-in egress policy, run specs of a cloud runner, and
checks that a Job holds what the ``kubernetes`` launcher renders and that a message holds no secret."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from orchestrator.domain.runner_types import K8sRunnerJobConfig
from orchestrator.launchers import kubernetes_job
from orchestrator.launchers.base import RunStatus
from orchestrator.launchers.egress import EgressPolicy
from orchestrator.protocol.launch import RunSpec
from tests.support.kube_launcher import IMAGE, make_spec

#: The stand-ins are on 127.0.0.1: these launchers allow loopback on purpose (the server's policy does not).
STAND_IN_EGRESS = EgressPolicy(denied_networks=())


def cloud_spec(out_dir: Path, configuration: dict[str, Any]) -> RunSpec:
    """The stand-in runner's spec (tests/support/kube_launcher.py) with ``configuration`` plus its ``job``."""
    spec = make_spec(out_dir)
    job = spec.runner_configuration["job"]
    return spec.model_copy(update={"runner_configuration": {**configuration, "job": job}})


def rendered_job(spec: RunSpec) -> dict[str, Any]:
    """The Job the ``kubernetes`` launcher creates for ``spec``."""
    job_config = K8sRunnerJobConfig.model_validate(spec.runner_configuration["job"])
    secret = kubernetes_job.token_secret_name(spec)
    return kubernetes_job.render_job_manifest(spec, job_config, IMAGE, token_secret=secret)


def holds(stored: Any, rendered: Any, path: str = "") -> list[str]:
    """Where ``stored`` (an object as the API server keeps it, defaults added) lacks or changes something
    of ``rendered``; empty when it holds all of it."""
    if isinstance(rendered, dict):
        if not isinstance(stored, dict):
            return [f"{path}: not an object"]
        return [p for key, value in rendered.items() for p in holds(stored.get(key), value, f"{path}.{key}")]
    if isinstance(rendered, list):
        if not isinstance(stored, list) or len(stored) != len(rendered):
            return [f"{path}: not a list of {len(rendered)}"]
        return [
            p
            for i, (s, r) in enumerate(zip(stored, rendered, strict=True))
            for p in holds(s, r, f"{path}[{i}]")
        ]
    return [] if stored == rendered else [f"{path}: {stored!r} != {rendered!r}"]


def leaked(text: str, secrets: list[str]) -> list[str]:
    """The secrets (or their first 16 characters) that ``text`` holds."""
    return [secret for secret in secrets if secret and (secret in text or secret[:16] in text)]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def eventually(
    check: Callable[[], Awaitable[RunStatus]], accept: Callable[[RunStatus], bool], within: float = 20
) -> RunStatus:
    """Check until ``accept``; AssertionError with the last status after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        status = await check()
        if accept(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"last status: {status}")
        await asyncio.sleep(0.05)
