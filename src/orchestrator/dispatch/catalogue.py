"""Changes to the module catalogue that read more than the row they write: what a module, rule, resource
type or provider must reference, and what still uses one before it may go. ``store/`` holds the rows;
this decides, in the caller's transaction."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain import catalogue, provider_secrets
from orchestrator.domain.catalogue import Module, ModuleContent, ModuleRule, ResourceType
from orchestrator.domain.module_rules import RuleScope
from orchestrator.errors import ConflictError, InvalidInputError, NotFoundError
from orchestrator.secretbox import SecretBox
from orchestrator.store import module_providers as provider_store
from orchestrator.store import module_rules as rule_store
from orchestrator.store import modules as module_store
from orchestrator.store import projects as project_store
from orchestrator.store import resource_types as type_store

#: How many users a refusal to delete names at most.
_NAMED_USERS = 20


# --- resource types ---


async def update_resource_type(
    conn: AsyncConnection, org_id: str, type_id: str, **changes: object
) -> ResourceType | None:
    """Change ``description``, ``output_schema`` or ``is_developer_accessible``; built-in types are fixed.
    None: no such type."""
    current = await type_store.get_resource_type(conn, org_id, type_id)
    if current is None:
        return None
    if current.built_in:
        raise ConflictError(f"resource type '{type_id}' is built in and cannot be changed")
    return await type_store.update_resource_type(conn, org_id, type_id, **changes)


async def delete_resource_type(conn: AsyncConnection, org_id: str, type_id: str) -> bool:
    """Delete a custom type that no module provisions or asks for (as dependency or co-provisioned)."""
    current = await type_store.get_resource_type(conn, org_id, type_id)
    if current is None:
        return False
    if current.built_in:
        raise ConflictError(f"resource type '{type_id}' is built in and cannot be deleted")
    provisioning = await module_store.modules_of_type(conn, org_id, type_id, limit=_NAMED_USERS)
    if provisioning:
        raise ConflictError(
            f"resource type '{type_id}' is provisioned by the modules: {', '.join(provisioning)}"
        )
    requesting = await module_store.modules_requesting_type(conn, org_id, type_id)
    if requesting:
        raise ConflictError(
            f"resource type '{type_id}' is a dependency or co-provisioned resource of the modules: "
            f"{', '.join(requesting)}"
        )
    return await type_store.delete_resource_type(conn, org_id, type_id)


# --- module providers ---


async def delete_provider(conn: AsyncConnection, org_id: str, provider_type: str, provider_id: str) -> bool:
    """Delete a provider that no module's current version maps (older versions may still name it)."""
    key = f"{provider_type}.{provider_id}"
    if await provider_store.get_provider(conn, org_id, provider_type, provider_id) is None:
        return False
    users = await module_store.modules_mapping_provider(conn, org_id, key)
    if users:
        raise ConflictError(f"module provider '{key}' is mapped by the modules: {', '.join(users)}")
    return await provider_store.delete_provider(conn, org_id, provider_type, provider_id)


async def seal_clear_provider_configurations(conn: AsyncConnection, box: SecretBox) -> int:
    """Seal the configurations stored in clear before sealing existed (run at start-up: a migration has no
    server key); how many."""
    sealed = 0
    for provider in await provider_store.unsealed(conn):
        public, whole = provider_secrets.seal_configuration(
            box, provider.org_id, provider.provider_type, provider.id, provider.configuration
        )
        sealed += await provider_store.seal(conn, provider, configuration=public, sealed=whole)
    return sealed


# --- modules ---


async def _check_references(
    conn: AsyncConnection, org_id: str, resource_type: str, content: ModuleContent
) -> None:
    """409 for resource types that do not exist, 400 for an unknown provider in the mapping (as upstream)."""
    wanted_types = catalogue.referenced_types(resource_type, content)
    found_types = await type_store.get_resource_types(conn, org_id, wanted_types)
    missing_types = [t for t in wanted_types if t not in found_types]
    if missing_types:
        raise ConflictError(
            f"resource types referenced by the module do not exist: {', '.join(missing_types)}"
        )
    wanted_providers = catalogue.referenced_providers(content)
    found_providers = await provider_store.get_providers(conn, org_id, wanted_providers)
    missing = [f"{t}.{i}" for t, i in wanted_providers if f"{t}.{i}" not in found_providers]
    if missing:
        raise InvalidInputError(f"provider_mapping: no module provider {', '.join(missing)}")


async def create_module(
    conn: AsyncConnection, *, org_id: str, module_id: str, resource_type: str, content: ModuleContent
) -> Module:
    """A module and its first version, once its content and what it references are valid."""
    catalogue.check_content(content)
    await _check_references(conn, org_id, resource_type, content)
    return await module_store.create_module(
        conn, org_id=org_id, module_id=module_id, resource_type=resource_type, content=content
    )


async def update_module(
    conn: AsyncConnection, org_id: str, module_id: str, change: Callable[[ModuleContent], ModuleContent]
) -> Module:
    """Make ``change(current content)`` current, as a new version; the module is locked from the read on,
    and unchanged content writes nothing."""
    current = await module_store.get_module(conn, org_id, module_id, for_update=True)
    if current is None:
        raise NotFoundError(f"module '{module_id}' not found")
    content = change(current.content)
    catalogue.check_content(content)
    if content == current.content:
        return current
    await _check_references(conn, org_id, current.resource_type, content)
    return await module_store.update_module(conn, current, content)


async def delete_module(conn: AsyncConnection, org_id: str, module_id: str) -> bool:
    """Delete a module that no rule names, with all its versions."""
    rule_ids = await rule_store.rule_ids_of_module(conn, org_id, module_id, limit=_NAMED_USERS)
    if rule_ids:
        raise ConflictError(
            f"module '{module_id}' is used by the module rules: {', '.join(str(r) for r in rule_ids)}; "
            "delete them first"
        )
    return await module_store.delete_module(conn, org_id, module_id)


# --- module rules ---


async def create_rule(conn: AsyncConnection, org_id: str, module_id: str, scope: RuleScope) -> ModuleRule:
    """A rule for the module's resource type.

    400 for a bad scope or a missing module (as upstream), 409 for a missing project, environment type or
    environment, or when another rule of the type has the same match key.
    """
    scope.check()
    module = await module_store.get_module(conn, org_id, module_id)
    if module is None:
        raise InvalidInputError(f"module_id: module '{module_id}' not found")
    project_id, env_type_id, env_id = scope.project_id, scope.env_type_id, scope.env_id
    if project_id is not None and await project_store.get_project(conn, org_id, project_id) is None:
        raise ConflictError(f"project '{project_id}' not found")
    if env_type_id is not None and await project_store.get_env_type(conn, org_id, env_type_id) is None:
        raise ConflictError(f"environment type '{env_type_id}' not found")
    if (
        env_id is not None
        and project_id is not None
        and await project_store.get_env(conn, org_id, project_id, env_id) is None
    ):
        raise ConflictError(f"environment '{env_id}' not found in project '{project_id}'")
    existing = await rule_store.rule_with_match_key(conn, org_id, module.resource_type, scope)
    if existing is not None:
        raise ConflictError(
            f"module rule conflicts with existing rule '{existing.id}' for module '{existing.module_id}'"
        )
    return await rule_store.insert_rule(conn, org_id, module_id, module.resource_type, scope)
