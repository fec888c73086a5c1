"""The catalogue resources' pure mappings: configuration to API body, API answer to state, import ids."""

from __future__ import annotations

import json

import pytest

from orchestrator.tfprovider import catalog, cty, deployments, modules
from orchestrator.tfprovider.session import ApiProblem


def test_env_import_id__is_project_slash_env() -> None:
    assert catalog.env_import_id("shop/dev") == {"project_id": "shop", "id": "dev"}
    for bad in ("dev", "/dev", "shop/", "shop/dev/x"):
        with pytest.raises(ValueError, match="PROJECT_ID/ENV_ID"):
            catalog.env_import_id(bad)


def test_provider_import_id__is_type_dot_id() -> None:
    assert modules.provider_import_id("aws.main") == {"provider_type": "aws", "id": "main"}
    with pytest.raises(ValueError, match=r"PROVIDER_TYPE\.ID"):
        modules.provider_import_id("aws")


def test_env_state__keeps_the_delete_options_the_api_does_not_know() -> None:
    found = {
        "id": "dev",
        "project_id": "shop",
        "env_type_id": "development",
        "display_name": "Dev",
        "status": "active",
    }
    state = catalog.env_state(found, {"force_delete": True, "delete_rules": None})
    assert state["force_delete"] is True and state["delete_rules"] is None
    assert state["runner_id"] is None and state["status"] == "active"


def test_configuration_state__keeps_configured_secrets_where_the_api_answers_secret() -> None:
    configured = json.dumps({"region": "eu-west-1", "secret_key": "s3cr3t"})
    answered = {"region": "eu-west-1", "secret_key": "SECRET"}
    assert modules.configuration_state(configured, answered) == configured


def test_configuration_state__shows_a_change_made_through_the_api() -> None:
    configured = json.dumps({"region": "eu-west-1", "secret_key": "s3cr3t"})
    answered = {"region": "us-east-1", "secret_key": "SECRET"}
    assert json.loads(modules.configuration_state(configured, answered) or "") == {
        "region": "us-east-1",
        "secret_key": "s3cr3t",
    }


def test_configuration_state__an_import_shows_secret_and_none_for_no_configuration() -> None:
    assert modules.configuration_state(None, {"token": "SECRET"}) == '{"token":"SECRET"}'
    assert modules.configuration_state(None, {}) is None


def test_module_body__maps_params_dependencies_and_coprovisioned() -> None:
    config = {
        "module_source": "inline",
        "module_source_code": "output x { value = 1 }",
        "module_params": {"name": {"type": "string", "is_optional": None, "description": None}},
        "module_inputs": '{"a":1}',
        "dependencies": {"db": {"type": "postgres", "class": None, "id": None, "params": '{"size":"s"}'}},
        "coprovisioned": [{"type": "dns", "params": {}, "is_dependent_on_current": True}],
    }
    body = modules.module_body(config)
    assert body["module_params"] == {"name": {"type": "string"}}
    assert body["module_inputs"] == {"a": 1}
    assert body["provider_mapping"] == {}
    assert body["dependencies"] == {"db": {"type": "postgres", "params": {"size": "s"}}}
    assert body["coprovisioned"] == [{"type": "dns", "params": {}, "is_dependent_on_current": True}]


@pytest.mark.parametrize(
    ("config", "attribute"),
    [
        ({"module_source": "git::x", "module_source_code": "x"}, "module_source"),
        ({"module_source": "inline", "module_inputs": "{not json"}, "module_inputs"),
        ({"module_source": "inline", "dependencies": {"db": {"class": "x"}}}, "dependencies.db"),
        (
            {"module_source": "inline", "dependencies": {"db": {"type": "x", "params": "["}}},
            "dependencies.db.params",
        ),
        ({"module_source": "inline", "coprovisioned": {"type": "x"}}, "coprovisioned"),
    ],
)
def test_module_body__a_bad_attribute_is_a_problem_naming_it(
    config: dict[str, object], attribute: str
) -> None:
    with pytest.raises(ApiProblem) as raised:
        modules.module_body(config)
    assert attribute in raised.value.summary + raised.value.detail


