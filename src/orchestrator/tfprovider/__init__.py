"""The ``platform-orchestrator`` Terraform provider (plugin protocol 6, built on pyvider).

pyvider finds this package through the ``pyvider`` entry point and calls `register_components`;
nothing is imported until then, so that ``octl`` can name the package without loading pyvider.
"""

from __future__ import annotations

from typing import Any


def register_components(hub: Any) -> None:
    """Register the provider, its resources and its data sources in pyvider's component hub."""
    from orchestrator.tfprovider.registry import register

    register(hub)
