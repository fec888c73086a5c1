"""The manifest compiler, pure: manifests and catalogues built in memory, main.tf compared as text."""

from __future__ import annotations

import gzip
import io
import json
import random
import re
import tarfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator import compiler
from orchestrator.compiler import hcl
from orchestrator.compiler.graph import MAX_NODES, Coordinate
from orchestrator.domain.catalogue import (
    Module,
    ModuleContent,
    ModuleParam,
    ModuleProvider,
    ModuleRule,
    ResourceRequest,
    ResourceType,
)
from orchestrator.domain.module_rules import EnvCatalogue, Placement
from orchestrator.errors import InvalidInputError, PayloadTooLargeError
from orchestrator.runner.bundle import extract_bundle

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ENV_UUID = uuid.UUID("2f1f7e53-7a38-4d5c-9d43-1d4f0b5a3c11")
ENV = compiler.EnvInfo(
    org_id="acme", project_id="shop", env_id="dev", env_type_id="development", env_uuid=ENV_UUID
)
WHERE = Placement(project_id="shop", env_type_id="development", env_id="dev")
BACKEND = 'backend "local" {\n  path = "state.tfstate"\n}'
CODE = 'variable "value" {\n  type = string\n}\n'


def rtype(type_id: str, outputs: dict[str, Any] | None = None, *, developer: bool = True) -> ResourceType:
    return ResourceType(
        org_id="acme",
        id=type_id,
        description=None,
        output_schema=outputs if outputs is not None else {},
        is_developer_accessible=developer,
        built_in=False,
        created_at=T0,
        updated_at=T0,
    )


def module(module_id: str, resource_type: str, **content: Any) -> Module:
    content.setdefault("module_source", "inline")
    if content["module_source"] == "inline":
        content.setdefault("module_source_code", CODE)
    return Module(
        org_id="acme",
        id=module_id,
        uuid=uuid.uuid5(uuid.NAMESPACE_DNS, module_id),
        resource_type=resource_type,
        content=ModuleContent(**content),
        version_id=uuid.uuid5(uuid.NAMESPACE_URL, f"{module_id}/{content!r}"),
        created_at=T0,
        updated_at=T0,
    )


def rule(m: Module, resource_class: str = "default", resource_id: str | None = None) -> ModuleRule:
    return ModuleRule(
        org_id="acme",
        id=uuid.uuid5(uuid.NAMESPACE_OID, f"{m.id}/{resource_class}/{resource_id}"),
        module_id=m.id,
        resource_type=m.resource_type,
        resource_class=resource_class,
        resource_id=resource_id,
        project_id=None,
        env_type_id=None,
        env_id=None,
        created_at=T0,
    )


def provider(
    provider_type: str, provider_id: str, source: str, version: str = "", **config: Any
) -> ModuleProvider:
    return ModuleProvider(
        org_id="acme",
        provider_type=provider_type,
        id=provider_id,
        description=None,
        source=source,
        version_constraint=version,
        configuration=config,
        created_at=T0,
        updated_at=T0,
    )


def catalogue(
    *entries: Module | tuple[Module, str, str | None], providers: tuple[ModuleProvider, ...] = ()
) -> EnvCatalogue:
    """Rules for each module (``(module, class, id)`` for another class or an id), as loaded for ``WHERE``."""
    rules: list[ModuleRule] = []
    modules: dict[str, Module] = {}
    for entry in entries:
        m, resource_class, resource_id = (entry, "default", None) if isinstance(entry, Module) else entry
        rules.append(rule(m, resource_class, resource_id))
        modules[m.id] = m
    return EnvCatalogue(
        where=WHERE, rules=tuple(rules), modules=modules, providers={p.key: p for p in providers}
    )


PG_OUTPUTS = {"properties": {"host": {"type": "string"}, "password": {"type": "string", "x-sensitive": True}}}
TYPES = {
    t.id: t
    for t in [
        rtype("postgres", PG_OUTPUTS),
        rtype("redis", {"properties": {"url": {"type": "string"}}}),
        rtype("queue", {"type": "object"}),
        rtype("network", {"properties": {"id": {"type": "string"}}}, developer=False),
        rtype("dns", {"properties": {"name": {"type": "string"}}, "additionalProperties": True}),
        rtype("chain"),
    ]
}
PG = module(
    "pg",
    "postgres",
    module_params={"name": ModuleParam(type="string"), "size": ModuleParam(type="number", is_optional=True)},
)
REDIS = module("redis", "redis", module_params={"url_prefix": ModuleParam(type="string", is_optional=True)})
QUEUE = module("queue", "queue", module_params={"value": ModuleParam(type="any", is_optional=True)})


def compile_(
    manifest: dict[str, Any], cat: EnvCatalogue, *, backend: str = BACKEND
) -> compiler.CompiledDeployment:
    return compiler.compile_deployment(
        compiler.parse_manifest(manifest), cat, resource_types=TYPES, env=ENV, backend=backend
    )


def block(main_tf: str, kind: str, name: str) -> str:
    """The text of one top-level block."""
    match = re.search(rf'^{kind} "{re.escape(name)}" {{\n.*?^}}\n', main_tf, re.MULTILINE | re.DOTALL)
    assert match, f"no {kind} {name!r} in:\n{main_tf}"
    return match.group(0)


def error_of(manifest: dict[str, Any], cat: EnvCatalogue) -> str:
    with pytest.raises(InvalidInputError) as caught:
        compile_(manifest, cat)
    return caught.value.message


# --- parse_manifest -------------------------------------------------------------------------------


