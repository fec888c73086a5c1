"""The server's data directory is private: mode 0700, its SQLite database 0600 (the key file is made 0600
by ``secretbox``). Local runs may execute on the same host, as another user; none of this is theirs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import structlog
from sqlalchemy.engine import make_url

from orchestrator.secretbox import KEY_FILE_NAME

log = structlog.get_logger(__name__)

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def prepare(data_dir: Path) -> None:
    """Create the data dir (0700), or take group and other access away from an existing one and from
    its key file."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    _tighten(data_dir, PRIVATE_DIR_MODE)
    key_file = data_dir / KEY_FILE_NAME
    if key_file.exists():
        _tighten(key_file, PRIVATE_FILE_MODE)


def private_sqlite_file(database_url: str) -> None:
    """Create the SQLite database file of ``database_url`` (0600) before SQLite does (it would use the
    umask, usually 0644), or tighten an existing one; SQLite gives its journal files the same mode."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return
    path = Path(url.database)
    path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE_MODE))
    _tighten(path, PRIVATE_FILE_MODE)


def _tighten(path: Path, mode: int) -> None:
    current = stat.S_IMODE(path.stat().st_mode)
    if current & ~mode:
        log.warning("taking group and other access away", path=str(path), mode=oct(current))
        path.chmod(current & mode)
