"""The runner resources' pure mapping between Terraform's shape and the API's, and their schemas."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest

from orchestrator.domain.runner_secrets import SENSITIVE_PATHS
from orchestrator.domain.runner_types import COMPATIBILITY, RunnerType
from orchestrator.tfprovider import cty, runners
from orchestrator.tfprovider.runners import (
    KINDS,
    KUBERNETES,
    KUBERNETES_GKE,
    SERVERLESS_ECS,
    VM,
    configuration_from_api,
    configuration_to_api,
    merge_patch_between,
    pod_template_text,
    rule_state,
    storage_from_api,
    storage_to_api,
)
from orchestrator.tfprovider.schema import Attribute
from tests.support.terraform_seeds import FIXTURES, FIXTURES_DIR, seed_blocks, seed_text, seeds_dir


def _members(schema: Mapping[str, Attribute], path: str = "") -> Iterator[tuple[str, Attribute, bool]]:
    """(dotted path, attribute, sensitive here or above) of every attribute, at every depth."""
    for name, attribute in schema.items():
        where = f"{path}.{name}" if path else name
        yield where, attribute, attribute.sensitive
        if attribute.object_type is not None:
            for inner, member, sensitive in _members(attribute.object_type.attributes, where):
                yield inner, member, sensitive or attribute.sensitive


def test_kinds__cover_every_runner_type_but_the_managed_pool() -> None:
    assert {kind.api_type for kind in KINDS} == {str(kind) for kind in RunnerType}


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_schema__every_value_the_api_masks_is_sensitive(kind: runners.RunnerKind) -> None:
    """The API answers these as SECRET (runner_secrets.SENSITIVE_PATHS): Terraform must never show them."""
    sensitive = {path for path, _, flagged in _members(kind.configuration) if flagged}
    for pattern in SENSITIVE_PATHS[RunnerType(kind.api_type)]:
        path = pattern.removesuffix(".*")  # a map of secrets: the map attribute is sensitive
        assert path in sensitive, f"{kind.name}: runner_configuration.{path} is not sensitive"


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_schema__state_storage_types_are_the_compatible_ones(kind: runners.RunnerKind) -> None:
    allowed = {str(storage) for storage in COMPATIBILITY[RunnerType(kind.api_type)]}
    assert set(kind.storage_types) == allowed
    nested = kind.resource_attributes()["state_storage_configuration"].object_type
    assert nested is not None
    storage = nested.attributes
    assert set(storage) == {"type"} | {f"{t}_configuration" for t in allowed if t != "orchestrator"}


def test_schema__id_requires_replace_and_rule_attributes_all_do() -> None:
    for kind in KINDS:
        assert kind.resource_attributes()["id"].requires_replace
    rule = runners.RUNNER_RULE.attributes
    assert all(rule[name].requires_replace for name in ("runner_id", "project_id", "env_type_id"))
    assert runners.RUNNER_RULE.update is None


def test_storage__nested_to_flat_and_back() -> None:
    nested = {
        "type": "kubernetes",
        "kubernetes_configuration": {"namespace": "state"},
        "s3_configuration": None,
        "gcs_configuration": None,
        "azurerm_configuration": None,
    }
    assert storage_to_api(nested) == {"type": "kubernetes", "namespace": "state"}
    assert storage_from_api({"type": "kubernetes", "namespace": "state"}, KUBERNETES.storage_types) == nested
    s3 = storage_from_api({"type": "s3", "bucket": "b"}, SERVERLESS_ECS.storage_types)
    assert s3 == {"type": "s3", "s3_configuration": {"bucket": "b", "path_prefix": None}}
    assert storage_to_api({"type": "orchestrator"}) == {"type": "orchestrator"}
    assert storage_to_api({"type": "s3", "s3_configuration": {"bucket": "b", "path_prefix": None}}) == {
        "type": "s3",
        "bucket": "b",
    }


def test_storage__a_block_of_another_type_or_none_is_refused_naming_it() -> None:
    with pytest.raises(
        ValueError, match=r"state_storage_configuration.s3_configuration does not match type 'gcs'"
    ):
        storage_to_api({"type": "gcs", "s3_configuration": {"bucket": "b"}})
    with pytest.raises(ValueError, match=r"state_storage_configuration.gcs_configuration is required"):
        storage_to_api({"type": "gcs", "gcs_configuration": None})


def test_configuration__to_api_adds_the_type_drops_nulls_decodes_the_pod_template() -> None:
    config = {
        "cluster": {"name": "c", "project_id": "p", "location": "l", "internal_ip": False, "proxy_url": None},
        "job": {
            "namespace": "n",
            "service_account": "s",
            "pod_template": '{"metadata": {"labels": {"a": "b"}}}',
        },
    }
    assert configuration_to_api(KUBERNETES_GKE, config) == {
        "type": "kubernetes-gke",
        "cluster": {"name": "c", "project_id": "p", "location": "l", "internal_ip": False},
        "job": {
            "namespace": "n",
            "service_account": "s",
            "pod_template": {"metadata": {"labels": {"a": "b"}}},
        },
    }
    with pytest.raises(ValueError, match=r"runner_configuration.job.pod_template is not valid JSON"):
        configuration_to_api(KUBERNETES_GKE, {"job": {"pod_template": "{not json"}})


def test_configuration__masked_secrets_keep_the_prior_value_and_import_leaves_them_null() -> None:
    answer = {
        "type": "kubernetes",
        "cluster": {
            "cluster_data": {"certificate_authority_data": "Q0E=", "server": "https://k"},
            "auth": {"client_certificate_data": "SECRET", "client_key_data": "SECRET"},
        },
        "job": {"namespace": "n", "service_account": "s"},
    }
    prior = {"cluster": {"auth": {"client_certificate_data": "cert", "client_key_data": "key"}}}
    state = configuration_from_api(KUBERNETES, answer, prior)
    assert state["cluster"]["auth"] == {
        "client_certificate_data": "cert",
        "client_key_data": "key",
        "service_account_token": None,
    }
    assert state["cluster"]["cluster_data"] == {
        "certificate_authority_data": "Q0E=",
        "server": "https://k",
        "proxy_url": None,
    }
    imported = configuration_from_api(KUBERNETES, answer, None)
    assert imported["cluster"]["auth"]["client_key_data"] is None


def test_configuration__a_map_of_secrets_keeps_known_entries_and_drops_unknown_ones() -> None:
    answer = {
        "type": "vm",
        "connection": {"type": "ssh", "host": "h", "port": 22, "username": "u", "private_key": "SECRET"},
        "job": {"runtime": "process", "environment": {}, "secrets": {"A": "SECRET", "B": "SECRET"}},
    }
    prior = {"connection": {"private_key": "pk", "port": None}, "job": {"secrets": {"A": "a"}}}
    state = configuration_from_api(VM, answer, prior)
    assert state["job"]["secrets"] == {"A": "a"}
    assert state["connection"]["private_key"] == "pk"
    assert state["connection"]["port"] is None  # the API's default for ssh, left unset
    explicit = configuration_from_api(VM, answer, {"connection": {"port": 22}})
    assert explicit["connection"]["port"] == 22


def test_pod_template__the_users_text_stays_while_equal_else_jsonencode_form() -> None:
    text = '{\n  "metadata": {"labels": {"a": "b"}}\n}'
    assert pod_template_text(text, {"metadata": {"labels": {"a": "b"}}}) == text
    assert pod_template_text(text, {"spec": {"x": "<&>"}}) == '{"spec":{"x":"\\u003c\\u0026\\u003e"}}'
    assert pod_template_text(None, None) is None


def test_merge_patch__removes_dropped_keys_and_replaces_lists() -> None:
    old = {"type": "vm", "job": {"environment": {"A": "1", "B": "2"}, "runtime": "process"}, "x": [1, 2]}
    new = {"type": "vm", "job": {"environment": {"A": "1"}, "runtime": "process"}, "x": [1]}
    assert merge_patch_between(old, new) == {"job": {"environment": {"B": None}}, "x": [1]}
    assert merge_patch_between({"a": {"b": 1}}, {"a": {"b": 1}}) == {}


def test_rule_state__empty_strings_are_null() -> None:
    found = {"id": "0b5e", "runner_id": "r", "project_id": "p", "env_type_id": ""}
    assert rule_state(found, {}) == {"id": "0b5e", "runner_id": "r", "project_id": "p", "env_type_id": None}


def test_validate__names_the_attribute_before_any_call() -> None:
    spec = runners.runner_spec(KUBERNETES_GKE)
    problems = spec.validate(
        {
            "id": "x",
            "runner_configuration": {"job": {"pod_template": "[1,"}},
            "state_storage_configuration": {},
        }
    )
    assert len(problems) == 1 and "runner_configuration.job.pod_template" in problems[0]


def test_validate__waits_for_values_known_only_at_apply() -> None:
    spec = runners.runner_spec(KUBERNETES_GKE)
    unknown = cty.UNKNOWN
    config = {
        "id": "x",
        "runner_configuration": {"job": {"pod_template": unknown}},
        "state_storage_configuration": {},
    }
    assert spec.validate(config) == []


def test_fixtures__are_the_seeds_tf_blocks_byte_for_byte() -> None:
    """Each fixture file is one TF block of seed 000 or 001, exactly as there; every TF block has one.

    The seeds' fragments (``  runner_configuration = {...}``) are incomplete, not wrong: the ECS one says
    so ("See other required properties"), and the two pod templates are arguments of some runner's job.
    Their completions are the ``*.completion.tf`` files. Seed 001's two ``resource ... "example"`` blocks
    are placeholders (``# ...``): tests/acceptance/test_terraform_runners.py validates them."""
    directory = seeds_dir()
    if directory is None:
        pytest.skip("the project's seeds (shared/seeds beside the repository, or PO_SEEDS_DIR) are not here")
    for prefix, names in FIXTURES.items():
        blocks = seed_blocks(seed_text(directory, prefix))
        assert len(blocks) == len(names), f"seed {prefix} has {len(blocks)} TF blocks"
        for name, block in zip(names, blocks, strict=True):
            assert (FIXTURES_DIR / name).read_bytes() == block.encode("utf-8"), name