def test_parse_manifest__reads_class_and_deprecated_variables() -> None:
    manifest = compiler.parse_manifest(
        {
            "workloads": {
                "api": {"resources": {"db": {"type": "postgres", "class": "big"}}, "variables": {"a": "b"}}
            },
            "shared": {"jobs": {"type": "queue", "id": "main", "params": {"x": [1]}}},
        }
    )

    assert "big" == manifest.workloads["api"].resources["db"].resource_class
    assert {"a": "b"} == manifest.workloads["api"].outputs
    assert {
        "workloads": {
            "api": {
                "resources": {"db": {"type": "postgres", "class": "big", "params": {}}},
                "outputs": {"a": "b"},
            }
        },
        "shared": {"jobs": {"type": "queue", "id": "main", "params": {"x": [1]}}},
    } == manifest.to_dict()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "manifest.workloads: field required"),
        ([], "manifest: input should be a valid dictionary"),
        ({"workloads": {}, "extra": 1}, "manifest.extra: unknown field"),
        ({"workloads": {"Api": {}}}, "manifest.workloads.Api: invalid workload name 'Api'"),
        ({"workloads": {"a": {}}}, "manifest.workloads.a: invalid workload name 'a'"),
        # The name is the workload's Terraform output: Terraform refuses an output name starting with a
        # digit, and no workload can be named like the metadata output.
        ({"workloads": {"9lives": {}}}, "manifest.workloads.9lives: invalid workload name '9lives'"),
        (
            {"workloads": {"platform_orchestrator_metadata": {}}},
            "manifest.workloads.platform_orchestrator_metadata: invalid workload name "
            "'platform_orchestrator_metadata'",
        ),
        ({"workloads": {"api": {"foo": 1}}}, "manifest.workloads.api.foo: unknown field"),
        (
            {"workloads": {"api": {"resources": {"db": {"type": "p"}}}}},
            "manifest.workloads.api.resources.db.type: type must be a valid resource type",
        ),
        (
            {"workloads": {"api": {"resources": {"db": {"type": "pg", "class": "a_b"}}}}},
            "manifest.workloads.api.resources.db.class: resource class must be a valid identifier",
        ),
        (
            {"workloads": {"api": {"resources": {"db": {"type": "pg", "id": "Main"}}}}},
            "manifest.workloads.api.resources.db.id: resource id must be one or more dot-separated parts",
        ),
        (
            {"workloads": {"api": {"resources": {"db": {"type": "pg", "name": "x"}}}}},
            "manifest.workloads.api.resources.db.name: unknown field",
        ),
        (
            {"workloads": {"api": {"resources": {"my__db": {"type": "pg"}}}}},
            "manifest.workloads.api.resources.my__db: invalid resource alias 'my__db'",
        ),
        (
            {"workloads": {"api": {"outputs": {"url": 1}}}},
            "manifest.workloads.api.outputs.url: input should be a valid string",
        ),
        (
            {"workloads": {"api": {"outputs": {"1url": "x"}}}},
            "manifest.workloads.api.outputs.1url: invalid output name",
        ),
        (
            {"workloads": {"api": {"outputs": {}, "variables": {}}}},
            "manifest.workloads.api.variables: variables and outputs cannot be used together",
        ),
        (
            {"workloads": {}, "shared": {"Q": {"type": "queue"}}},
            "manifest.shared.Q: invalid shared resource alias 'Q'",
        ),
        (
            {"workloads": {f"w{i}": {} for i in range(101)}},
            "manifest.workloads: at most 100 workloads are allowed, got 101",
        ),
        (
            {"workloads": {"api": {"resources": {f"r{i}": {"type": "pg"} for i in range(101)}}}},
            "manifest.workloads.api.resources: at most 100 resources per workload are allowed, got 101",
        ),
        (
            {"workloads": {}, "shared": {f"s{i}": {"type": "pg"} for i in range(101)}},
            "manifest.shared: at most 100 shared resources are allowed, got 101",
        ),
        (
            {
                "workloads": {
                    "api": {"resources": {"db": {"type": "pg", "params": {f"p{i}": 1 for i in range(21)}}}}
                }
            },
            "manifest.workloads.api.resources.db.params: at most 20 params are allowed, got 21",
        ),
    ],
)
def test_parse_manifest__errors_name_the_field(data: object, message: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        compiler.parse_manifest(data)

    assert caught.value.message.startswith(message), caught.value.message


def test_parse_manifest__limits_are_inclusive() -> None:
    manifest = compiler.parse_manifest(
        {
            "workloads": {f"w{i}": {} for i in range(100)},
            "shared": {
                f"s{i}": {"type": "pg", "params": {f"p{j}": j for j in range(20)}} for i in range(100)
            },
        }
    )

    assert 100 == len(manifest.workloads) == len(manifest.shared)


# --- references -----------------------------------------------------------------------------------


def test_compile__sibling_reference_becomes_a_module_traversal_and_a_dependency() -> None:
    compiled = compile_(
        {
            "workloads": {
                "api": {
                    "resources": {
                        "db": {"type": "postgres", "params": {"name": "orders"}},
                        "cache": {"type": "redis", "params": {"url_prefix": "${resources.db.outputs.host}"}},
                    },
                    "outputs": {
                        "db_host": "${resources.db.outputs.host}",
                        "dsn": "postgres://${resources.db.outputs.host}:5432/orders",
                    },
                }
            }
        },
        catalogue(PG, REDIS),
    )

    assert (
        'module "wl_api__cache__redis" {\n'
        f'  source = "./modules/redis/{REDIS.version_id}"\n'
        "\n"
        "  url_prefix = module.wl_api__db__postgres.host\n"
        "\n"
        "  depends_on = [\n"
        "    module.wl_api__db__postgres,\n"
        "  ]\n"
        "}\n"
    ) == block(compiled.main_tf, "module", "wl_api__cache__redis")
    assert (
        'output "api" {\n'
        "  description = \"The outputs of workload 'api'\"\n"
        "  value = {\n"
        "    db_host = module.wl_api__db__postgres.host\n"
        '    dsn     = "postgres://${module.wl_api__db__postgres.host}:5432/orders"\n'
        "  }\n"
        "}\n"
    ) == block(compiled.main_tf, "output", "api")


def test_compile__shared_resources_are_named_from_workloads() -> None:
    compiled = compile_(
        {
            "workloads": {
                "api": {
                    "resources": {
                        "cache": {"type": "redis", "params": {"url_prefix": "${shared.jobs.outputs.url}/api"}}
                    },
                    "outputs": {"jobs": "${shared.jobs.outputs.url}"},
                }
            },
            "shared": {"jobs": {"type": "queue"}},
        },
        catalogue(REDIS, QUEUE),
    )

    redis = block(compiled.main_tf, "module", "wl_api__cache__redis")
    assert '  url_prefix = "${module.shared__jobs__queue.url}/api"\n' in redis
    assert "    module.shared__jobs__queue,\n" in redis
    assert "    jobs = module.shared__jobs__queue.url\n" in block(compiled.main_tf, "output", "api")
    assert 'module "shared__jobs__queue" {' in compiled.main_tf


def test_compile__shared_resources_cannot_be_named_by_shared_params() -> None:
    message = error_of(
        {
            "workloads": {},
            "shared": {
                "aa": {"type": "queue"},
                "bb": {"type": "queue", "params": {"value": "${shared.aa.outputs.x}"}},
            },
        },
        catalogue(QUEUE),
    )

    assert (
        "manifest.shared.bb.params.value: '${shared.aa.outputs.x}': "
        "shared resources can only be named in a workload" == message
    )


def test_compile__context_values_are_written_as_literal_text() -> None:
    queue = module(
        "queue",
        "queue",
        module_params={"value": ModuleParam(type="any", is_optional=True)},
        module_inputs={"where": "${context.res_type}.${context.res_class}@${context.res_id}"},
    )
    compiled = compile_(
        {
            "workloads": {
                "api": {
                    "resources": {
                        "q": {
                            "type": "queue",
                            "params": {
                                "value": {
                                    "all": "${context.org_id}/${context.project_id}/${context.env_id}/"
                                    "${context.env_type_id}/${context.env_uuid}",
                                    "alone": "${context.env_id}",
                                }
                            },
                        }
                    },
                    "outputs": {"env": "${context.env_uuid}"},
                }
            }
        },
        catalogue(queue),
    )

    q = block(compiled.main_tf, "module", "wl_api__q__queue")
    assert f'    all   = "acme/shop/dev/development/{ENV_UUID}"\n' in q
    assert '    alone = "dev"\n' in q
    assert '  where = "queue.default@workloads.api.q"\n' in q
    assert f'    env = "{ENV_UUID}"\n' in compiled.main_tf


def test_compile__resource_context_keys_are_not_known_in_workload_outputs() -> None:
    message = error_of({"workloads": {"api": {"outputs": {"t": "${context.res_type}"}}}}, catalogue())

    assert message == (
        "manifest.workloads.api.outputs.t: unknown context key 'res_type', "
        "must be one of [env_id env_type_id env_uuid org_id project_id]"
    )


def test_compile__literals_are_escaped() -> None:
    text = 'a "quoted" \\ back\nline\ttab ${unclosed %{ if } $\\{literal} 50%'
    compiled = compile_(
        {"workloads": {"api": {"resources": {"q": {"type": "queue", "params": {"value": text}}}}}},
        catalogue(QUEUE),
    )

    assert (
        '  value = "a \\"quoted\\" \\\\ back\\nline\\ttab $${unclosed %%{ if } $${literal} 50%"\n'
        in block(compiled.main_tf, "module", "wl_api__q__queue")
    )


def test_compile__a_dollar_before_an_interpolation_stays_literal() -> None:
    compiled = compile_(
        {
            "workloads": {
                "api": {
                    "resources": {"q": {"type": "queue"}},
                    "outputs": {
                        "price": "$${resources.q.outputs.amount}",
                        "two": "$$${resources.q.outputs.amount}!",
                    },
                }
            }
        },
        catalogue(QUEUE),
    )

    outputs = block(compiled.main_tf, "output", "api")
    assert '    price = "${"$"}${module.wl_api__q__queue.amount}"\n' in outputs
    assert '    two   = "${"$$"}${module.wl_api__q__queue.amount}!"\n' in outputs


def test_compile__values_keep_their_json_types() -> None:
    value: dict[str, Any] = {
        "n": 1.5,
        "i": -3,
        "b": False,
        "z": None,
        "l": [1, "x"],
        "my key": {},
        "true": "k",
        "e": [],
    }
    compiled = compile_(
        {"workloads": {"api": {"resources": {"q": {"type": "queue", "params": {"value": value}}}}}},
        catalogue(QUEUE),
    )

    assert (
        "  value = {\n"
        "    b = false\n"
        "    e = []\n"
        "    i = -3\n"
        "    l = [\n"
        "      1,\n"
        '      "x",\n'
        "    ]\n"
        '    "my key" = {}\n'
        "    n        = 1.5\n"
        '    "true"   = "k"\n'
        "    z        = null\n"
        "  }\n"
    ) in block(compiled.main_tf, "module", "wl_api__q__queue")


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        (
            {"x": "${resources.nope.outputs.host}"},
            "'${resources.nope.outputs.host}': no resource 'nope' in workload 'api'",
        ),
        (
            {"x": "${shared.nope.outputs.host}"},
            "'${shared.nope.outputs.host}': no shared resource 'nope' in the manifest",
        ),
        (
            {"x": "${resources.db.outputs.port}"},
            "'${resources.db.outputs.port}': resource type 'postgres' has no output 'port', "
            "its outputs are [host password]",
        ),
        ({"x": "${resources.db.host}"}, "invalid placeholder '${resources.db.host}'"),
        ({"x": "${ context.env_id }"}, "invalid placeholder '${ context.env_id }'"),
        ({"x": "${var.token}"}, "'var' placeholders are not supported here"),
        ({"x": "${self.outputs.host}"}, "'self' placeholders are not supported here"),
        ({"x": "${select.dependencies('x').outputs.y}"}, "'select' placeholders are not supported here"),
    ],
)
def test_compile__bad_references_in_outputs_name_the_field(outputs: dict[str, str], message: str) -> None:
    manifest = {
        "workloads": {
            "api": {"resources": {"db": {"type": "postgres", "params": {"name": "n"}}}, "outputs": outputs}
        }
    }

    assert f"manifest.workloads.api.outputs.x: {message}" == error_of(manifest, catalogue(PG))


