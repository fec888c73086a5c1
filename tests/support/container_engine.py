"""A stand-in for the ``docker`` / ``podman`` command line (not Docker): what the ``vm`` runner over SSH calls
on the machine for ``runtime: docker``, so its container scripts run for real without a container engine.

``install_engine(directory, name)`` writes an executable ``<directory>/<name>`` (put ``directory`` on the
run's PATH). It keeps its containers in ``<directory>/containers/<name>/`` and understands the commands the
launcher uses, as the real CLI answers them:

- ``run -d --name N [--network host] [--label L] [-e NAME]... IMAGE ARGS...``: starts the "container"
  detached, in a session of its own: this checkout's runner (``python -m orchestrator.cli.runner ARGS``)
  with, as its environment, the client's value of each ``-e NAME`` (a ``-e NAME=value`` is refused, exit
  125: the launcher must never put a value on a command line). Prints the container id.
- ``container inspect --format F N``: ``{{.State.Running}}``, ``{{.State.Status}}`` and
  ``{{.State.ExitCode}}`` in F; exit 1 for no such container.
- ``logs [--tail N] N``: the container's stdout to stdout, its stderr to stderr.
- ``stop [-t S] N``: SIGTERM, SIGKILL after S seconds; ``rm [-f] N``: removes it (killing it with -f).

- ``version`` and ``info``: answer as an engine whose daemon runs, unless ``<directory>/daemon-down`` exists:
  then these and ``run`` fail as the real CLI does without a daemon ("Cannot connect to the Docker daemon
  at unix:///var/run/docker.sock ...", ``run`` adding "Run 'docker run --help' for more information").

Each ``run`` also appends its argv to ``<directory>/runs.log``, for tests to check what the command line
held. Stand-ins differ from the real thing: no image, no isolation, no restart policies.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

__all__ = ["install_engine"]

_SOURCE = r"""
import json, os, signal, subprocess, sys, time, uuid
from pathlib import Path

HOME = Path(__file__).resolve().parent
CONTAINERS = HOME / "containers"
RUNNER = PYTHON


def fail(message, code=1):
    print(f"Error: {message}", file=sys.stderr)
    sys.exit(code)


def box(name):
    return CONTAINERS / name


def started(pid):
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split())
    except OSError:
        return None


def running(name):
    try:
        pid, since = (box(name) / "pid").read_text().split()
    except (OSError, ValueError):
        return False
    fields = started(int(pid))
    return fields is not None and fields[0] != "Z" and fields[19] == since


def state(name):
    if running(name):
        return "running", 0
    try:
        return "exited", int((box(name) / "exit_code").read_text())
    except (OSError, ValueError):
        return "created", 0


DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


def daemon_down():
    return (HOME / "daemon-down").exists()


def version(args):
    if daemon_down():
        fail(DOWN)
    print("27.0.0")


def run(args):
    with (HOME / "runs.log").open("a") as log:
        log.write(json.dumps(sys.argv[1:]) + "\n")
    if daemon_down():
        print(f"docker: {DOWN}", file=sys.stderr)
        print("Run 'docker run --help' for more information", file=sys.stderr)
        sys.exit(125)
    name, names, i = None, [], 0
    while i < len(args) and args[i].startswith("-"):
        flag = args[i]
        if flag == "-d":
            i += 1
            continue
        value = args[i + 1]
        if flag == "--name":
            name = value
        elif flag == "-e":
            if "=" in value:
                fail(f"refusing a value on the command line: -e {value.split('=')[0]}=...", 125)
            names.append(value)
        i += 2
    image, command = args[i], args[i + 1 :]
    if name is None or box(name).exists():
        fail(f"the container name {name!r} is already in use", 125)
    box(name).mkdir(parents=True)
    (box(name) / "config.json").write_text(json.dumps({"image": image, "names": names, "args": command}))
    env = {n: os.environ[n] for n in names if n in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    subprocess.Popen(
        [sys.executable, __file__, "_supervise", name, *command],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    for _ in range(100):
        if (box(name) / "pid").exists():
            break
        time.sleep(0.05)
    print(uuid.uuid4().hex)


def supervise(name, command):
    with open(box(name) / "stdout", "wb") as out, open(box(name) / "stderr", "wb") as err:
        child = subprocess.Popen([RUNNER, "-m", "orchestrator.cli.runner", *command], stdout=out, stderr=err)
        (box(name) / "pid.new").write_text(f"{child.pid} {started(child.pid)[19]}")
        os.replace(box(name) / "pid.new", box(name) / "pid")
        signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
        code = child.wait()
    (box(name) / "exit_code").write_text(str(code if code >= 0 else 128 - code))


def inspect(args):
    fmt = args[args.index("--format") + 1] if "--format" in args else "{{.State.Status}}"
    name = args[-1]
    if not box(name).exists():
        fail(f"No such container: {name}")
    status, code = state(name)
    print(
        fmt.replace("{{.State.Running}}", "true" if status == "running" else "false")
        .replace("{{.State.Status}}", status)
        .replace("{{.State.ExitCode}}", str(code))
    )


def signal_container(name, signum):
    if running(name):
        pid = int((box(name) / "pid").read_text().split()[0])
        os.kill(pid, signum)


def stop(args):
    grace = int(args[args.index("-t") + 1]) if "-t" in args else 10
    name = args[-1]
    if not box(name).exists():
        fail(f"No such container: {name}")
    signal_container(name, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while running(name) and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_container(name, signal.SIGKILL)
    while running(name):
        time.sleep(0.05)
    print(name)


def remove(args):
    name = args[-1]
    if not box(name).exists():
        fail(f"No such container: {name}")
    if running(name):
        if "-f" not in args:
            fail(f"container {name} is running", 1)
        signal_container(name, signal.SIGKILL)
        while running(name):
            time.sleep(0.05)
    for path in sorted(box(name).iterdir()):
        path.unlink()
    box(name).rmdir()
    print(name)


def logs(args):
    tail = int(args[args.index("--tail") + 1]) if "--tail" in args else None
    name = args[-1]
    if not box(name).exists():
        fail(f"No such container: {name}")
    for stream, target in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        lines = (box(name) / stream).read_text(errors="replace").splitlines(keepends=True)
        target.write("".join(lines[-tail:] if tail else lines))


def main():
    args = sys.argv[1:]
    if args[:1] == ["_supervise"]:
        return supervise(args[1], args[2:])
    if args[:2] == ["container", "inspect"]:
        return inspect(args[2:])
    commands = {"run": run, "stop": stop, "rm": remove, "logs": logs, "version": version, "info": version}
    if not args or args[0] not in commands:
        fail(f"unknown command: {args[:1]}", 125)
    commands[args[0]](args[1:])


main()
"""


def install_engine(directory: Path, name: str = "docker") -> Path:
    """Write the stand-in CLI as ``<directory>/<name>``; its runner is this Python's (this checkout's)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    source = _SOURCE.replace("PYTHON", repr(sys.executable), 1)
    path.write_text(f"#!{sys.executable}\n{source}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
