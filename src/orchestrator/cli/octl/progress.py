"""Progress while ``octl`` waits for a deployment, on stderr (``DeployProgress``: with its phase and its
resource changes so far, from its live log).

On a terminal it is one live status line: a spinner, the message and the time elapsed, redrawn several
times a second by rich while the main thread is blocked in a long poll. Anywhere else (a pipe, a CI log)
it is one plain line per poll, so logs stay readable and nothing is redrawn.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.status import Status
from rich.text import Text


def format_duration(seconds: float) -> str:
    """``7s``, ``1m05s``, ``2h00m03s``: whole seconds, as a person reads them."""
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class _Elapsed:
    """The status text, rendered afresh on every refresh so the elapsed time keeps counting."""

    def __init__(self, progress: WaitProgress) -> None:
        self.progress = progress

    def __rich__(self) -> Text:
        return Text(self.progress.line())


class WaitProgress:
    """A context manager showing ``message`` with the time elapsed since ``started`` (a monotonic time)."""

    def __init__(
        self,
        message: str,
        *,
        console: Console,
        started: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.message = message
        self.console = console
        self.clock = clock
        self.started = clock() if started is None else started
        self._status: Status | None = None

    @property
    def live(self) -> bool:
        """Whether this is the redrawn status line (stderr is a terminal)."""
        return self.console.is_terminal

    def elapsed(self) -> float:
        return self.clock() - self.started

    def __enter__(self) -> WaitProgress:
        if self.live:
            self._status = self.console.status(_Elapsed(self), spinner="dots")
            self._status.start()
        return self

    def line(self) -> str:
        """The progress line as it reads now."""
        return f"{self.message} ({format_duration(self.elapsed())})"

    def poll(self) -> None:
        """Called before each long poll: a plain line when not live (the live line redraws itself)."""
        if not self.live:
            self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


class DeployProgress(WaitProgress):
    """``octl deploy``'s progress: the deployment's phase and how many resource changes its plan has and
    its apply made so far, counted from the decrypted log (``planned_change`` and ``apply_complete``
    lines). Live on a terminal; elsewhere one plain line whenever the phase changes."""

    def __init__(
        self,
        deployment_id: str,
        *,
        console: Console,
        started: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            f"Waiting for deployment {deployment_id} to complete",
            console=console,
            started=started,
            clock=clock,
        )
        self.phase: str | None = None
        self.planned: set[str] = set()
        self.applied: set[str] = set()

    def line(self) -> str:
        """Piped: ``Waiting for deployment ID to complete: apply, 2 planned, 0 applied (12s)``; on a
        terminal, where the id was printed just above, short enough for 80 columns: ``Phase apply, 2
        planned, 0 applied (12s)``."""
        counts = f", {len(self.planned)} planned, {len(self.applied)} applied" if self.planned else ""
        elapsed = format_duration(self.elapsed())
        if not self.live:
            return f"{self.message}{f': {self.phase}' if self.phase else ''}{counts} ({elapsed})"
        if self.phase is None:
            return f"Waiting for the deployment to start ({elapsed})"
        return f"Phase {self.phase}{counts} ({elapsed})"

    def set_phase(self, phase: str) -> None:
        if phase == self.phase:
            return
        self.phase = phase
        self.poll()

    def feed(self, text: str) -> None:
        """Count the resource changes in a piece of the decrypted log (Terraform's ``-json`` lines)."""
        for line in text.splitlines():
            if not line.startswith("{") or (
                '"planned_change"' not in line and '"apply_complete"' not in line
            ):
                continue
            try:
                document = json.loads(line)
            except ValueError:
                continue
            kind = document.get("type") if isinstance(document, dict) else None
            target = document.get("change" if kind == "planned_change" else "hook") if kind else None
            if not isinstance(target, dict):
                continue
            address = str((target.get("resource") or {}).get("addr"))
            if kind == "planned_change" and target.get("action") not in ("noop", "read"):
                self.planned.add(address)
            elif kind == "apply_complete":
                self.applied.add(address)

    def print(self, text: str) -> None:
        """Text above the live line (or plainly, when not live)."""
        self.console.print(Text(text), end="", markup=False, highlight=False, soft_wrap=True)