def test_compile__output_keys_are_free_without_listed_properties_or_with_additional_ones() -> None:
    dns = module("dns", "dns")
    compiled = compile_(
        {
            "workloads": {
                "api": {
                    "resources": {"q": {"type": "queue"}, "d": {"type": "dns"}},
                    "outputs": {
                        "a": "${resources.q.outputs.anything.deep.0}",
                        "b": "${resources.d.outputs.other}",
                    },
                }
            }
        },
        catalogue(QUEUE, dns),
    )

    outputs = block(compiled.main_tf, "output", "api")
    assert "    a = module.wl_api__q__queue.anything.deep[0]\n" in outputs
    assert "    b = module.wl_api__d__dns.other\n" in outputs


def test_compile__a_sensitive_output_makes_the_workload_output_sensitive() -> None:
    compiled = compile_(
        {
            "workloads": {
                "api": {
                    "resources": {"db": {"type": "postgres", "params": {"name": "n"}}},
                    "outputs": {"pw": "${resources.db.outputs.password}"},
                },
                "web": {
                    "resources": {"db": {"type": "postgres", "params": {"name": "n"}}},
                    "outputs": {"h": "${resources.db.outputs.host}"},
                },
            }
        },
        catalogue(PG),
    )

    assert "  sensitive = true\n" in block(compiled.main_tf, "output", "api")
    assert "sensitive" not in block(compiled.main_tf, "output", "web")


# --- modules, params, catalogue ------------------------------------------------------------------


def test_compile__a_type_without_module_names_the_resource() -> None:
    message = error_of({"workloads": {"api": {"resources": {"db": {"type": "postgres"}}}}}, catalogue(REDIS))

    assert (
        "manifest.workloads.api.resources.db: no module provisions resource type 'postgres' "
        "(class 'default') in this environment" == message
    )


