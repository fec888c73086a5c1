"""Optional fields of answers (``schemas.optional()``): left out when None, never ``null``, as upstream's
documents declare them; our OpenAPI shows them optional and not nullable."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from orchestrator.api import (
    deployments,
    module_providers,
    module_rules,
    modules,
    resource_types,
    runners,
    schemas,
    state_versions,
)
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings


def _omitted_when_none() -> set[tuple[str, str]]:
    """(model, field name in the answer) of every field declared with ``schemas.optional()``."""
    found = set()
    for module in (
        schemas,
        resource_types,
        module_providers,
        modules,
        module_rules,
        deployments,
        runners,
        state_versions,
    ):
        for model in vars(module).values():
            if (
                inspect.isclass(model)
                and issubclass(model, BaseModel)
                and model.__module__ == module.__name__
            ):
                for name, info in model.model_fields.items():
                    if info.exclude_if is not None:
                        found.add((model.__name__, info.alias or name))
    return found


def test_optional__absent_when_none_present_when_set() -> None:
    assert {"items": []} == schemas.PageOf[str](items=[]).model_dump(mode="json")
    assert {"items": ["a"], "next_page_token": "t"} == schemas.PageOf[str](
        items=["a"], next_page_token="t"
    ).model_dump(mode="json")


def test_optional__our_openapi_shows_the_fields_optional_and_not_nullable(tmp_path: Path) -> None:
    settings = ServerSettings(
        data_dir=tmp_path, database_url=f"sqlite+aiosqlite:///{tmp_path / 'db'}", listen="127.0.0.1:0"
    )
    components: dict[str, Any] = create_app(settings).openapi()["components"]["schemas"]
    omitted = _omitted_when_none()
    checked: set[tuple[str, str]] = set()
    wrong: list[str] = []

    for component in components.values():
        model = re.sub(r"\[.*", "", component.get("title", ""))
        for prop, schema in component.get("properties", {}).items():
            if (model, prop) not in omitted:
                continue
            checked.add((model, prop))
            if prop in component.get("required", []) or "default" in schema:
                wrong.append(f"{model}.{prop} required or with a default: {schema}")
            if {"type": "null"} in schema.get("anyOf", []) or schema.get("type") == "null":
                wrong.append(f"{model}.{prop} nullable: {schema}")

    assert [] == wrong
    assert {
        ("PageOf", "next_page_token"),
        ("EnvironmentOut", "runner_id"),
        ("EnvironmentOut", "status_message"),
        ("ModuleRuleOut", "env_id"),
        ("ResourceRequestOut", "class"),
        ("DeploymentMetrics", "num_tf_resources"),
        ("RunnerSummaryOut", "description"),
        ("StateVersionOut", "serial"),
    } <= checked
