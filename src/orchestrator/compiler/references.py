"""Turning JSON values with ``${...}`` placeholders into HCL expressions, in the scope they were written in.

What a placeholder may name depends on where it is written (as upstream, ``DP:internal/graphs/tofu.go``):

=====================================  ===================================  ==========================
written in                             ``resources.ALIAS`` is               ``shared.ALIAS``
=====================================  ===================================  ==========================
a workload's resource params, outputs  a resource of the workload           a shared resource
a module's ``module_inputs``           a dependency of the module           not allowed
a dependency's or co-provisioned       a dependency of the module that      not allowed
resource's params                      asked for it
a shared resource's params             a dependency of its own module       not allowed
=====================================  ===================================  ==========================

``context.KEY`` is one of :data:`BASE_CONTEXT_KEYS`, plus ``res_type``, ``res_class`` and ``res_id``
(the node's coordinate) in module inputs and params; its value is written as literal text.
``var.KEY`` (a sensitive string variable) is only allowed in provider configurations.

A reference to a resource output becomes ``module.<name>.<key>``; an output key must be one of the
``properties`` of the resource type's ``output_schema`` when it lists any (unless ``additionalProperties``
allows more). A property marked ``"x-sensitive": true`` or ``"writeOnly": true`` is sensitive.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from orchestrator.compiler import hcl, placeholders
from orchestrator.compiler.graph import Coordinate, module_name
from orchestrator.domain.catalogue import ResourceType
from orchestrator.domain.validation import go_list
from orchestrator.errors import InvalidInputError

#: Context keys every placeholder scope knows.
BASE_CONTEXT_KEYS: Final = ("org_id", "project_id", "env_id", "env_type_id", "env_uuid")


@dataclass(frozen=True)
class Scope:
    #: Names the owner of ``aliases`` in errors: "workload 'api'", "module 'pg' (version …)".
    owner: str
    #: What ``resources.ALIAS`` may name; None where resources may not be named.
    aliases: Mapping[str, Coordinate] | None
    #: What ``shared.ALIAS`` may name; None where shared resources may not be named.
    shared: Mapping[str, Coordinate] | None
    context: Mapping[str, str]
    allow_variables: bool = False


@dataclass
class Rendered:
    expr: hcl.Expr
    #: The nodes whose outputs the expression reads.
    references: set[Coordinate] = field(default_factory=set)
    sensitive: bool = False
    #: ``var.KEY`` names used.
    variables: set[str] = field(default_factory=set)


def _is_sensitive(schema: Any) -> bool:
    return isinstance(schema, dict) and (schema.get("x-sensitive") is True or schema.get("writeOnly") is True)


class Resolver:
    def __init__(self, resource_types: Mapping[str, ResourceType]) -> None:
        self.resource_types = resource_types

    def render(self, value: Any, scope: Scope, where: str) -> Rendered:
        """``value`` (JSON data) as an HCL expression; :class:`InvalidInputError` naming ``where``."""
        out = Rendered(hcl.Raw("null"))
        out.expr = self._value(value, scope, where, out)
        return out

    def _value(self, value: Any, scope: Scope, where: str, out: Rendered) -> hcl.Expr:
        if value is None:
            return hcl.Raw("null")
        if isinstance(value, bool):
            return hcl.Raw("true" if value else "false")
        if isinstance(value, int | float):
            try:
                return hcl.Raw(hcl.number(value))
            except ValueError as exc:
                raise InvalidInputError(f"{where}: {exc}") from exc
        if isinstance(value, str):
            return self._string(value, scope, where, out)
        if isinstance(value, list | tuple):
            return hcl.Tup(tuple(self._value(v, scope, f"{where}[{i}]", out) for i, v in enumerate(value)))
        if isinstance(value, dict):
            return hcl.Obj(
                tuple(
                    (str(k), self._value(value[k], scope, f"{where}.{k}", out))
                    for k in sorted(value, key=str)
                )
            )
        raise InvalidInputError(f"{where}: unsupported value of type {type(value).__name__}")

    def _string(self, text: str, scope: Scope, where: str, out: Rendered) -> hcl.Raw:
        try:
            parts = placeholders.split(text)
        except placeholders.PlaceholderError as exc:
            raise InvalidInputError(f"{where}: {exc}") from exc
        pieces: list[str | hcl.Raw] = []
        for part in parts:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, placeholders.ContextRef):
                if part.key not in scope.context:
                    raise InvalidInputError(
                        f"{where}: unknown context key '{part.key}', must be one of {go_list(scope.context)}"
                    )
                pieces.append(scope.context[part.key])
            elif isinstance(part, placeholders.ResourceRef):
                pieces.append(self._resource(part, scope, where, out))
            elif isinstance(part, placeholders.VarRef) and scope.allow_variables:
                out.variables.add(part.key)
                pieces.append(hcl.Raw(f"var.{part.key}"))
            else:
                kind = part.kind if isinstance(part, placeholders.UnsupportedRef) else "var"
                raise InvalidInputError(f"{where}: '{kind}' placeholders are not supported here")
        return hcl.template(pieces)

    def _resource(self, ref: placeholders.ResourceRef, scope: Scope, where: str, out: Rendered) -> hcl.Raw:
        if ref.shared:
            if scope.shared is None:
                raise InvalidInputError(
                    f"{where}: '${{{ref.text}}}': shared resources can only be named in a workload"
                )
            target = scope.shared.get(ref.alias)
            if target is None:
                raise InvalidInputError(
                    f"{where}: '${{{ref.text}}}': no shared resource '{ref.alias}' in the manifest"
                )
        elif scope.aliases is None:
            raise InvalidInputError(f"{where}: '${{{ref.text}}}': resources cannot be named in {scope.owner}")
        else:
            target = scope.aliases.get(ref.alias)
            if target is None:
                raise InvalidInputError(
                    f"{where}: '${{{ref.text}}}': no resource '{ref.alias}' in {scope.owner}"
                )
        out.sensitive |= self._check_output(target, ref, where)
        out.references.add(target)
        return hcl.Raw(hcl.traversal(f"module.{module_name(target)}", ref.output))

    def _check_output(self, target: Coordinate, ref: placeholders.ResourceRef, where: str) -> bool:
        resource_type = self.resource_types.get(target.type)
        schema = resource_type.output_schema if resource_type else {}
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return False
        key = ref.output[0]
        if key in properties:
            return _is_sensitive(properties[key])
        if schema.get("additionalProperties"):
            return False
        raise InvalidInputError(
            f"{where}: '${{{ref.text}}}': resource type '{target.type}' has no output '{key}', "
            f"its outputs are {go_list(properties)}"
        )
