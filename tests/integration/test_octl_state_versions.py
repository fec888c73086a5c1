"""``octl get state-versions``, ``octl state pull`` and ``octl state rollback`` against the real server,
run as the installed program (the in-process server logs to this process's standard output).

The versions are written to the server's database as its state backend writes them
(``dispatch.state_versions.write``); the rollback through a real runner's Terraform, with a redeploy
planning against the older state, is tests/acceptance/test_state_versions.py.
"""

from __future__ import annotations

import asyncio
import json
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from orchestrator.dispatch import state_versions
from orchestrator.secretbox import SecretBox, load_or_create_key
from orchestrator.settings import ServerSettings
from orchestrator.store import db
from tests.support.octl import OctlProcess, org_admin_token, serve


def tfstate(serial: int, *names: str) -> dict[str, Any]:
    return {
        "version": 4,
        "terraform_version": "1.15.5",
        "serial": serial,
        "lineage": "5b1c2a4e-0d7f-4e43-9a59-3c1d1e1a7f00",
        "outputs": {},
        "resources": [
            {"mode": "managed", "type": "terraform_data", "name": n, "instances": [{"attributes": {"id": n}}]}
            for n in names
        ],
    }


@dataclass
class Platform:
    octl: OctlProcess
    viewer: OctlProcess
    settings: ServerSettings

    def write_versions(self, *states: dict[str, Any]) -> None:
        """Store ``states`` as versions of shop/dev, as the state backend does."""
        env = json.loads(self.octl("get", "env", "shop", "dev", "-o", "json").stdout)

        async def go() -> None:
            engine = db.create_engine(self.settings.resolved_database_url)
            box = SecretBox(load_or_create_key(self.settings.data_dir))
            try:
                async with engine.begin() as conn:
                    for state in states:
                        await state_versions.write(
                            conn,
                            box,
                            org_id="acme",
                            env_uuid=uuid.UUID(env["uuid"]),
                            data=json.dumps(state, indent=2).encode(),
                            keep=100,
                            now=datetime.now(UTC),
                        )
            finally:
                await engine.dispose()

        asyncio.run(go())


@pytest.fixture
def platform(settings: ServerSettings, tmp_path: Path) -> Iterator[Platform]:
    with serve(settings) as base_url:
        octl = OctlProcess(
            base_url=base_url, token=org_admin_token(base_url), config_path=tmp_path / "octl.yaml"
        )
        for args in (
            ("create", "env-type", "development"),
            ("create", "project", "shop"),
            ("create", "env", "shop", "dev", "--set", "env_type_id=development"),
        ):
            assert 0 == octl(*args).exit_code
        token = json.loads(octl("create", "token", "--set", "role=viewer", "-o", "json").stdout)["token"]
        viewer = OctlProcess(base_url=base_url, token=token, config_path=tmp_path / "viewer.yaml")
        yield Platform(octl=octl, viewer=viewer, settings=settings)


def test_get_state_versions__a_table_newest_first_and_json(platform: Platform) -> None:
    empty = platform.viewer("get", "state-versions", "shop", "dev")
    platform.write_versions(tfstate(1, "a"), tfstate(2, "a", "b"))

    table = platform.viewer("get", "state-versions", "shop", "dev")
    listed = json.loads(platform.viewer("get", "state-versions", "shop", "dev", "-o", "json").stdout)

    assert (0, "No state versions kept for environment shop/dev.\n") == (empty.exit_code, empty.stderr)
    assert 0 == table.exit_code, table.output
    lines = table.stdout.splitlines()
    assert ["Version", "Serial", "Lineage", "Resources", "Deployment", "Kind", "CreatedAt"] == lines[
        0
    ].split()
    assert [
        ["2", "2", tfstate(1)["lineage"], "2", "terraform"],
        ["1", "1", tfstate(1)["lineage"], "1", "terraform"],
    ] == [line.split()[:5] for line in lines[1:]]
    assert [(2, True), (1, False)] == [(v["version"], v["current"]) for v in listed]


def test_state_pull__the_current_or_a_given_version_to_stdout_or_a_private_file(
    platform: Platform, tmp_path: Path
) -> None:
    platform.write_versions(tfstate(1, "a"), tfstate(2, "a", "b"))
    target = tmp_path / "dev.tfstate"

    current = platform.octl("state", "pull", "shop", "dev")
    first = platform.octl("state", "pull", "shop", "dev", "--version", "1", "-o", str(target))
    by_viewer = platform.viewer("state", "pull", "shop", "dev")
    missing = platform.octl("state", "pull", "shop", "dev", "--version", "9")

    assert 0 == current.exit_code, current.output
    assert tfstate(2, "a", "b") == json.loads(current.stdout)
    assert "State version 2 (serial 2, 2 resource(s)" in current.stderr
    assert 0 == first.exit_code, first.output
    assert tfstate(1, "a") == json.loads(target.read_text())
    assert 0o600 == stat.S_IMODE(target.stat().st_mode)
    assert f"State version 1 of shop/dev written to {target}." in first.stderr
    assert 1 == by_viewer.exit_code
    assert "Error: forbidden: role 'viewer' may not manage in organization 'acme'" in by_viewer.stderr
    assert "" == by_viewer.stdout
    assert (1, "Error: not found: state version 9 not found in environment 'shop/dev'\n") == (
        missing.exit_code,
        missing.stderr.splitlines(keepends=True)[-1],
    )


def test_state_pull__an_environment_without_state_says_so(platform: Platform) -> None:
    result = platform.octl("state", "pull", "shop", "dev")

    assert (1, "Error: environment shop/dev has no Terraform state yet\n") == (
        result.exit_code,
        result.stderr,
    )


def test_state_rollback__asks_refuses_without_a_terminal_and_rolls_back_with_yes(platform: Platform) -> None:
    platform.write_versions(tfstate(1, "a"), tfstate(2, "a", "b"), tfstate(3, "a", "b", "c"))

    unasked = platform.octl("state", "rollback", "shop", "dev", "1")
    by_viewer = platform.viewer("state", "rollback", "shop", "dev", "1", "--yes")
    rolled = platform.octl("state", "rollback", "shop", "dev", "1", "--yes")
    pulled = json.loads(platform.octl("state", "pull", "shop", "dev").stdout)
    listed = json.loads(platform.viewer("get", "state-versions", "shop", "dev", "-o", "json").stdout)

    assert 2 == unasked.exit_code
    assert (
        "Error: state rollback of shop/dev asks for confirmation, and standard input is not a terminal: pass "
        "--yes to roll back without asking\n"
    ) == unasked.stderr
    assert 1 == by_viewer.exit_code
    assert "Error: forbidden: role 'viewer' may not manage in organization 'acme'" in by_viewer.stderr
    assert 0 == rolled.exit_code, rolled.output
    assert (
        "State of shop/dev rolled back to version 1: version 4 (serial 4, 1 resource(s), a rollback to "
        "version 1, at "
    ) in rolled.stderr
    assert {**tfstate(1, "a"), "serial": 4} == pulled
    assert [(4, "rollback", 1), (3, "terraform", None)] == [
        (v["version"], v["kind"], v.get("rolled_back_from")) for v in listed[:2]
    ]
