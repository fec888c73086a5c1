"""Every ``octl`` command, found by walking its click groups, fails as one line saying what to do next,
with a non-zero exit and no traceback: against a stopped server, with a wrong token, in a wrong org."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.live_server import serve_in_thread
from tests.support.octl import Octl, leaf_commands, org_admin_token, sample_args

#: Commands that never reach the API (the config file, a key made here).
LOCAL = {
    ("config", "set-org"),
    ("config", "set-token"),
    ("config", "set-url"),
    ("config", "show"),
    ("config", "use"),
    ("create", "agent-key"),
    ("terraform", "install-provider"),
}
#: Commands that read a public route: no token, no organization.
PUBLIC = {("get", "compatibility-matrix")}
#: Commands of the platform, not of an organization: a platform-admin token, whatever the organization.
PLATFORM = {
    ("create", "managed-runner-registration"),
    ("delete", "managed-runner-registration"),
    ("get", "managed-runner-registrations"),
}
COMMANDS = [path for path in leaf_commands() if path not in LOCAL]
AUTHENTICATED = [path for path in COMMANDS if path not in PUBLIC]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """One server for the module (each case only reads an error answer): its URL and an admin token."""
    from tests.support.orgs import BOOTSTRAP_TOKEN

    data = tmp_path_factory.mktemp("server")
    settings = ServerSettings(
        data_dir=data, database_url=f"sqlite+aiosqlite:///{data / 'po.db'}", bootstrap_token=BOOTSTRAP_TOKEN
    )
    with serve_in_thread(create_app(settings)) as base_url:
        yield base_url, org_admin_token(base_url)


def _stopped_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _check_one_line(result_output: str, stderr: str, exit_code: int, hint: str) -> None:
    assert exit_code != 0, result_output
    assert "Traceback" not in result_output
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert 1 == len(errors), stderr
    assert stderr.rstrip().endswith(errors[0]), stderr
    assert hint in errors[0], errors[0]


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command__against_a_stopped_server(path: tuple[str, ...], tmp_path: Path) -> None:
    octl = Octl(base_url=_stopped_url(), token="po_sample", config_path=tmp_path / "config.yaml")

    result = octl(*sample_args(path, tmp_path))

    _check_one_line(result.output, result.stderr, result.exit_code, "is `orchestrator serve` running")
    assert 3 == result.exit_code


@pytest.mark.parametrize("path", AUTHENTICATED, ids=" ".join)
def test_every_command__with_a_wrong_token(
    path: tuple[str, ...], server: tuple[str, str], tmp_path: Path
) -> None:
    octl = Octl(base_url=server[0], token="po_" + "x" * 40, config_path=tmp_path / "config.yaml")

    result = octl(*sample_args(path, tmp_path))

    _check_one_line(result.output, result.stderr, result.exit_code, "octl config set-token")
    assert 1 == result.exit_code


@pytest.mark.parametrize(
    "path", [p for p in AUTHENTICATED if p[-1] not in ("org", "orgs") and p not in PLATFORM], ids=" ".join
)
def test_every_command__in_a_wrong_org(
    path: tuple[str, ...], server: tuple[str, str], tmp_path: Path
) -> None:
    octl = Octl(base_url=server[0], token=server[1], config_path=tmp_path / "config.yaml")

    result = octl(*sample_args(path, tmp_path), PO_ORG_ID="no-such-org")

    _check_one_line(result.output, result.stderr, result.exit_code, "octl config set-org")
    assert 1 == result.exit_code
    assert "no-such-org" in result.stderr


@pytest.mark.parametrize("path", sorted(PLATFORM), ids=" ".join)
def test_every_platform_command__with_an_org_admin_token(
    path: tuple[str, ...], server: tuple[str, str], tmp_path: Path
) -> None:
    octl = Octl(base_url=server[0], token=server[1], config_path=tmp_path / "config.yaml")

    result = octl(*sample_args(path, tmp_path))

    _check_one_line(result.output, result.stderr, result.exit_code, "orchestrator token create")
    assert 1 == result.exit_code
    assert "platform admin" in result.stderr
