"""The module catalogue: resource types, module providers, modules and module rules.

Shapes follow upstream's provider: ``output_schema``, ``module_inputs`` and a provider's ``configuration``
are JSON strings (``jsonencode(...)``); ``module_params``, ``dependencies`` and ``coprovisioned`` are HCL
objects as upstream writes them (maps of objects and a list of objects whose members are all optional but
``type``). They are dynamic attributes (pyvider, which the provider was first built on, could not declare a
map or list of nested attributes with optional members, and their states record them so): any object is
accepted and checked here, and the value in state is the configured one whenever the API's answer means
the same (defaults such as ``is_optional = false`` or ``class = "default"`` left out on either side).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from orchestrator.tfprovider import cty
from orchestrator.tfprovider.resource import SourceSpec, Spec
from orchestrator.tfprovider.schema import a_bool, a_dyn, a_map, a_str
from orchestrator.tfprovider.session import ApiProblem, Session
from orchestrator.tfprovider.values import JsonDict, drop_nulls, parse_json

#: What the API answers in place of a provider configuration's secret values.
SECRET = "SECRET"
INLINE_SOURCE = "inline"
DEFAULT_CLASS = "default"


# -- shared helpers ---------------------------------------------------------------------------------


def compact_json(value: Any) -> str:
    """``value`` as ``jsonencode`` writes it (sorted keys, no spaces): an import matches its configuration."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def json_state(prior: Any, value: Any) -> str | None:
    """A JSON attribute's text for state: the prior text when it means ``value``, else ``value`` compact."""
    if value is None:
        return None
    if isinstance(prior, str):
        try:
            if json.loads(prior) == value:
                return prior
        except ValueError:
            pass
    return compact_json(value)


def json_value(attribute: str, text: Any) -> Any:
    """The value of a JSON-string attribute; a bad one is a diagnostic naming the attribute."""
    try:
        return parse_json(attribute, text)
    except ValueError as exc:
        raise ApiProblem(f"invalid {attribute}", str(exc)) from None


def problems_of(build: Callable[[JsonDict], Any]) -> Callable[[JsonDict], list[str]]:
    """A plan-time check: the messages of the problems ``build`` finds in a configuration."""

    def check(config: JsonDict) -> list[str]:
        try:
            build(config)
        except ApiProblem as problem:
            return [problem.detail]
        return []

    return check


def same_or(
    prior: Any, found: Any, normal: Callable[[Any], Any], render: Callable[[Any], Any] = lambda value: value
) -> Any:
    """``prior`` when it means what the API answered (``normal`` of both equal), else the answer without
    the members that only repeat a default (as a configuration would leave them out: an import),
    ``render``-ed in the configuration's shape."""
    answered = normal(found)
    if normal(prior) == answered:
        return prior
    return render(answered)


def _params_as_text(requests: Any) -> Any:
    """Requests (a map or a list) with each ``params`` object as the JSON string upstream documents."""

    def one(request: Any) -> Any:
        if isinstance(request, dict) and isinstance(request.get("params"), dict):
            return {**request, "params": compact_json(request["params"])}
        return request

    if isinstance(requests, dict):
        return {alias: one(request) for alias, request in requests.items()}
    if isinstance(requests, list):
        return [one(request) for request in requests]
    return requests


def literal(value: Any) -> cty.DynamicValue | None:
    """A dynamic attribute's value typed as HCL types the same literal (objects and tuples, not maps and
    lists): Terraform compares a dynamic value's type too, and the configuration's is a literal's."""
    if value is None:
        return None
    return cty.DynamicValue(cty.literal_type(value), value)


def _empty_to_none(value: Any) -> Any:
    return value or None


def _params_value(attribute: str, params: Any) -> Any:
    """A dependency's ``params``: a JSON string (upstream's documentation) or an object (its example)."""
    if isinstance(params, str):
        return json_value(attribute, params)
    return params


def _request_body(attribute: str, request: Any) -> JsonDict:
    if not isinstance(request, dict) or not isinstance(request.get("type"), str):
        raise ApiProblem(f"invalid {attribute}", f"{attribute} must be an object with a string 'type'")
    body: JsonDict = drop_nulls(dict(request))
    if "params" in body:
        body["params"] = _params_value(f"{attribute}.params", body["params"])
    return body


