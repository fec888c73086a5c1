"""Every component of the provider, registered in pyvider's hub under its Terraform type name."""

from __future__ import annotations

from typing import Any

from orchestrator.tfprovider import catalog, deployments, modules, runners
from orchestrator.tfprovider.provider import NAME, PlatformOrchestratorProvider
from orchestrator.tfprovider.resource import data_source_class, resource_class

PREFIX = NAME

RESOURCE_SPECS = (
    *catalog.RESOURCES,
    *runners.RESOURCES,
    *modules.RESOURCES,
    *deployments.RESOURCES,
)
DATA_SOURCE_SPECS = (
    *catalog.DATA_SOURCES,
    *runners.DATA_SOURCES,
    *modules.DATA_SOURCES,
)


def register(hub: Any) -> None:
    hub.register("provider", NAME, PlatformOrchestratorProvider)
    for spec in RESOURCE_SPECS:
        hub.register("resource", f"{PREFIX}_{spec.name}", resource_class(PREFIX, spec))
    for source in DATA_SOURCE_SPECS:
        hub.register("data_source", f"{PREFIX}_{source.name}", data_source_class(PREFIX, source))
