"""Kubernetes' own schemas for the manifests tests render or capture: ``kubernetes-validate --strict``.

``kubernetes_validate.validate(manifest, version, strict=True)`` checks a manifest against the OpenAPI
schemas of a Kubernetes release (as JSON schema), unknown fields refused. Tests check the newest release
the installed package ships and 1.30 (``KUBERNETES_VERSIONS``). Nothing else of the API server's validation
(name formats, cross-field rules, admission) is covered.

``validate`` reads the schema files (1.8 MB of definitions) at every call, 70 ms a Job for the two
versions; the stand-in API server checks every object a client sends, so :func:`schema_problems` does what
``validate`` does with each file read once: the same files of the package's ``-strict`` directory (found
as ``validate`` finds them: the newest release not newer than the one asked for), the same validator
(JSON schema 2020-12 with the definitions as a registry). ``tests/unit/test_kube_schema.py`` checks that
both agree.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any, Final

from kubernetes_validate import utils as kubernetes_validate
from packaging.version import Version

__all__ = ["KUBERNETES_VERSIONS", "assert_valid", "schema_problems", "schema_release"]

#: The newest Kubernetes whose schemas ``kubernetes-validate`` ships, and 1.30.
KUBERNETES_VERSIONS: Final = (kubernetes_validate.latest_version(), "1.30.0")
_SCHEMAS: Final = "kubernetes-json-schema"


def schema_release(desired: str) -> str:
    """The release whose schemas ``validate`` uses for ``desired``: the newest not newer than it."""
    wanted = Version(kubernetes_validate.major_minor(desired.removeprefix("v")))
    usable = [
        v for v in kubernetes_validate.all_versions() if Version(kubernetes_validate.major_minor(v)) <= wanted
    ]
    if not usable:
        raise ValueError(f"kubernetes-validate ships no schemas for Kubernetes {desired}")
    return str(usable[-1])


@functools.cache
def _definitions(schema_dir: str, version: str) -> Any:
    return kubernetes_validate.schema_contents(f"{_SCHEMAS}/{schema_dir}/_definitions.json", version)


@functools.cache
def _validator(version: str, api_version: str, kind: str) -> Any | None:
    """The strict validator of ``kind`` in ``api_version`` for Kubernetes ``version``; None if the package
    has no schema for it."""
    release = schema_release(version)
    schema_dir = f"v{release}-local-strict"
    # rbac.authorization.k8s.io/v1 -> rbac-v1, as validate names the files.
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kubernetes_validate.schema_contents(
            f"{_SCHEMAS}/{schema_dir}/{kind.lower()}-{group_version}.json", version
        )
    except FileNotFoundError:
        return None
    registry = kubernetes_validate.Resource.from_contents(_definitions(schema_dir, version)) @ (
        kubernetes_validate.Resource.from_contents(schema) @ kubernetes_validate.Registry()
    )
    return kubernetes_validate.jsonschema.validators.Draft202012Validator(schema, registry=registry)


def schema_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Why ``manifest`` fails strict validation, ``Kubernetes <version>: <field>: <message>`` for each
    problem and version; empty when it passes for every version of ``KUBERNETES_VERSIONS``."""
    api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return ["apiVersion and kind must be strings"]
    problems: list[str] = []
    for version in KUBERNETES_VERSIONS:
        validator = _validator(version, api_version, kind)
        if validator is None:
            problems.append(f"Kubernetes {version}: no schema for {kind} in {api_version}")
            continue
        for error in sorted(validator.iter_errors(dict(manifest)), key=lambda e: list(map(str, e.path))):
            where = ".".join(str(part) for part in error.path) or "(top level)"
            problems.append(f"Kubernetes {version}: {where}: {error.message}")
    return problems


def assert_valid(manifest: Mapping[str, Any]) -> None:
    """``manifest`` passes ``kubernetes-validate --strict`` for every version of ``KUBERNETES_VERSIONS``."""
    problems = schema_problems(manifest)
    metadata = manifest.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    assert not problems, f"{manifest.get('kind')} {name}: " + "; ".join(problems)