def _request_normal(request: Any) -> Any:
    """A dependency or co-provisioned resource without the members that only repeat a default."""
    if not isinstance(request, dict):
        return request
    normal = drop_nulls(dict(request))
    if "params" in normal:
        normal["params"] = _params_value("params", normal["params"])
    for name, default in (("class", DEFAULT_CLASS), ("params", {}), ("is_dependent_on_current", False)):
        if normal.get(name) == default:
            normal.pop(name)
    if normal.get("copy_dependents_from_current") is False:
        normal.pop("copy_dependents_from_current")
    return normal


def _params_normal(params: Any) -> Any:
    if not isinstance(params, dict):
        return params or None
    normal = {}
    for name, param in params.items():
        item = drop_nulls(dict(param)) if isinstance(param, dict) else param
        if isinstance(item, dict) and item.get("is_optional") is False:
            item.pop("is_optional")
        normal[name] = item
    return normal or None


def _dependencies_normal(dependencies: Any) -> Any:
    if not isinstance(dependencies, dict):
        return dependencies or None
    return {alias: _request_normal(request) for alias, request in dependencies.items()} or None


def _coprovisioned_normal(coprovisioned: Any) -> Any:
    if not isinstance(coprovisioned, list):
        return coprovisioned or None
    return [_request_normal(request) for request in coprovisioned] or None


# -- resource types ---------------------------------------------------------------------------------


def _resource_type_body(config: JsonDict) -> JsonDict:
    body: JsonDict = {
        "description": config.get("description"),
        "output_schema": json_value("output_schema", config.get("output_schema")),
    }
    if config.get("is_developer_accessible") is not None:
        body["is_developer_accessible"] = config["is_developer_accessible"]
    return body


async def _create_resource_type(session: Session, config: JsonDict) -> JsonDict:
    body = {"id": config["id"], **_resource_type_body(config)}
    return await session.call(
        f"create resource type {config['id']!r}", session.client.create_resource_type, session.org, body
    )


async def _read_resource_type(session: Session, keys: JsonDict) -> JsonDict | None:
    return await session.find(
        f"read resource type {keys['id']!r}", session.client.get_resource_type, session.org, keys["id"]
    )


async def _update_resource_type(session: Session, config: JsonDict, prior: JsonDict) -> JsonDict:
    return await session.call(
        f"update resource type {config['id']!r}",
        session.client.update_resource_type,
        session.org,
        config["id"],
        _resource_type_body(config),
    )


async def _delete_resource_type(session: Session, state: JsonDict) -> None:
    await session.call(
        f"delete resource type {state['id']!r}", session.client.delete_resource_type, session.org, state["id"]
    )


def _resource_type_state(found: JsonDict, prior: JsonDict) -> JsonDict:
    return {
        "id": found["id"],
        "description": found.get("description"),
        "output_schema": json_state(prior.get("output_schema"), found.get("output_schema")),
        "is_developer_accessible": found.get("is_developer_accessible"),
    }


RESOURCE_TYPE = Spec(
    name="resource_type",
    description="A resource type a manifest can request and modules provision.",
    attributes={
        "id": a_str(required=True, requires_replace=True, description="The resource type id."),
        "description": a_str(optional=True),
        "output_schema": a_str(
            required=True, description="The JSON schema of its outputs (jsonencode(...))."
        ),
        "is_developer_accessible": a_bool(
            optional=True, computed=True, description="Whether manifests may request it (default true)."
        ),
    },
    create=_create_resource_type,
    validate=problems_of(_resource_type_body),
    read=_read_resource_type,
    update=_update_resource_type,
    delete=_delete_resource_type,
    to_state=_resource_type_state,
)

RESOURCE_TYPE_SOURCE = SourceSpec(
    name="resource_type",
    attributes={
        "id": a_str(required=True),
        "description": a_str(computed=True),
        "output_schema": a_str(computed=True),
        "is_developer_accessible": a_bool(computed=True),
    },
    read=_read_resource_type,
    to_state=_resource_type_state,
)


# -- module providers -------------------------------------------------------------------------------


def _provider_name(values: JsonDict) -> str:
    return f"{values['provider_type']}.{values['id']}"


