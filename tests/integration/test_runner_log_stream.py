"""The runner's live log stream against a real HTTP server: ``tests/support/chunk_gateway.py``, the chunk
contract of ``protocol.log_stream`` served by uvicorn, with injected 503s, answers lost after the store
(dropped connections), a gateway without the route (404, 405), the deployment ended (410), other bytes
stored (409), a gateway down for a 100 MiB log, a dead and a black-holed gateway.

Then whole runs: ``po-runner standard`` (a process, the embedded engine) against the same gateway, and
``run_standard`` twice in one process (as a long-lived process would run deployments): phases in order, the
last chunk stored before the whole log and the results, nothing of a stream left after its run.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from orchestrator.client.gateway import RunnerGateway
from orchestrator.client.http import Backoff
from orchestrator.protocol import age
from orchestrator.protocol.launch import WarmOrder
from orchestrator.protocol.log_stream import ChunkPlaintext, Phase, decrypt_chunk
from orchestrator.runner import log_stream, logs, standard
from orchestrator.runner.gateway_client import GatewayClient, runner_retry
from orchestrator.runner.settings import RunnerSettings
from tests.support.chunk_gateway import ChunkGateway, StoredChunk, chunk_lines, decrypt_whole_log
from tests.support.live_server import serve_in_thread

TOKEN = "dep-token-Qw84mZr1LxT0"
DEPLOYMENT = "7a0d6c1e-1f7b-4a8e-9a43-2d7c51f0b6aa"
ENV_UUID = "0b9e8f7c-3a4d-4e5f-8a6b-7c8d9e0f1a2b"
RUNNER_BIN = Path(sys.executable).parent / "po-runner"
#: Retries within the test's patience (the runner's own backoff reaches 10 s).
FAST = Backoff(first_seconds=0.01, max_seconds=0.2)


@pytest.fixture
def keys() -> tuple[str, str]:
    return age.generate_identity()


@pytest.fixture
def gateway() -> ChunkGateway:
    return ChunkGateway(token=TOKEN)


@pytest.fixture
def url(gateway: ChunkGateway) -> Iterator[str]:
    with serve_in_thread(gateway) as base_url:
        yield base_url


def client(url: str, *, first_contact_seconds: float = 20.0, timeout_seconds: float = 30.0) -> GatewayClient:
    return GatewayClient(
        gateway=RunnerGateway(url=url, org_id="acme", runner_id="r1", timeout_seconds=timeout_seconds),
        token=SecretStr(TOKEN),
        retry=runner_retry(attempts=3, backoff_seconds=0.01),
        first_contact_seconds=first_contact_seconds,
    )


class Run:
    """A LogStream on a LogBuffer, as ``run_standard`` opens it, for one test."""

    def __init__(
        self,
        url: str,
        recipient: str,
        *,
        flush_seconds: float = 1.0,
        log_bytes: int = 1 << 20,
        spill_dir: str | None = None,
        first_contact_seconds: float = 20.0,
        attempt_seconds: float = log_stream.ATTEMPT_SECONDS,
    ) -> None:
        self.sink = logs.LogBuffer(max_bytes=log_bytes)
        self.log = logs.make_logger(self.sink, level="info", deployment_id=DEPLOYMENT)
        self.client = client(url, first_contact_seconds=first_contact_seconds)
        self.stream = log_stream.LogStream(
            gateway=self.client,
            env_uuid=ENV_UUID,
            deployment_id=DEPLOYMENT,
            recipient=recipient,
            log=self.log,
            max_bytes=1 << 30,
            backoff=FAST,
            flush_seconds=flush_seconds,
            spill_dir=spill_dir,
            attempt_seconds=attempt_seconds,
        )
        self.stream.open(self.sink)

    def end(self, drain_seconds: float = 30.0) -> None:
        self.stream.finish(drain_seconds=drain_seconds)
        self.stream.close()
        self.client.close()
        assert not self.stream.thread.is_alive()

    def lines(self) -> list[dict[str, Any]]:
        """The runner's own lines (JSON) in the log."""
        text = self.sink.getvalue().decode()
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def events(self) -> list[str]:
        return [line["event"] for line in self.lines()]


def own_lines(lines: list[str]) -> list[str]:
    """The test's lines among the stream's (the runner's own lines are JSON)."""
    return [line for line in lines if not line.startswith("{")]