def test_compile__rules_pick_the_module_by_class_and_id() -> None:
    big = module("pg-big", "postgres", module_params={"name": ModuleParam(type="string", is_optional=True)})
    main = module("pg-main", "postgres", module_params={"name": ModuleParam(type="string", is_optional=True)})
    compiled = compile_(
        {
            "workloads": {
                "api": {
                    "resources": {
                        "a": {"type": "postgres", "params": {"name": "a"}},
                        "b": {"type": "postgres", "class": "big"},
                        "c": {"type": "postgres", "class": "big", "id": "main"},
                    }
                }
            }
        },
        catalogue(PG, (big, "big", None), (main, "big", "main")),
    )

    assert {
        ("wl_api__a__postgres", "pg"),
        ("wl_api__b__postgres__big", "pg-big"),
        ("res__main__postgres__big", "pg-main"),
    } == {(n.name, n.module_id) for n in compiled.nodes}


def test_compile__a_class_without_rule_is_an_error() -> None:
    message = error_of(
        {"workloads": {"api": {"resources": {"db": {"type": "postgres", "class": "big"}}}}}, catalogue(PG)
    )

    assert "no module provisions resource type 'postgres' (class 'big') in this environment" in message


def test_compile__types_hidden_from_developers_are_refused_in_manifests() -> None:
    network = module("net", "network")
    message = error_of({"workloads": {"api": {"resources": {"n": {"type": "network"}}}}}, catalogue(network))

    assert message.startswith(
        "manifest.workloads.api.resources.n.type: resource type 'network' is not available"
    )


def test_compile__unknown_param_is_named() -> None:
    message = error_of(
        {
            "workloads": {
                "api": {"resources": {"db": {"type": "postgres", "params": {"name": "x", "color": "red"}}}}
            }
        },
        catalogue(PG),
    )

    assert (
        "manifest.workloads.api.resources.db.params.color: "
        "unknown param of module 'pg' (its params: name, size)" == message
    )


def test_compile__missing_required_param_is_named() -> None:
    message = error_of({"workloads": {"api": {"resources": {"db": {"type": "postgres"}}}}}, catalogue(PG))

    assert message.startswith(
        "manifest.workloads.api.resources.db.params.name: node 'type=postgres,class=default,"
        "id=workloads.api.db': uses module pg@"
    )
    assert message.endswith(" which requires string param 'name' to be set")


@pytest.mark.parametrize(
    ("params", "ok"),
    [
        ({"name": "x", "size": 10}, True),
        ({"name": "x", "size": 1.5}, True),
        ({"name": "x", "size": "${context.env_id}"}, True),
        ({"name": "x", "size": "10"}, False),
        ({"name": "x", "size": True}, False),
        ({"name": 1}, False),
    ],
)
def test_compile__param_types_are_checked(params: dict[str, Any], ok: bool) -> None:
    manifest = {"workloads": {"api": {"resources": {"db": {"type": "postgres", "params": params}}}}}
    if ok:
        compile_(manifest, catalogue(PG))
    else:
        assert "module 'pg' expects a" in error_of(manifest, catalogue(PG))


def test_compile__module_sources_and_registry_versions() -> None:
    registry = module("r", "redis", module_source="terraform-aws-modules/elasticache/aws@1.2.0")
    git = module("q", "queue", module_source="git::https://example.com/q.git?ref=v1")
    local = module("d", "dns", module_source="./shared/dns/x@y")
    compiled = compile_(
        {
            "workloads": {
                "api": {"resources": {"r": {"type": "redis"}, "q": {"type": "queue"}, "d": {"type": "dns"}}}
            }
        },
        catalogue(registry, git, local),
    )

    assert '  source  = "terraform-aws-modules/elasticache/aws"\n  version = "1.2.0"\n' in block(
        compiled.main_tf, "module", "wl_api__r__redis"
    )
    assert '  source = "git::https://example.com/q.git?ref=v1"\n' in block(
        compiled.main_tf, "module", "wl_api__q__queue"
    )
    assert 'module "wl_api__d__dns" {\n  source = "./shared/dns/x@y"\n}\n' == block(
        compiled.main_tf, "module", "wl_api__d__dns"
    )
    assert ["main.tf"] == list(compiled.files)


def test_compile__a_stored_source_reading_the_disk_is_refused() -> None:
    """A module stored before sources were checked is refused when compiled, naming it."""
    bad = module("q", "queue", module_source="git::file:///etc")
    message = error_of({"workloads": {"api": {"resources": {"q": {"type": "queue"}}}}}, catalogue(bad))

    assert "module 'q' (version " in message
    assert "module_source: 'git::file:///etc' reads local files" in message


def test_compile__reserved_module_arguments_are_refused() -> None:
    bad = module("q", "queue", module_inputs={"count": 2})
    message = error_of({"workloads": {"api": {"resources": {"q": {"type": "queue"}}}}}, catalogue(bad))

    assert "'count' is a reserved argument of Terraform module blocks" in message


# --- dependencies and co-provisioning ------------------------------------------------------------


def test_compile__dependencies_become_nodes_and_their_aliases_are_module_inputs() -> None:
    net = module("net", "network", module_params={"cidr": ModuleParam(type="string")})
    pg = module(
        "pg",
        "postgres",
        module_params={"name": ModuleParam(type="string")},
        module_inputs={"network_id": "${resources.net.outputs.id}"},
        dependencies={"net": ResourceRequest(type="network", params={"cidr": "10.0.0.0/16"})},
    )
    compiled = compile_(
        {
            "workloads": {
                "api": {"resources": {"db": {"type": "postgres", "params": {"name": "a"}}}},
                "web": {"resources": {"db": {"type": "postgres", "params": {"name": "w"}}}},
            }
        },
        catalogue(pg, net),
    )

    assert [
        ("wl_api__db__network", "network.default@workloads.api.db", "postgres.default@workloads.api.db"),
        ("wl_api__db__postgres", "postgres.default@workloads.api.db", "workload.default@api"),
        ("wl_web__db__network", "network.default@workloads.web.db", "postgres.default@workloads.web.db"),
        ("wl_web__db__postgres", "postgres.default@workloads.web.db", "workload.default@web"),
    ] == [(n.name, n.resource, n.params_defined_by) for n in compiled.nodes]
    db = block(compiled.main_tf, "module", "wl_api__db__postgres")
    assert "  network_id = module.wl_api__db__network.id\n" in db
    assert "  depends_on = [\n    module.wl_api__db__network,\n  ]\n" in db
    assert '  cidr = "10.0.0.0/16"\n' in block(compiled.main_tf, "module", "wl_api__db__network")
    assert {"num_workloads": 2, "num_resource_nodes": 4} == compiled.metrics


