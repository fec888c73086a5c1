"""Module rule selection: which module provisions a resource ``(type, class, id)`` in an environment.

Upstream decides in two steps, and so do we:

1. The control plane keeps the rules *effective* in the environment (each of ``project_id``, ``env_type_id``,
   ``env_id`` is empty or equal) and, for each resource kind ``(type, class, id or none)``, only those of
   the highest environment specificity, the bitmask ``env_id<<2 | project_id<<1 | env_type_id``
   (``CP:internal/api/catalogue.go:calculateSpecificity/getAllModuleRulesAndDefinitionIds``).
2. The graph looks a resource up by its type, then its class, then its id, falling back to the rules
   without an id (``platform-orchestrator-graph:module_definition.go:FindBest``).

So the order of precedence, most specific first, is:

    resource_class (always equal: a rule without one has "default") > resource_id > env_id > project_id
    > env_type_id

A rule naming the resource's id beats any rule without one, whatever their environment fields; among rules
alike in that, an environment rule beats a project rule, which beats an environment type rule. The unique
match key (type, class, id, project, env type, env) makes the winner unique: two effective rules of the
same kind and specificity would have the same key.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.domain.catalogue import (
    DEFAULT_RESOURCE_CLASS,
    Module,
    ModuleProvider,
    ModuleRule,
    ResourceType,
)
from orchestrator.errors import InvalidInputError


@dataclass(frozen=True, kw_only=True)
class Placement:
    """The environment a resource is deployed to."""

    project_id: str
    env_type_id: str
    env_id: str


@dataclass(frozen=True, kw_only=True)
class RuleScope:
    """Which resources of its type a module rule decides, and where; with the type, the rule's match key
    (unique in the organization)."""

    resource_class: str = DEFAULT_RESOURCE_CLASS
    resource_id: str | None = None
    project_id: str | None = None
    env_type_id: str | None = None
    env_id: str | None = None

    def check(self) -> None:
        """An ``env_id`` needs its ``project_id`` and excludes ``env_type_id`` (400, as upstream)."""
        if self.env_id is not None and self.project_id is None:
            raise InvalidInputError("project_id: must be set when env_id is set")
        if self.env_id is not None and self.env_type_id is not None:
            raise InvalidInputError("env_type_id: must not be set when env_id is set")


def is_effective(rule: ModuleRule, where: Placement) -> bool:
    """Each environment field of the rule is empty or equal (an env_id only counts with its project)."""
    return (
        (rule.project_id is None or rule.project_id == where.project_id)
        and (rule.env_type_id is None or rule.env_type_id == where.env_type_id)
        and (rule.env_id is None or (rule.project_id == where.project_id and rule.env_id == where.env_id))
    )


def env_specificity(rule: ModuleRule) -> int:
    """env (6, always with its project) > project and env type (3) > project (2) > env type (1) > none (0)."""
    return (
        (rule.env_id is not None) << 2 | (rule.project_id is not None) << 1 | (rule.env_type_id is not None)
    )


def _precedence(rule: ModuleRule) -> tuple[bool, int, uuid.UUID]:
    # Sorts the winner first; the id only breaks ties the uniqueness of match keys already rules out.
    return (rule.resource_id is None, -env_specificity(rule), rule.id)


def select_rule(
    rules: Iterable[ModuleRule],
    *,
    resource_type: str,
    resource_class: str | None = None,
    resource_id: str | None = None,
    where: Placement,
) -> ModuleRule | None:
    """The rule deciding the module of resource ``(type, class, id)`` in ``where``; None when no rule matches.

    ``resource_class`` None means "default". A resource without an id only matches rules without one.
    """
    wanted_class = resource_class or DEFAULT_RESOURCE_CLASS
    candidates = [
        rule
        for rule in rules
        if rule.resource_type == resource_type
        and rule.resource_class == wanted_class
        and (rule.resource_id is None or rule.resource_id == resource_id)
        and is_effective(rule, where)
    ]
    return min(candidates, key=_precedence) if candidates else None


def most_specific_per_kind(rules: Iterable[ModuleRule], where: Placement) -> list[ModuleRule]:
    """The effective rules, keeping per ``(type, class, id or none)`` only the most environment-specific.

    What upstream's catalogue and available-resource-types answer; ordered by type, class, id.
    """
    best: dict[tuple[str, str, str | None], ModuleRule] = {}
    for rule in rules:
        if not is_effective(rule, where):
            continue
        kind = (rule.resource_type, rule.resource_class, rule.resource_id)
        held = best.get(kind)
        if held is None or _precedence(rule) < _precedence(held):
            best[kind] = rule
    return [best[kind] for kind in sorted(best, key=lambda k: (k[0], k[1], k[2] or ""))]


@dataclass(frozen=True, kw_only=True)
class ResolvedModule:
    rule: ModuleRule
    module: Module


@dataclass(frozen=True, kw_only=True)
class EnvCatalogue:
    """The modules, rules and providers that apply to one environment (upstream's internal module catalogue).

    Load it once per deployment (``dispatch.env_catalogue.load_env_catalogue``) and resolve every resource
    of the manifest against it, so that one deployment sees one consistent catalogue.
    """

    where: Placement
    #: Effective in ``where``, most specific per kind (see ``most_specific_per_kind``).
    rules: tuple[ModuleRule, ...]
    #: The current version of every module a rule names, by module id.
    modules: dict[str, Module]
    #: Every provider those modules map, by ``provider_type.id``.
    providers: dict[str, ModuleProvider]

    def resolve(
        self, resource_type: str, resource_class: str | None = None, resource_id: str | None = None
    ) -> ResolvedModule | None:
        rule = select_rule(
            self.rules,
            resource_type=resource_type,
            resource_class=resource_class,
            resource_id=resource_id,
            where=self.where,
        )
        if rule is None:
            return None
        return ResolvedModule(rule=rule, module=self.modules[rule.module_id])


@dataclass(frozen=True, kw_only=True)
class AvailableResourceType:
    """A resource type a manifest may use in an environment, with the module each of its kinds resolves to."""

    resource_type: ResourceType
    #: One per ``(class, id or none)`` with a rule in the environment, ordered by class then id.
    options: tuple[ResolvedModule, ...]
