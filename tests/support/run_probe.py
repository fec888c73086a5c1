"""A probe of run isolation, as an attacker would write it: a process a run's ``local-exec`` starts in a
session of its own (``setsid nohup``), which then looks at every process of another uid (its environment,
working directory, open files, memory) and at every environment it can read for a marker, writing each
success as a JSON line to ``<found>/probe.jsonl``. ``<found>/probe.pid`` holds its pid, ``probe.alive`` its
last round, ``probe.uids`` the uids of every process it saw. It runs until it is killed, or for two minutes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

#: The probe's program: ``python probe.py FOUND MARKER [FILE...]`` (each FILE it also tries to read).
PROBE = r"""
import json, os, sys, time
found, marker, deadline = sys.argv[1], sys.argv[2].encode(), time.time() + 120
me = os.getuid()
with open(f"{found}/probe.pid", "w") as pid_file:
    pid_file.write(str(os.getpid()))
def note(**what):
    with open(f"{found}/probe.jsonl", "a") as out:
        out.write(json.dumps(what) + "\n")
seen = set()
uids = set()
while time.time() < deadline:
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        base = f"/proc/{name}"
        try:
            with open(f"{base}/status") as status:
                uid = next(int(l.split()[1]) for l in status if l.startswith("Uid:"))
        except Exception:
            continue
        uids.add(uid)
        try:
            with open(f"{base}/environ", "rb") as environ:
                data = environ.read()
            if marker in data and (name, "marker") not in seen:
                seen.add((name, "marker"))
                note(pid=int(name), uid=uid, what="marker in environ")
            if uid != me and (name, "environ") not in seen:
                seen.add((name, "environ"))
                note(pid=int(name), uid=uid, what="environ")
        except OSError:
            pass
        if uid == me:
            continue
        for what, probe in (
            ("cwd", lambda: os.readlink(f"{base}/cwd")),
            ("fd", lambda: os.listdir(f"{base}/fd")),
            ("mem", lambda: os.close(os.open(f"{base}/mem", os.O_RDWR))),
        ):
            if (name, what) in seen:
                continue
            try:
                detail = probe()
            except OSError:
                continue
            seen.add((name, what))
            note(pid=int(name), uid=uid, what=what, detail=str(detail))
    for path in sys.argv[3:]:
        try:
            with open(path, "rb") as readable:
                data = readable.read()
        except OSError:
            continue
        if (path, "file") not in seen:
            seen.add((path, "file"))
            note(path=path, what="file read", marker=marker in data)
    with open(f"{found}/probe.uids.new", "w") as uids_file:
        uids_file.write(" ".join(map(str, sorted(uids))))
    os.replace(f"{found}/probe.uids.new", f"{found}/probe.uids")
    with open(f"{found}/probe.alive", "w") as alive:
        alive.write(str(time.time()))
    time.sleep(0.1)
"""


def findings(found: Path) -> list[dict[str, Any]]:
    """What the probe could see (empty: nothing)."""
    path = found / "probe.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def uids_seen(found: Path) -> set[int]:
    """The uids of every process the probe saw (``probe.uids``): it was looking while they lived."""
    path = found / "probe.uids"
    return {int(uid) for uid in path.read_text().split()} if path.exists() else set()


def wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.1)


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
