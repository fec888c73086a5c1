"""The commands of ``octl``, one module per kind of object; importing a module registers its commands."""

from __future__ import annotations

from orchestrator.cli.octl.commands import (
    agent_keys,
    config,
    deploy,
    deployments,
    envs,
    logs,
    managed_registrations,
    module_rules,
    modules,
    orgs,
    projects,
    providers,
    resource_types,
    runner_rules,
    runners,
    states,
    tokens,
    usage,
    verbs,
)

__all__ = [
    "agent_keys",
    "config",
    "deploy",
    "deployments",
    "envs",
    "logs",
    "managed_registrations",
    "module_rules",
    "modules",
    "orgs",
    "projects",
    "providers",
    "resource_types",
    "runner_rules",
    "runners",
    "states",
    "tokens",
    "usage",
    "verbs",
]
