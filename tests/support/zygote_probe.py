"""A zygote whose children report what they became instead of running a deployment, for the tests of
``launchers.zygote``: ``python -m tests.support.zygote_probe`` with the channel as its stdin, as the local
launcher starts ``po-runner zygote``. Each child writes ``report()`` as JSON to ``$PROBE_REPORT`` (created
exclusively), waits until ``$PROBE_WAIT`` exists if that is set, and exits with ``$PROBE_EXIT`` (0).

``python -m tests.support.zygote_probe --fresh`` writes the same report from a fresh interpreter (no
zygote): what a cold runner's process looks like.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import signal
import socket
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.launchers import zygote

#: ``prctl`` option that reads whether the process is dumpable.
PR_GET_DUMPABLE = 3


def report() -> dict[str, Any]:
    """What this process is: session, user, files, environment, signals, random state, cgroup."""
    open_fds = []
    for fd in range(3, 1024):
        try:
            os.fstat(fd)
        except OSError:
            continue
        open_fds.append(fd)
    umask = os.umask(0o077)
    os.umask(umask)
    with open("/proc/self/cgroup") as cgroup:
        line = next((entry.strip() for entry in cgroup if entry.startswith("0::")), "")
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "pgid": os.getpgid(0),
        "uids": list(os.getresuid()),
        "gids": list(os.getresgid()),
        "groups": os.getgroups(),
        "umask": umask,
        "cwd": os.getcwd(),
        "environ": dict(os.environ),
        "proc_environ": _proc_environ(),
        "open_fds": open_fds,
        "signals": {
            signal.Signals(signum).name: repr(signal.getsignal(signum))
            for signum in sorted(signal.valid_signals())
            if signum in set(signal.Signals)
        },
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "random": random.getrandbits(64),
        "ssl_random": ssl.RAND_bytes(16).hex(),
        "cgroup": line,
        "dumpable": ctypes.CDLL(None).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0),
        "argv": sys.argv,
        "tempdir": tempfile.gettempdir(),
    }


def _proc_environ() -> str | None:
    """What ``/proc/self/environ`` shows (None: unreadable, as for a non-dumpable process not root's)."""
    try:
        return Path("/proc/self/environ").read_bytes().decode(errors="replace")
    except OSError:
        return None


def memory_holds(pid: int, needle: bytes) -> bool:
    """Whether ``needle`` is anywhere in the readable memory of process ``pid`` (root: a non-dumpable
    process's ``/proc/<pid>/mem`` is root's)."""
    tail = len(needle) - 1
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(value, 16) for value in fields[0].split("-"))
            carry = b""
            while start < end:
                size = min(end - start, 1 << 22)
                try:
                    mem.seek(start)
                    chunk = mem.read(size)
                except OSError:
                    break
                if needle in carry + chunk:
                    return True
                carry = chunk[-tail:] if tail else b""
                start += size
    return False


def _child() -> None:
    found = report()
    fd = os.open(os.environ["PROBE_REPORT"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w") as out:
        json.dump(found, out)
    wait = os.environ.get("PROBE_WAIT")
    deadline = time.monotonic() + 120
    while wait and not os.path.exists(wait) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))


def main() -> None:
    if sys.argv[1:] == ["--fresh"]:
        json.dump(report(), sys.stdout)
        return
    channel = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    zygote.not_dumpable()
    sys.exit(zygote.serve(channel, _child))


if __name__ == "__main__":
    main()
