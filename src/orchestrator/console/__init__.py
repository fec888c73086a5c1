"""The web console: static ES modules, one CSS file and one HTML page, served from the package at
``/console/`` (``/`` and ``/console`` redirect there). The page calls the same JSON API as ``octl`` with the
user's bearer token; the server only serves the files. See docs/guides/console.md."""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass
from email.utils import formatdate
from importlib import resources
from pathlib import PurePosixPath
from typing import Final

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

CONSOLE_PATH: Final = "/console"

#: The console's only policy: its own scripts, styles and API (same origin), nothing inline, no frames,
#: and Trusted Types enforced so that no string from anywhere can be put into the page as HTML.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; "
    "require-trusted-types-for 'script'; trusted-types 'none'"
)

#: Every answer of the console carries these.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
}

_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


def _assets() -> dict[str, Asset]:
    """Every file under ``static/`` by its path relative to it (``index.html``, ``js/app.js``), read once."""
    root = resources.files(__package__) / "static"
    found: dict[str, Asset] = {}

    def walk(node: resources.abc.Traversable, prefix: PurePosixPath) -> None:
        for child in node.iterdir():
            path = prefix / child.name
            if child.is_dir():
                walk(child, path)
                continue
            suffix = PurePosixPath(child.name).suffix
            media_type = _TYPES.get(suffix) or mimetypes.guess_type(child.name)[0]
            if media_type is None:
                continue
            body = child.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
            found[str(path)] = Asset(body=body, media_type=media_type, etag=etag)

    walk(root, PurePosixPath())
    return found


def install(app: FastAPI) -> None:
    """``GET`` (and ``HEAD``) ``/``, ``/console`` (both redirect to ``console/``, relative, so that a path
    prefix in front of the server is kept) and ``/console/{path}``: the files, revalidated with their ETag."""
    assets = _assets()
    modified = formatdate(usegmt=True)

    async def to_console() -> Response:
        # Relative: from "/" and from "/console" alike, "console/" is the console's directory.
        return RedirectResponse("console/", status_code=302, headers=SECURITY_HEADERS)

    async def asset(request: Request, path: str = "") -> Response:
        found = assets.get(path or "index.html")
        if found is None:
            return JSONResponse(
                {"error": "API-404", "message": f"no console file '{path}'"},
                status_code=404,
                headers=SECURITY_HEADERS,
            )
        headers = {
            **SECURITY_HEADERS,
            "ETag": found.etag,
            "Last-Modified": modified,
            # Revalidated at every load: a new version of the server serves new files at once.
            "Cache-Control": "no-cache",
        }
        if found.etag in _etags(request.headers.get("if-none-match", "")):
            return Response(status_code=304, headers=headers)
        return Response(found.body, media_type=found.media_type, headers=headers)

    methods = ["GET", "HEAD"]
    app.add_api_route("/", to_console, methods=methods, include_in_schema=False)
    app.add_api_route(CONSOLE_PATH, to_console, methods=methods, include_in_schema=False)
    app.add_api_route(f"{CONSOLE_PATH}/", asset, methods=methods, include_in_schema=False)
    app.add_api_route(f"{CONSOLE_PATH}/{{path:path}}", asset, methods=methods, include_in_schema=False)


def _etags(header: str) -> set[str]:
    return {part.strip().removeprefix("W/") for part in header.split(",") if part.strip()}
