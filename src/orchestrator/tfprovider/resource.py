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
from typing import Any

from orchestrator.tfprovider import cty
from orchestrator.tfprovider.schema import Attribute, merge_defaults_into_plan, resolve_defaults
from orchestrator.tfprovider.session import ApiProblem, Session, current
from orchestrator.tfprovider.values import JsonDict, has_unknown, native

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
    attributes: Mapping[str, Attribute]
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


class Diagnostics:
    """The error diagnostics of one request: a summary and a detail each."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    def add(self, summary: str, detail: str = "") -> None:
        self.errors.append((summary, detail))

    def problem(self, problem: ApiProblem) -> None:
        self.add(problem.summary, problem.detail)


def _state(attributes: Mapping[str, Attribute], values: JsonDict) -> JsonDict:
    return {name: values.get(name) for name in attributes}


def _changed(prior: Any, planned: Any) -> bool:
    return has_unknown(planned) or native(prior) != native(planned)


def validate(spec: Spec, config: Any) -> list[str]:
    """The problems `Spec.validate` finds in a configuration; none while a value is unknown (checked at
    apply then). Defaults count as configured."""
    effective = resolve_defaults(config, spec.attributes)
    if not isinstance(effective, Mapping) or has_unknown(effective):
        return []
    return spec.validate(native(effective))


def plan(
    spec: Spec, prior: JsonDict | None, proposed: JsonDict | None, config: JsonDict | None, diags: Diagnostics
) -> tuple[JsonDict | None, list[str]]:
    """The planned state and the attributes whose change replaces the object.

    Terraform proposes the configuration merged with the prior state; defaults are filled in, and a
    computed attribute left null is unknown on create and keeps its prior value on update (only an
    update through `to_state` changes it)."""
    if proposed is None:  # destroy
        return None, []
    for message in validate(spec, config):
        diags.add(message)
    if diags.errors:
        return None, []
    effective = resolve_defaults(config, spec.attributes)
    planned = dict(merge_defaults_into_plan(proposed, effective, spec.attributes))
    for name, attribute in spec.attributes.items():
        if attribute.computed and not attribute.required and planned.get(name) is None:
            planned[name] = prior.get(name) if prior is not None else cty.UNKNOWN
    if prior is None:
        return planned, []
    replaced = [
        name
        for name, attribute in spec.attributes.items()
        if attribute.requires_replace and _changed(prior.get(name), planned.get(name))
    ]
    return planned, replaced


async def apply(
    spec: Spec, prior: JsonDict | None, planned: JsonDict | None, config: JsonDict | None, diags: Diagnostics
) -> JsonDict | None:
    """Create, update or delete as planned; the new state (the prior one when an update or a delete
    failed, null when a create failed)."""
    effective = native(resolve_defaults(config, spec.attributes)) or {}
    try:
        session = current()
    except ApiProblem as problem:
        diags.problem(problem)
        return prior
    if planned is None:
        try:
            await spec.delete(session, native(prior) or {})
        except ApiProblem as problem:
            if problem.status != 404:
                diags.problem(problem)
                return prior
        return None
    if prior is None:
        try:
            created = await spec.create(session, effective)
        except ApiProblem as problem:
            diags.problem(problem)
            return None
        return _state(spec.attributes, spec.to_state(created, effective))
    if spec.update is None:  # every attribute requires replacement: Terraform never asks
        diags.add(f"{spec.name} cannot be updated", "change it by replacing it")
        return prior
    before = native(prior)
    try:
        updated = await spec.update(session, effective, before)
    except ApiProblem as problem:
        diags.problem(problem)
        return prior
    return _state(spec.attributes, spec.to_state(updated, {**before, **effective}))


async def read(spec: Spec, prior: JsonDict | None, diags: Diagnostics) -> JsonDict | None:
    """The object as the API has it now; null when it is gone (drift), the prior state on an error."""
    before = native(prior)
    if not before:
        return None
    try:
        found = await spec.read(current(), before)
    except ApiProblem as problem:
        diags.problem(problem)
        return prior
    if found is None:
        return None
    return _state(spec.attributes, spec.to_state(found, before))


async def import_state(spec: Spec, type_name: str, import_id: str, diags: Diagnostics) -> JsonDict | None:
    """The state of an existing object by its import id; what only the user knows (`Spec.write_back`)
    stays null."""
    try:
        keys = spec.import_id(import_id)
    except ValueError as exc:
        diags.add(f"cannot import {spec.name}", str(exc))
        return None
    try:
        found = await spec.read(current(), keys)
    except ApiProblem as problem:
        diags.problem(problem)
        return None
    if found is None:
        diags.add(
            "Cannot import non-existent remote object",
            f"No {type_name} was found for id {import_id!r}: only objects that exist can be imported.",
        )
        return None
    state = spec.to_state(found, keys)
    for name in spec.write_back:
        state[name] = None
    return _state(spec.attributes, state)


@dataclass(frozen=True)
class SourceSpec:
    """A data source: ``attributes`` with the keys required and the rest computed; ``read`` by those keys."""

    name: str
    attributes: Mapping[str, Attribute]
    read: Read
    to_state: ToState
    description: str = ""


async def read_source(spec: SourceSpec, config: JsonDict | None, diags: Diagnostics) -> JsonDict | None:
    """A data source's state: the object its keys name, or an error when there is none."""
    keys = native(config) or {}
    try:
        found = await spec.read(current(), keys)
    except ApiProblem as problem:
        diags.problem(problem)
        return None
    if found is None:
        wanted = ", ".join(f"{k}={v!r}" for k, v in keys.items() if v is not None)
        diags.add(f"{spec.name} not found", f"no {spec.name} with {wanted}")
        return None
    return _state(spec.attributes, spec.to_state(found, keys))
