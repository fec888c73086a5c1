"""Server-sent events (``text/event-stream``) read line by line, as the WHATWG HTML standard parses them.

Only what a client of ``GET .../logs?follow=true`` needs: ``event``, ``data`` (several lines joined by
newlines), ``id``; comment lines (``: keep-alive``) and ``retry`` are skipped. An event is dispatched at
the blank line that ends it; one cut off by a dropped connection is never dispatched.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ServerSentEvent:
    #: ``message`` when the server named none.
    event: str
    data: str
    #: The event's ``id`` (the last one seen in the stream, as the standard says), or None.
    id: str | None


def parse(lines: Iterable[str]) -> Iterator[ServerSentEvent]:
    """The events of a stream given as lines (without their line ends)."""
    event, last_id = "", None
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield ServerSentEvent(event=event or "message", data="\n".join(data), id=last_id)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            last_id = value