def test_compile__dependencies_with_an_id_are_shared_and_at_inherits() -> None:
    net = module("net", "network")
    dns = module("dns", "dns")
    pg = module(
        "pg",
        "postgres",
        module_params={"name": ModuleParam(type="string")},
        dependencies={
            "net": ResourceRequest(type="network", resource_id="main"),
            "dns": ResourceRequest(type="dns", resource_class="@", resource_id="@.dns"),
        },
    )
    compiled = compile_(
        {
            "workloads": {
                "api": {"resources": {"db": {"type": "postgres", "class": "big", "params": {"name": "a"}}}},
                "web": {"resources": {"db": {"type": "postgres", "class": "big", "params": {"name": "w"}}}},
            }
        },
        catalogue((pg, "big", None), net, (dns, "big", None)),
    )

    assert [
        "dns.big@workloads.api.db.dns",
        "dns.big@workloads.web.db.dns",
        "network.default@main",
        "postgres.big@workloads.api.db",
        "postgres.big@workloads.web.db",
    ] == sorted(n.resource for n in compiled.nodes)
    assert 'module "res__main__network" {' in compiled.main_tf
    assert 'module "res__workloads_api_db_dns__dns__big" {' in compiled.main_tf


def test_compile__a_dependency_param_names_sibling_dependencies() -> None:
    net = module("net", "network")
    dns = module("dns", "dns", module_params={"zone": ModuleParam(type="string")})
    pg = module(
        "pg",
        "postgres",
        module_params={"name": ModuleParam(type="string")},
        dependencies={
            "net": ResourceRequest(type="network"),
            "dns": ResourceRequest(type="dns", params={"zone": "${resources.net.outputs.id}.example"}),
        },
    )
    compiled = compile_(
        {"workloads": {"api": {"resources": {"db": {"type": "postgres", "params": {"name": "a"}}}}}},
        catalogue(pg, net, dns),
    )

    dns_block = block(compiled.main_tf, "module", "wl_api__db__dns")
    assert '  zone = "${module.wl_api__db__network.id}.example"\n' in dns_block
    assert "    module.wl_api__db__network,\n" in dns_block


def test_compile__unknown_dependency_alias_in_module_inputs_is_named() -> None:
    pg = module("pg", "postgres", module_inputs={"x": "${resources.vpc.outputs.id}"})
    message = error_of({"workloads": {"api": {"resources": {"db": {"type": "postgres"}}}}}, catalogue(pg))

    assert message == (
        f"manifest.workloads.api.resources.db (module 'pg' (version {pg.version_id}) module_inputs.x): "
        f"'${{resources.vpc.outputs.id}}': no resource 'vpc' in module 'pg' (version {pg.version_id})"
    )


def test_compile__a_dependency_without_module_names_the_chain() -> None:
    pg = module("pg", "postgres", dependencies={"net": ResourceRequest(type="network")})
    message = error_of({"workloads": {"api": {"resources": {"db": {"type": "postgres"}}}}}, catalogue(pg))

    assert message == (
        f"manifest.workloads.api.resources.db (module 'pg' (version {pg.version_id}) dependencies.net): "
        "no module provisions resource type 'network' (class 'default') in this environment"
    )


def test_compile__coprovisioned_resources_and_their_ordering() -> None:
    dns = module("dns", "dns")
    net = module("net", "network")
    pg = module(
        "pg",
        "postgres",
        coprovisioned=(
            ResourceRequest(type="dns", is_dependent_on_current=True),
            ResourceRequest(type="network", resource_id="audit", copy_dependents_from_current=True),
        ),
    )
    redis = module(
        "redis",
        "redis",
        module_inputs={"x": "1"},
        dependencies={"db": ResourceRequest(type="postgres", resource_id="main")},
    )
    compiled = compile_(
        {"workloads": {"api": {"resources": {"cache": {"type": "redis"}}}}}, catalogue(pg, dns, net, redis)
    )

    by_name = {n.name: n for n in compiled.nodes}
    assert {"res__main__postgres", "res__main__dns", "res__audit__network", "wl_api__cache__redis"} == set(
        by_name
    )
    # The dns resource waits for postgres, so it also waits for what postgres passes its dependents to.
    assert ("res__audit__network", "res__main__postgres") == by_name["res__main__dns"].depends_on
    assert ("res__audit__network", "res__main__postgres") == by_name["wl_api__cache__redis"].depends_on
    assert () == by_name["res__main__postgres"].depends_on


def test_compile__requests_with_different_params_conflict() -> None:
    message = error_of(
        {
            "workloads": {
                "api": {"resources": {"db": {"type": "postgres", "id": "main", "params": {"name": "a"}}}},
                "web": {"resources": {"db": {"type": "postgres", "id": "main", "params": {"name": "b"}}}},
            }
        },
        catalogue(PG),
    )

    assert message.startswith(
        "manifest.workloads.web.resources.db: resource postgres.default@main is also requested by "
        "manifest.workloads.api.resources.db with different params"
    )


def test_compile__the_same_resource_in_two_workloads_is_one_node() -> None:
    compiled = compile_(
        {
            "workloads": {
                "api": {"resources": {"db": {"type": "postgres", "id": "main", "params": {"name": "a"}}}},
                "web": {
                    "resources": {"main-db": {"type": "postgres", "id": "main"}},
                    "outputs": {"h": "${resources.main-db.outputs.host}"},
                },
            }
        },
        catalogue(PG),
    )

    assert ["res__main__postgres"] == [n.name for n in compiled.nodes]
    assert "    h = module.res__main__postgres.host\n" in compiled.main_tf


def test_compile__reference_cycles_are_refused() -> None:
    a = module("a", "queue", module_params={"value": ModuleParam(type="any", is_optional=True)})
    message = error_of(
        {
            "workloads": {
                "api": {
                    "resources": {
                        "x": {"type": "queue", "params": {"value": "${resources.y.outputs.v}"}},
                        "y": {"type": "queue", "params": {"value": "${resources.x.outputs.v}"}},
                    }
                }
            }
        },
        catalogue(a),
    )

    assert message == (
        "manifest: the resources depend on each other in a cycle: "
        "queue.default@workloads.api.x -> queue.default@workloads.api.y -> queue.default@workloads.api.x"
    )


def test_compile__a_module_depending_on_its_own_kind_is_a_cycle() -> None:
    chain = module("chain", "chain", dependencies={"next": ResourceRequest(type="chain")})
    message = error_of({"workloads": {"api": {"resources": {"c": {"type": "chain"}}}}}, catalogue(chain))

    assert message.endswith("chain.default@workloads.api.c -> chain.default@workloads.api.c")


def test_compile__ever_new_resource_ids_stop_at_the_node_limit() -> None:
    chain = module("chain", "chain", dependencies={"next": ResourceRequest(type="chain", resource_id="@-x")})
    message = error_of({"workloads": {"api": {"resources": {"c": {"type": "chain"}}}}}, catalogue(chain))

    assert f"the resource graph grows past {MAX_NODES} resources" in message


# --- providers -----------------------------------------------------------------------------------


