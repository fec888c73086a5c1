"""The provider's RPCs but the schema: each takes a request's bytes and answers a response's.

Imported by `server` at the first request that needs it (a start for the schema only never does).
Every failure is a diagnostic: an API error with the API's message (`session.ApiProblem`), anything
unexpected as an internal error with its message, its traceback on stderr (Terraform's log), never in
the diagnostic.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.tfprovider import cty, tfplugin6
from orchestrator.tfprovider.schema import SCHEMA_VERSION, Attribute, object_type

if TYPE_CHECKING:
    from orchestrator.tfprovider.resource import Diagnostics, SourceSpec, Spec

Handler = Callable[[bytes], Awaitable[bytes]]


# -- the schema -------------------------------------------------------------------------------------


def _attribute(name: str, attribute: Attribute) -> dict[str, Any]:
    message: dict[str, Any] = {
        "name": name,
        "description": attribute.description,
        "required": attribute.required,
        "optional": attribute.optional,
        "computed": attribute.computed,
        "sensitive": attribute.sensitive,
    }
    if attribute.object_type is not None:
        message["nested_type"] = {
            "attributes": [
                _attribute(member, value) for member, value in attribute.object_type.attributes.items()
            ],
            "nesting": tfplugin6.NESTING_SINGLE,
        }
    else:
        message["type"] = cty.type_bytes(attribute.type)
    return message


def _schema(attributes: Mapping[str, Attribute], description: str = "") -> dict[str, Any]:
    return {
        "version": SCHEMA_VERSION,
        "block": {
            "version": SCHEMA_VERSION,
            "attributes": [_attribute(name, attribute) for name, attribute in attributes.items()],
            "description": description,
        },
    }


def build_schema_response() -> bytes:
    """The ``GetProviderSchema`` response, from the code."""
    from orchestrator.tfprovider import provider, registry

    response = tfplugin6.message("GetProviderSchema.Response")(
        provider=_schema(provider.ATTRIBUTES),
        resource_schemas={
            name: _schema(spec.attributes, spec.description) for name, spec in registry.RESOURCES.items()
        },
        data_source_schemas={
            name: _schema(spec.attributes, spec.description) for name, spec in registry.DATA_SOURCES.items()
        },
        server_capabilities={},
    )
    answer: bytes = response.SerializeToString(deterministic=True)
    return answer


# -- values -------------------------------------------------------------------------------------------


def _decode(value: Any, attributes: Mapping[str, Attribute]) -> Any:
    """A ``DynamicValue`` message's value (msgpack, or JSON), typed by ``attributes``; null when empty."""
    if value.msgpack:
        return cty.from_msgpack(value.msgpack, object_type(attributes))
    if value.json:
        return cty.from_json(json.loads(value.json), object_type(attributes))
    return None


def _encode(value: Any, attributes: Mapping[str, Attribute]) -> dict[str, bytes]:
    return {"msgpack": cty.to_msgpack(value, object_type(attributes))}


def _diagnostics(diags: Diagnostics) -> list[dict[str, Any]]:
    return [
        {"severity": tfplugin6.SEVERITY_ERROR, "summary": summary, "detail": detail}
        for summary, detail in diags.errors
    ]


def _error(summary: str, detail: str = "") -> list[dict[str, Any]]:
    return [{"severity": tfplugin6.SEVERITY_ERROR, "summary": summary, "detail": detail}]


def _add(repeated: Any, messages: Iterable[dict[str, Any]]) -> None:
    """Append each of ``messages`` (given as field values) to a repeated message field."""
    for fields in messages:
        repeated.add(**fields)


def _resource(type_name: str) -> Spec | None:
    from orchestrator.tfprovider import registry

    return registry.RESOURCES.get(type_name)


def _source(type_name: str) -> SourceSpec | None:
    from orchestrator.tfprovider import registry

    return registry.DATA_SOURCES.get(type_name)


def _unknown_type(kind: str, type_name: str) -> list[dict[str, Any]]:
    return _error(f"Unknown {kind} type", f"the platform-orchestrator provider has no {kind} {type_name!r}")


# -- the handlers -------------------------------------------------------------------------------------


async def get_metadata(request: bytes) -> bytes:
    from orchestrator.tfprovider import registry

    response = tfplugin6.message("GetMetadata.Response")(
        server_capabilities={},
        resources=[{"type_name": name} for name in registry.RESOURCES],
        data_sources=[{"type_name": name} for name in registry.DATA_SOURCES],
    )
    answer: bytes = response.SerializeToString()
    return answer


