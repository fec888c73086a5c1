"""Inline module code checked with Terraform's own parser before it is stored.

A module whose ``module_source_code`` does not parse used to be accepted and to fail only at its first
deployment, in the runner, naming no line. ``check_syntax`` runs ``po-terraform fmt -no-color -`` (the
embedded engine this installation ships, beside its Python) on the code: ``fmt`` parses the HCL and
nothing else (no providers, no network, nothing of the code is evaluated), in about 0.1 s. The first error
diagnostic becomes a 422 naming the field, the line and Terraform's own words.

Where the engine is not installed (``po-terraform`` missing, or its exit code 127: no ``engine`` extra),
or it does not answer within ``TIMEOUT_SECONDS``, the code is stored unchecked, as before: the check
never refuses code for a reason of its own. Syntax is all it checks: OpenTofu and Terraform share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Final

import structlog

from orchestrator.errors import InvalidInputError

log = structlog.get_logger(__name__)

#: The embedded engine's command line, installed beside this Python (``[project.scripts]``).
ENGINE: Final = Path(sys.executable).parent / "po-terraform"
#: How long a check may take before the code is stored unchecked.
TIMEOUT_SECONDS: Final = 20.0
#: The exit code of ``po-terraform`` without the engine (the ``engine`` extra not installed).
ENGINE_MISSING: Final = 127
_ERROR: Final = re.compile(r"^Error: (?P<summary>.+)$", re.MULTILINE)
_WHERE: Final = re.compile(r"^\s+on <stdin> line (?P<line>\d+)", re.MULTILINE)
#: Longest diagnostic detail quoted in the answer.
_MAX_DETAIL: Final = 500


def first_error(stderr: str) -> str | None:
    """``line N: <summary>: <detail>`` of the first error diagnostic ``fmt`` printed, or None."""
    found = _ERROR.search(stderr)
    if found is None:
        return None
    block = stderr[found.end() :]
    following = _ERROR.search(block)
    if following is not None:
        block = block[: following.start()]
    where = _WHERE.search(block)
    # The detail is the last paragraph of the block: after the source snippet.
    paragraphs = [p.strip() for p in block.strip().split("\n\n") if p.strip()]
    detail = " ".join(paragraphs[-1].split()) if len(paragraphs) > 1 else ""
    if len(detail) > _MAX_DETAIL:
        detail = detail[: _MAX_DETAIL - 3] + "..."
    place = f"line {where.group('line')}: " if where else ""
    return f"{place}{found.group('summary').strip()}" + (f": {detail}" if detail else "")


async def check_syntax(code: str, *, field: str = "module_source_code") -> None:
    """Raise InvalidInputError naming ``field`` and the line when ``code`` is not valid HCL."""
    if not ENGINE.exists():
        return
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CHECKPOINT_DISABLE": "1",
        "TF_CLI_CONFIG_FILE": os.devnull,
    }
    process = await asyncio.create_subprocess_exec(
        str(ENGINE),
        "fmt",
        "-no-color",
        "-",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=environment,
    )
    try:
        _, stderr = await asyncio.wait_for(process.communicate(code.encode()), TIMEOUT_SECONDS)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        log.warning("inline module code left unchecked: the engine did not answer in time")
        return
    if process.returncode in (0, ENGINE_MISSING):
        return
    problem = first_error(stderr.decode(errors="replace"))
    if problem is None:
        log.warning("inline module code left unchecked: the engine failed", exit_code=process.returncode)
        return
    raise InvalidInputError(f"{field}: does not parse as Terraform code: {problem}")
