"""The examples of the docs site (docs/**/*.md), for the tests that run them.

Every fenced block whose language is one of ``CHECKED`` (commands, YAML, HCL, JSON, Dockerfiles) carries a
marker on the line before it (a blank line between is allowed), invisible on the site:

    <!-- example: get-started/octl-deploy -->

    ```sh
    octl deploy shop dev manifest.yaml
    ```

A test takes the block's text with ``docs_example("get-started/octl-deploy")`` and runs or applies it;
tests/unit/test_docs_examples.py fails when a checked block has no marker, when two blocks share a name,
and when no test asks for a block's name (it reads the tests' ``docs_example("...")`` calls). Output shown as
it was printed is fenced ``text`` and needs no marker. ``Shell`` runs command blocks as a user types them.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import ssl
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: Fence languages whose blocks must be run or applied by a test.
CHECKED = frozenset(
    {"sh", "bash", "shell", "console", "yaml", "yml", "hcl", "terraform", "json", "dockerfile"}
)
#: Fence languages that are not examples: output as printed, diagrams.
UNCHECKED = frozenset({"text"})
MARKER = re.compile(r"^\s*<!-- example: ([a-z0-9][a-z0-9./_-]*) -->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([^\s`{]*)")


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its language, text (the fence's indentation removed), the line of its
    opening fence (1-based) and the name of its marker, if any."""

    page: Path
    line: int
    language: str
    text: str
    name: str | None

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending: str | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        marker = MARKER.match(line)
        if marker:
            pending = marker.group(1)
            index += 1
            continue
        opening = FENCE.match(line)
        if opening:
            indent, fence, language = opening.groups()
            first = index + 1
            body: list[str] = []
            index += 1
            while index < len(lines) and not lines[index].strip().startswith(fence):
                text = lines[index]
                body.append(text[len(indent) :] if text.startswith(indent) else text.lstrip())
                index += 1
            found.append(Block(page, first, language.lower(), "\n".join(body) + "\n", pending))
            pending = None
        elif line.strip():
            pending = None
        index += 1
    return found


def markers(page: Path) -> list[str]:
    """The names of the markers of ``page`` outside fenced blocks (one inside a block is text)."""
    found: list[str] = []
    fence: str | None = None
    for line in page.read_text(encoding="utf-8").splitlines():
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(2)
        elif fence is not None and line.strip().startswith(fence) and not line.strip()[len(fence) :].strip():
            fence = None
        elif fence is None and (marker := MARKER.match(line)):
            found.append(marker.group(1))
    return found


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


@cache
def examples() -> dict[str, Block]:
    """Every named block of the docs, by name (a second block of the same name is an error)."""
    named: dict[str, Block] = {}
    for page in pages():
        for block in blocks(page):
            if block.name is None:
                continue
            if block.name in named:
                raise AssertionError(
                    f"two examples named {block.name}: {named[block.name].where()}, {block.where()}"
                )
            named[block.name] = block
    return named


def docs_example(name: str) -> str:
    """The text of the docs' example ``name`` (see the module's docstring)."""
    found = examples().get(name)
    if found is None:
        raise AssertionError(
            f"no example named {name} in docs/ (a marker <!-- example: {name} --> before a block)"
        )
    return found.text


def commands(text: str) -> list[str]:
    """The commands of a shell block: comments and blank lines dropped, continued lines joined; a comment
    after a command is kept (the shell ignores it)."""
    joined: list[str] = []
    current = ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        joined.append(current + line)
        current = ""
    if current:
        joined.append(current)
    return joined


@dataclass
class Shell:
    """Runs the docs' commands in bash as a user types them in one terminal: each ``run`` is one bash
    process, and what it exports (``export``, ``cd``) is carried to the next. ``start`` runs a command in
    the background (a server, an agent), as in a second terminal; ``stop`` ends it by its process group."""

    cwd: Path
    env: dict[str, str]
    #: A directory of the test's where the shell keeps its exported variables and working directory.
    state: Path
    timeout: float = 300
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def run(
        self, script: str, *, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        state = self.state / "shell"
        wrapped = (
            "set -eo pipefail\n"
            f"{script}\n"
            f"export -p > {shlex.quote(f'{state}.env')}; pwd > {shlex.quote(f'{state}.pwd')}\n"
        )
        done = subprocess.run(
            ["bash", "-c", wrapped],
            cwd=self._pwd(),
            env=self.env,
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            timeout=self.timeout,
        )
        if check:
            assert 0 == done.returncode, (
                f"{script}\nexit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
            )
        self._load(state)
        return done

    def _pwd(self) -> Path:
        saved = self.state / "shell.pwd"
        return Path(saved.read_text().strip()) if saved.exists() else self.cwd

    def _load(self, state: Path) -> None:
        exported = Path(f"{state}.env")
        if not exported.exists():
            return
        values = subprocess.run(
            ["bash", "-c", f"source {shlex.quote(str(exported))} 2>/dev/null; env -0"],
            env={},
            capture_output=True,
            check=True,
        ).stdout
        env = {}
        for entry in values.split(b"\0"):
            if b"=" in entry:
                key, _, value = entry.partition(b"=")
                env[key.decode()] = value.decode(errors="surrogateescape")
        for noise in ("PWD", "OLDPWD", "SHLVL", "_"):
            env.pop(noise, None)
        self.env = env

    def start(self, command: str, *, log: Path) -> subprocess.Popen[str]:
        """``command`` in the background, its output to ``log``, in a process group of its own."""
        with log.open("w") as out:
            process = subprocess.Popen(
                ["bash", "-c", command],
                cwd=self._pwd(),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        self.started.append(process)
        return process

    def stop(self, process: subprocess.Popen[str] | None = None, *, sig: int = signal.SIGTERM) -> None:
        for running in [process] if process is not None else list(self.started):
            if running.poll() is None:
                try:
                    os.killpg(running.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    running.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(running.pid, signal.SIGKILL)
                    running.wait(timeout=10)
            if running in self.started:
                self.started.remove(running)


def wait_for(
    url: str, *, timeout: float = 60, log: Path | None = None, verify: bool | ssl.SSLContext = True
) -> None:
    """Until ``url`` answers 200 (a server the docs started)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout} s" + (f"\n{log.read_text()}" if log else ""))


def substitute(text: str, replacements: Mapping[str, str]) -> str:
    """``text`` with each placeholder of ``replacements`` replaced (a path of the docs by a temporary one,
    an example host by the test's server): the commands stay those of the docs otherwise."""
    for old, new in replacements.items():
        assert old in text, f"the example no longer holds {old!r}: update the test with the docs"
        text = text.replace(old, new)
    return text
