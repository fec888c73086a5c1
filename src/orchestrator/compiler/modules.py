"""What the compiler takes from a node's module: its source, its params, and the providers it maps.

Providers: each module provider ``TYPE.ID`` a used module maps becomes one aliased configuration,
``provider "TYPE" { alias = "ID" ... }``, and ``required_providers`` gets one entry per ``TYPE``. Module
providers of one type must therefore share their ``source``; their version constraints are all applied.
An empty version constraint means "any version" (Terraform's built-in providers accept no constraint).
A module's ``provider_mapping`` becomes the module block's ``providers = { NAME = TYPE.ID }``.

Provider configuration values may use ``${context.KEY}`` and ``${var.KEY}`` (a sensitive variable the
runner's environment sets as ``TF_VAR_KEY``). A key ending in ``[N]`` with an object value is written
as a nested block (``assume_role[0] = {...}`` → ``assume_role { ... }``), as upstream does. Literal
credentials (``domain.provider_secrets``) become sensitive variables too, whose values the bundle's
``po-provider-secrets.auto.tfvars.json`` holds: ``main.tf``, which viewers may read, never shows them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.compiler import hcl, placeholders
from orchestrator.compiler.graph import Graph, Node
from orchestrator.compiler.references import Resolver, Scope
from orchestrator.domain import provider_secrets
from orchestrator.domain.catalogue import INLINE_SOURCE, Module, ModuleProvider, check_module_source
from orchestrator.errors import InvalidInputError

#: Arguments Terraform reserves in a module block; no input or param may take these names.
RESERVED_MODULE_ARGUMENTS: Final = frozenset(
    {"source", "version", "providers", "count", "for_each", "depends_on", "lifecycle"}
)
# A registry address with a version: (hostname/)namespace/name/system@version (never a local path).
_REGISTRY_WITH_VERSION: Final = re.compile(r"^(?!\.\.?/)((?:[^/:@]+/)?[^/:@]+/[^/:@]+/[^/:@]+)@([^/:@]+)$")
_PROVIDER_MAPPING_KEY: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)?$")
_BLOCK_KEY: Final = re.compile(r"^(.+)\[\d+\]$")
_PARAM_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "string": (str,),
    "number": (int, float),
    "bool": (bool,),
    "list": (list, tuple),
    "map": (dict,),
}


def inline_path(module: Module) -> str:
    """Where an inline module's code goes in the bundle (upstream's layout)."""
    return f"modules/{module.id}/{module.version_id}"


def source_attributes(module: Module) -> list[hcl.Attr]:
    """``source`` (and ``version`` for a registry address written ``address@version``)."""
    source = module.content.module_source
    try:
        # Also here: a module stored before sources were checked must not read the runner's disk either.
        check_module_source(source)
    except InvalidInputError as exc:
        raise InvalidInputError(f"module '{module.id}' (version {module.version_id}) {exc.message}") from exc
    if source == INLINE_SOURCE:
        return [hcl.Attr("source", hcl.Raw(hcl.quote("./" + inline_path(module))))]
    if match := _REGISTRY_WITH_VERSION.match(source):
        return [
            hcl.Attr("source", hcl.Raw(hcl.quote(match[1]))),
            hcl.Attr("version", hcl.Raw(hcl.quote(match[2]))),
        ]
    return [hcl.Attr("source", hcl.Raw(hcl.quote(source)))]


def _type_matches(expected: str, value: Any) -> bool:
    if expected == "any" or placeholders.is_single_placeholder(value):
        return True
    if expected == "number" and isinstance(value, bool):
        return False
    return isinstance(value, _PARAM_TYPES.get(expected, ()))


def check_params(node: Node) -> None:
    """The node's params against its module's ``module_params``: present unless optional (checked first,
    as upstream does, whose words the message ends with), known, typed."""
    module = node.required_module
    declared = module.content.module_params
    where = node.params_where
    for name, param in sorted(declared.items()):
        if not param.is_optional and node.params.get(name) is None:
            c = node.coordinate
            raise InvalidInputError(
                f"{where}.{name}: node 'type={c.type},class={c.resource_class},id={c.id}': uses module "
                f"{module.id}@{module.version_id} which requires {param.type} param '{name}' to be set"
            )
    for name in sorted(node.params):
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise InvalidInputError(
                f"{where}.{name}: unknown param of module '{module.id}' (its params: {known})"
            )
        if not _type_matches(declared[name].type, node.params[name]):
            raise InvalidInputError(
                f"{where}.{name}: module '{module.id}' expects a {declared[name].type}, "
                f"got {type(node.params[name]).__name__}"
            )
    for name in sorted(set(node.params) | set(module.content.module_inputs)):
        if name in RESERVED_MODULE_ARGUMENTS:
            raise InvalidInputError(
                f"{where}.{name}: '{name}' is a reserved argument of Terraform module blocks "
                f"(module '{module.id}')"
            )


@dataclass(frozen=True)
class Providers:
    """The module providers the graph's modules map, by ``TYPE.ID``."""

    by_key: dict[str, ModuleProvider]

    def required(self) -> hcl.Block | None:
        """``required_providers``, one entry per provider type."""
        by_type: dict[str, list[ModuleProvider]] = {}
        for provider in self.by_key.values():
            by_type.setdefault(provider.provider_type, []).append(provider)
        if not by_type:
            return None
        entries: list[hcl.Item] = []
        for provider_type, providers in sorted(by_type.items()):
            sources = sorted({p.source for p in providers})
            if len(sources) > 1:
                keys = ", ".join(sorted(p.key for p in providers))
                raise InvalidInputError(
                    f"module providers {keys} are all of type '{provider_type}' but have different sources "
                    f"({', '.join(sources)}); one deployment can use only one source per provider type"
                )
            items: list[tuple[str, hcl.Expr]] = [("source", hcl.Raw(hcl.quote(sources[0])))]
            versions = sorted({p.version_constraint for p in providers if p.version_constraint})
            if versions:
                items.append(("version", hcl.Raw(hcl.quote(", ".join(versions)))))
            entries.append(hcl.Attr(provider_type, hcl.Obj(tuple(items))))
        return hcl.Block("required_providers", (), tuple(entries))

    def blocks(
        self, resolver: Resolver, context: Mapping[str, str]
    ) -> tuple[list[hcl.Block], set[str], dict[str, Any]]:
        """One aliased ``provider`` block per module provider, the variables their configurations use, and
        the values of the variables that stand for their credentials (``provider_secrets``): those go to a
        variables file of the bundle, never into ``main.tf``."""
        blocks: list[hcl.Block] = []
        variables: set[str] = set()
        secret_values: dict[str, Any] = {}
        for key, provider in sorted(self.by_key.items()):
            where = f"module provider '{key}' configuration"
            scope = Scope(owner=where, aliases=None, shared=None, context=context, allow_variables=True)
            configuration, values = provider_secrets.extract_secrets(
                provider.provider_type, provider.id, provider.configuration
            )
            secret_values.update(values)
            body: list[hcl.Item] = [hcl.Attr("alias", hcl.Raw(hcl.quote(provider.id)))]
            body.extend(_configuration(resolver, configuration, scope, where, variables))
            blocks.append(hcl.Block("provider", (provider.provider_type,), tuple(body)))
        return blocks, variables, secret_values


