"""What a Terraform state document says of itself (``domain.state_versions.summarize``), read leniently,
and the document a rollback writes."""

from __future__ import annotations

import json

import pytest

from orchestrator.domain.state_versions import MAX_LINEAGE, Summary, rollback_document, summarize


def test_summarize__serial_lineage_and_managed_instances() -> None:
    state = {
        "version": 4,
        "serial": 7,
        "lineage": "l-1",
        "resources": [
            {"mode": "managed", "type": "terraform_data", "name": "a", "instances": [{}, {}]},
            {"type": "terraform_data", "name": "b", "instances": [{}]},  # no mode: managed
            {"mode": "data", "type": "external", "name": "d", "instances": [{}]},
            {"mode": "managed", "type": "terraform_data", "name": "c"},  # no instances
        ],
    }

    assert Summary(serial=7, lineage="l-1", resources=3) == summarize(json.dumps(state).encode())


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"not json", Summary(serial=None, lineage=None, resources=None)),
        (b"[1, 2]", Summary(serial=None, lineage=None, resources=None)),
        (
            b'{"serial": true, "lineage": 5, "resources": {}}',
            Summary(serial=None, lineage=None, resources=None),
        ),
        (b'{"serial": -1}', Summary(serial=None, lineage=None, resources=None)),
        (b'{"serial": 18446744073709551615}', Summary(serial=None, lineage=None, resources=None)),
        (b'{"serial": 0, "resources": []}', Summary(serial=0, lineage=None, resources=0)),
    ],
)
def test_summarize__what_a_document_does_not_say_is_none(data: bytes, expected: Summary) -> None:
    assert expected == summarize(data)


def test_summarize__a_long_lineage_is_cut() -> None:
    assert "x" * MAX_LINEAGE == summarize(json.dumps({"lineage": "x" * 500}).encode()).lineage


def test_rollback_document__only_the_serial_changes() -> None:
    state = {"version": 4, "serial": 2, "lineage": "l", "outputs": {"o": {"value": 1}}, "resources": []}

    written = rollback_document(json.dumps(state).encode(), serial=9)

    assert {**state, "serial": 9} == json.loads(written)
    assert written.endswith(b"}\n")
    with pytest.raises(ValueError):
        rollback_document(b"[]", serial=1)
    with pytest.raises(ValueError):
        rollback_document(b"nope", serial=1)
