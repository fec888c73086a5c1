"""A directory or file nobody can write to, not even root: for tests of a read-only data dir.

``chmod`` stops other users only; as root (as CI runs) the directory is made immutable (``chattr +i``,
which root may do with CAP_LINUX_IMMUTABLE on ext4, xfs, btrfs and tmpfs). The result is probed by writing;
where neither works the test is skipped, or fails where tools are required (CI).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


def _writable(path: Path) -> bool:
    if path.is_file():
        try:
            with open(path, "ab"):
                return True
        except OSError:
            return False
    probe = path / f".probe-{uuid.uuid4().hex}"
    try:
        probe.mkdir()
    except OSError:
        return False
    probe.rmdir()
    return True


def _chattr(flag: str, path: Path) -> bool:
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    result = subprocess.run([chattr, flag, str(path)], capture_output=True, check=False)
    return result.returncode == 0


@contextlib.contextmanager
def read_only(path: Path, *, required: bool) -> Iterator[Path]:
    """``path`` (a directory, created if missing, or a file) read-only for the block; writable again
    afterwards."""
    if not path.is_file():
        path.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode
    immutable = os.geteuid() == 0 and _chattr("+i", path)
    if not immutable:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        if _writable(path):
            message = f"cannot make {path} read-only here (root without chattr +i)"
            if required:
                pytest.fail(message)
            pytest.skip(message)
        yield path
    finally:
        if immutable:
            _chattr("-i", path)
        path.chmod(mode)
