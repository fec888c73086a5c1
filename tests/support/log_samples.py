"""A deployment log holding every kind of line octl's renderer (``cli/octl/log_render.py``) knows, for
tests that compare another renderer with it (the web console's, tests/browser)."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.runner import logs


def _terraform(kind: str, message: str, level: str = "info", **fields: Any) -> str:
    return json.dumps(
        {"@level": level, "@message": message, "@module": "terraform.ui", "type": kind, **fields}
    )


def _runner_lines() -> str:
    """Lines written by the runner's real logger, a traceback included."""
    sink = logs.LogBuffer(max_bytes=1 << 20)
    log = logs.make_logger(
        sink, level="info", org_id="acme", runner_id="local", deployment_id="d-1", mode="deploy", env_uuid="e"
    )
    log.info("platform orchestrator runner starting", version="1.2.3")
    log.warning("`state push` failed; retrying", attempt=2, delay_seconds=0.5, ok=False, tags=["a", "b"])
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("deployment failed", message="the apply failed")
    return sink.getvalue().decode()


def sample_log() -> str:
    """Runner lines, Terraform's UI lines of every type the renderer treats apart, upstream's Go runner's
    lines and plain text, as one log."""
    diagnostic = {
        "severity": "error",
        "summary": "Invalid function argument",
        "detail": 'Invalid value for "str" parameter: string required. ' * 4 + "\n  indented line kept",
        "address": "module.app.terraform_data.app",
        "range": {"filename": "modules/app/main.tf", "start": {"line": 7, "column": 3, "byte": 90}},
        "snippet": {
            "context": 'resource "terraform_data" "app"',
            "code": "  input = upper(var.items)\n  other = 1",
            "start_line": 7,
            "highlight_start_offset": 16,
            "highlight_end_offset": 25,
            "values": [
                {"traversal": "var.items", "statement": "is a list of string"},
                {"traversal": "var.count", "statement": "is 3"},
            ],
            "function_call": {
                "called_as": "upper",
                "signature": {
                    "name": "upper",
                    "params": [{"name": "str", "type": "string"}],
                    "return_type": "string",
                },
            },
        },
    }
    warning = {"severity": "warning", "summary": "Deprecated attribute", "detail": "Use something else."}
    no_snippet = {
        "severity": "error",
        "summary": "Missing file",
        "range": {"filename": "x.tf", "start": {"line": 1}},
    }
    outputs = {
        "url": {"sensitive": False, "type": "string", "value": "https://shop.example.test"},
        "password": {"sensitive": True, "type": "string", "value": "hunter2"},
        "tags": {"sensitive": False, "type": ["set", "string"], "value": ["a", "b"]},
        "config": {
            "sensitive": False,
            "type": ["object", {"name": "string", "ports": ["list", "number"], "meta": ["map", "string"]}],
            "value": {"name": "x", "ports": [80, 443], "meta": {"k": "v"}},
        },
        "pair": {"sensitive": False, "type": ["tuple", ["string", "bool"]], "value": ["a", True]},
        "script": {"sensitive": False, "type": "string", "value": "line one\nEOT\nline three"},
        "empty": {"sensitive": False, "type": ["list", "string"], "value": []},
        "later": {"sensitive": False},
    }
    lines = [
        _runner_lines().rstrip("\n"),
        _terraform("version", "Terraform 1.15.5", terraform="1.15.5", ui="1.2"),
        _terraform("refresh_start", "terraform_data.a: Refreshing state... [id=1]"),
        _terraform("refresh_complete", "terraform_data.a: Refresh complete [id=1]"),
        _terraform("planned_change", "terraform_data.a: Plan to create"),
        _terraform("change_summary", "Plan: 1 to add, 0 to change, 0 to destroy."),
        _terraform(
            "outputs",
            "Outputs: 2",
            outputs={
                "url": {"action": "create"},
                "gone": {"action": "delete"},
                "same": {"action": "noop"},
                "secret": {"action": "update", "sensitive": True},
            },
        ),
        _terraform("apply_start", "terraform_data.a: Creating..."),
        _terraform(
            "provision_progress",
            "terraform_data.a: (local-exec): hello",
            hook={
                "resource": {"addr": "terraform_data.a"},
                "provisioner": "local-exec",
                "output": "hello world",
            },
        ),
        _terraform("provision_complete", "terraform_data.a: (local-exec) Provisioning complete"),
        _terraform("diagnostic", "Error: Invalid function argument", level="error", diagnostic=diagnostic),
        _terraform("diagnostic", "Warning: Deprecated attribute", level="warn", diagnostic=warning),
        _terraform("diagnostic", "Error: Missing file", level="error", diagnostic=no_snippet),
        _terraform("apply_complete", "terraform_data.a: Creation complete after 0s [id=2]"),
        _terraform("change_summary", "Apply complete! Resources: 1 added, 0 changed, 0 destroyed."),
        _terraform("outputs", "Outputs: 8", outputs=outputs),
        _terraform("a_future_type", "Something new"),
        json.dumps({"@level": "info", "type": "no_message_at_all"}),
        json.dumps({"time": "2026-01-01T00:00:00Z", "level": "ERROR", "msg": "upload failed", "code": 503}),
        json.dumps(
            {"time": "2026-01-01T00:00:00Z", "level": "INFO", "msg": "started", "source": "main.go:1"}
        ),
        "[po-runner] log truncated at 10 MiB",
        "panic: runtime error",
        "{not json",
        "[1, 2]",
        "",
        "    indented plain line",
    ]
    return "\n".join(lines) + "\n"
