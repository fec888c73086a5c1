"""Our Helm charts (``charts/``), rendered with helm-python-sdk: what the chart tests share.

``import_helm`` gives the ``helm_python`` module, or skips the test without it (fails when ``CI`` or
``PO_TEST_REQUIRE_TOOLS`` is set). ``manifests`` parses what ``Chart.render`` (or ``Config.render``)
returns; ``by_kind``, ``one`` and ``env_of`` pick from it; ``merged`` merges values as Helm does (maps
deeply, everything else replaced); ``undocumented_values`` lists the values.yaml leaves a chart's README
does not name.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.support.tools import tools_required

__all__ = ["by_kind", "env_of", "import_helm", "manifests", "merged", "one", "undocumented_values"]


def import_helm() -> ModuleType:
    """``helm_python``; skips the test when it is not installed (fails in CI / PO_TEST_REQUIRE_TOOLS)."""
    try:
        import helm_python
    except ImportError as exc:  # pragma: no cover - depends on the environment
        reason = f"helm-python-sdk is not installed ({exc})"
        if tools_required():
            pytest.fail(f"{reason}; CI/PO_TEST_REQUIRE_TOOLS is set, so this is a failure")
        pytest.skip(reason)
    return helm_python


def merged(base: Mapping[str, Any], *overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with each override merged in turn: maps deeply, other values replaced (Helm's rule)."""
    result = copy.deepcopy(dict(base))
    for override in overrides:
        _merge(result, override)
    return result


def _merge(into: dict[str, Any], override: Mapping[str, Any]) -> None:
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def manifests(files: Mapping[str, str]) -> list[dict[str, Any]]:
    """The objects of rendered templates (``path -> text``), in path order; NOTES.txt and empty
    documents left out."""
    return [
        doc
        for path, text in sorted(files.items())
        if path.endswith((".yaml", ".yml"))
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in objects if m["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [m for m in by_kind(objects, kind) if name is None or m["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} found"
    return found[0]


def env_of(container: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A container's environment by variable name."""
    return {e["name"]: e for e in container.get("env", [])}


def undocumented_values(chart: Path, objects: set[str]) -> list[str]:
    """Each leaf of the chart's values.yaml (dotted: ``image.tag``) not named in backquotes in its
    README.md; the keys in ``objects`` count as one leaf (Kubernetes objects such as ``resources``)."""
    readme = (chart / "README.md").read_text()

    def leaves(node: Any, prefix: str) -> Iterator[str]:
        if isinstance(node, dict) and node and prefix not in objects:
            for key, value in node.items():
                yield from leaves(value, f"{prefix}.{key}" if prefix else key)
        else:
            yield prefix

    values = yaml.safe_load((chart / "values.yaml").read_text())
    return [leaf for leaf in leaves(values, "") if f"`{leaf}`" not in readme]
