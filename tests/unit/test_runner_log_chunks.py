"""How the runner cuts its log into live chunks (``runner.log_stream.Chunker``) and what ``LogBuffer`` hands
the stream: time, size and phase cuts, lines too long for a chunk, quotes and control characters that grow in
the chunk's JSON, the stream's cap, redaction."""

from __future__ import annotations

import json

import pytest

from orchestrator.protocol import age
from orchestrator.protocol.log_stream import (
    FLUSH_SECONDS,
    MAX_CHUNK_TEXT_BYTES,
    MAX_CHUNK_UPLOAD_BYTES,
    Phase,
    decrypt_chunk,
    encrypt_chunk,
)
from orchestrator.runner import diagnostics, logs
from orchestrator.runner.log_stream import FIRST_LINE_SECONDS, Chunker, Piece

BIG = 1 << 40
DEPLOYMENT = "3f1c1a52-5d0e-4a57-9a6b-0c2f8f7d9e10"


def lines_of(pieces: list[Piece]) -> list[str]:
    return "".join(piece.text for piece in pieces).splitlines(keepends=True)


def upload_size(piece: Piece, seq: int = 1) -> int:
    _identity, recipient = age.generate_identity()
    return len(encrypt_chunk(DEPLOYMENT, seq, piece.phase, piece.text, recipient))


def test_the_first_line_of_a_phase_is_due_at_once_later_chunks_a_flush_after_the_chunk_before() -> None:
    chunker = Chunker(max_bytes=BIG)

    assert [] == chunker.add("starting\n", 100.0)
    assert 100.0 == chunker.due_at
    assert [Piece(Phase.INIT, "starting\n")] == chunker.cut(100.0)
    assert chunker.due_at is None

    chunker.add("one\n", 100.25)
    assert 100.0 + FLUSH_SECONDS == chunker.due_at, "a flush after the last cut"
    chunker.add("two\n", 100.75)
    assert 100.0 + FLUSH_SECONDS == chunker.due_at, "the first line of a chunk sets when it is due"
    assert [Piece(Phase.INIT, "one\ntwo\n")] == chunker.cut(101.0)
    assert [] == chunker.cut(101.0)

    chunker.add("steady\n", 101.1)
    assert 101.0 + FLUSH_SECONDS == chunker.due_at, "a steady log: a chunk a second"


def test_the_first_line_after_a_quiet_while_is_due_soon() -> None:
    chunker = Chunker(max_bytes=BIG)
    chunker.add("starting\n", 100.0)
    chunker.cut(100.0)

    chunker.add("after a pause\n", 105.0)
    assert 105.0 + FIRST_LINE_SECONDS == chunker.due_at
    chunker.add("and another\n", 105.1)
    assert 105.0 + FIRST_LINE_SECONDS == chunker.due_at
    assert [Piece(Phase.INIT, "after a pause\nand another\n")] == chunker.cut(105.0 + FIRST_LINE_SECONDS)

    chunker.add("soon after\n", 105.5)
    assert 105.0 + FIRST_LINE_SECONDS + FLUSH_SECONDS == chunker.due_at, "never two chunks within a flush"
    chunker.cut(106.25)
    chunker.add("a bit later\n", 106.9)
    assert 106.25 + FLUSH_SECONDS == chunker.due_at
    assert FIRST_LINE_SECONDS < FLUSH_SECONDS