def assert_in_order_once(gateway: ChunkGateway) -> None:
    """Stored 1, 2, ..., n in that order; each answered 202 once; none sent before the one before it was
    answered."""
    stored = gateway.stored_seqs()
    assert list(range(1, len(stored) + 1)) == stored
    answered = [seq for seq, status in gateway.puts if status == 202]
    assert stored == answered, "a chunk answered 202 was sent again, or one was sent before the one before"
    assert [seq for seq, _ in gateway.puts] == sorted(seq for seq, _ in gateway.puts)


def test_chunks_arrive_in_order_once_through_503s_and_lost_answers(
    gateway: ChunkGateway, url: str, keys: tuple[str, str]
) -> None:
    identity, recipient = keys
    gateway.unavailable, gateway.lose_answers = 3, 2
    run = Run(url, recipient, flush_seconds=0.01)
    written = ["init line"]
    run.sink.write_line(written[0])
    for phase in (Phase.PLAN, Phase.APPLY, Phase.REPORTING):
        run.stream.set_phase(phase)
        for number in range(1500):
            written.append(f"{phase.value} line {number} " + "p" * 80)
            run.sink.write_line(written[-1])

    run.end()

    assert_in_order_once(gateway)
    assert {503, None} <= {status for _, status in gateway.puts}, "the faults were not hit"
    chunks = gateway.decrypted(identity, DEPLOYMENT)
    assert written == own_lines(chunk_lines(chunks))
    phases = [chunk.phase for chunk in chunks]
    assert [Phase.INIT, Phase.PLAN, Phase.APPLY, Phase.REPORTING] == list(dict.fromkeys(phases))
    assert phases == sorted(phases, key=[Phase.INIT, Phase.PLAN, Phase.APPLY, Phase.REPORTING].index)
    assert [phase.value for phase in phases] == [gateway.chunks[seq].phase for seq in sorted(gateway.chunks)]
    assert "log stream: the runner gateway is unavailable; the chunks wait and are sent again" in run.events()


@pytest.mark.parametrize("status", [404, 405])
def test_a_gateway_without_the_route_turns_streaming_off_with_one_line(
    gateway: ChunkGateway, url: str, keys: tuple[str, str], status: int
) -> None:
    gateway.no_route = status
    run = Run(url, keys[1], flush_seconds=0.01)
    for number in range(2000):
        run.sink.write_line(f"line {number}")

    run.end()

    assert [(1, status)] == gateway.puts
    off = [event for event in run.events() if "live log chunks" in event]
    assert [
        f"the runner gateway does not take live log chunks ({status}): streaming is off for this run; "
        "the whole log is uploaded at the end"
    ] == off


def test_410_stops_the_stream(gateway: ChunkGateway, url: str, keys: tuple[str, str]) -> None:
    gateway.gone_after = 2
    run = Run(url, keys[1], flush_seconds=0.01)
    for number in range(3000):
        run.sink.write_line(f"line {number} " + "g" * 60)

    run.end()

    assert [1, 2] == gateway.stored_seqs()
    assert [(3, 410)] == [put for put in gateway.puts if put[0] > 2]
    assert "log stream: the deployment has ended (410); streaming stopped" in run.events()


def test_409_is_logged_and_the_next_chunk_goes_on(
    gateway: ChunkGateway, url: str, keys: tuple[str, str]
) -> None:
    identity, recipient = keys
    gateway.preload(2, b"other bytes")
    run = Run(url, recipient, flush_seconds=0.01)
    for number in range(3000):
        run.sink.write_line(f"line {number} " + "c" * 60)

    run.end()

    stored = gateway.stored_seqs()
    assert 2 not in stored and [1, 3, 4] == stored[:3]
    assert (2, 409) in gateway.puts
    conflicts = [line for line in run.lines() if "(409)" in line["event"]]
    assert [2] == [line["seq"] for line in conflicts]
    assert all(chunk.seq != 2 for chunk in gateway.decrypted(identity, DEPLOYMENT))


