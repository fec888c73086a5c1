"""Reading the processes' log lines in tests: JSON lines parsed, and secrets looked for in every line."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Lines of a PEM body shorter than this are not looked for on their own (the last line can be short).
_MIN_PEM_LINE = 16


def json_lines(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The lines of ``text`` that are JSON objects, and those (not blank) that are not."""
    parsed: list[dict[str, Any]] = []
    other: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            other.append(line)
            continue
        if isinstance(value, dict):
            parsed.append(value)
        else:
            other.append(line)
    return parsed, other


def forms(secret: str) -> list[str]:
    """What to look for of ``secret``: itself, and for a PEM each long line of its body (a key printed
    without its header lines, or re-wrapped, is still found)."""
    found = [secret]
    if secret.startswith("-----BEGIN"):
        found += [
            line.strip()
            for line in secret.splitlines()
            if len(line.strip()) >= _MIN_PEM_LINE and not line.startswith("-----")
        ]
    return found


def secret_hits(logs: Mapping[str, str], secrets: Mapping[str, str]) -> list[str]:
    """``"<secret name> in <log name>: <line>"`` for each line of each log holding a form of a secret
    (JSON escapes undone too: a secret with a newline appears as ``\\n`` in a JSON line)."""
    hits: list[str] = []
    for log_name, text in logs.items():
        for line in text.splitlines():
            decoded = line.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
            for secret_name, secret in secrets.items():
                if any(form in line or form in decoded for form in forms(secret)):
                    hits.append(f"{secret_name} in {log_name}: {line[:300]}")
    return hits
