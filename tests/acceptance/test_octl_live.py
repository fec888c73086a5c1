"""The live deployment view through ``octl``, end to end: ``octl logs -f`` follows a deployment while it runs
(across a server restart and a dropped connection), ``octl deploy`` shows its phases and progress, ``octl
get deployment`` its phase history.

Everything is real: ``orchestrator serve`` as a process (killed and started again on the same port and
database), the local ``vm`` runner (``po-runner standard`` on this host, streaming its log in encrypted
chunks), the embedded Terraform engine, and the installed ``octl``. The module's second resource has a
provisioner that prints a marker and sleeps, so the apply runs for a while after the plan.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
import yaml

from orchestrator.client.api import ApiClient
from orchestrator.protocol import log_stream
from tests.support.octl import OCTL_EXECUTABLE, ORG, OctlProcess, Ran, on_terminal
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.outages import Proxy, ServerProcess
from tests.support.stack import EXAMPLES, Stack, build_stack, demo_manifest, runner_body

# Each test on one of the databases, the must-show test (the follow across a restart) on both.
pytestmark = [pytest.mark.slow, pytest.mark.spread]

#: What the module's provisioner prints; its code holds only ``$((40+2))``, so the marker is in the log
#: alone (the module's code is stored, and not secret).
MARKER = "octl-live-marker-42"
MARKER_COMMAND = "echo octl-live-marker-$((40+2))"
SLOW_SECONDS = 6


@dataclass
class Live:
    server: ServerProcess
    stack: Stack
    octl: OctlProcess
    tmp_path: Path

    def client(self, base_url: str | None = None) -> ApiClient:
        return ApiClient(base_url or self.server.url, self.octl.token)

    def manifest(self, name: str = "shop") -> Path:
        path = self.tmp_path / f"manifest-{name}.yaml"
        path.write_text(yaml.safe_dump(demo_manifest(name)))
        return path

    def deploy_no_wait(self, name: str = "shop") -> str:
        started = self.octl("deploy", "shop", "dev", str(self.manifest(name)), "--no-wait", "--yes")
        assert 0 == started.exit_code, started.output
        return str(yaml.safe_load(started.stdout)["deployment_id"])

    def logs_key(self, deployment_id: str) -> str:
        text = (self.tmp_path / "keys" / f"{deployment_id}.logs.key").read_text()
        return text.strip().splitlines()[-1]

    def chunks_text(self, deployment_id: str) -> str:
        """Every stored chunk's text, in order, decrypted with the saved key (through the page API)."""
        identity, texts, after = self.logs_key(deployment_id), [], 0
        with self.client() as client:
            while True:
                page = client.get_deployment_log_chunks(ORG, deployment_id, after=after)
                for item in page["items"]:
                    chunk = log_stream.decrypt_chunk(
                        item["ciphertext"], identity, deployment_id=deployment_id, seq=item["seq"]
                    )
                    texts.append(chunk.text)
                    after = item["seq"]
                if after >= page["last_seq"]:
                    return "".join(texts)


def _slow_module(stack: Stack, command: str) -> None:
    module = yaml.safe_load((EXAMPLES / "module.yaml").read_text())
    code = module["module_source_code"].replace(
        'input = "bucket-${var.name}"',
        f'input = "bucket-${{var.name}}"\n  provisioner "local-exec" {{\n    command = "{command}"\n  }}',
    )
    patched = stack.client.patch(f"/orgs/{stack.org}/modules/demo-app", json={"module_source_code": code})
    assert 200 == patched.status_code, patched.text


@pytest.fixture
def live(database_url: str, tmp_path: Path) -> Iterator[Live]:
    # No zygote and no warm runners: each is started ahead with the server's own environment, so it would
    # run the installed runner rather than the tree under test's (PYTHONPATH, below).
    server = ServerProcess(database_url, tmp_path / "data", PO_LOCAL_ZYGOTE="off", PO_LOCAL_WARM_RUNNERS="0")
    server.start()
    try:
        # The runner of the tree under test (a local run inherits no PYTHONPATH of the server's).
        tree = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
        runner = runner_body(tmp_path / "terraformrc")
        runner["runner_configuration"]["job"]["environment"].update(tree)
        stack = build_stack(server.url, tmp_path, runner=runner)
        _slow_module(stack, f"{MARKER_COMMAND}; sleep {SLOW_SECONDS}")
        token = str(stack.client.headers["Authorization"]).removeprefix("Bearer ")
        octl = OctlProcess(base_url=server.url, token=token, config_path=tmp_path / "octl.yaml")
        yield Live(server=server, stack=stack, octl=octl, tmp_path=tmp_path)
        stack.client.close()
    finally:
        server.stop()


