"""Following a real deployment's live log (issue 22) the way any client can: a raw server-sent events
client (:class:`SseFollower`, httpx streaming, ``event:``/``id:``/``data:`` parsed by hand), a module that
prints a marker string in the middle of its apply and then waits (:class:`MarkerModule`), and a grep of
everything the orchestrator stored (:class:`StoredBytes`: the database's bytes and the object store's
files) for that marker.

The marker never appears in what the orchestrator is given: the module's code holds it with a ``_``
between each character of its random part and the shell removes them when the resource is created, so
only the run's output (Terraform's, streamed in encrypted chunks) holds the marker itself. Found anywhere
in storage, it came from the log in clear.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
import yaml

from orchestrator.protocol import log_stream
from orchestrator.protocol.log_stream import ChunkPlaintext
from orchestrator.store import db
from tests.support.stack import EXAMPLES, Stack

#: How long a wait for a follower's events lasts before the test fails (a run reaches its apply in a few
#: seconds; well within the tests' timeout, 120 s, so that a failure says what did not come).
WAIT_SECONDS = 60.0
#: How long the marker's resource waits for its release at most (then it ends anyway: no run outlives a
#: failed test by more).
RELEASE_BOUND_SECONDS = 90

# --- the follower ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SseEvent:
    """One server-sent event: its ``event:`` name, ``id:`` (or None) and ``data:`` parsed as JSON."""

    name: str
    id: str | None
    data: dict[str, Any]


@dataclass
class SseFollower:
    """``GET <url>`` read as server-sent events in a thread of its own: every event in ``events`` in the
    order it came, ``error`` if the stream failed, ``done`` once it closed. Comment lines (``: keep-alive``)
    are skipped; an event is dispatched at its blank line, its ``data:`` lines joined (the SSE format)."""

    url: str
    headers: dict[str, str]
    events: list[SseEvent] = field(default_factory=list)
    status_code: int | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    _arrived: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> SseFollower:
        threading.Thread(target=self._run, name="sse-follower", daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            with httpx.stream("GET", self.url, headers=self.headers, timeout=WAIT_SECONDS) as response:
                self.status_code = response.status_code
                if response.status_code != 200:
                    response.read()
                    raise AssertionError(f"follow answered {response.status_code}: {response.text}")
                name, event_id, data = "", None, list[str]()  # the event being read
                for line in response.iter_lines():
                    if line.startswith(":"):
                        continue
                    if line == "":
                        if data:
                            self._add(SseEvent(name or "message", event_id, json.loads("\n".join(data))))
                        name, event_id, data = "", None, []
                        continue
                    key, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if key == "event":
                        name = value
                    elif key == "id":
                        event_id = value
                    elif key == "data":
                        data.append(value)
        except BaseException as exc:  # reported to the test
            self.error = exc
        finally:
            self.done.set()
            with self._arrived:
                self._arrived.notify_all()

    def _add(self, event: SseEvent) -> None:
        with self._arrived:
            self.events.append(event)
            self._arrived.notify_all()

    def wait_for(self, found: Callable[[list[SseEvent]], bool], what: str) -> list[SseEvent]:
        """The events so far, once ``found`` holds for them; fails naming ``what`` if the stream ends or
        ``WAIT_SECONDS`` pass first."""
        with self._arrived:
            ok = self._arrived.wait_for(lambda: found(self.events) or self.done.is_set(), WAIT_SECONDS)
            events = list(self.events)
        if not ok or not found(events):
            raise AssertionError(f"no {what} (stream ended: {self.done.is_set()}, {self.error!r}): {events}")
        return events

    def wait_done(self) -> list[SseEvent]:
        assert self.done.wait(WAIT_SECONDS), f"the stream did not end: {self.events}"
        assert self.error is None, repr(self.error)
        return list(self.events)

    def named(self, name: str) -> list[SseEvent]:
        return [event for event in self.events if event.name == name]


def follow(stack: Stack, deployment_id: str) -> SseFollower:
    """A follower of the deployment's logs (``?follow=true``) with the stack's token, started."""
    url = f"{stack.client.base_url}/orgs/{stack.org}/deployments/{deployment_id}/logs?follow=true"
    return SseFollower(url, {"Authorization": stack.client.headers["Authorization"]}).start()


def decrypt(event: SseEvent, identity: str, deployment_id: str) -> ChunkPlaintext:
    """A ``chunk`` event's plaintext (checked to be that deployment's chunk of that number)."""
    assert log_stream.SSE_CHUNK == event.name, event
    return log_stream.decrypt_chunk(
        event.data["ciphertext"], identity, deployment_id=deployment_id, seq=int(event.data["seq"])
    )


# --- the marker module ----------------------------------------------------------------------------------

DEMO_MODULE: dict[str, Any] = yaml.safe_load((EXAMPLES / "module.yaml").read_text())


@dataclass(frozen=True)
class MarkerModule:
    """The demo module (examples/demo) whose ``terraform_data.app`` prints ``marker`` while it is created,
    then waits until ``release()`` (at most ``RELEASE_BOUND_SECONDS``). ``directory`` is readable by every
    user (a run may be another uid's), the release file in it is named by a random id of its own."""

    marker: str
    directory: Path
    release_file: Path

    @classmethod
    def new(cls) -> MarkerModule:
        directory = Path(tempfile.mkdtemp(prefix="po-live-marker-"))
        directory.chmod(0o755)
        return cls(
            marker=f"LIVE-MARKER-{uuid.uuid4().hex}",
            directory=directory,
            release_file=directory / f"release-{uuid.uuid4().hex}",
        )

    def code(self) -> str:
        prefix, _, secret = self.marker.rpartition("-")
        hidden = "_".join(secret)  # the shell's `tr -d _` makes it the marker again
        command = (
            f"echo {prefix}-$(echo {hidden} | tr -d _); "
            f"for i in $(seq {RELEASE_BOUND_SECONDS * 10}); do [ -e {self.release_file} ] && exit 0; "
            "sleep 0.1; done"
        )
        assert self.marker not in command
        source: str = DEMO_MODULE["module_source_code"]
        anchor = "    bucket = terraform_data.bucket.output\n  }\n"
        assert anchor in source
        return source.replace(
            anchor, f'{anchor}  provisioner "local-exec" {{\n    command = "{command}"\n  }}\n'
        )

    def install(self, stack: Stack) -> None:
        """The stack's ``demo-app`` module becomes this one."""
        patched = stack.client.patch(
            f"/orgs/{stack.org}/modules/demo-app", json={"module_source_code": self.code()}
        )
        assert 200 == patched.status_code, patched.text

    def release(self) -> None:
        self.release_file.touch()
        self.release_file.chmod(0o644)

    def remove(self) -> None:
        for path in self.directory.iterdir():
            path.unlink()
        self.directory.rmdir()


# --- the grep -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredBytes:
    """Everything the orchestrator stored, read once: ``(place, bytes)`` for the SQLite database's files
    (its main file, journal and WAL), or each PostgreSQL table's rows cast to text, and every file under
    the data directory (the object store, ``<data dir>/objects``, and the rest)."""

    places: list[tuple[str, bytes]]

    @classmethod
    def read(cls, database_url: str, data_dir: Path) -> StoredBytes:
        places: list[tuple[str, bytes]] = []
        if database_url.startswith("sqlite"):
            database = Path(database_url.split("///", 1)[1])
            for path in sorted(database.parent.glob(database.name + "*")):
                places.append((str(path), path.read_bytes()))
        else:
            places += asyncio.run(_postgres_tables(database_url))
        for root, _, files in os.walk(data_dir):
            for name in sorted(files):
                path = Path(root) / name
                places.append((str(path), path.read_bytes()))
        return cls(places)

    def where(self, needle: bytes) -> list[str]:
        """The places holding ``needle``: its bytes, or its hex (PostgreSQL shows ``bytea`` as ``\\x...``
        in a row's text), or its base64 at any of the three alignments."""
        forms = [needle, needle.hex().encode(), *_base64_forms(needle)]
        return [place for place, data in self.places if any(form in data for form in forms)]


def _base64_forms(needle: bytes) -> list[bytes]:
    """What every base64 text containing ``needle`` holds, whatever its offset (the bytes of the full
    groups, for each of the three offsets)."""
    forms = []
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + needle)
        # Drop the groups touched by the padding bytes in front and the partial group at the end.
        start = 4 * ((offset + 2) // 3)
        end = 4 * ((offset + len(needle)) // 3)
        if end - start >= 16:
            forms.append(encoded[start:end])
    return forms


async def _postgres_tables(database_url: str) -> list[tuple[str, bytes]]:
    engine = db.create_engine(database_url)
    try:
        async with engine.connect() as conn:
            names = (
                await conn.execute(
                    sa.text(
                        "SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' "
                        "ORDER BY table_name"
                    )
                )
            ).scalars()
            found = []
            for name in list(names):
                quoted = '"' + name.replace('"', '""') + '"'
                rows = (await conn.execute(sa.text(f"SELECT t::text FROM {quoted} AS t"))).scalars()
                found.append((f"table {name}", "\n".join(rows).encode()))
            return found
    finally:
        await engine.dispose()
