"""examples/runners: one runner per runner type (and per `vm` connection), each accepted by the API when
created through ``octl`` (as a platform admin: ``vm`` with a local connection is theirs)."""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.domain import runner_types
from orchestrator.settings import ServerSettings
from tests.support.octl import ORG, Octl, org_admin_token, serve
from tests.support.orgs import BOOTSTRAP_TOKEN

EXAMPLES = Path(__file__).parents[2] / "examples" / "runners"


def _kind(path: Path) -> str:
    configuration = yaml.safe_load(path.read_text())["runner_configuration"]
    if configuration["type"] == "vm":
        return f"vm-{configuration['connection']['type']}"
    return str(configuration["type"])


def _known_kinds() -> set[str]:
    """Every runner type the API knows, a `vm` once per connection type."""
    kinds = set()
    for model in typing.get_args(typing.get_args(runner_types.RunnerConfiguration)[0]):
        kind = model.model_fields["type"].default
        if kind == "vm":
            connection = model.model_fields["connection"].annotation
            for option in typing.get_args(connection):
                kinds.add(f"vm-{option.model_fields['type'].default}")
        else:
            kinds.add(kind)
    return kinds


def test_examples__one_per_runner_type() -> None:
    kinds = sorted(_kind(path) for path in EXAMPLES.glob("*.yaml"))

    assert sorted(_known_kinds()) == kinds


@pytest.fixture
def platform_octl(settings: ServerSettings, tmp_path: Path) -> Iterator[Octl]:
    with serve(settings) as base_url:
        org_admin_token(base_url)
        yield Octl(base_url=base_url, token=BOOTSTRAP_TOKEN, config_path=tmp_path / "octl.yaml")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_example__is_accepted_by_the_api(path: Path, platform_octl: Octl) -> None:
    created = platform_octl("create", "runner", path.stem, f"--set-yaml=@{path}", "-o", "json")

    assert 0 == created.exit_code, created.output
    runner = json.loads(created.stdout)
    assert (path.stem, ORG) == (runner["id"], runner["org_id"])
    assert (
        yaml.safe_load(path.read_text())["runner_configuration"]["type"]
        == runner["runner_configuration"]["type"]
    )