async def validate_provider_config(request: bytes) -> bytes:
    from orchestrator.tfprovider import provider

    parsed = tfplugin6.message("ValidateProviderConfig.Request").FromString(request)
    _decode(parsed.config, provider.ATTRIBUTES)  # a value that does not fit fails here
    answer: bytes = tfplugin6.message("ValidateProviderConfig.Response")().SerializeToString()
    return answer


async def configure_provider(request: bytes) -> bytes:
    from orchestrator.tfprovider import provider, session
    from orchestrator.tfprovider.values import native

    parsed = tfplugin6.message("ConfigureProvider.Request").FromString(request)
    block = native(_decode(parsed.config, provider.ATTRIBUTES)) or {}
    diagnostics: list[dict[str, Any]] = []
    try:
        provider.configure(block)
    except session.ProviderConfigError as exc:
        diagnostics = _error(f"platform-orchestrator provider: {exc}")
    answer: bytes = tfplugin6.message("ConfigureProvider.Response")(
        diagnostics=diagnostics
    ).SerializeToString()
    return answer


async def validate_resource_config(request: bytes) -> bytes:
    from orchestrator.tfprovider import resource

    parsed = tfplugin6.message("ValidateResourceConfig.Request").FromString(request)
    response = tfplugin6.message("ValidateResourceConfig.Response")()
    spec = _resource(parsed.type_name)
    if spec is None:
        _add(response.diagnostics, _unknown_type("resource", parsed.type_name))
    else:
        config = _decode(parsed.config, spec.attributes)
        _add(response.diagnostics, [_error(message)[0] for message in resource.validate(spec, config)])
    answer: bytes = response.SerializeToString()
    return answer


async def validate_data_resource_config(request: bytes) -> bytes:
    parsed = tfplugin6.message("ValidateDataResourceConfig.Request").FromString(request)
    response = tfplugin6.message("ValidateDataResourceConfig.Response")()
    spec = _source(parsed.type_name)
    if spec is None:
        _add(response.diagnostics, _unknown_type("data source", parsed.type_name))
    else:
        _decode(parsed.config, spec.attributes)
    answer: bytes = response.SerializeToString()
    return answer


async def upgrade_resource_state(request: bytes) -> bytes:
    parsed = tfplugin6.message("UpgradeResourceState.Request").FromString(request)
    response = tfplugin6.message("UpgradeResourceState.Response")()
    spec = _resource(parsed.type_name)
    if spec is None:
        _add(response.diagnostics, _unknown_type("resource", parsed.type_name))
    elif parsed.version > SCHEMA_VERSION:
        _add(
            response.diagnostics,
            _error(
                "State written by a newer provider",
                f"{parsed.type_name}'s state has schema version {parsed.version}; this provider knows "
                f"{SCHEMA_VERSION}: upgrade the provider",
            ),
        )
    elif not parsed.raw_state.json:
        _add(response.diagnostics, _error("Unsupported state", "the state has no JSON form (flatmap)"))
    else:
        state = cty.from_json(json.loads(parsed.raw_state.json), object_type(spec.attributes))
        response.upgraded_state.CopyFrom(_message_value(_encode(state, spec.attributes)))
    answer: bytes = response.SerializeToString()
    return answer


def _message_value(fields: dict[str, bytes]) -> Any:
    return tfplugin6.message("DynamicValue")(**fields)


async def read_resource(request: bytes) -> bytes:
    from orchestrator.tfprovider import resource

    parsed = tfplugin6.message("ReadResource.Request").FromString(request)
    response = tfplugin6.message("ReadResource.Response")(private=parsed.private)
    spec = _resource(parsed.type_name)
    if spec is None:
        _add(response.diagnostics, _unknown_type("resource", parsed.type_name))
    else:
        diags = resource.Diagnostics()
        state = await resource.read(spec, _decode(parsed.current_state, spec.attributes), diags)
        response.new_state.CopyFrom(_message_value(_encode(state, spec.attributes)))
        _add(response.diagnostics, _diagnostics(diags))
    answer: bytes = response.SerializeToString()
    return answer


async def plan_resource_change(request: bytes) -> bytes:
    from orchestrator.tfprovider import resource

    parsed = tfplugin6.message("PlanResourceChange.Request").FromString(request)
    response = tfplugin6.message("PlanResourceChange.Response")()
    spec = _resource(parsed.type_name)
    if spec is None:
        _add(response.diagnostics, _unknown_type("resource", parsed.type_name))
    else:
        diags = resource.Diagnostics()
        planned, replaced = resource.plan(
            spec,
            _decode(parsed.prior_state, spec.attributes),
            _decode(parsed.proposed_new_state, spec.attributes),
            _decode(parsed.config, spec.attributes),
            diags,
        )
        _add(response.diagnostics, _diagnostics(diags))
        if not diags.errors:
            response.planned_state.CopyFrom(_message_value(_encode(planned, spec.attributes)))
            _add(response.requires_replace, [{"steps": [{"attribute_name": name}]} for name in replaced])
            response.planned_private = parsed.prior_private
    answer: bytes = response.SerializeToString()
    return answer


