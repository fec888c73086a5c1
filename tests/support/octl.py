"""Driving ``octl`` against a live server: the in-process runner and the server with its own public URL.

The server is the real app under uvicorn (``serve_in_thread``), built once its port is bound, so that
``public_url`` (the URL runners call back: bundle, state, results, logs) is the server itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner, Result

from orchestrator.cli.octl import main
from orchestrator.client import ApiClient
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.conftest import BOOTSTRAP_TOKEN
from tests.support.live_server import serve_in_thread

ORG = "acme"


@dataclass
class Octl:
    """Runs ``octl`` in-process with PO_API_URL/PO_AUTH_TOKEN/PO_ORG_ID set for the org's admin token."""

    base_url: str
    token: str
    config_path: Path
    env: dict[str, str | None] = field(default_factory=dict)

    def __call__(self, *args: str, input: str | None = None, **env: str | None) -> Result:
        environ: dict[str, str | None] = {
            "PO_API_URL": self.base_url,
            "PO_AUTH_TOKEN": self.token,
            "PO_ORG_ID": ORG,
            "OCTL_CONFIG": str(self.config_path),
            **self.env,
            **env,
        }
        return CliRunner().invoke(main, list(args), input=input, env=environ, catch_exceptions=False)


@contextmanager
def serve(settings: ServerSettings, **overrides: object) -> Iterator[str]:
    """The whole server (API, gateway, dispatcher) on a free port, ``public_url`` pointing at it."""

    def build(base_url: str) -> object:
        return create_app(settings.model_copy(update={"public_url": base_url, **overrides}))

    with serve_in_thread(factory=build) as base_url:
        yield base_url


def org_admin_token(base_url: str) -> str:
    """Create organization ``acme`` and answer an admin token of it (made with the bootstrap token)."""
    with ApiClient(base_url, BOOTSTRAP_TOKEN) as platform:
        platform.create_org(ORG)
        return str(platform.create_token(ORG, {"role": "admin", "description": "octl tests"})["token"])
