"""One generic resource and data source over the API, specialised by a `Spec` per object kind.

A `Spec` says how an object kind's Terraform attributes map to API calls: `create`, `read` (``None`` when
the object is gone: drift), `update` (absent: every change replaces), `delete`, and `to_state`, which turns
an API answer into attributes, given the prior attributes so that what the API cannot give back (secrets,
shown as ``SECRET``; JSON strings as the user wrote them) stays as configured. Every API error becomes a
Terraform diagnostic with the API's message; a 404 on read removes the object from state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pyvider.cty import CtyValue
from pyvider.data_sources import BaseDataSource
from pyvider.resources import BaseResource
from pyvider.resources.context import ResourceContext
from pyvider.schema import PvsAttribute, PvsSchema, a_unknown, s_data_source, s_resource

from orchestrator.tfprovider.session import ApiProblem, Session, current
from orchestrator.tfprovider.values import JsonDict, attrs_class, native

Create = Callable[[Session, JsonDict], Awaitable[JsonDict]]
Read = Callable[[Session, JsonDict], Awaitable[JsonDict | None]]
Update = Callable[[Session, JsonDict, JsonDict], Awaitable[JsonDict]]
Delete = Callable[[Session, JsonDict], Awaitable[None]]
ToState = Callable[[JsonDict, JsonDict], JsonDict]
ImportId = Callable[[str], JsonDict]


def _import_by_id(import_id: str) -> JsonDict:
    return {"id": import_id}


@dataclass(frozen=True)
class Spec:
    """How one object kind is managed; ``name`` is the type name without the provider prefix."""

    name: str
    attributes: Mapping[str, PvsAttribute]
    create: Create
    read: Read
    delete: Delete
    to_state: ToState
    update: Update | None = None
    import_id: ImportId = _import_by_id
    #: Attributes whose values only the user knows (secrets): import leaves them null.
    write_back: tuple[str, ...] = ()
    description: str = ""
    #: Checks of a configuration (plain values) before any call: messages naming the attribute.
    validate: Callable[[JsonDict], list[str]] = field(default=lambda _config: [])


def _computed_only(attributes: Mapping[str, PvsAttribute]) -> list[str]:
    return [name for name, attribute in attributes.items() if attribute.computed and not attribute.optional]


def _optional_computed(attributes: Mapping[str, PvsAttribute]) -> list[str]:
    return [name for name, attribute in attributes.items() if attribute.computed and attribute.optional]


def _report(ctx: ResourceContext[Any, Any, Any], problem: ApiProblem) -> None:
    ctx.add_error(problem.summary, problem.detail)


class ApiResource(BaseResource[Any, Any, Any]):
    """A managed object of the API; subclasses set `spec` (see `resource_class`)."""

    spec: ClassVar[Spec]

    @classmethod
    def get_schema(cls) -> PvsSchema:
        return s_resource(dict(cls.spec.attributes))

    def _state(self, values: JsonDict) -> Any:
        return self.state_class(**{name: values.get(name) for name in self.spec.attributes})  # type: ignore[misc]

    async def _validate_config(self, config: Any) -> list[str]:
        values = native(config) or {}
        if any(isinstance(value, CtyValue) for value in values.values()):
            return []  # unknown until apply: checked then
        return self.spec.validate(values)

    async def _create(
        self, ctx: ResourceContext[Any, Any, Any], base_plan: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, Any]:
        for name in _computed_only(self.spec.attributes) + _optional_computed(self.spec.attributes):
            if base_plan.get(name) is None:
                base_plan[name] = a_unknown(self.spec.attributes[name])
        return base_plan, None

    async def read(self, ctx: ResourceContext[Any, Any, Any]) -> Any:
        prior = native(ctx.state)
        if not prior:
            return None
        try:
            found = await self.spec.read(current(), prior)
        except ApiProblem as problem:
            _report(ctx, problem)
            return ctx.state
        if found is None:
            return None
        return self._state(self.spec.to_state(found, prior))

    async def _create_apply(self, ctx: ResourceContext[Any, Any, Any]) -> tuple[Any, Any]:
        config = native(ctx.config) or {}
        try:
            created = await self.spec.create(current(), config)
        except ApiProblem as problem:
            _report(ctx, problem)
            return None, None
        return self._state(self.spec.to_state(created, config)), None

    async def _update_apply(self, ctx: ResourceContext[Any, Any, Any]) -> tuple[Any, Any]:
        config = native(ctx.config) or {}
        prior = native(ctx.state) or {}
        if self.spec.update is None:  # every attribute requires replacement: Terraform never asks
            raise ApiProblem(f"{self.spec.name} cannot be updated", "change it by replacing it")
        try:
            updated = await self.spec.update(current(), config, prior)
        except ApiProblem as problem:
            _report(ctx, problem)
            return ctx.state, None
        return self._state(self.spec.to_state(updated, {**prior, **config})), None

    async def _delete_apply(self, ctx: ResourceContext[Any, Any, Any]) -> None:
        prior = native(ctx.state) or {}
        try:
            await self.spec.delete(current(), prior)
        except ApiProblem as problem:
            if problem.status != 404:
                _report(ctx, problem)

    async def import_state(self, ctx: ResourceContext[Any, Any, Any], import_id: str) -> Any:
        try:
            keys = self.spec.import_id(import_id)
        except ValueError as exc:
            raise ApiProblem(f"cannot import {self.spec.name}", str(exc)) from None
        found = await self.spec.read(current(), keys)
        if found is None:
            return None
        state = self.spec.to_state(found, keys)
        for name in self.spec.write_back:
            state[name] = None
        return self._state(state)


@dataclass(frozen=True)
class SourceSpec:
    """A data source: ``attributes`` with the keys required and the rest computed; ``read`` by those keys."""

    name: str
    attributes: Mapping[str, PvsAttribute]
    read: Read
    to_state: ToState
    description: str = ""


class ApiDataSource(BaseDataSource[Any, Any, Any]):
    spec: ClassVar[SourceSpec]

    @classmethod
    def get_schema(cls) -> PvsSchema:
        return s_data_source(dict(cls.spec.attributes))

    async def _validate_config(self, config: Any) -> list[str]:
        return []

    async def read(self, ctx: ResourceContext[Any, Any, Any]) -> Any:
        keys = native(ctx.config) or {}
        try:
            found = await self.spec.read(current(), keys)
        except ApiProblem as problem:
            _report(ctx, problem)
            return None
        if found is None:
            wanted = ", ".join(f"{k}={v!r}" for k, v in keys.items() if v is not None)
            _report(ctx, ApiProblem(f"{self.spec.name} not found", f"no {self.spec.name} with {wanted}"))
            return None
        state = self.spec.to_state(found, keys)
        return self.state_class(**{name: state.get(name) for name in self.spec.attributes})


def resource_class(prefix: str, spec: Spec) -> type[ApiResource]:
    """A registered-name-ready resource class for ``spec``."""
    fields = list(spec.attributes)
    model = attrs_class(f"{spec.name}_state", fields)
    return type(
        f"Resource_{spec.name}",
        (ApiResource,),
        {"spec": spec, "config_class": model, "state_class": model, "_registered_name": f"{prefix}_{spec.name}"},
    )


def data_source_class(prefix: str, spec: SourceSpec) -> type[ApiDataSource]:
    fields = list(spec.attributes)
    model = attrs_class(f"{spec.name}_data", fields)
    return type(
        f"DataSource_{spec.name}",
        (ApiDataSource,),
        {"spec": spec, "config_class": model, "state_class": model, "_registered_name": f"{prefix}_{spec.name}"},
    )