def test_module_state__keeps_the_configuration_when_the_answer_only_adds_defaults() -> None:
    prior = {
        "module_params": {"name": {"type": "string"}},
        "dependencies": {"db": {"type": "postgres", "params": '{"size":"s"}'}},
        "coprovisioned": [{"type": "dns", "is_dependent_on_current": True}],
        "module_inputs": '{ "a" : 1 }',
    }
    found = {
        "id": "m",
        "module_params": {"name": {"type": "string", "is_optional": False}},
        "module_inputs": {"a": 1},
        "provider_mapping": {},
        "dependencies": {"db": {"type": "postgres", "class": "default", "params": {"size": "s"}}},
        "coprovisioned": [
            {
                "type": "dns",
                "class": "default",
                "params": {},
                "is_dependent_on_current": True,
                "copy_dependents_from_current": False,
            }
        ],
    }
    state = modules.module_state(found, prior)
    assert state["module_inputs"] == '{ "a" : 1 }'
    assert state["provider_mapping"] is None
    assert state["module_params"].value == {"name": {"type": "string"}}
    assert state["module_params"].type == cty.Object({"name": cty.Object({"type": cty.STRING})})
    assert state["dependencies"].value["db"]["params"] == '{"size":"s"}'
    assert isinstance(state["coprovisioned"].type, cty.Tuple)


def test_module_state__an_import_leaves_defaults_out_and_params_as_json_text() -> None:
    found = {
        "id": "m",
        "module_params": {"name": {"type": "string", "is_optional": False}},
        "dependencies": {"db": {"type": "postgres", "class": "special", "params": {"size": "s"}}},
        "coprovisioned": [],
    }
    state = modules.module_state(found, {})
    assert state["module_params"].value == {"name": {"type": "string"}}
    assert state["dependencies"].value["db"]["params"] == '{"size":"s"}'
    assert state["dependencies"].value["db"]["class"] == "special"
    assert state["coprovisioned"] is None
    assert state["module_inputs"] is None


def test_deployment__mode_and_manifest_are_checked_before_any_call() -> None:
    assert deployments.validate_deployment({"manifest": '{"workloads": {}}'}) == []
    assert deployments.validate_deployment({"manifest": "workloads: {}\n", "mode": "plan_only"}) == []
    problems = deployments.validate_deployment({"manifest": "[1]", "mode": "rollback"})
    assert any("mode must be one of deploy, plan_only" in p for p in problems)
    assert any("manifest must be an object" in p for p in problems)


def test_deployment_state__an_import_takes_the_manifest_as_compact_json() -> None:
    found = {
        "id": "d1",
        "project_id": "p",
        "env_id": "e",
        "mode": "deploy",
        "status": "succeeded",
        "manifest": {"workloads": {"b": {}, "a": {}}},
    }
    state = deployments.deployment_state(found, {})
    assert state["manifest"] == '{"workloads":{"a":{},"b":{}}}'
    assert state["mode"] == "deploy" and state["outputs"] is None
    kept = deployments.deployment_state(found, {"manifest": "x", "mode": None, "outputs": '{"o":1}'})
    assert kept["manifest"] == "x" and kept["outputs"] == '{"o":1}'


def test_plan_time_checks__name_the_attribute() -> None:
    assert modules.MODULE.validate({"module_source": "git::x", "module_source_code": "x"}) == [
        "module_source must be 'inline' when module_source_code is set"
    ]
    assert modules.MODULE.validate({"module_source": "inline", "module_inputs": '{"a": 1}'}) == []
    [problem] = modules.RESOURCE_TYPE.validate({"id": "t", "output_schema": "{oops"})
    assert problem.startswith("output_schema is not valid JSON")
    [problem] = modules.PROVIDER.validate({"configuration": {"not": "a string"}})
    assert problem == "configuration must be a JSON string (use jsonencode(...))"
