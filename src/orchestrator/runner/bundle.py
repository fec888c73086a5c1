"""Unpacking a deployment bundle (tar.gz) safely into the code directory.

A bundle is produced by our own dispatcher, but it crosses the network and lands in customer
infrastructure, so it is treated as hostile: every member is checked before anything is written.
Refused: absolute names, ``..`` components, links pointing outside the directory (or anywhere, for
hard links outside the archive), device files and FIFOs, and archives expanding past a size cap.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from orchestrator import errors

#: Largest total size of the unpacked files.
MAX_EXTRACTED_BYTES = 512 * 1024 * 1024
#: The file every bundle must contain at its root.
MAIN_FILE = "main.tf"


class BundleError(errors.InvalidInputError):
    """The deployment bundle is not a valid, safe tar.gz archive."""


def extract_bundle(data: bytes, destination: Path) -> list[str]:
    """Unpack ``data`` into ``destination`` (created if needed); return the member names.

    Raises ``BundleError`` before writing anything when a member is unsafe.
    """
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members = archive.getmembers()
            _check_members(members)
            destination.mkdir(parents=True, exist_ok=True)
            if hasattr(tarfile, "data_filter"):
                # Belt and braces: the stdlib "data" filter repeats the path checks at write time.
                archive.extractall(destination, members=members, filter="data")
            else:  # pragma: no cover - Python 3.11.0-3.11.3 only
                archive.extractall(destination, members=members)
    except BundleError:
        raise
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise BundleError(f"cannot unpack the deployment bundle: {exc}") from exc
    return [member.name for member in members]


def _check_members(members: list[tarfile.TarInfo]) -> None:
    total = 0
    for member in members:
        name = _safe_relative(member.name, what="member")
        if member.isdev() or not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise BundleError(f"bundle member {member.name!r} is not a regular file, directory or link")
        if member.issym():
            if posixpath.isabs(member.linkname):
                raise BundleError(f"bundle link {member.name!r} points to an absolute path")
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
            _safe_relative(target, what=f"target of link {member.name!r}")
        if member.islnk():
            _safe_relative(member.linkname, what=f"target of hard link {member.name!r}")
        total += max(member.size, 0)
        if total > MAX_EXTRACTED_BYTES:
            raise BundleError(f"bundle expands past {MAX_EXTRACTED_BYTES} bytes")


def _safe_relative(name: str, *, what: str) -> str:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or name.startswith("\\") or ":" in path.parts[0]:
        raise BundleError(f"bundle {what} {name!r} is an absolute path")
    if ".." in path.parts or any("\\" in part for part in path.parts):
        raise BundleError(f"bundle {what} {name!r} escapes the code directory")
    return str(path)
