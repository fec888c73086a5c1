"""Driving ``octl`` against a live server: the in-process runner and the server with its own public URL.

The server is the real app under uvicorn (``serve_in_thread``), built once its port is bound, so that
``public_url`` (the URL runners call back: bundle, state, results, logs) is the server itself.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import click
import structlog
from click.testing import CliRunner, Result

from orchestrator.cli.octl import main
from orchestrator.client.api import ApiClient
from orchestrator.protocol import age
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.live_server import serve_in_thread
from tests.support.orgs import BOOTSTRAP_TOKEN

ORG = "acme"
#: The installed console script, next to the interpreter running the tests.
OCTL_EXECUTABLE = Path(sys.executable).with_name("octl")


@dataclass
class Octl:
    """Runs ``octl`` in-process with PO_API_URL/PO_AUTH_TOKEN/PO_ORG_ID set for the org's admin token."""

    base_url: str
    token: str
    config_path: Path
    env: dict[str, str | None] = field(default_factory=dict)

    def __call__(self, *args: str, input: str | None = None, **env: str | None) -> Result:
        environ: dict[str, str | None] = {
            "PO_API_URL": self.base_url,
            "PO_AUTH_TOKEN": self.token,
            "PO_ORG_ID": ORG,
            "OCTL_CONFIG": str(self.config_path),
            "OCTL_KEYS_DIR": str(self.config_path.parent / "keys"),
            **self.env,
            **env,
        }
        return CliRunner().invoke(main, list(args), input=input, env=environ, catch_exceptions=False)


@dataclass(frozen=True)
class Ran:
    """A finished ``octl`` process."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@dataclass
class OctlProcess(Octl):
    """Runs the installed ``octl`` as a process: nothing else writes to its stdout (an in-process server
    logs to the test's own), and it is the program users run."""

    timeout_seconds: float = 300.0

    def __call__(self, *args: str, input: str | None = None, **env: str | None) -> Ran:  # type: ignore[override]
        environ = {
            **os.environ,
            "PO_API_URL": self.base_url,
            "PO_AUTH_TOKEN": self.token,
            "PO_ORG_ID": ORG,
            "OCTL_CONFIG": str(self.config_path),
            "OCTL_KEYS_DIR": str(self.config_path.parent / "keys"),
        }
        for name, value in {**self.env, **env}.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
        done = subprocess.run(
            [str(OCTL_EXECUTABLE), *args],
            input=input if input is not None else "",
            capture_output=True,
            text=True,
            env=environ,
            timeout=self.timeout_seconds,
        )
        return Ran(exit_code=done.returncode, stdout=done.stdout, stderr=done.stderr)


def on_terminal(
    octl: Octl, *args: str, columns: int = 80, timeout_seconds: float = 120.0, **env: str | None
) -> Ran:
    """The installed ``octl`` with a pseudo-terminal of ``columns`` columns as its stdin, stdout and stderr
    (both streams are in ``stdout``, its line ends made ``\\n``); colours off (NO_COLOR)."""
    main, secondary = os.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    environ = {
        **os.environ,
        "PO_API_URL": octl.base_url,
        "PO_AUTH_TOKEN": octl.token,
        "PO_ORG_ID": ORG,
        "OCTL_CONFIG": str(octl.config_path),
        "OCTL_KEYS_DIR": str(octl.config_path.parent / "keys"),
        "NO_COLOR": "1",
        "TERM": "xterm",
    }
    environ.pop("COLUMNS", None)
    environ.pop("LINES", None)
    for name, value in {**octl.env, **env}.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    process = subprocess.Popen(
        [str(OCTL_EXECUTABLE), *args], stdin=secondary, stdout=secondary, stderr=secondary, env=environ
    )
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + timeout_seconds
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # the process ended and closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif process.poll() is not None:
                break
        exit_code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        os.close(main)
    text = seen.decode(errors="replace").replace("\r\n", "\n")
    return Ran(exit_code=exit_code, stdout=text, stderr=text)


@contextmanager
def serve(settings: ServerSettings, **overrides: object) -> Iterator[str]:
    """The whole server (API, gateway, dispatcher) on a free port, ``public_url`` pointing at it."""

    def build(base_url: str) -> object:
        return create_app(settings.model_copy(update={"public_url": base_url, **overrides}))

    # The server's log lines go to stderr: on stdout, which CliRunner swaps while octl runs, a line the
    # server logs meanwhile (a dispatcher's, in its thread) would land in octl's captured output. (The
    # tests' autouse fixture puts structlog back as it was after each test.)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.__stderr__))
    with serve_in_thread(factory=build) as base_url:
        yield base_url


def org_admin_token(base_url: str) -> str:
    """Create organization ``acme`` and answer an admin token of it (made with the bootstrap token)."""
    with ApiClient(base_url, BOOTSTRAP_TOKEN) as platform:
        platform.create_org(ORG)
        return str(platform.create_token(ORG, {"role": "admin", "description": "octl tests"})["token"])


def leaf_commands(group: click.Group | None = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The command lines (``("get", "runners")``...) of every leaf command of ``octl``, found by walking
    its click groups, so a command added later is covered without a test naming it."""
    group = group or main
    for name in sorted(group.commands):
        command = group.commands[name]
        if isinstance(command, click.Group):
            yield from leaf_commands(command, (*path, name))
        else:
            yield (*path, name)


def command_of(path: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def sample_args(path: tuple[str, ...], files: Path) -> list[str]:
    """Arguments that get ``path`` past its own checks to the API: a value of the right type for each
    argument and required option, a body for the commands that send one, ``--yes`` where asked for, a
    key where one is read."""
    command = command_of(path)
    args = list(path)
    for param in command.params:
        if isinstance(param, click.Argument):
            if isinstance(param.type, click.types.UUIDParameterType):
                args.append(str(uuid.uuid4()))
            elif isinstance(param.type, click.types.IntParamType):
                args.append("1")
            elif param.name == "source":
                manifest = files / "manifest.yaml"
                manifest.write_text("workloads: {}\n")
                args.append(str(manifest))
            elif param.required:
                args.append("sample")
        elif isinstance(param, click.Option) and param.required:
            if isinstance(param.type, click.Choice):
                args += [param.opts[0], str(param.type.choices[0])]
            elif isinstance(param.type, click.File | click.Path):
                sample = files / "sample.txt"
                sample.write_text("sample\n")
                args += [param.opts[0], str(sample)]
            else:
                args += [param.opts[0], "sample"]
    names = {param.name for param in command.params}
    if "sets" in names:
        args += ["--set", "description=sample"]
    if "yes" in names:
        args.append("--yes")
    if "key" in names:
        args += ["--key", age.generate_identity()[0]]
    return args
