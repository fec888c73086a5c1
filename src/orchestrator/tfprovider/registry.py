"""Every resource and data source of the provider under its Terraform type name."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.tfprovider import catalog, deployments, modules, runners
from orchestrator.tfprovider.provider import NAME
from orchestrator.tfprovider.resource import SourceSpec, Spec

PREFIX = NAME

RESOURCE_SPECS: tuple[Spec, ...] = (
    *catalog.RESOURCES,
    *runners.RESOURCES,
    *modules.RESOURCES,
    *deployments.RESOURCES,
)
DATA_SOURCE_SPECS: tuple[SourceSpec, ...] = (
    *catalog.DATA_SOURCES,
    *runners.DATA_SOURCES,
    *modules.DATA_SOURCES,
)

RESOURCES: Mapping[str, Spec] = {f"{PREFIX}_{spec.name}": spec for spec in RESOURCE_SPECS}
DATA_SOURCES: Mapping[str, SourceSpec] = {f"{PREFIX}_{spec.name}": spec for spec in DATA_SOURCE_SPECS}