def test_a_chunk_is_cut_before_its_text_passes_the_size_limit() -> None:
    chunker = Chunker(max_bytes=BIG)
    line = "x" * 999 + "\n"

    cut: list[Piece] = []
    for _ in range(200):
        cut.extend(chunker.add(line, 0.0))
    cut.extend(chunker.cut())

    assert [MAX_CHUNK_TEXT_BYTES // 1000] * 3 == [len(piece.text) // 1000 for piece in cut[:3]]
    assert all(len(piece.text.encode()) <= MAX_CHUNK_TEXT_BYTES for piece in cut)
    assert [line] * 200 == lines_of(cut)


def test_quotes_and_control_characters_are_cut_by_their_size_in_the_chunks_json() -> None:
    """Terraform's JSON lines are full of quotes, each escaped in the chunk: the upload stays under the
    gateway's limit whatever the text holds."""
    chunker = Chunker(max_bytes=BIG)
    quotes = '"' * 40_000 + "\n"  # 40 KB of text, 80 KB in the chunk's JSON
    controls = "\x01" * 30_000 + "\n"  # 30 KB of text, 180 KB in the chunk's JSON: split

    cut = [*chunker.add(quotes, 0.0), *chunker.add(quotes, 0.0), *chunker.add(controls, 0.0), *chunker.cut()]

    assert [quotes, quotes, controls] == lines_of(cut)
    assert len(cut) >= 4
    assert all(upload_size(piece) <= MAX_CHUNK_UPLOAD_BYTES for piece in cut)


def test_a_line_longer_than_a_chunk_is_split_and_joins_again() -> None:
    chunker = Chunker(max_bytes=BIG)
    ascii_line = "a" * (3 * MAX_CHUNK_TEXT_BYTES + 10) + "\n"
    accented = "é" * MAX_CHUNK_TEXT_BYTES + "\n"  # two bytes each in UTF-8: split at characters

    cut = [*chunker.add("before\n", 0.0), *chunker.add(ascii_line, 0.0), *chunker.add(accented, 0.0)]
    cut += chunker.cut()

    assert ["before\n", ascii_line, accented] == lines_of(cut)
    assert "before\n" == cut[0].text, "the pending chunk is cut before the long line"
    assert all(len(piece.text.encode()) <= MAX_CHUNK_TEXT_BYTES for piece in cut)
    assert not cut[1].text.endswith("\n"), "a piece of a line ends its chunk without a newline"
    assert all(upload_size(piece) <= MAX_CHUNK_UPLOAD_BYTES for piece in cut)


def test_a_phase_change_cuts_the_chunk_and_the_new_phase_goes_out_at_once() -> None:
    chunker = Chunker(max_bytes=BIG)
    chunker.add("init line\n", 0.0)
    chunker.cut()
    chunker.add("more init\n", 1.0)

    assert [Piece(Phase.INIT, "more init\n")] == chunker.set_phase(Phase.PLAN)
    assert [] == chunker.set_phase(Phase.PLAN)
    chunker.add("planning\n", 5.0)
    assert 5.0 == chunker.due_at
    assert [Piece(Phase.PLAN, "planning\n")] == chunker.cut()
    assert [] == chunker.set_phase(Phase.APPLY), "nothing pending: nothing to cut"


def test_the_plan_summary_ends_the_plan_phase_of_an_apply() -> None:
    summary = json.dumps(
        {"@message": "Plan: 1 to add", "type": "change_summary", "changes": {"add": 1, "operation": "plan"}}
    )
    applied = json.dumps({"type": "change_summary", "changes": {"add": 1, "operation": "apply"}})
    chunker = Chunker(max_bytes=BIG, phase=Phase.PLAN)
    chunker.switch_after(diagnostics.is_plan_summary, Phase.APPLY)

    cut = [*chunker.add('{"type":"planned_change"}\n', 0.0), *chunker.add(applied + "\n", 0.0)]
    assert [] == cut, "an apply's summary is not a plan's"
    cut = [*chunker.add(summary + "\n", 0.0), *chunker.add('{"type":"apply_start"}\n', 0.0), *chunker.cut()]

    assert [Phase.PLAN, Phase.APPLY] == [piece.phase for piece in cut]
    assert cut[0].text.endswith(summary + "\n")
    assert '{"type":"apply_start"}\n' == cut[1].text
    assert not diagnostics.is_plan_summary("change_summary is not JSON")


def test_past_the_cap_a_last_chunk_says_the_stream_was_truncated() -> None:
    chunker = Chunker(max_bytes=5000)
    line = "y" * 999 + "\n"

    cut: list[Piece] = []
    for _ in range(5):
        cut.extend(chunker.add(line, 0.0))
    assert [] == cut
    cut = chunker.add(line, 0.0)

    assert [line] * 5 == lines_of(cut[:1])
    assert [
        Piece(Phase.INIT, "[po-runner] log stream truncated at 5000 bytes: later lines are not streamed\n")
    ] == (cut[1:])
    assert chunker.truncated
    assert [] == chunker.add("more\n", 0.0)
    assert [] == chunker.set_phase(Phase.PLAN)
    assert [] == chunker.cut()


def test_the_chunk_plaintext_names_its_deployment_seq_and_phase() -> None:
    identity, recipient = age.generate_identity()
    ciphertext = encrypt_chunk(DEPLOYMENT, 7, Phase.APPLY, "a line\n", recipient)

    chunk = decrypt_chunk(ciphertext, identity, deployment_id=DEPLOYMENT, seq=7)

    assert (7, Phase.APPLY, "a line\n") == (chunk.seq, chunk.phase, chunk.text)
    with pytest.raises(age.AgeDecryptError, match="moved"):
        decrypt_chunk(ciphertext, identity, deployment_id=DEPLOYMENT, seq=8)


def test_log_buffer_hands_its_listener_redacted_lines_past_its_own_cap() -> None:
    sink = logs.LogBuffer(max_bytes=1024, secrets=["s3cr3t-token"])
    sink.write_line("kept before the listener: s3cr3t-token")
    heard: list[str] = []

    sink.attach(heard.append)
    for number in range(40):
        sink.write_line(f"line {number} " + "z" * 40)
    sink.write_line("the token s3cr3t-token again")

    assert "kept before the listener: [REDACTED]\n" == heard[0], "the lines kept so far come first"
    assert 42 == len(heard), "the stream has every line, the whole log's cap notwithstanding"
    assert sink.truncated
    assert "the token [REDACTED] again\n" == heard[-1]
    assert not any("s3cr3t-token" in line for line in heard)
    sink.detach()
    sink.write_line("after")
    assert 42 == len(heard)


def test_a_listener_that_fails_is_detached_and_the_log_goes_on() -> None:
    sink = logs.LogBuffer(max_bytes=1 << 20)
    calls: list[str] = []

    def broken(line: str) -> None:
        calls.append(line)
        raise RuntimeError("bug")

    sink.attach(broken)
    sink.write_line("one")
    sink.write_line("two")

    assert ["one\n"] == calls
    assert b"one\ntwo\n" == sink.getvalue()
