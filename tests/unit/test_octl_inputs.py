"""The request body octl builds from --set, --set-json and --set-yaml (upstream octl rules)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from orchestrator.cli.octl import inputs


def build(
    *sets: str, set_json: str | None = None, set_yaml: str | None = None, stdin: str = ""
) -> dict[str, object]:
    return inputs.build_body(sets=sets, set_json=set_json, set_yaml=set_yaml, stdin=io.StringIO(stdin))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("plain", "plain"),
        ("true", True),
        ("false", False),
        ("null", None),
        ("42", 42),
        ("[1, 2]", [1, 2]),
        ('{"a": {"b": 1}}', {"a": {"b": 1}}),
        ("True", "True"),
        ("-1", "-1"),
        ("1.5", "1.5"),
        ("4x", "4x"),
        ('"quoted"', '"quoted"'),
        ("", ""),
        ("a=b", "a=b"),
        (" [1]", " [1]"),
    ],
)
def test_parse_set_value__json_only_for_brackets_words_and_digits(raw: str, expected: object) -> None:
    assert expected == inputs.parse_set_value("k", raw)


def test_parse_sets__splits_on_first_equals_and_last_flag_wins() -> None:
    assert {"runner_id": "a=b", "n": 2} == inputs.parse_sets(["runner_id=x", "n=1", "runner_id=a=b", "n=2"])


def test_parse_sets__top_level_keys_only() -> None:
    """A dotted key is a key of its own: --set sets top-level keys, it does not walk paths."""
    assert {"runner_configuration.type": "vm"} == inputs.parse_sets(["runner_configuration.type=vm"])


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("novalue", "expected key=value"),
        ("=x", "non-empty name"),
        (" k=x", "non-empty name"),
        ("k=[1,", "--set k: invalid JSON"),
        ("k={nope}", "--set k: invalid JSON"),
        ("k=007", "leading zero"),
    ],
)
def test_parse_sets__bad_items_name_the_problem(item: str, message: str) -> None:
    with pytest.raises(inputs.InputError, match=message.replace("[", r"\[")):
        inputs.parse_sets([item])


def test_build_body__set_json_raw_string() -> None:
    assert {"runner_id": "r", "project_id": None} == build(set_json='{"runner_id": "r", "project_id": null}')


def test_build_body__set_yaml_from_file(tmp_path: Path) -> None:
    path = tmp_path / "runner.yaml"
    path.write_text("description: GKE\nrunner_configuration:\n  type: kubernetes-gke\n")

    assert {"description": "GKE", "runner_configuration": {"type": "kubernetes-gke"}} == build(
        set_yaml=f"@{path}"
    )


def test_build_body__set_json_from_file(tmp_path: Path) -> None:
    path = tmp_path / "rule.json"
    path.write_text('{"runner_id": "r", "env_type_id": "dev"}')

    assert {"runner_id": "r", "env_type_id": "dev"} == build(set_json=f"@{path}")


def test_build_body__dash_reads_stdin() -> None:
    assert {"display_name": "From stdin"} == build(set_yaml="-", stdin="display_name: From stdin\n")
    assert {"display_name": "json"} == build(set_json="-", stdin='{"display_name": "json"}')


def test_build_body__set_is_applied_last_and_wins() -> None:
    body = build(
        "description=from set",
        "extra=[1]",
        set_yaml="description: from yaml\nrunner_configuration: {type: vm}\n",
    )

    assert {"description": "from set", "runner_configuration": {"type": "vm"}, "extra": [1]} == body


def test_build_body__set_replaces_a_whole_top_level_key() -> None:
    """--set does not merge into nested mappings: the value replaces the key."""
    body = build('runner_configuration={"type": "vm"}', set_yaml="runner_configuration: {type: x, job: {}}\n")

    assert {"runner_configuration": {"type": "vm"}} == body


def test_build_body__json_and_yaml_are_mutually_exclusive() -> None:
    with pytest.raises(inputs.InputError, match="mutually exclusive"):
        build(set_json="{}", set_yaml="{}")


def test_build_body__nothing_given_is_empty() -> None:
    assert {} == build()
    assert {} == build(set_yaml="")
    assert {} == build(set_yaml="# only a comment\n")


def test_build_body__yaml_dates_stay_strings() -> None:
    """The API wants the text as written; PyYAML would otherwise make datetime.date objects."""
    assert {"expires_at": "2030-01-01", "at": "2030-01-01T00:00:00Z"} == build(
        set_yaml="expires_at: 2030-01-01\nat: 2030-01-01T00:00:00Z\n"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"set_json": "[1, 2]"}, "--set-json: the document must be a mapping of fields, not list"),
        ({"set_yaml": "just text"}, "--set-yaml: the document must be a mapping of fields, not str"),
        ({"set_json": '{"a": '}, "--set-json: invalid JSON: Expecting value at line 1 column 7"),
        ({"set_yaml": "a: [1,\n"}, "--set-yaml: invalid YAML: .* at line 2 column 1"),
        ({"set_yaml": "@"}, "'@' must be followed by a file name"),
        ({"set_yaml": "!!python/object:os.system {}"}, "--set-yaml: invalid YAML"),
    ],
)
def test_build_body__bad_documents_name_the_flag(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(inputs.InputError, match=message):
        build(**kwargs)


def test_build_body__missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"

    with pytest.raises(inputs.InputError, match=f"--set-yaml: cannot read '{missing}': No such file"):
        build(set_yaml=f"@{missing}")


def test_with_id__the_argument_gives_the_id() -> None:
    assert {"id": "r1", "description": "d"} == inputs.with_id({"description": "d"}, "id", "r1")
    assert {"id": "r1"} == inputs.with_id({"id": "r1"}, "id", "r1")


def test_with_id__a_different_id_in_the_body_is_refused() -> None:
    with pytest.raises(inputs.InputError, match="the input sets id 'r2', but the argument is 'r1'"):
        inputs.with_id({"id": "r2"}, "id", "r1")


def test_without_id__drops_an_agreeing_id_and_refuses_another() -> None:
    assert {"description": "d"} == inputs.without_id({"id": "r1", "description": "d"}, "id", "r1")
    with pytest.raises(inputs.InputError, match="must agree"):
        inputs.without_id({"id": "r2"}, "id", "r1")


@pytest.mark.parametrize("flag", ["set_yaml", "set_json"])
@pytest.mark.parametrize("value", ["runner-config.yaml", "conf/runner.yml", "runner.json"])
def test_build_body__a_file_name_without_at_suggests_the_at(flag: str, value: str) -> None:
    option = "--" + flag.replace("_", "-")

    with pytest.raises(inputs.InputError) as caught:
        inputs.build_body(**{flag: value}, stdin=io.StringIO())

    assert f"write {option}=@{value}" in str(caught.value)


def test_build_body__an_existing_file_without_at_suggests_the_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "runner").write_text("description: x\n")
    monkeypatch.chdir(tmp_path)

    with pytest.raises(inputs.InputError, match="write --set-yaml=@runner"):
        inputs.build_body(set_yaml="runner", stdin=io.StringIO())


@pytest.mark.parametrize("document", ["description: my.yaml", "{a: b.json}", "a: 1\nb: c.yaml"])
def test_build_body__a_document_mentioning_a_file_is_still_a_document(document: str) -> None:
    assert inputs.build_body(set_yaml=document, stdin=io.StringIO())
