"""JSON Merge Patch (RFC 7396): the RFC's own examples (Appendix A), and what it means for a runner update."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from orchestrator.domain.merge_patch import kept_from_target, merge_patch

#: RFC 7396, Appendix A, row by row: original, patch, result.
RFC_7396_EXAMPLES = [
    ('{"a":"b"}', '{"a":"c"}', '{"a":"c"}'),
    ('{"a":"b"}', '{"b":"c"}', '{"a":"b","b":"c"}'),
    ('{"a":"b"}', '{"a":null}', "{}"),
    ('{"a":"b","b":"c"}', '{"a":null}', '{"b":"c"}'),
    ('{"a":["b"]}', '{"a":"c"}', '{"a":"c"}'),
    ('{"a":"c"}', '{"a":["b"]}', '{"a":["b"]}'),
    ('{"a":{"b":"c"}}', '{"a":{"b":"d","c":null}}', '{"a":{"b":"d"}}'),
    ('{"a":[{"b":"c"}]}', '{"a":[1]}', '{"a":[1]}'),
    ('["a","b"]', '["c","d"]', '["c","d"]'),
    ('{"a":"b"}', '["c"]', '["c"]'),
    ('{"a":"foo"}', "null", "null"),
    ('{"a":"foo"}', '"bar"', '"bar"'),
    ('{"e":null}', '{"a":1}', '{"e":null,"a":1}'),
    ("[1,2]", '{"a":"b","c":null}', '{"a":"b"}'),
    ("{}", '{"a":{"bb":{"ccc":null}}}', '{"a":{"bb":{}}}'),
]


@pytest.mark.parametrize(("original", "patch", "result"), RFC_7396_EXAMPLES)
def test_merge_patch__rfc_7396_appendix_a(original: str, patch: str, result: str) -> None:
    assert json.loads(result) == merge_patch(json.loads(original), json.loads(patch))


def test_merge_patch__arguments_are_not_modified() -> None:
    target: dict[str, Any] = {"job": {"namespace": "a", "pod_template": {"spec": {"containers": []}}}}
    patch: dict[str, Any] = {"job": {"namespace": None, "pod_template": {"spec": {"containers": [{}]}}}}
    target_before, patch_before = copy.deepcopy(target), copy.deepcopy(patch)

    merged = merge_patch(target, patch)
    merged["job"]["pod_template"]["spec"]["containers"][0]["name"] = "main"

    assert (target_before, patch_before) == (target, patch)


@pytest.mark.parametrize(
    ("path", "kept"),
    [
        (("connection", "key"), True),  # the patch has connection, but not its key
        (("connection", "type"), False),
        (("job",), True),
        (("job", "environment", "X"), True),
        (("spec", "containers", 0, "env"), False),  # under a list the patch replaced
    ],
)
def test_kept_from_target__whether_a_merged_value_is_the_stored_one(
    path: tuple[str | int, ...], kept: bool
) -> None:
    patch = {"connection": {"type": "local"}, "spec": {"containers": [{"name": "main"}]}}

    assert kept is kept_from_target(patch, path)