@dataclass
class Follower:
    """``octl logs -f`` as a process, its output read line by line as it comes."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    first_plan: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(
        cls, octl: OctlProcess, deployment_id: str, *args: str, base_url: str | None = None
    ) -> Follower:
        environ = {
            **os.environ,
            "PO_API_URL": base_url or octl.base_url,
            "PO_AUTH_TOKEN": octl.token,
            "PO_ORG_ID": ORG,
            "OCTL_CONFIG": str(octl.config_path),
            "OCTL_KEYS_DIR": str(octl.config_path.parent / "keys"),
        }
        process = subprocess.Popen(
            [str(OCTL_EXECUTABLE), "logs", "-f", deployment_id, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environ,
        )
        follower = cls(process)
        assert process.stdout is not None and process.stderr is not None
        follower.threads = [
            threading.Thread(target=follower._read, args=(process.stdout, follower.lines), daemon=True),
            threading.Thread(target=follower._read, args=(process.stderr, follower.stderr), daemon=True),
        ]
        for thread in follower.threads:
            thread.start()
        return follower

    def _read(self, stream: IO[str], into: list[str]) -> None:
        for line in stream:
            into.append(line)
            if into is self.lines and ('"planned_change"' in line or "Plan to create" in line):
                self.first_plan.set()

    def wait(self, timeout_seconds: float = 180) -> Ran:
        exit_code = self.process.wait(timeout_seconds)
        for thread in self.threads:
            thread.join(10)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return Ran(exit_code=exit_code, stdout="".join(self.lines), stderr="".join(self.stderr))


def _executing(live: Live, deployment_id: str) -> dict[str, Any]:
    with live.client() as client:
        return client.get_deployment(ORG, deployment_id)


@pytest.mark.spread(False)
def test_logs_follow__live_across_a_server_restart_and_a_dropped_connection(live: Live) -> None:
    """The plan reaches followers while the apply runs; one follower goes through a server restart (kill
    -9), another through a connection cut twice; both print every chunk once, in order; the stored bytes
    never hold the marker the module prints."""
    proxy = Proxy(live.server.port)
    proxy.up()
    deployment_id = live.deploy_no_wait()
    direct = Follower.start(live.octl, deployment_id, "--raw")
    cut = Follower.start(live.octl, deployment_id, "--raw", base_url=proxy.url)

    assert direct.first_plan.wait(60), "".join(direct.stderr)
    assert "executing" == _executing(live, deployment_id)["status"], "the plan came after the apply ended"
    proxy.down()
    live.server.kill()
    time.sleep(0.5)
    proxy.up()
    live.server.start()
    time.sleep(1.5)
    proxy.down()
    proxy.up()
    direct_ran, cut_ran = direct.wait(), cut.wait()
    proxy.down()

    whole = live.chunks_text(deployment_id)
    assert MARKER in whole
    assert '"type":"apply_complete"' in whole.replace(" ", "")
    for ran in (direct_ran, cut_ran):
        assert 0 == ran.exit_code, ran.stderr
        assert f"Deployment {deployment_id} succeeded" in ran.stderr
        # Every chunk once, in order: the followed text is exactly the stored chunks' text.
        assert whole == ran.stdout
        assert "never reached the server" not in ran.stderr
    assert "following again after chunk" in direct_ran.stderr
    assert "following again after chunk" in cut_ran.stderr
    data = b"".join(p.read_bytes() for p in (live.tmp_path / "data").rglob("*") if p.is_file())
    assert MARKER.encode() not in data


def test_logs_follow__rendered_with_phases_and_the_end(live: Live) -> None:
    deployment_id = live.deploy_no_wait("rendered")

    followed = Follower.start(live.octl, deployment_id).wait()
    again = live.octl("logs", "-f", deployment_id)  # ended: the stored chunks, then the end at once

    assert 0 == followed.exit_code, followed.stderr
    assert "Creating...\n" in followed.stdout
    assert "\nApply complete! Resources: 2 added, 0 changed, 0 destroyed.\n" in followed.stdout
    assert f"(local-exec): {MARKER}\n" in followed.stdout
    assert not [line for line in followed.stdout.splitlines() if line.startswith("{")]
    phases = [
        line.removeprefix("Phase: ") for line in followed.stderr.splitlines() if line.startswith("Phase: ")
    ]
    assert ["init", "plan", "apply", "reporting"] == [p for p in phases if p not in ("queued", "launching")]
    assert 0 == again.exit_code
    assert followed.stdout == again.stdout


def test_logs__while_it_runs_prints_the_log_so_far(live: Live) -> None:
    """No "has no logs" while a deployment runs: `octl logs` prints what its runner streamed so far."""
    deployment_id = live.deploy_no_wait("so-far")
    follower = Follower.start(live.octl, deployment_id)
    assert follower.first_plan.wait(60), "".join(follower.stderr)

    so_far = live.octl("logs", deployment_id)
    status = _executing(live, deployment_id)["status"]
    follower.wait()

    assert 0 == so_far.exit_code, so_far.stderr
    assert "executing" == status
    assert ": Plan to create\n" in so_far.stdout
    assert "Apply complete!" not in so_far.stdout
    assert f"has no whole log yet: `octl logs -f {deployment_id}` follows it." in so_far.stderr


def test_logs_follow__failed_deployment_exits_1_with_terraforms_error(live: Live) -> None:
    _slow_module(live.stack, "exit 3")
    deployment_id = live.deploy_no_wait("failing")

    followed = Follower.start(live.octl, deployment_id).wait()

    assert 1 == followed.exit_code
    assert "│ Error: local-exec provisioner error" in followed.stdout
    assert f"Error: Deployment {deployment_id} failed: " in followed.stderr


def test_logs_follow__a_runner_that_streams_nothing_gives_its_whole_log(live: Live) -> None:
    """An upstream runner only puts the whole log at the end: followed, it is printed once it is there."""
    with httpx.Client(
        base_url=live.server.url, headers={"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}
    ) as admin:
        runner = admin.get(f"/orgs/{ORG}/runners/local").json()
        configuration = runner["runner_configuration"]
        configuration["job"]["environment"]["RUNNER_LOG_STREAM_MAX_BYTES"] = "0"
        patched = admin.patch(f"/orgs/{ORG}/runners/local", json={"runner_configuration": configuration})
        assert 200 == patched.status_code, patched.text
    deployment_id = live.deploy_no_wait("whole")

    followed = Follower.start(live.octl, deployment_id).wait()

    assert 0 == followed.exit_code, followed.stderr
    assert "\nApply complete! Resources: 2 added, 0 changed, 0 destroyed.\n" in followed.stdout
    assert "" == live.chunks_text(deployment_id)


def test_deploy__phases_and_progress_live_on_a_terminal_plain_lines_piped(live: Live) -> None:
    on_tty = on_terminal(
        live.octl, "deploy", "shop", "dev", str(live.manifest("tty")), "--yes", timeout_seconds=180
    )
    piped = live.octl("deploy", "shop", "dev", str(live.manifest("piped")), "--yes")

    assert 0 == on_tty.exit_code, on_tty.output
    # The live line, redrawn about ten times a second: its phase and counts as they changed (the provisioner
    # holds the apply). A phase shorter than a redraw (plan, with the engine session) may not be drawn.
    assert "Phase init (" in on_tty.output or "Phase plan (" in on_tty.output
    assert "Phase apply, 2 planned, 0 applied (" in on_tty.output
    assert "to complete:" not in on_tty.output  # the long piped form would wrap at 80 columns
    assert "succeeded after" in on_tty.output
    assert 0 == piped.exit_code, piped.output
    # Piped: one plain line per phase, in order.
    waits = [line for line in piped.stderr.splitlines() if line.startswith("Waiting for deployment")]
    phases = [re.sub(r"[, ].*", "", line.split(": ", 1)[1]) for line in waits if ": " in line]
    assert [p for p in phases if p not in ("queued", "launching")] == ["init", "plan", "apply", "reporting"]
    assert any("2 planned" in line for line in waits), waits
    assert "Cannot follow" not in piped.stderr


def test_deploy__show_logs_streams_the_rendered_log(live: Live) -> None:
    result = live.octl("deploy", "shop", "dev", str(live.manifest("shown")), "--yes", "--show-logs")

    assert 0 == result.exit_code, result.output
    stderr = result.stderr
    assert (
        stderr.index("Runner logs:")
        < stderr.index("Apply complete! Resources: 2 added")
        < stderr.index("succeeded after")
    )
    assert f"(local-exec): {MARKER}\n" in stderr


def test_get_deployment__phase_history_and_the_list_s_phase(live: Live) -> None:
    finished = live.octl("deploy", "shop", "dev", str(live.manifest("history")), "--yes")
    deployment_id = re.search(r"Deployment ([0-9a-f-]{36}) created", finished.stderr).group(1)  # type: ignore[union-attr]

    shown = live.octl("get", "deployment", deployment_id)
    as_json = live.octl("get", "deployment", deployment_id, "-o", "json")
    listed = live.octl("get", "deployments")

    assert 0 == shown.exit_code, shown.output
    table, history = shown.stdout.split("\n\n")
    assert "reporting" in table.splitlines()[1].split()
    rows = [line.split() for line in history.splitlines()]
    assert ["Phase", "StartedAt", "Took"] == rows[0]
    assert ["queued", "launching", "init", "plan", "apply", "reporting"] == [row[0] for row in rows[1:]]
    assert all(len(row) == 3 and row[2].endswith("s") for row in rows[1:])
    phases = yaml.safe_load(as_json.stdout)["phases"]
    assert [row[1] for row in rows[1:]] == [p["started_at"] for p in phases]
    header = listed.stdout.splitlines()[0].split()
    assert "reporting" == listed.stdout.splitlines()[1].split()[header.index("Phase")]
