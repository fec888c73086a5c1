"""``octl``'s log renderer on the runner's own lines (written by the runner's real logger), upstream's Go
runner's lines, plain text, colours and widths. Terraform's lines are rendered from the real engine in
tests/integration/test_octl_log_render_engine.py."""

from __future__ import annotations

import json

from orchestrator.cli.octl.log_render import LogRenderer, hcl_value
from orchestrator.runner import logs


def _runner_log() -> str:
    sink = logs.LogBuffer(max_bytes=1 << 20)
    log = logs.make_logger(
        sink, level="info", org_id="acme", runner_id="local", deployment_id="d-1", mode="deploy", env_uuid="e"
    )
    log.info("platform orchestrator runner starting", version="1.2.3")
    log.info("executing apply")
    log.warning("`state push` failed; retrying", attempt=2, delay_seconds=0.5)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("deployment failed", message="the apply failed")
    return sink.getvalue().decode()


def test_runner_lines__short_without_the_fields_every_line_repeats() -> None:
    rendered = LogRenderer().text(_runner_log())

    lines = rendered.splitlines()
    assert "[runner] platform orchestrator runner starting (version=1.2.3)" == lines[0]
    assert "[runner] executing apply" == lines[1]
    assert "[runner] warning: `state push` failed; retrying (attempt=2 delay_seconds=0.5)" == lines[2]
    assert '[runner] error: deployment failed (message="the apply failed")' == lines[3]
    assert "  Traceback (most recent call last):" == lines[4]
    assert "  ValueError: boom" == lines[-1]
    assert "acme" not in rendered and "d-1" not in rendered


def test_upstream_runner_lines__slog_json() -> None:
    line = json.dumps({"time": "2026-01-01T00:00:00Z", "level": "ERROR", "msg": "upload failed", "code": 503})

    assert "[runner] error: upload failed (code=503)\n" == LogRenderer().line(line)


def test_other_lines__as_they_are() -> None:
    text = "[po-runner] log truncated at 10 MiB\npanic: runtime error\n{not json\n[1, 2]\n"

    assert text == LogRenderer().text(text)


def test_unknown_terraform_message__its_message() -> None:
    line = json.dumps({"@level": "info", "@message": "Something new", "type": "a_future_type"})

    assert "Something new\n" == LogRenderer().line(line)


def test_diagnostic__wrapped_at_the_width_and_coloured_only_when_asked() -> None:
    line = json.dumps(
        {
            "@level": "error",
            "@message": "Error: Bad",
            "type": "diagnostic",
            "diagnostic": {"severity": "error", "summary": "Bad", "detail": "word " * 30, "address": "a.b"},
        }
    )

    plain = LogRenderer(width=40).line(line)
    coloured = LogRenderer(width=40, colour=True).line(line)

    # As Terraform: the address, and without a range no snippet and no blank line before the detail.
    assert plain.startswith("╷\n│ Error: Bad\n│\n│   with a.b,\n│ word word")
    assert plain.endswith("╵\n\n")
    assert all(len(row) <= 40 for row in plain.splitlines())
    assert "\x1b[" not in plain
    assert "\x1b[1m\x1b[31mError: \x1b[0m" in coloured


def test_blocks__one_blank_line_around_them() -> None:
    summary = json.dumps({"@message": "Plan: 1 to add.", "type": "change_summary", "@level": "info"})
    change = json.dumps({"@message": "a: Plan to create", "type": "planned_change", "@level": "info"})

    assert "a: Plan to create\n\nPlan: 1 to add.\n\n" == LogRenderer().text(f"{change}\n{summary}\n")
    assert "Plan: 1 to add.\n\n" == LogRenderer().text(summary)


def test_hcl_value__as_terraform_prints_outputs() -> None:
    assert '"a"' == hcl_value("a")
    assert "null" == hcl_value(None)
    assert 'toset([\n  "x",\n])' == hcl_value(["x"], ["set", "string"])
    assert '[\n  "a",\n  1,\n]' == hcl_value(["a", 1], ["tuple", ["string", "number"]])
    assert "<<EOT_\nEOT\nx\nEOT_" == hcl_value("EOT\nx")
