"""The verb groups: ``octl create|get|update|delete <object>``; each resource module adds its objects."""

from __future__ import annotations

import click

from orchestrator.cli.octl.session import OctlGroup


@click.group(cls=OctlGroup)
def create() -> None:
    """Create an object from --set, --set-json or --set-yaml input."""


@click.group(cls=OctlGroup)
def get() -> None:
    """Show one object or list objects (default output: table)."""


@click.group(cls=OctlGroup)
def update() -> None:
    """Update an object (PATCH) from --set, --set-json or --set-yaml input."""


@click.group(cls=OctlGroup)
def delete() -> None:
    """Delete an object."""