def test_compile__providers_are_aliased_configurations_mapped_into_modules() -> None:
    aws_main = provider(
        "aws",
        "main",
        "hashicorp/aws",
        "~> 5.0",
        region="eu-west-1",
        default_tags={"tags": {"env": "${context.env_id}"}},
    )
    aws_us = provider(
        "aws",
        "us",
        "hashicorp/aws",
        ">= 5.1",
        region="us-east-1",
        **{"assume_role[0]": {"role_arn": "${var.role_arn}"}},
    )
    pg = module("pg", "postgres", provider_mapping={"aws": "aws.main", "aws.replica": "aws.us"})
    redis = module("redis", "redis", provider_mapping={"aws": "aws.main"})
    compiled = compile_(
        {"workloads": {"api": {"resources": {"db": {"type": "postgres"}, "cache": {"type": "redis"}}}}},
        catalogue(pg, redis, providers=(aws_main, aws_us, provider("gcp", "x", "hashicorp/google"))),
    )

    assert compiled.main_tf.startswith(
        "# Generated by the Platform Orchestrator for environment acme/shop/dev "
        f"({ENV_UUID}). Do not edit.\n"
        "\n"
        "terraform {\n"
        "  required_providers {\n"
        "    aws = {\n"
        '      source  = "hashicorp/aws"\n'
        '      version = ">= 5.1, ~> 5.0"\n'
        "    }\n"
        "  }\n"
        "\n"
        '  backend "local" {\n'
        '    path = "state.tfstate"\n'
        "  }\n"
        "}\n"
        "\n"
        'variable "role_arn" {\n'
        "  type      = string\n"
        "  sensitive = true\n"
        "}\n"
        "\n"
        'provider "aws" {\n'
        '  alias = "main"\n'
        "  default_tags = {\n"
        "    tags = {\n"
        '      env = "dev"\n'
        "    }\n"
        "  }\n"
        '  region = "eu-west-1"\n'
        "}\n"
        "\n"
        'provider "aws" {\n'
        '  alias  = "us"\n'
        '  region = "us-east-1"\n'
        "  assume_role {\n"
        "    role_arn = var.role_arn\n"
        "  }\n"
        "}\n"
    )
    assert "  providers = {\n    aws         = aws.main\n    aws.replica = aws.us\n  }\n" in block(
        compiled.main_tf, "module", "wl_api__db__postgres"
    )
    assert "google" not in compiled.main_tf


def test_compile__provider_credentials_go_to_a_variables_file_not_main_tf() -> None:
    """Literal credentials of a provider become sensitive variables: main.tf (which viewers read) names
    them, the bundle's variables file holds the values; references and other values stay in main.tf."""
    # A block's key is not an identifier: passed as a mapping (Any values, as ``**config`` takes).
    nested: dict[str, Any] = {"assume_role[0]": {"role_arn": "arn:aws:iam::1:role/x", "external_id": "ext"}}
    aws = provider(
        "aws",
        "main",
        "hashicorp/aws",
        region="eu-west-1",
        access_key="AKIA-CANARY",
        secret_key="s3cr3t-canary",
        token="${var.session_token}",
        **nested,
    )
    pg = module("pg", "postgres", provider_mapping={"aws": "aws.main"})

    compiled = compile_(
        {"workloads": {"api": {"resources": {"db": {"type": "postgres"}}}}}, catalogue(pg, providers=(aws,))
    )
    values = json.loads(compiled.files["po-provider-secrets.auto.tfvars.json"])

    assert "CANARY" not in compiled.main_tf.upper()
    assert (
        'provider "aws" {\n'
        '  alias      = "main"\n'
        "  access_key = var.po_aws_main_access_key\n"
        '  region     = "eu-west-1"\n'
        "  secret_key = var.po_aws_main_secret_key\n"
        "  token      = var.session_token\n"
        "  assume_role {\n"
        '    external_id = "ext"\n'
        '    role_arn    = "arn:aws:iam::1:role/x"\n'
        "  }\n"
        "}\n"
    ) in compiled.main_tf
    assert (
        'variable "po_aws_main_secret_key" {\n  type      = string\n  sensitive = true\n}\n'
        in compiled.main_tf
    )
    assert {"po_aws_main_access_key": "AKIA-CANARY", "po_aws_main_secret_key": "s3cr3t-canary"} == values


def test_compile__a_mapping_to_a_missing_provider_is_an_error() -> None:
    pg = module("pg", "postgres", provider_mapping={"aws": "aws.gone"})
    message = error_of({"workloads": {"api": {"resources": {"db": {"type": "postgres"}}}}}, catalogue(pg))

    assert (
        f"module 'pg' (version {pg.version_id}) maps provider 'aws' to module provider 'aws.gone', "
        "which does not exist" == message
    )


def test_compile__one_provider_type_needs_one_source() -> None:
    pg = module("pg", "postgres", provider_mapping={"aws": "aws.a", "aws.b": "aws.b"})
    message = error_of(
        {"workloads": {"api": {"resources": {"db": {"type": "postgres"}}}}},
        catalogue(pg, providers=(provider("aws", "a", "hashicorp/aws"), provider("aws", "b", "example/aws"))),
    )

    assert message.startswith(
        "module providers aws.a, aws.b are all of type 'aws' but have different sources"
    )


def test_compile__provider_configurations_cannot_name_resources() -> None:
    pg = module("pg", "postgres", provider_mapping={"aws": "aws.a"})
    message = error_of(
        {"workloads": {"api": {"resources": {"db": {"type": "postgres"}}}}},
        catalogue(pg, providers=(provider("aws", "a", "hashicorp/aws", region="${resources.x.outputs.r}"),)),
    )

    assert message.startswith(
        "module provider 'aws.a' configuration.region: '${resources.x.outputs.r}': resources cannot be named"
    )