def _configuration_body(config: JsonDict) -> Any:
    value = json_value("configuration", config.get("configuration"))
    return {} if value is None else value


async def _create_provider(session: Session, config: JsonDict) -> JsonDict:
    body = {
        "provider_type": config["provider_type"],
        "id": config["id"],
        "description": config.get("description"),
        "source": config["source"],
        "version_constraint": config["version_constraint"],
        "configuration": _configuration_body(config),
    }
    return await session.call(
        f"create provider {_provider_name(config)!r}",
        session.client.create_module_provider,
        session.org,
        body,
    )


async def _read_provider(session: Session, keys: JsonDict) -> JsonDict | None:
    return await session.find(
        f"read provider {_provider_name(keys)!r}",
        session.client.get_module_provider,
        session.org,
        keys["provider_type"],
        keys["id"],
    )


async def _update_provider(session: Session, config: JsonDict, prior: JsonDict) -> JsonDict:
    patch = {
        "description": config.get("description"),
        "version_constraint": config["version_constraint"],
        "configuration": _configuration_body(config),
    }
    return await session.call(
        f"update provider {_provider_name(config)!r}",
        session.client.update_module_provider,
        session.org,
        config["provider_type"],
        config["id"],
        patch,
    )


async def _delete_provider(session: Session, state: JsonDict) -> None:
    await session.call(
        f"delete provider {_provider_name(state)!r}",
        session.client.delete_module_provider,
        session.org,
        state["provider_type"],
        state["id"],
    )


def unmask(answered: Any, known: Any) -> Any:
    """The API's configuration with each ``"SECRET"`` replaced by the configured value at its place."""
    if answered == SECRET:
        return known if known is not None else SECRET
    if isinstance(answered, dict):
        known_map = known if isinstance(known, dict) else {}
        return {key: unmask(value, known_map.get(key)) for key, value in answered.items()}
    if isinstance(answered, list):
        known_list = known if isinstance(known, list) else []
        return [
            unmask(value, known_list[i] if i < len(known_list) else None) for i, value in enumerate(answered)
        ]
    return answered


def configuration_state(prior_text: Any, answered: Any) -> str | None:
    """The configuration for state: the configured text when it means the (masked) answer; else the
    answer, with the configured secrets kept where the API shows ``"SECRET"`` (an import has none)."""
    try:
        known = json.loads(prior_text) if isinstance(prior_text, str) else None
    except ValueError:
        known = None
    value = unmask(answered or {}, known)
    if prior_text is None and value == {}:
        return None
    return json_state(prior_text, value)


def _provider_state(found: JsonDict, prior: JsonDict) -> JsonDict:
    return {
        "provider_type": found["provider_type"],
        "id": found["id"],
        "description": found.get("description"),
        "source": found.get("source"),
        "version_constraint": found.get("version_constraint"),
        "configuration": configuration_state(prior.get("configuration"), found.get("configuration")),
    }


def provider_import_id(import_id: str) -> JsonDict:
    """``PROVIDER_TYPE.ID``, as upstream's provider imports a module provider."""
    provider_type, dot, provider_id = import_id.partition(".")
    if not dot or not provider_type or not provider_id:
        raise ValueError(f"the import id must be PROVIDER_TYPE.ID, not {import_id!r}")
    return {"provider_type": provider_type, "id": provider_id}


PROVIDER = Spec(
    name="provider",
    description="A module provider: a Terraform provider block that modules map their providers to.",
    attributes={
        "provider_type": a_str(required=True, requires_replace=True, description="aws, google, ..."),
        "id": a_str(required=True, requires_replace=True),
        "source": a_str(required=True, requires_replace=True, description="hashicorp/aws, ..."),
        "version_constraint": a_str(required=True),
        "description": a_str(optional=True),
        "configuration": a_str(
            optional=True,
            sensitive=True,
            description="The provider block's configuration (jsonencode(...)); may hold secrets.",
        ),
    },
    create=_create_provider,
    validate=problems_of(_configuration_body),
    read=_read_provider,
    update=_update_provider,
    delete=_delete_provider,
    to_state=_provider_state,
    import_id=provider_import_id,
)

