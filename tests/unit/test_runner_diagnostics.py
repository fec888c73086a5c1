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


def test_output_scan__finds_the_last_summary_and_error_line_by_line_as_the_list_functions_do() -> None:
    other_error = json.dumps(
        {"@level": "error", "type": "diagnostic", "diagnostic": {"severity": "error", "summary": "Later"}}
    )
    warning = json.dumps(
        {"@level": "warn", "type": "diagnostic", "diagnostic": {"severity": "warning", "summary": "Hm"}}
    )
    lines = ["plain text", _summary("plan"), ERROR, "{not json", other_error, warning, _summary("apply")]
    scan = diagnostics.OutputScan()

    for line in lines:
        scan.feed(line)

    assert scan.planned
    assert diagnostics.ChangeSummary(add=1, change=0, remove=0, operation="apply") == scan.summary
    assert scan.summary == diagnostics.change_summary(lines)
    assert {"severity": "error", "summary": "Later"} == scan.error
    error = diagnostics.last_error_diagnostic(lines, action="apply")
    assert error is not None and "Later" == error.message
    assert error == diagnostics.diagnostic_error({"severity": "error", "summary": "Later"}, action="apply")


def test_output_scan__lines_that_name_neither_are_not_parsed() -> None:
    scan = diagnostics.OutputScan()

    scan.feed(json.dumps({"type": "apply_progress", "hook": {"resource": {"addr": "x"}}}))
    scan.feed('{"type": "change_summary", "changes": ')  # cut short: skipped

    assert (None, False, None) == (scan.summary, scan.planned, scan.error)