async def apply_resource_change(request: bytes) -> bytes:
    from orchestrator.tfprovider import resource

    parsed = tfplugin6.message("ApplyResourceChange.Request").FromString(request)
    response = tfplugin6.message("ApplyResourceChange.Response")(private=parsed.planned_private)
    spec = _resource(parsed.type_name)
    if spec is None:
        _add(response.diagnostics, _unknown_type("resource", parsed.type_name))
    else:
        diags = resource.Diagnostics()
        state = await resource.apply(
            spec,
            _decode(parsed.prior_state, spec.attributes),
            _decode(parsed.planned_state, spec.attributes),
            _decode(parsed.config, spec.attributes),
            diags,
        )
        response.new_state.CopyFrom(_message_value(_encode(state, spec.attributes)))
        _add(response.diagnostics, _diagnostics(diags))
    answer: bytes = response.SerializeToString()
    return answer


async def import_resource_state(request: bytes) -> bytes:
    from orchestrator.tfprovider import resource

    parsed = tfplugin6.message("ImportResourceState.Request").FromString(request)
    response = tfplugin6.message("ImportResourceState.Response")()
    spec = _resource(parsed.type_name)
    if spec is None:
        _add(response.diagnostics, _unknown_type("resource", parsed.type_name))
    else:
        diags = resource.Diagnostics()
        state = await resource.import_state(spec, parsed.type_name, parsed.id, diags)
        _add(response.diagnostics, _diagnostics(diags))
        if state is not None:
            response.imported_resources.add(
                type_name=parsed.type_name, state=_message_value(_encode(state, spec.attributes))
            )
    answer: bytes = response.SerializeToString()
    return answer


async def read_data_source(request: bytes) -> bytes:
    from orchestrator.tfprovider import resource

    parsed = tfplugin6.message("ReadDataSource.Request").FromString(request)
    response = tfplugin6.message("ReadDataSource.Response")()
    spec = _source(parsed.type_name)
    if spec is None:
        _add(response.diagnostics, _unknown_type("data source", parsed.type_name))
    else:
        diags = resource.Diagnostics()
        state = await resource.read_source(spec, _decode(parsed.config, spec.attributes), diags)
        _add(response.diagnostics, _diagnostics(diags))
        if not diags.errors:
            response.state.CopyFrom(_message_value(_encode(state, spec.attributes)))
    answer: bytes = response.SerializeToString()
    return answer


#: The response message of each served method, for an internal error's diagnostic.
_RESPONSES: dict[str, str] = {
    "GetMetadata": "GetMetadata.Response",
    "ValidateProviderConfig": "ValidateProviderConfig.Response",
    "ConfigureProvider": "ConfigureProvider.Response",
    "ValidateResourceConfig": "ValidateResourceConfig.Response",
    "ValidateDataResourceConfig": "ValidateDataResourceConfig.Response",
    "UpgradeResourceState": "UpgradeResourceState.Response",
    "ReadResource": "ReadResource.Response",
    "PlanResourceChange": "PlanResourceChange.Response",
    "ApplyResourceChange": "ApplyResourceChange.Response",
    "ImportResourceState": "ImportResourceState.Response",
    "ReadDataSource": "ReadDataSource.Response",
}


def _guarded(method: str, handler: Handler) -> Handler:
    async def guarded(request: bytes) -> bytes:
        try:
            return await handler(request)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            summary = "Internal error in the platform-orchestrator provider"
            if isinstance(exc, cty.CtyError):
                summary = "A value does not fit the platform-orchestrator provider's schema"
            response = tfplugin6.message(_RESPONSES[method])()
            _add(response.diagnostics, _error(summary, f"{method}: {type(exc).__name__}: {exc}"))
            answer: bytes = response.SerializeToString()
            return answer

    return guarded


HANDLERS: dict[str, Handler] = {
    method: _guarded(method, handler)
    for method, handler in (
        ("GetMetadata", get_metadata),
        ("ValidateProviderConfig", validate_provider_config),
        ("ConfigureProvider", configure_provider),
        ("ValidateResourceConfig", validate_resource_config),
        ("ValidateDataResourceConfig", validate_data_resource_config),
        ("UpgradeResourceState", upgrade_resource_state),
        ("ReadResource", read_resource),
        ("PlanResourceChange", plan_resource_change),
        ("ApplyResourceChange", apply_resource_change),
        ("ImportResourceState", import_resource_state),
        ("ReadDataSource", read_data_source),
    )
}