def test_a_100_mib_log_waits_on_disk_not_in_memory_and_is_delivered_whole(
    gateway: ChunkGateway, url: str, keys: tuple[str, str], tmp_path: Path
) -> None:
    """The gateway is down while the log is written: the queue keeps 1 MiB in memory, the rest waits
    encrypted in the spill file; then everything arrives, in order."""
    identity, recipient = keys
    line_count, pad = 100 * 1024, "m" * 1000  # about 100 MiB of text
    expected = {"next": 0, "chunks": 0}
    failures: list[str] = []

    def check(chunk: StoredChunk) -> None:  # in the server's thread, as each chunk is stored
        plain = decrypt_chunk(chunk.body, identity, deployment_id=DEPLOYMENT, seq=chunk.seq)
        for line in own_lines(plain.text.splitlines()):
            if line != f"{expected['next']} {pad}":
                failures.append(f"chunk {chunk.seq}: {line[:20]!r} where line {expected['next']} was due")
            expected["next"] += 1
        expected["chunks"] += 1

    gateway.on_store, gateway.keep_bodies = check, False
    gateway.down.set()
    run = Run(url, recipient, log_bytes=1024, spill_dir=str(tmp_path))

    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        for number in range(line_count):
            run.sink.write_line(f"{number} {pad}")
        grown = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    spilled, peak_queue = run.stream.spilled_chunks, run.stream.peak_memory_bytes
    gateway.down.clear()
    run.end(drain_seconds=60)

    assert [] == failures[:3]
    assert line_count == expected["next"]
    assert grown < 4 << 20, f"the runner's memory grew by {grown} bytes while 100 MiB were logged"
    assert peak_queue <= log_stream.QUEUE_MEMORY_BYTES
    assert spilled > 1000
    assert_in_order_once(gateway)
    assert [] == os.listdir(tmp_path), "the spill file is never visible"


def test_chunks_that_cannot_wait_on_disk_end_the_stream_with_a_notice(
    gateway: ChunkGateway, url: str, keys: tuple[str, str], tmp_path: Path
) -> None:
    """No spill file (its directory is gone): the chunk that would have gone there says the stream ends,
    under its own number; what was in memory is delivered."""
    identity, recipient = keys
    gateway.down.set()
    run = Run(url, recipient, spill_dir=str(tmp_path / "gone"), log_bytes=8 << 20)
    for number in range(3000):
        run.sink.write_line(f"line {number} " + "s" * 1000)
    gateway.down.clear()

    run.end()

    assert_in_order_once(gateway)
    chunks = gateway.decrypted(identity, DEPLOYMENT)
    assert chunks[-1].text.startswith(
        "[po-runner] log stream truncated: undelivered chunks could not be kept"
    )
    assert all(not chunk.text.startswith("[po-runner]") for chunk in chunks[:-1])
    assert "log stream: undelivered chunks could not be kept; the stream ends here" in run.events()


def test_a_dead_gateway_ends_the_drain(gateway: ChunkGateway, url: str, keys: tuple[str, str]) -> None:
    """The gateway took the first chunks, then went down for good: the end of the run gives up on the rest
    after the drain time, saying so, and leaves no thread behind."""
    run = Run(url, keys[1], flush_seconds=0.01)
    run.sink.write_line("first")
    while not gateway.stored_seqs():
        threading.Event().wait(0.01)
    gateway.down.set()
    for number in range(500):
        run.sink.write_line(f"line {number} " + "d" * 200)

    run.end(drain_seconds=0.5)

    [given_up] = [e for e in run.lines() if e["event"].startswith("log stream: chunks not delivered")]
    assert given_up["chunks"] >= 1 and given_up["first_seq"] == 2
    assert [1] == gateway.stored_seqs()


def test_a_gateway_that_stops_answering_ends_the_drain_and_the_thread(
    gateway: ChunkGateway, url: str, keys: tuple[str, str]
) -> None:
    """The gateway took the first chunk, then answers nothing (connections held): each attempt waits its
    bound, the end of the run gives up after the drain time, and no thread is left."""
    run = Run(url, keys[1], flush_seconds=0.01, attempt_seconds=0.5)
    run.sink.write_line("first")
    while not gateway.stored_seqs():
        threading.Event().wait(0.01)
    gateway.black_hole.set()
    try:
        for number in range(100):
            run.sink.write_line(f"line {number}")
        while len(gateway.puts) < 3:  # attempts time out and are made again
            threading.Event().wait(0.01)

        run.end(drain_seconds=0.5)
    finally:
        gateway.release.set()

    [given_up] = [e for e in run.lines() if e["event"].startswith("log stream: chunks not delivered")]
    assert 2 == given_up["first_seq"]
    assert {(2, None)} == set(gateway.puts[1:])


def test_a_gateway_never_reached_stops_the_stream_after_the_first_contact_window(
    keys: tuple[str, str],
) -> None:
    """A black hole (connections accepted, never answered): the stream stops with the gateway client's
    first contact window, as every other request of the run does."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        url = f"http://127.0.0.1:{hole.getsockname()[1]}"
        run = Run(url, keys[1], flush_seconds=0.01, first_contact_seconds=1.0)
        for number in range(100):
            run.sink.write_line(f"line {number}")
        while run.stream.thread.is_alive():
            run.stream.thread.join(0.1)
        run.end(drain_seconds=30)

    [stopped] = [e for e in run.events() if e.startswith("log stream: the runner gateway refused a chunk")]
    assert "no answer from the runner gateway for 1 s" in stopped
    assert run.client.unreachable


# Whole runs.


def make_bundle(main_tf: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = main_tf.encode()
        info = tarfile.TarInfo("main.tf")
        info.size, info.mode = len(data), 0o644
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def module(state: Path) -> str:
    return f"""
