"""The catalogue of one environment: the module rules that apply there, most specific per resource kind
(``domain.module_rules``), the current version of their modules and those modules' providers."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy.ext.asyncio import AsyncConnection

from orchestrator.domain.catalogue import referenced_providers
from orchestrator.domain.module_rules import (
    AvailableResourceType,
    EnvCatalogue,
    Placement,
    ResolvedModule,
    most_specific_per_kind,
)
from orchestrator.store import module_providers as provider_store
from orchestrator.store import module_rules as rule_store
from orchestrator.store import modules as module_store
from orchestrator.store import resource_types as type_store
from orchestrator.store.pages import Page, to_page


async def load_env_catalogue(conn: AsyncConnection, org_id: str, where: Placement) -> EnvCatalogue:
    """The rules that apply in ``where``, the current version of their modules and those modules' providers.

    Read it inside the deployment's transaction for a consistent snapshot.
    """
    rules = most_specific_per_kind(await rule_store.effective_rules(conn, org_id, where), where)
    found = await module_store.get_modules(conn, org_id, (r.module_id for r in rules))
    provider_keys = {pair for module in found.values() for pair in referenced_providers(module.content)}
    providers = await provider_store.get_providers(conn, org_id, provider_keys)
    return EnvCatalogue(where=where, rules=tuple(rules), modules=found, providers=providers)


async def available_resource_types(
    conn: AsyncConnection,
    org_id: str,
    where: Placement,
    *,
    type_id: str | None,
    include_non_developer_accessible: bool,
    after: tuple[str, ...] | None,
    limit: int,
) -> Page[AvailableResourceType]:
    """The resource types with a rule in ``where``, ordered by id (upstream listAvailableResourceTypes)."""
    catalogue = await load_env_catalogue(conn, org_id, where)
    by_type: dict[str, list[ResolvedModule]] = defaultdict(list)
    for rule in catalogue.rules:
        if type_id is None or rule.resource_type == type_id:
            by_type[rule.resource_type].append(
                ResolvedModule(rule=rule, module=catalogue.modules[rule.module_id])
            )
    types = await type_store.get_resource_types(conn, org_id, by_type)
    items = [
        AvailableResourceType(resource_type=types[name], options=tuple(by_type[name]))
        for name in sorted(types)
        if (after is None or name > after[0])
        and (include_non_developer_accessible or types[name].is_developer_accessible)
    ]
    return to_page(items[: limit + 1], limit, lambda a: (a.resource_type.id,))
