"""A real server (uvicorn on 127.0.0.1) whose dispatcher launches real runner processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.settings import ServerSettings
from tests.support.stack import Stack, build_stack, running_server


@pytest.fixture
def server_url(settings: ServerSettings) -> Iterator[str]:
    def make(port: int) -> ServerSettings:
        return settings.model_copy(
            update={
                "listen": f"127.0.0.1:{port}",
                "public_url": f"http://127.0.0.1:{port}",
                "status_check_interval_seconds": 0.5,
            }
        )

    with running_server(make) as url:
        yield url


@pytest.fixture
def stack(server_url: str, tmp_path: Path) -> Iterator[Stack]:
    made = build_stack(server_url, tmp_path)
    yield made
    made.client.close()
