"""format_validation_error: one line naming the first field, every error in the details, no pydantic noise."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pydantic
import pytest
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter

from orchestrator.domain.runner_requests import RunnerCreateBody
from orchestrator.domain.runner_types import RUNNER_CONFIGURATION_ADAPTER
from orchestrator.domain.validation import (
    format_validation_error,
    go_list,
    invalid_input,
    nested_error,
    register_discriminated_union,
)
from orchestrator.errors import InvalidInputError


def _positive(value: int) -> int:
    if value <= 0:
        raise ValueError("must be positive")
    return value


def _deep(value: dict[str, Any]) -> dict[str, Any]:
    if "bad" in value:
        raise nested_error([(("bad", 0, "name"), "is wrong here")], value=value)
    return value


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    count: Annotated[int, AfterValidator(_positive)] | str = 1


class Cat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["cat"] = "cat"
    lives: int = 9


class Dog(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["dog"] = "dog"
    good: bool = True


class Shelter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Item] = Field(default_factory=list)
    labels: dict[str, int] = Field(default_factory=dict)
    pet: Annotated[Cat | Dog, Field(discriminator="kind")] | None = None
    extra: Annotated[dict[str, Any], AfterValidator(_deep)] = Field(default_factory=dict)


register_discriminated_union("animal kind", ("cat", "dog"), fields=("pet",))


def fmt(data: object, *, prefix: str = "") -> tuple[str, list[dict[str, str]]]:
    with pytest.raises(pydantic.ValidationError) as info:
        Shelter.model_validate(data)
    return format_validation_error(info.value, prefix=prefix)


def test_unknown_field() -> None:
    assert fmt({"items": [{"name": "a", "colour": "red"}]}) == (
        "items[0].colour: unknown field",
        [{"field": "items[0].colour", "message": "unknown field"}],
    )


def test_missing_field_with_list_index() -> None:
    message, details = fmt({"items": [{"name": "a"}, {}]})
    assert message == "items[1].name: field required"
    assert details == [{"field": "items[1].name", "message": "field required"}]


def test_function_wrapper_segments_are_dropped() -> None:
    # ``int | str`` with a validator: pydantic locates errors under ``function-after[...]`` and ``str``.
    with pytest.raises(pydantic.ValidationError) as info:
        Shelter.model_validate({"items": [{"name": "a", "count": 1.5}]})
    raw_locs = [error["loc"] for error in info.value.errors()]
    assert any(any("function-after[" in str(part) for part in loc) for loc in raw_locs)
    _, details = format_validation_error(info.value)
    assert all("function-after" not in d["field"] for d in details)
    assert {d["field"] for d in details} <= {"items[0].count", "items[0].count.str"}
    assert details[0]["field"] == "items[0].count"


def test_value_error_prefix_is_removed() -> None:
    message, _ = fmt({"items": [{"name": "a", "count": -1}]})
    assert message.startswith("items[0].count: must be positive")
    assert "Value error" not in message


def test_discriminated_union_tag_is_dropped() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        Shelter.model_validate({"pet": {"kind": "dog", "good": "very"}})
    assert info.value.errors()[0]["loc"] == ("pet", "dog", "good")
    message, _ = format_validation_error(info.value)
    assert message.startswith("pet.good: input should be a valid boolean")


def test_unknown_and_missing_tag() -> None:
    assert fmt({"pet": {"kind": "eel"}})[0] == "pet.kind: unknown animal kind 'eel', must be one of [cat dog]"
    assert fmt({"pet": {"lives": 3}})[0] == "pet.kind: field required, must be one of [cat dog]"


def test_unregistered_union_gets_a_generic_noun() -> None:
    class Bird(BaseModel):
        sort: Literal["bird"]

    class Fish(BaseModel):
        sort: Literal["fish"]

    adapter: TypeAdapter[Bird | Fish] = TypeAdapter(Annotated[Bird | Fish, Field(discriminator="sort")])
    with pytest.raises(pydantic.ValidationError) as info:
        adapter.validate_python({"sort": "worm"})
    assert format_validation_error(info.value, prefix="animal")[0] == (
        "animal.sort: unknown sort value 'worm', must be one of [bird fish]"
    )


def test_dict_keys_needing_quotes() -> None:
    message, _ = fmt({"labels": {"app.kubernetes.io/name": "x", "plain-key_1": 2}})
    assert message.startswith('labels["app.kubernetes.io/name"]: input should be a valid integer')


def test_nested_error_from_a_validator_keeps_its_full_location() -> None:
    message, details = fmt({"extra": {"bad": [{}]}})
    assert message == "extra.bad[0].name: is wrong here"
    assert details == [{"field": "extra.bad[0].name", "message": "is wrong here"}]


def test_prefix_and_error_count() -> None:
    message, details = fmt({"items": [{}, {"name": "b", "x": 1}], "nope": 1}, prefix="body.shelter")
    assert [d["field"] for d in details] == [
        "body.shelter.items[0].name",
        "body.shelter.items[1].x",
        "body.shelter.nope",
    ]
    assert message == "body.shelter.items[0].name: field required (and 2 more errors)"


def test_root_level_error_has_no_field() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        Shelter.model_validate("not a mapping")
    message, details = format_validation_error(info.value)
    assert details[0]["field"] == ""
    assert message == details[0]["message"]
    assert message.startswith("input should be")


def test_messages_are_one_line() -> None:
    def multi(value: str) -> str:
        raise ValueError("first line\nsecond   line")

    adapter: TypeAdapter[str] = TypeAdapter(Annotated[str, AfterValidator(multi)])
    with pytest.raises(pydantic.ValidationError) as info:
        adapter.validate_python("x")
    assert format_validation_error(info.value, prefix="f")[0] == "f: first line second line"


def test_invalid_input_carries_details() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        Shelter.model_validate({"items": [{}]})
    error = invalid_input(info.value)
    assert isinstance(error, InvalidInputError)
    assert error.message == "items[0].name: field required"
    assert error.details == {"errors": [{"field": "items[0].name", "message": "field required"}]}


def test_go_list() -> None:
    assert go_list(["c", "a", "b"]) == "[a b c]"
    assert go_list([]) == "[]"


# --- the runner examples named in the task --------------------------------------------------------

GKE: dict[str, Any] = {
    "type": "kubernetes-gke",
    "cluster": {
        "name": "c",
        "project_id": "p",
        "location": "l",
        "auth": {"gcp_audience": "a", "gcp_service_account": "s"},
    },
    "job": {"namespace": "ns", "service_account": "sa"},
}


def _runner(config: dict[str, Any]) -> str:
    data = {
        "id": "r1",
        "runner_configuration": config,
        "state_storage_configuration": {"type": "orchestrator"},
    }
    with pytest.raises(pydantic.ValidationError) as info:
        RunnerCreateBody.model_validate(data)
    return format_validation_error(info.value)[0]


def test_runner_messages() -> None:
    assert (
        _runner({**GKE, "cluster": {**GKE["cluster"], "foo": 1}})
        == "runner_configuration.cluster.foo: unknown field"
    )
    cluster = {k: v for k, v in GKE["cluster"].items() if k != "name"}
    assert _runner({**GKE, "cluster": cluster}) == "runner_configuration.cluster.name: field required"
    assert _runner({**GKE, "type": "foo"}) == (
        "runner_configuration.type: unknown runner type 'foo', must be one of "
        "[kubernetes kubernetes-agent kubernetes-aks kubernetes-eks kubernetes-gke serverless-ecs vm]"
    )
    job = {**GKE["job"], "pod_template": {"spec": {"containers": [{"image": "x"}]}}}
    assert _runner({**GKE, "job": job}).startswith(
        "runner_configuration.job.pod_template.spec.containers[0].name: field required"
    )


def test_runner_configuration_validated_alone_with_prefix() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        RUNNER_CONFIGURATION_ADAPTER.validate_python({**GKE, "job": {"namespace": "ns"}})
    assert info.value.errors()[0]["loc"][0] == "kubernetes-gke"
    assert format_validation_error(info.value, prefix="runner_configuration")[0] == (
        "runner_configuration.job.service_account: field required"
    )
    assert format_validation_error(info.value)[0] == "job.service_account: field required"


@pytest.mark.parametrize("value", ["My_Project", "-shop", "shop-", "a--b", "x"])
def test_id_pattern__is_explained_in_words_not_as_a_regex(value: str) -> None:
    from orchestrator.api.schemas import Identifier

    class Body(BaseModel):
        id: Identifier

    with pytest.raises(pydantic.ValidationError) as caught:
        Body(id=value)
    message, _ = format_validation_error(caught.value)

    if value == "x":  # too short: pydantic's own words
        assert message == "id: string should have at least 2 characters"
        return
    assert message.startswith("id: must start with a lowercase letter and hold only lowercase letters")
    assert "^" not in message
    assert "(?:" not in message
