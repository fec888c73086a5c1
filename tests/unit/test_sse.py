"""``client.sse``: server-sent events as the follow endpoint sends them."""

from __future__ import annotations

from orchestrator.client import sse


def test_parse__events_ids_comments_and_multi_line_data() -> None:
    lines = [
        ": keep-alive",
        "",
        "event: chunk",
        "id: 1",
        'data: {"seq": 1}',
        "",
        "event: phase",
        'data:{"phase": "plan"}',
        "",
        "data: first",
        "data: second",
        "retry: 1000",
        "",
        "event: end",
        'data: {"status": "succeeded"}',
    ]

    events = list(sse.parse(lines))

    assert [
        sse.ServerSentEvent(event="chunk", data='{"seq": 1}', id="1"),
        sse.ServerSentEvent(event="phase", data='{"phase": "plan"}', id="1"),
        sse.ServerSentEvent(event="message", data="first\nsecond", id="1"),
    ] == events  # the last event was cut off before its blank line: never dispatched
