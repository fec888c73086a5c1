"""``runner.diagnostics.planned``: whether an ``apply`` without a plan file got past its planning."""

from __future__ import annotations

import json

from orchestrator.runner import diagnostics


def _summary(operation: str) -> str:
    changes = {"add": 1, "change": 0, "import": 0, "remove": 0, "operation": operation}
    return json.dumps({"@level": "info", "type": "change_summary", "changes": changes})


ERROR = json.dumps(
    {"@level": "error", "type": "diagnostic", "diagnostic": {"severity": "error", "summary": "Boom"}}
)


def test_planned__true_once_the_plan_change_summary_was_printed() -> None:
    assert diagnostics.planned(["not json", _summary("plan"), ERROR])
    assert diagnostics.planned([_summary("plan"), _summary("apply")])


def test_planned__false_without_a_plan_change_summary() -> None:
    assert not diagnostics.planned([ERROR])
    assert not diagnostics.planned([_summary("apply"), _summary("destroy")])
    assert not diagnostics.planned([json.dumps({"type": "change_summary", "changes": "plan"})])
    assert not diagnostics.planned([])
