"""Attribute schemas: what each resource, data source and the provider block accept and keep.

An `Attribute` is a value's type and its flags; `a_obj` makes a nested object attribute (Terraform's
``nested_type`` with nesting ``single``) whose members have flags of their own. A ``default`` makes the
attribute optional and computed, and fills it wherever the configuration leaves it null
(`resolve_defaults`), at any depth, so plan and apply agree on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.tfprovider import cty

#: The version of every schema; the state of each resource records it (1 since the first release).
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class NestedObject:
    attributes: Mapping[str, Attribute]


@dataclass(frozen=True)
class Attribute:
    type: cty.CtyType
    description: str = ""
    required: bool = False
    optional: bool = False
    computed: bool = False
    sensitive: bool = False
    #: A change of the attribute replaces the object (top-level attributes only).
    requires_replace: bool = False
    default: Any = None
    #: The members of a nested object attribute (`a_obj`).
    object_type: NestedObject | None = field(default=None)

    def __post_init__(self) -> None:
        if self.default is not None and not self.computed:
            object.__setattr__(self, "computed", True)
        if self.required and (self.optional or self.computed):
            raise ValueError("a required attribute is neither optional nor computed")
        if not (self.required or self.optional or self.computed):
            raise ValueError("an attribute is required, optional or computed")

    def evolve(self, **changes: Any) -> Attribute:
        return replace(self, **changes)


def _attribute(cty_type: cty.CtyType, **kwargs: Any) -> Attribute:
    if not (kwargs.get("required") or kwargs.get("optional") or kwargs.get("computed")):
        kwargs["optional"] = True  # an element type (a_list(a_str())) carries only its type
    return Attribute(type=cty_type, **kwargs)


def a_str(**kwargs: Any) -> Attribute:
    return _attribute(cty.STRING, **kwargs)


def a_bool(**kwargs: Any) -> Attribute:
    return _attribute(cty.BOOL, **kwargs)


def a_num(**kwargs: Any) -> Attribute:
    return _attribute(cty.NUMBER, **kwargs)


def a_dyn(**kwargs: Any) -> Attribute:
    return _attribute(cty.DYNAMIC, **kwargs)


def a_list(element: Attribute, **kwargs: Any) -> Attribute:
    return _attribute(cty.List(element.type), **kwargs)


def a_map(element: Attribute, **kwargs: Any) -> Attribute:
    return _attribute(cty.Map(element.type), **kwargs)


def a_obj(members: Mapping[str, Attribute], **kwargs: Any) -> Attribute:
    return _attribute(object_type(members), object_type=NestedObject(dict(members)), **kwargs)


def object_type(attributes: Mapping[str, Attribute]) -> cty.Object:
    """The object type of a block (or a nested object) with ``attributes``."""
    return cty.Object({name: attribute.type for name, attribute in attributes.items()})


def resolve_defaults(value: Any, attributes: Mapping[str, Attribute]) -> Any:
    """``value`` (an object of ``attributes``) with each null attribute that has a default set to it, in
    nested objects too. Unknown values stay unknown: they are not absent."""
    if not isinstance(value, Mapping):
        return value
    resolved = dict(value)
    for name, attribute in attributes.items():
        current = resolved.get(name)
        if current is None and attribute.default is not None:
            current = attribute.default
        if attribute.object_type is not None:
            current = resolve_defaults(current, attribute.object_type.attributes)
        resolved[name] = current
    return resolved


def merge_defaults_into_plan(planned: Any, config: Any, attributes: Mapping[str, Attribute]) -> Any:
    """The planned object with every defaulted attribute as the effective configuration has it.

    Terraform's proposed state carries the prior value of an attribute the configuration leaves out;
    where the attribute has a default, the default wins (apply reads the effective configuration, so the
    plan must say the same)."""
    if not isinstance(planned, Mapping) or not isinstance(config, Mapping):
        return planned
    merged = dict(planned)
    for name, attribute in attributes.items():
        wanted = config.get(name)
        if cty.is_unknown(wanted):
            continue
        if attribute.default is not None and wanted is not None:
            merged[name] = wanted
        elif attribute.object_type is not None and isinstance(merged.get(name), Mapping):
            merged[name] = merge_defaults_into_plan(merged[name], wanted, attribute.object_type.attributes)
    return merged
