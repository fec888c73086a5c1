"""The deployment bundle: a tar.gz of the compiled files, the same bytes for the same files.

Entries are regular files only (no links, no directory entries), sorted by path, with mtime 0, owner
0:0 and mode 0644; the gzip header carries no name and no time. The runner unpacks it into its code
directory (``orchestrator.runner.bundle``) and requires ``main.tf`` at the root.
"""

from __future__ import annotations

import gzip
import io
import tarfile

from orchestrator.compiler.deployment import CompiledDeployment
from orchestrator.errors import PayloadTooLargeError
from orchestrator.protocol.results import MAX_BUNDLE_BYTES


def build_bundle(compiled: CompiledDeployment, *, max_bytes: int = MAX_BUNDLE_BYTES) -> bytes:
    """The tar.gz of ``compiled.files``; :class:`PayloadTooLargeError` when it is over ``max_bytes``."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as compressed:
        with tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for path, content in sorted(compiled.files.items()):
                info = tarfile.TarInfo(path)
                info.size = len(content)
                info.mode = 0o644
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                archive.addfile(info, io.BytesIO(content))
    data = buffer.getvalue()
    if len(data) > max_bytes:
        raise PayloadTooLargeError(
            f"the deployment bundle is {len(data)} bytes, over the limit of {max_bytes} bytes; "
            "inline modules this large belong in a git or registry module_source"
        )
    return data