# --- determinism, names, outputs -----------------------------------------------------------------


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: _shuffled(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def test_compile__the_same_input_gives_the_same_bytes_in_any_key_order() -> None:
    manifest = {
        "workloads": {
            f"w{i}": {
                "resources": {
                    "db": {"type": "postgres", "params": {"name": f"n{i}", "size": i}},
                    "cache": {"type": "redis", "params": {"url_prefix": "${resources.db.outputs.host}"}},
                    "q": {
                        "type": "queue",
                        "params": {"value": {"a": [1, {"b": "${shared.jobs.outputs.x}"}], "c": None}},
                    },
                },
                "outputs": {"z": "${resources.cache.outputs.url}", "a": "${shared.jobs.outputs.y}"},
            }
            for i in range(5)
        },
        "shared": {"jobs": {"type": "queue"}, "more": {"type": "queue", "id": "more"}},
    }
    first = compile_(manifest, catalogue(PG, REDIS, QUEUE))
    rng = random.Random(7)
    for _ in range(5):
        again = compile_(_shuffled(manifest, rng), catalogue(QUEUE, REDIS, PG))
        assert first.main_tf == again.main_tf
        assert first.files == again.files
        assert compiler.graph_of(first) == compiler.graph_of(again)
        assert compiler.build_bundle(first) == compiler.build_bundle(again)


_NAME = st.from_regex(r"[a-z0-9][a-z0-9-]{0,6}[a-z0-9]", fullmatch=True)
_ALIAS = st.from_regex(r"[A-Za-z0-9]{1,3}(?:(?:_|-+)[A-Za-z0-9]{1,3}){0,2}", fullmatch=True)
_PART = st.from_regex(r"[a-z0-9]{1,3}(?:-+[a-z0-9]{1,3})?", fullmatch=True)
_TYPE = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9-]{0,4}[A-Za-z0-9]", fullmatch=True)
_ID = st.one_of(
    st.tuples(_NAME, _ALIAS).map(lambda p: f"workloads.{p[0]}.{p[1]}"),
    _NAME.map(lambda n: f"shared.{n}"),
    st.lists(_PART, min_size=1, max_size=4).map(".".join),
)
_COORDINATE = st.builds(Coordinate, _TYPE, st.one_of(st.just("default"), _TYPE), _ID)


@given(st.lists(_COORDINATE, min_size=2, max_size=30, unique=True))
def test_module_name__is_a_distinct_identifier_per_coordinate(coordinates: list[Coordinate]) -> None:
    names = [compiler.module_name(c) for c in coordinates]

    assert len(set(names)) == len(names)
    assert all(hcl.is_identifier(name) for name in names)


def test_compile__metadata_output_maps_node_ids_to_module_metadata() -> None:
    compiled = compile_({"workloads": {"api": {"resources": {"q": {"type": "queue"}}}}}, catalogue(QUEUE))

    node_id = compiler.node_hash(ENV_UUID, Coordinate("queue", "default", "workloads.api.q"))
    assert (
        'output "platform_orchestrator_metadata" {\n'
        '  description = "Metadata the modules report, by node id"\n'
        "  value = {\n"
        f'    "{node_id}" = lookup(module.wl_api__q__queue, "platform_orchestrator_metadata", {{}})\n'
        "  }\n"
        "}\n"
    ) == block(compiled.main_tf, "output", compiler.METADATA_OUTPUT)
    assert [node_id] == [n.id for n in compiled.nodes]


def test_compile__every_workload_has_an_output() -> None:
    compiled = compile_({"workloads": {"empty": {}}}, catalogue())

    assert (
        'output "empty" {\n  description = "The outputs of workload \'empty\'"\n'
        "  value       = {}\n}\n" == block(compiled.main_tf, "output", "empty")
    )
    assert {"empty": {"a": 1}} == compiler.workload_outputs(
        {"empty": {"a": 1}, "platform_orchestrator_metadata": {}}
    )


def test_compile__inline_modules_are_files_of_their_version() -> None:
    compiled = compile_(
        {"workloads": {"api": {"resources": {"db": {"type": "postgres", "params": {"name": "x"}}}}}},
        catalogue(PG),
    )

    assert {
        "main.tf": compiled.main_tf.encode(),
        f"modules/pg/{PG.version_id}/main.tf": CODE.encode(),
    } == compiled.files


def test_compile__the_catalogue_must_be_the_environments() -> None:
    other = EnvCatalogue(
        where=Placement(project_id="shop", env_type_id="development", env_id="prod"),
        rules=(),
        modules={},
        providers={},
    )

    with pytest.raises(ValueError, match="not for environment dev"):
        compile_({"workloads": {}}, other)


def test_required_resource_types__are_the_manifests_and_the_rules() -> None:
    manifest = compiler.parse_manifest(
        {"workloads": {"api": {"resources": {"x": {"type": "mystery"}}}}, "shared": {"s1": {"type": "shh"}}}
    )

    assert {"mystery", "shh", "postgres", "redis"} == compiler.required_resource_types(
        manifest, catalogue(PG, REDIS)
    )


# --- backends ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state_type", "config", "expected"),
    [
        (
            "kubernetes",
            {"namespace": "tf-state"},
            f'backend "kubernetes" {{\n  secret_suffix     = "{ENV_UUID}"\n  namespace         = "tf-state"\n'
            "  in_cluster_config = true\n}\n",
        ),
        (
            "s3",
            {"bucket": "my-bucket"},
            f'backend "s3" {{\n  bucket = "my-bucket"\n  key    = "{ENV_UUID}.tfstate"\n}}\n',
        ),
        (
            "s3",
            {"type": "s3", "bucket": "my-bucket", "path_prefix": "teams/a/"},
            f'backend "s3" {{\n  bucket = "my-bucket"\n  key    = "teams/a/{ENV_UUID}.tfstate"\n}}\n',
        ),
        (
            "gcs",
            {"bucket": "b-1", "path_prefix": "x"},
            f'backend "gcs" {{\n  bucket = "b-1"\n  prefix = "x/{ENV_UUID}"\n}}\n',
        ),
        (
            "azurerm",
            {"storage_account_name": "acct1", "container_name": "tfstate"},
            f'backend "azurerm" {{\n  storage_account_name = "acct1"\n  container_name       = "tfstate"\n'
            f'  key                  = "{ENV_UUID}/terraform.tfstate"\n}}\n',
        ),
        (
            "azurerm",
            {
                "storage_account_name": "acct1",
                "container_name": "tfstate",
                "resource_group_name": "rg",
                "path_prefix": "p/q",
            },
            f'backend "azurerm" {{\n  resource_group_name  = "rg"\n  storage_account_name = "acct1"\n'
            f'  container_name       = "tfstate"\n'
            f'  key                  = "p/q/{ENV_UUID}/terraform.tfstate"\n}}\n',
        ),
        (
            "orchestrator",
            {},
            'backend "http" {\n  address        = "https://po.example.com/state/e1"\n'
            '  lock_address   = "https://po.example.com/state/e1/lock"\n'
            '  unlock_address = "https://po.example.com/state/e1/lock"\n'
            '  lock_method    = "LOCK"\n  unlock_method  = "UNLOCK"\n}\n',
        ),
    ],
)
def test_render_backend__each_type(state_type: str, config: dict[str, Any], expected: str) -> None:
    text = compiler.render_backend(
        state_type, config, env_uuid=ENV_UUID, orchestrator_state_url="https://po.example.com/state/e1/"
    )

    assert expected == text


def test_render_backend__accepts_the_uuid_as_text() -> None:
    assert compiler.render_backend(
        "s3", {"bucket": "bkt"}, env_uuid=str(ENV_UUID)
    ) == compiler.render_backend("s3", {"bucket": "bkt"}, env_uuid=ENV_UUID)