PROVIDER_SOURCE = SourceSpec(
    name="provider",
    attributes={
        "provider_type": a_str(required=True),
        "id": a_str(required=True),
        "source": a_str(computed=True),
        "version_constraint": a_str(computed=True),
        "description": a_str(computed=True),
        "configuration": a_str(computed=True, sensitive=True, description='Secrets show as "SECRET".'),
    },
    read=_read_provider,
    to_state=_provider_state,
)


# -- modules ----------------------------------------------------------------------------------------


def module_body(config: JsonDict) -> JsonDict:
    """The API's module fields from a configuration (without ``id`` and ``resource_type``)."""
    source = config.get("module_source")
    code = config.get("module_source_code")
    if code is not None and source != INLINE_SOURCE:
        raise ApiProblem(
            "invalid module_source", f"module_source must be {INLINE_SOURCE!r} when module_source_code is set"
        )
    params = config.get("module_params") or {}
    if not isinstance(params, dict):
        raise ApiProblem("invalid module_params", "module_params must be a map of objects with a 'type'")
    dependencies = config.get("dependencies") or {}
    if not isinstance(dependencies, dict):
        raise ApiProblem("invalid dependencies", "dependencies must be a map of objects with a 'type'")
    coprovisioned = config.get("coprovisioned") or []
    if not isinstance(coprovisioned, list):
        raise ApiProblem("invalid coprovisioned", "coprovisioned must be a list of objects with a 'type'")
    inputs = json_value("module_inputs", config.get("module_inputs"))
    return {
        "description": config.get("description"),
        "module_source": source,
        "module_source_code": code,
        "module_params": {name: drop_nulls(param) for name, param in params.items()},
        "module_inputs": {} if inputs is None else inputs,
        "provider_mapping": config.get("provider_mapping") or {},
        "dependencies": {
            alias: _request_body(f"dependencies.{alias}", request) for alias, request in dependencies.items()
        },
        "coprovisioned": [
            _request_body(f"coprovisioned[{index}]", request) for index, request in enumerate(coprovisioned)
        ],
    }


async def _create_module(session: Session, config: JsonDict) -> JsonDict:
    body = {"id": config["id"], "resource_type": config["resource_type"], **module_body(config)}
    return await session.call(
        f"create module {config['id']!r}", session.client.create_module, session.org, body
    )


async def _read_module(session: Session, keys: JsonDict) -> JsonDict | None:
    return await session.find(
        f"read module {keys['id']!r}", session.client.get_module, session.org, keys["id"]
    )


async def _update_module(session: Session, config: JsonDict, prior: JsonDict) -> JsonDict:
    return await session.call(
        f"update module {config['id']!r}",
        session.client.update_module,
        session.org,
        config["id"],
        module_body(config),
    )


async def _delete_module(session: Session, state: JsonDict) -> None:
    await session.call(
        f"delete module {state['id']!r}", session.client.delete_module, session.org, state["id"]
    )


def module_state(found: JsonDict, prior: JsonDict) -> JsonDict:
    inputs = found.get("module_inputs") or None
    return {
        "id": found["id"],
        "resource_type": found.get("resource_type"),
        "description": found.get("description"),
        "module_source": found.get("module_source"),
        "module_source_code": found.get("module_source_code"),
        "module_inputs": None
        if inputs is None and prior.get("module_inputs") is None
        else json_state(prior.get("module_inputs"), inputs or {}),
        "provider_mapping": same_or(
            prior.get("provider_mapping"), found.get("provider_mapping"), _empty_to_none
        ),
        "module_params": literal(
            same_or(prior.get("module_params"), found.get("module_params") or None, _params_normal)
        ),
        "dependencies": literal(
            same_or(
                prior.get("dependencies"),
                found.get("dependencies") or None,
                _dependencies_normal,
                _params_as_text,
            )
        ),
        "coprovisioned": literal(
            same_or(
                prior.get("coprovisioned"),
                found.get("coprovisioned") or None,
                _coprovisioned_normal,
                _params_as_text,
            )
        ),
        "version_id": found.get("version_id"),
    }


