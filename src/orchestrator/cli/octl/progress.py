"""Progress while ``octl`` waits for a deployment, on stderr.

On a terminal it is one live status line: a spinner, the message and the time elapsed, redrawn several
times a second by rich while the main thread is blocked in a long poll. Anywhere else (a pipe, a CI log)
it is one plain line per poll, so logs stay readable and nothing is redrawn.
"""

from __future__ import annotations

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

    def __init__(self, message: str, elapsed: Callable[[], float]) -> None:
        self.message = message
        self.elapsed = elapsed

    def __rich__(self) -> Text:
        return Text(f"{self.message} ({format_duration(self.elapsed())})")


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
            self._status = self.console.status(_Elapsed(self.message, self.elapsed), spinner="dots")
            self._status.start()
        return self

    def poll(self) -> None:
        """Called before each long poll: a plain line when not live (the live line redraws itself)."""
        if not self.live:
            line = f"{self.message} ({format_duration(self.elapsed())})"
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