@pytest.mark.parametrize(
    ("state_type", "config", "url", "message"),
    [
        ("s3", {}, None, "state_storage_configuration.bucket: field required"),
        (
            "s3",
            {"bucket": "b", "region": "x"},
            None,
            "state_storage_configuration.bucket: string should have at least 3",
        ),
        ("ftp", {}, None, "state_storage_configuration.type: unknown state storage type 'ftp'"),
        ("orchestrator", {}, None, "the orchestrator state storage needs the orchestrator's state URL"),
        (
            "orchestrator",
            {},
            "https://u:p@po.example.com/s",
            "the orchestrator state URL must not hold credentials",
        ),
        ("orchestrator", {}, "file:///tmp/x", "orchestrator state URL 'file:///tmp/x' is not an http(s) URL"),
    ],
)
def test_render_backend__bad_input(
    state_type: str, config: dict[str, Any], url: str | None, message: str
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        compiler.render_backend(state_type, config, env_uuid=ENV_UUID, orchestrator_state_url=url)

    assert caught.value.message.startswith(message), caught.value.message


def test_compile__the_backend_block_sits_in_the_terraform_block_and_no_credential_appears() -> None:
    backend = compiler.render_backend(
        "orchestrator", {}, env_uuid=ENV_UUID, orchestrator_state_url="https://po.example.com/state"
    )
    compiled = compile_({"workloads": {}}, catalogue(), backend=backend)

    assert (
        'terraform {\n  backend "http" {\n    address        = "https://po.example.com/state"\n'
        in compiled.main_tf
    )
    assert "password" not in compiled.main_tf and "username" not in compiled.main_tf


# --- bundle --------------------------------------------------------------------------------------


def test_build_bundle__is_deterministic_sorted_and_plain(tmp_path: Path) -> None:
    compiled = compile_(
        {
            "workloads": {
                "api": {
                    "resources": {"db": {"type": "postgres", "params": {"name": "x"}}, "c": {"type": "redis"}}
                }
            }
        },
        catalogue(PG, REDIS),
    )
    data = compiler.build_bundle(compiled)

    assert data == compiler.build_bundle(compiled)
    assert b"\x00\x00\x00\x00" == data[4:8]  # gzip MTIME
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        members = archive.getmembers()
    assert sorted(compiled.files) == [m.name for m in members]
    assert all(
        (m.isreg(), m.mtime, m.uid, m.gid, m.mode, m.uname) == (True, 0, 0, 0, 0o644, "") for m in members
    )
    names = extract_bundle(data, tmp_path)
    assert compiled.files == {name: (tmp_path / name).read_bytes() for name in names}


def test_build_bundle__refuses_a_bundle_over_the_bound() -> None:
    compiled = compile_({"workloads": {}}, catalogue())
    size = len(compiler.build_bundle(compiled))

    with pytest.raises(
        PayloadTooLargeError, match=f"the deployment bundle is {size} bytes, over the limit of {size - 1}"
    ):
        compiler.build_bundle(compiled, max_bytes=size - 1)
    assert size == len(compiler.build_bundle(compiled, max_bytes=size))


def test_build_bundle__the_default_bound_is_the_runners() -> None:
    noise = random.Random(0).randbytes(64 * 1024 * 1024 + 1)
    compiled = compile_({"workloads": {}}, catalogue())
    huge = compiler.CompiledDeployment(
        main_tf=compiled.main_tf,
        files={**compiled.files, "modules/big/1/main.tf": noise},
        env_uuid=ENV_UUID,
        nodes=(),
        workloads={},
        metrics=compiled.metrics,
    )

    with pytest.raises(PayloadTooLargeError, match=r"over the limit of 67108864 bytes"):
        compiler.build_bundle(huge)
    assert gzip.decompress(compiler.build_bundle(compiled))  # the small one passes


# --- diff ----------------------------------------------------------------------------------------


def test_diff__first_deployment_adds_everything() -> None:
    compiled = compile_(
        {"workloads": {"api": {"resources": {"db": {"type": "postgres", "params": {"name": "x"}}}}}},
        catalogue(PG),
    )

    result = compiler.diff(None, compiled)

    assert {"num_added": 2, "num_changed": 0, "num_removed": 0} == {
        k: v for k, v in result.items() if k != "changes"
    }
    assert [
        {
            "id": compiler.node_hash(ENV_UUID, Coordinate("workload", "default", "api")),
            "resource": "workload.default@api",
            "type": "added",
            "summary": "workload added",
        },
        {
            "id": compiled.nodes[0].id,
            "resource": "postgres.default@workloads.api.db",
            "type": "added",
            "summary": f"add resource using module pg@{PG.version_id} (dependency of workload.default@api)",
        },
    ] == result["changes"]


def test_diff__changes_between_deployments() -> None:
    pg2 = module("pg", "postgres", module_params={"name": ModuleParam(type="string")}, description="v2")
    before = compile_(
        {
            "workloads": {
                "api": {
                    "resources": {
                        "db": {"type": "postgres", "params": {"name": "x"}},
                        "c": {"type": "redis"},
                    },
                    "outputs": {"a": "1"},
                },
                "old": {},
            },
            "shared": {"jobs": {"type": "queue", "params": {"value": 1}}},
        },
        catalogue(PG, REDIS, QUEUE),
    )
    after = compile_(
        {
            "workloads": {
                "api": {
                    "resources": {"db": {"type": "postgres", "params": {"name": "x"}}},
                    "outputs": {"a": "2"},
                },
                "new": {},
            },
            "shared": {"jobs": {"type": "queue", "params": {"value": 2}}},
        },
        catalogue(pg2, REDIS, QUEUE),
    )
    stored = json.loads(json.dumps(compiler.graph_of(before)))

    result = compiler.diff_graphs(stored, compiler.graph_of(after))

    assert [
        ("workload.default@api", "params_changed", "workload output variables changed"),
        ("workload.default@new", "added", "workload added"),
        ("workload.default@old", "removed", "workload removed"),
        (
            "postgres.default@workloads.api.db",
            "module_changed",
            f"module changed from pg@{PG.version_id} to pg@{pg2.version_id}",
        ),
        ("queue.default@shared.jobs", "params_changed", "resource params changed"),
        (
            "redis.default@workloads.api.c",
            "removed",
            f"remove resource using module redis@{REDIS.version_id} (dependency of workload.default@api)",
        ),
    ] == [(c["resource"], c["type"], c["summary"]) for c in result["changes"]]
    assert (1, 3, 2) == (result["num_added"], result["num_changed"], result["num_removed"])
    assert result == compiler.diff(before, after)
    assert {"changes": [], "num_added": 0, "num_changed": 0, "num_removed": 0} == compiler.diff(after, after)