MODULE = Spec(
    name="module",
    description="A module: the OpenTofu module that provisions resources of one resource type.",
    attributes={
        "id": a_str(required=True, requires_replace=True, description="The module id."),
        "resource_type": a_str(required=True, requires_replace=True),
        "description": a_str(optional=True),
        "module_source": a_str(
            required=True, description='A module source, or "inline" with module_source_code.'
        ),
        "module_source_code": a_str(
            optional=True, description="The module's code when module_source is inline."
        ),
        "module_inputs": a_str(optional=True, description="Inputs of the module (jsonencode(...))."),
        "module_params": a_dyn(optional=True, description="name = {type, is_optional, description}."),
        "provider_mapping": a_map(a_str(), optional=True, description='local name = "TYPE.ID".'),
        "dependencies": a_dyn(optional=True, description="alias = {type, class, id, params}."),
        "coprovisioned": a_dyn(
            optional=True,
            description="[{type, class, id, params, is_dependent_on_current, copy_dependents_from_current}].",
        ),
    },
    create=_create_module,
    validate=problems_of(module_body),
    read=_read_module,
    update=_update_module,
    delete=_delete_module,
    to_state=module_state,
)

MODULE_SOURCE = SourceSpec(
    name="module",
    attributes={
        "id": a_str(required=True),
        "resource_type": a_str(computed=True),
        "description": a_str(computed=True),
        "module_source": a_str(computed=True),
        "module_source_code": a_str(computed=True),
        "module_inputs": a_str(computed=True),
        "module_params": a_dyn(computed=True),
        "provider_mapping": a_map(a_str(), computed=True),
        "dependencies": a_dyn(computed=True),
        "coprovisioned": a_dyn(computed=True),
        "version_id": a_str(computed=True),
    },
    read=_read_module,
    to_state=module_state,
)


# -- module rules -----------------------------------------------------------------------------------

_RULE_SCOPE = ("resource_class", "resource_id", "project_id", "env_type_id", "env_id")


async def _create_module_rule(session: Session, config: JsonDict) -> JsonDict:
    body = {"module_id": config["module_id"], **{name: config.get(name) for name in _RULE_SCOPE}}
    return await session.call(
        f"create a module rule for module {config['module_id']!r}",
        session.client.create_module_rule,
        session.org,
        drop_nulls(body),
    )


async def _read_module_rule(session: Session, keys: JsonDict) -> JsonDict | None:
    return await session.find(
        f"read module rule {keys['id']!r}", session.client.get_module_rule, session.org, keys["id"]
    )


async def _delete_module_rule(session: Session, state: JsonDict) -> None:
    await session.call(
        f"delete module rule {state['id']!r}", session.client.delete_module_rule, session.org, state["id"]
    )


def _module_rule_state(found: JsonDict, prior: JsonDict) -> JsonDict:
    return {
        "id": str(found["id"]),
        "module_id": found.get("module_id"),
        "resource_type": found.get("resource_type"),
        **{name: found.get(name) for name in _RULE_SCOPE},
    }


MODULE_RULE = Spec(
    name="module_rule",
    description="A module rule: which module provisions a resource, by class, id, project and environment.",
    attributes={
        "id": a_str(computed=True, description="The rule's id (a UUID)."),
        "module_id": a_str(required=True, requires_replace=True),
        "resource_class": a_str(
            optional=True, computed=True, requires_replace=True, description="Default: default."
        ),
        "resource_id": a_str(optional=True, requires_replace=True),
        "project_id": a_str(optional=True, requires_replace=True),
        "env_type_id": a_str(optional=True, requires_replace=True, description="Not with env_id."),
        "env_id": a_str(optional=True, requires_replace=True, description="Not with env_type_id."),
        "resource_type": a_str(computed=True, description="The resource type of the rule's module."),
    },
    create=_create_module_rule,
    read=_read_module_rule,
    delete=_delete_module_rule,
    to_state=_module_rule_state,
)

MODULE_RULE_SOURCE = SourceSpec(
    name="module_rule",
    attributes={
        "id": a_str(required=True),
        "module_id": a_str(computed=True),
        "resource_type": a_str(computed=True),
        **{name: a_str(computed=True) for name in _RULE_SCOPE},
    },
    read=_read_module_rule,
    to_state=_module_rule_state,
)

RESOURCES = (RESOURCE_TYPE, PROVIDER, MODULE, MODULE_RULE)
DATA_SOURCES = (RESOURCE_TYPE_SOURCE, PROVIDER_SOURCE, MODULE_SOURCE, MODULE_RULE_SOURCE)
