"""Our Helm charts (``charts/``), rendered with helm-python-sdk: what the chart tests share.

``import_helm`` gives the ``helm_python`` module, or skips the test without it (fails when ``CI`` or
``PO_TEST_REQUIRE_TOOLS`` is set). ``manifests`` parses what ``Chart.render`` (or ``Config.render``)
returns; ``by_kind``, ``one`` and ``env_of`` pick from it; ``merged`` merges values as Helm does (maps
deeply, everything else replaced); ``undocumented_values`` lists the values.yaml leaves a chart's README
does not name. ``manifest_problems`` checks a rendered manifest: Kubernetes' strict schemas
(``kube_schema``), or for a ServiceMonitor (a custom resource, which kubernetes-validate has no schema for)
the fields of the Prometheus Operator's CRD that our charts use.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.support.kube_schema import schema_problems
from tests.support.tools import tools_required

__all__ = [
    "by_kind",
    "env_of",
    "import_helm",
    "manifest_problems",
    "manifests",
    "merged",
    "one",
    "service_monitor_problems",
    "undocumented_values",
]


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


#: The Prometheus Operator's ServiceMonitor (``monitoring.coreos.com/v1``): the fields our charts set, with
#: their types in the operator's CRD. kubernetes-validate ships no schema for custom resources.
_SERVICE_MONITOR_FIELDS: dict[str, set[str]] = {
    "": {"apiVersion", "kind", "metadata", "spec"},
    "metadata": {"name", "namespace", "labels", "annotations"},
    "spec": {"selector", "namespaceSelector", "endpoints", "jobLabel"},
    "spec.selector": {"matchLabels", "matchExpressions"},
    "spec.namespaceSelector": {"any", "matchNames"},
    "spec.endpoints[]": {"port", "path", "interval", "scheme", "scrapeTimeout"},
}
_DURATION = re.compile(
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)


def service_monitor_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Why ``manifest`` is not a ServiceMonitor as the operator's CRD describes the fields our charts use:
    unknown fields, wrong types, a missing selector or endpoint port, an interval that is no duration."""
    problems: list[str] = []

    def known(node: Any, where: str) -> None:
        if not isinstance(node, Mapping):
            problems.append(f"{where or '(top level)'}: must be an object")
            return
        unknown = set(node) - _SERVICE_MONITOR_FIELDS[where]
        if unknown:
            problems.append(f"{where or '(top level)'}: unknown fields {sorted(unknown)}")

    def strings(node: Any, where: str) -> None:
        if not isinstance(node, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in node.items()
        ):
            problems.append(f"{where}: must map strings to strings")

    if (manifest.get("apiVersion"), manifest.get("kind")) != ("monitoring.coreos.com/v1", "ServiceMonitor"):
        return ["not a monitoring.coreos.com/v1 ServiceMonitor"]
    known(manifest, "")
    metadata, spec = manifest.get("metadata", {}), manifest.get("spec", {})
    known(metadata, "metadata")
    strings(metadata.get("labels", {}), "metadata.labels")
    known(spec, "spec")
    known(spec.get("selector", {}), "spec.selector")
    strings(spec.get("selector", {}).get("matchLabels"), "spec.selector.matchLabels")
    namespaces = spec.get("namespaceSelector", {})
    known(namespaces, "spec.namespaceSelector")
    if not all(isinstance(n, str) for n in namespaces.get("matchNames", [])):
        problems.append("spec.namespaceSelector.matchNames: must be strings")
    endpoints = spec.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        return [*problems, "spec.endpoints: must be a non-empty list"]
    for number, endpoint in enumerate(endpoints):
        known(endpoint, "spec.endpoints[]")
        if not isinstance(endpoint, Mapping) or not isinstance(endpoint.get("port"), str):
            problems.append(f"spec.endpoints[{number}].port: must be a port name")
            continue
        interval = endpoint.get("interval", "30s")
        if not isinstance(interval, str) or not _DURATION.match(interval):
            problems.append(f"spec.endpoints[{number}].interval: {interval!r} is not a duration")
    return problems


def manifest_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Why a rendered manifest is invalid (empty: valid): a ServiceMonitor by the operator's fields, any
    other object by Kubernetes' strict schemas."""
    if manifest.get("kind") == "ServiceMonitor":
        return service_monitor_problems(manifest)
    return schema_problems(manifest)