terraform {{
  backend "local" {{
    path = "{state}"
  }}
}}

resource "terraform_data" "first" {{
  input = "hello"
}}

output "leak" {{
  value = "{TOKEN}"
}}
"""


def runner_environ(url: str, tmp_path: Path, *, mode: str, recipient: str, **extra: str) -> dict[str, str]:
    config = tmp_path / "terraformrc"
    config.touch()
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "TF_CLI_CONFIG_FILE": str(config),
        "CHECKPOINT_DISABLE": "1",
        "IAC_BACKEND": "embedded",
        "IAC_CODE_DIR": str(tmp_path / f"code-{mode}"),
        "ORG_ID": "acme",
        "RUNNER_ID": "r1",
        "DEPLOYMENT_ID": DEPLOYMENT,
        "DEPLOYMENT_ENV_UUID": ENV_UUID,
        "MODE": mode,
        "TOKEN": TOKEN,
        "RUNNER_GATEWAY_URL": url,
        "ENCRYPTING_LOGS_KEY": recipient,
        "RUNNER_HTTP_BACKOFF_SECONDS": "0.05",
        # The code under test, where the tests run from a source tree.
        **{name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ},
        **extra,
    }


def run_runner(url: str, tmp_path: Path, *, mode: str, recipient: str) -> subprocess.CompletedProcess[str]:
    environ = runner_environ(url, tmp_path, mode=mode, recipient=recipient)
    return subprocess.run(
        [str(RUNNER_BIN), "standard"], env=environ, capture_output=True, text=True, timeout=100, check=False
    )


def assert_streamed_before_the_results(
    gateway: ChunkGateway, chunks: list[ChunkPlaintext], identity: str
) -> None:
    """Every chunk stored before the whole log and the results; the chunks' lines are the whole log's first
    lines, in order (the lines after the stream's end: uploading the log, reporting)."""
    kinds = [kind for kind, _ in gateway.events]
    assert ["logs", "results"] == kinds[-2:] and {"chunk"} == set(kinds[:-2])
    streamed = chunk_lines(chunks)
    whole = decrypt_whole_log(gateway.whole_log, identity).splitlines()
    assert streamed == whole[: len(streamed)]
    # The stream's own lines (an outage of the chunks) may come at any time, even in the last chunk.
    events = [str(json.loads(line).get("event")) for line in streamed]
    assert "reporting the deployment" == [e for e in events if not e.startswith("log stream:")][-1]
    assert Phase.REPORTING == chunks[-1].phase


@pytest.mark.parametrize(
    ("mode", "phases"),
    [
        ("deploy", [Phase.INIT, Phase.PLAN, Phase.APPLY, Phase.REPORTING]),
        ("destroy", [Phase.INIT, Phase.PLAN, Phase.DESTROY, Phase.REPORTING]),
        ("plan_only", [Phase.INIT, Phase.PLAN, Phase.REPORTING]),
    ],
)
def test_a_run_streams_its_phases_and_ends_the_stream_before_the_results(
    gateway: ChunkGateway, url: str, keys: tuple[str, str], tmp_path: Path, mode: str, phases: list[Phase]
) -> None:
    identity, recipient = keys
    gateway.bundle = make_bundle(module(tmp_path / "state" / "terraform.tfstate"))
    gateway.unavailable, gateway.lose_answers = 2, 1

    done = run_runner(url, tmp_path, mode=mode, recipient=recipient)

    assert 0 == done.returncode, done.stderr + done.stdout
    assert_in_order_once(gateway)
    chunks = gateway.decrypted(identity, DEPLOYMENT)
    assert phases == list(dict.fromkeys(chunk.phase for chunk in chunks))
    assert_streamed_before_the_results(gateway, chunks, identity)
    text = "".join(chunk.text for chunk in chunks)
    summary = '"type":"change_summary"'
    assert summary in text and '"operation":"plan"' in text
    if mode != "plan_only":
        last_plan = max(i for i, chunk in enumerate(chunks) if chunk.phase == Phase.PLAN)
        assert '"operation":"plan"' in chunks[last_plan].text.splitlines()[-1], (
            "the plan ends with its summary"
        )
        applied = "".join(chunk.text for chunk in chunks if chunk.phase in (Phase.APPLY, Phase.DESTROY))
        assert f'"operation":"{"apply" if mode == "deploy" else "destroy"}"' in applied
    assert TOKEN not in text
    assert all(TOKEN.encode() not in stored.body for stored in gateway.chunks.values())


def test_a_warm_runner_streams_as_a_cold_one(
    gateway: ChunkGateway, url: str, keys: tuple[str, str], tmp_path: Path
) -> None:
    """``po-runner warm`` (the local launcher's warm pool): its order on stdin, then the run as ``standard``,
    its log streamed the same."""
    identity, recipient = keys
    gateway.bundle = make_bundle(module(tmp_path / "s.tfstate"))
    environ = runner_environ(url, tmp_path, mode="deploy", recipient=recipient)
    order = WarmOrder(environ=environ, cwd=str(tmp_path)).encode()
    started: dict[str, str] = {name: environ[name] for name in ("PATH", "PYTHONPATH") if name in environ}

    done = subprocess.run(
        [str(RUNNER_BIN), "warm"], input=order, env=started, capture_output=True, timeout=100, check=False
    )

    assert 0 == done.returncode, done.stderr.decode()
    assert_in_order_once(gateway)
    chunks = gateway.decrypted(identity, DEPLOYMENT)
    assert [Phase.INIT, Phase.PLAN, Phase.APPLY, Phase.REPORTING] == list(
        dict.fromkeys(c.phase for c in chunks)
    )
    assert_streamed_before_the_results(gateway, chunks, identity)


def test_a_run_on_a_gateway_without_the_route_is_as_before(
    gateway: ChunkGateway, url: str, keys: tuple[str, str], tmp_path: Path
) -> None:
    identity, recipient = keys
    gateway.bundle = make_bundle(module(tmp_path / "s.tfstate"))
    gateway.no_route = 404

    done = run_runner(url, tmp_path, mode="deploy", recipient=recipient)

    assert 0 == done.returncode, done.stderr + done.stdout
    assert [(1, 404)] == gateway.puts
    whole = decrypt_whole_log(gateway.whole_log, identity)
    assert 1 == whole.count("does not take live log chunks (404)")
    assert '"operation":"apply"' in whole
    assert gateway.results is not None and "success" == gateway.results["status"]


def test_a_run_told_not_to_stream_sends_no_chunk(
    gateway: ChunkGateway, url: str, keys: tuple[str, str], tmp_path: Path
) -> None:
    identity, recipient = keys
    gateway.bundle = make_bundle(module(tmp_path / "s.tfstate"))
    environ = runner_environ(
        url, tmp_path, mode="deploy", recipient=recipient, RUNNER_LOG_STREAM_MAX_BYTES="0"
    )

    done = subprocess.run(
        [str(RUNNER_BIN), "standard"], env=environ, capture_output=True, text=True, timeout=100, check=False
    )

    assert 0 == done.returncode, done.stderr + done.stdout
    assert [] == gateway.puts
    assert "live log streaming is off" in decrypt_whole_log(gateway.whole_log, identity)


def test_runs_in_one_process_leave_nothing_of_their_stream_behind(
    gateway: ChunkGateway, url: str, keys: tuple[str, str], tmp_path: Path
) -> None:
    """``run_standard`` twice in one process: after each run no stream thread is left, and the second run's
    chunks are its own (numbered from 1, its deployment inside)."""
    identity, recipient = keys
    gateway.bundle = make_bundle(module(tmp_path / "s.tfstate"))
    stored_by_run: list[list[int]] = []
    for mode in ("deploy", "destroy"):
        environ = runner_environ(url, tmp_path, mode=mode, recipient=recipient)
        settings = RunnerSettings.model_validate({key.lower(): value for key, value in environ.items()})
        gateway.chunks.clear()
        gateway.digests.clear()
        gateway.events.clear()

        outcome = standard.run_standard(settings, environ=environ, echo=None)

        assert 0 == outcome.exit_code
        assert [] == [t for t in threading.enumerate() if t.name == log_stream.THREAD_NAME]
        chunks = gateway.decrypted(identity, DEPLOYMENT)
        assert_streamed_before_the_results(gateway, chunks, identity)
        stored_by_run.append(gateway.stored_seqs())
    assert all(seqs[0] == 1 for seqs in stored_by_run)
    assert [] == [name for name in os.listdir(tmp_path) if name.startswith(".po-log-stream")]