def _configuration(
    resolver: Resolver, data: Mapping[str, Any], scope: Scope, where: str, variables: set[str]
) -> list[hcl.Item]:
    attributes: list[hcl.Item] = []
    blocks: list[hcl.Item] = []
    for key in sorted(data):
        value = data[key]
        block = _BLOCK_KEY.match(key)
        name = block[1] if block and isinstance(value, dict) else key
        if not hcl.is_identifier(name) or name == "alias":
            raise InvalidInputError(f"{where}.{key}: not a valid provider argument name")
        if block and isinstance(value, dict):
            inner = _configuration(resolver, value, scope, f"{where}.{key}", variables)
            blocks.append(hcl.Block(name, (), tuple(inner)))
            continue
        rendered = resolver.render(value, scope, f"{where}.{key}")
        variables |= rendered.variables
        attributes.append(hcl.Attr(name, rendered.expr))
    return attributes + blocks


def collect_providers(graph: Graph, available: Mapping[str, ModuleProvider]) -> Providers:
    """The providers of the graph's modules; :class:`InvalidInputError` for a mapping to a missing one."""
    used: dict[str, ModuleProvider] = {}
    for node in graph.nodes.values():
        module = node.required_module
        for name, key in sorted(module.content.provider_mapping.items()):
            if not _PROVIDER_MAPPING_KEY.match(name):
                raise InvalidInputError(
                    f"module '{module.id}' provider_mapping.{name}: not a valid provider name"
                )
            provider = available.get(key)
            if provider is None:
                raise InvalidInputError(
                    f"module '{module.id}' (version {module.version_id}) maps provider '{name}' to "
                    f"module provider '{key}', which does not exist"
                )
            used[key] = provider
    return Providers(used)


def provider_mapping(module: Module, providers: Providers) -> hcl.Attr | None:
    """``providers = { NAME = TYPE.ID }`` of the module block, or None."""
    mapping = module.content.provider_mapping
    if not mapping:
        return None
    items = tuple(
        (name, hcl.Raw(f"{providers.by_key[key].provider_type}.{providers.by_key[key].id}"))
        for name, key in sorted(mapping.items())
    )
    return hcl.Attr("providers", hcl.Obj(items, raw_keys=True))
