"""The pure parts of the input checks: where a parsed body holds bad text, and the cheap pre-check that
lets most bodies through unparsed (it must match every body that has a problem)."""

from __future__ import annotations

import pytest

from orchestrator.web import input_checks
from orchestrator.web.input_checks import (
    NON_FINITE_MESSAGE,
    NUL_MESSAGE,
    SURROGATE_MESSAGE,
    json_problems,
    text_problem,
)

BAD_BODIES = [
    b'{"a": "\\u0000"}',
    b'{"a": "\\ud800"}',
    b'{"a": "\\udfff x"}',
    b'{"a": "\xed\xa0\x80"}',
    b'{"a": "raw \x00 nul"}',
    b'{"a": NaN}',
    b'{"a": Infinity}',
    b'{"a": -Infinity}',
    b'{"a": 1e999}',
    b'{"a": 1E+400}',
    b'{"a": 0.5e0309}',
    b'{"a": ' + b"9" * 250 + b".0e99}",
    b'{"\\u0000": 1}',
]


@pytest.mark.parametrize("body", BAD_BODIES)
def test_precheck__matches_every_body_with_a_problem(body: bytes) -> None:
    parsed = input_checks._parse(body)

    assert input_checks._SUSPECT_JSON.search(body) is not None
    assert [] != json_problems(parsed)


@pytest.mark.parametrize(
    "body",
    [b'{"a": "b", "n": [1, 2.5, -3e10, true, null]}', b'{"NaNa": "Infinite"}', b'{"e": 1e99}'],
)
def test_precheck__lets_ordinary_bodies_through(body: bytes) -> None:
    assert [] == json_problems(input_checks._parse(body))


def test_json_problems__in_document_order_with_paths() -> None:
    value = input_checks._parse(
        b'{"a": {"b": ["ok", "\\u0000"]}, "c": NaN, "d\\ud800": 1, "e": [{"f": "\\udc00"}]}'
    )

    problems = json_problems(value)

    assert [
        (("a", "b", 1), NUL_MESSAGE),
        (("c",), NON_FINITE_MESSAGE),
        (("d<U+D800>",), f"key {SURROGATE_MESSAGE}"),
        (("e", 0, "f"), SURROGATE_MESSAGE),
    ] == problems


def test_json_problems__stops_at_the_limit() -> None:
    value = input_checks._parse(b"[" + b",".join([b'"\\u0000"'] * 50) + b"]")

    assert 3 == len(json_problems(value, limit=3))


def test_text_problem__names_the_first_bad_character() -> None:
    assert text_problem("plain café 😀") is None
    assert NUL_MESSAGE == text_problem("a\x00b")
    assert SURROGATE_MESSAGE == text_problem("a\udfffb")


def test_parse__not_json_is_said_so() -> None:
    assert input_checks._parse(b"age-encryption.org/v1 NaN") is input_checks._NOT_JSON
