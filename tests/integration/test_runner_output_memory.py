"""An engine command's output does not stay in the runner's memory (issue 22): its lines go to the log and
to ``diagnostics.OutputScan`` as they come, and the command's result keeps only their tail; what the runner
reads of the output (the change summary, whether it planned, the last error diagnostic) is found all the
same, wherever in the output it was.

The engine is a stand-in (a Python script printing Terraform's JSON lines) run by the real ``IacCli``, as
``po-runner`` runs it, in a process of its own whose peak RSS is read from /proc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from orchestrator.runner import diagnostics, engine, iac, logs

#: Lines of about 1 KiB the stand-in prints: 48 MiB of output (the runner held about 3.5 times a log's
#: size before).
LINES = 48 * 1024
#: How much the runner's peak RSS may grow while it runs the command: far above the bounded structures
#: (a 1 MiB log buffer, 2 x 200 tail lines, the reader's 64 KiB reads), far below the output's size.
RSS_GROWTH_BOUND_MIB = 24

ENGINE = textwrap.dedent(
    """\
    import json, os, sys
    lines = int(os.environ["FAKE_LINES"])
    filler = json.dumps({"@level": "info", "@message": "x" * 900, "type": "provision_progress"})
    summary = {"@level": "info", "type": "change_summary"}
    out = sys.stdout
    for n in range(lines):
        if n == 10:
            changes = {"add": 2, "change": 0, "remove": 0, "operation": "plan"}
            out.write(json.dumps({**summary, "changes": changes}) + "\\n")
        if n == lines // 2:
            diagnostic = {"severity": "error", "summary": "Boom", "detail": "in the middle"}
            out.write(json.dumps({"@level": "error", "type": "diagnostic", "diagnostic": diagnostic}) + "\\n")
        out.write(filler + "\\n")
    changes = {"add": 2, "change": 0, "remove": 1, "operation": "apply"}
    out.write(json.dumps({**summary, "changes": changes}) + "\\n")
    sys.stderr.write("the stderr's last line\\n")
    sys.exit(1)
    """
)

RUNNER = textwrap.dedent(
    """\
    import json, sys
    from pathlib import Path
    from orchestrator.runner import engine, iac, logs

    def peak_kib():
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    fake = engine.Engine(backend=engine.IacBackend.TERRAFORM, command=(sys.executable, sys.argv[1]))
    sink = logs.LogBuffer(max_bytes=1 << 20)
    cli = iac.IacCli(fake, workdir=Path(sys.argv[2]), environ={"FAKE_LINES": sys.argv[3]}, sink=sink)
    before = peak_kib()
    result = cli.run("apply", "-json")
    after = peak_kib()
    print(json.dumps({
        "before_kib": before,
        "after_kib": after,
        "exit_code": result.exit_code,
        "stdout_lines": len(result.stdout),
        "longest": max(len(line) for line in result.stdout),
        "stderr": result.stderr,
        "summary": None if result.stdout_scan.summary is None else vars(result.stdout_scan.summary),
        "planned": result.stdout_scan.planned,
        "error": result.error_diagnostic,
        "log_bytes": len(sink.getvalue()),
        "log_truncated": sink.truncated,
    }))
    """
)


def test_a_large_output__the_runner_keeps_its_tail_and_what_it_reads_of_it(tmp_path: Path) -> None:
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    work = tmp_path / "work"
    work.mkdir()

    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(script), str(work), str(LINES)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )

    assert 0 == done.returncode, done.stderr
    got = json.loads(done.stdout)
    grown_mib = (got["after_kib"] - got["before_kib"]) / 1024
    assert grown_mib < RSS_GROWTH_BOUND_MIB, got
    assert 1 == got["exit_code"]
    assert iac.TAIL_LINES == got["stdout_lines"]
    assert got["longest"] <= iac.TAIL_LINE_CHARS
    assert ["the stderr's last line"] == got["stderr"]
    assert {"add": 2, "change": 0, "remove": 1, "operation": "apply"} == got["summary"]
    assert got["planned"]
    assert {"severity": "error", "summary": "Boom", "detail": "in the middle"} == got["error"]
    assert got["log_truncated"]
    assert got["log_bytes"] <= 1 << 20


def test_a_command_whose_stdout_is_not_logged__keeps_all_of_it(tmp_path: Path) -> None:
    """``show -json`` and ``output -json`` print the document the runner reads: kept whole, never logged."""
    script = tmp_path / "engine.py"
    script.write_text(ENGINE.replace("sys.exit(1)", "sys.exit(0)"))
    sink = logs.LogBuffer(max_bytes=1 << 20)
    fake = engine.Engine(backend=engine.IacBackend.TERRAFORM, command=(sys.executable, str(script)))
    cli = iac.IacCli(fake, workdir=tmp_path, environ={"FAKE_LINES": str(iac.TAIL_LINES * 2)}, sink=sink)

    result = cli.run("show", "-json", log_stdout=False)

    assert result.ok
    assert iac.TAIL_LINES * 2 + 3 == len(result.stdout)
    assert b"provision_progress" not in sink.getvalue()
    assert result.stdout_scan.planned
    assert diagnostics.change_summary(result.stdout) == result.stdout_scan.summary
