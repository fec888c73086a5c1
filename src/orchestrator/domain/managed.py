"""Managed runners (seed 004): the platform's own runners, one pool serving every organization.

Pure names, patterns and checks shared by the API (runner rules), the dispatch policy and the gateway's
``/runner/*`` routes. The pool is the runner id ``managed`` in every organization.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final

from orchestrator.errors import InvalidInputError

#: The pool's runner id in every organization (and its runner type, ours).
MANAGED_RUNNER_ID: Final = "managed"
MANAGED_RUNNER_TYPE: Final = "managed"
#: The tag every managed runner carries (added by the server).
MANAGED_TAG: Final = "managed"
MANAGED_DESCRIPTION: Final = "managed by the platform"
#: The 403 of any change to the pool through the API.
READ_ONLY_MESSAGE: Final = (
    "runner 'managed' is managed by the platform: it cannot be created, changed or deleted"
)
#: The 404 of /runner/* on a server without MANAGED_RUNNER_SECRET.
NOT_ENABLED_MESSAGE: Final = (
    "managed runners are not enabled on this server (it was started without MANAGED_RUNNER_SECRET)"
)
#: The 403 of the agent protocol's routes (``/runner-gateway/v1/orgs/{org}/runners/managed/...``).
NOT_AN_AGENT_MESSAGE: Final = (
    "runner 'managed' is the platform's managed pool: it does not use the agent protocol "
    "(managed runners register at /runner/register and claim at /runner/claim)"
)
SECRET_INVALID_MESSAGE: Final = "the managed runner secret is not valid"
TOKEN_INVALID_MESSAGE: Final = "the managed runner token is not valid: register again"
#: A claimed deployment's handle: ``managed:<runner record id>``.
HANDLE_PREFIX: Final = "managed:"

NAME_PATTERN: Final = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
TAG_PATTERN: Final = r"[a-z0-9][a-z0-9.-]{0,62}"
MAX_TAGS: Final = 32
_NAME = re.compile(NAME_PATTERN)
_TAG = re.compile(TAG_PATTERN)


def check_name(name: str, *, field: str = "name") -> str:
    if not _NAME.fullmatch(name):
        raise InvalidInputError(
            f"{field}: must match {NAME_PATTERN} (lowercase letters, digits and '-', at most 63)",
            details={"errors": [{"field": field, "message": f"must match {NAME_PATTERN}"}]},
        )
    return name


def check_tags(tags: Iterable[str], *, field: str = "tags") -> list[str]:
    """The tags, each checked, without duplicates, sorted; InvalidInputError naming the bad one."""
    checked: set[str] = set()
    for index, tag in enumerate(tags):
        if not isinstance(tag, str) or not _TAG.fullmatch(tag):
            where = f"{field}[{index}]"
            raise InvalidInputError(
                f"{where}: must match {TAG_PATTERN}",
                details={"errors": [{"field": where, "message": f"must match {TAG_PATTERN}"}]},
            )
        checked.add(tag)
    if len(checked) > MAX_TAGS:
        raise InvalidInputError(f"{field}: at most {MAX_TAGS} tags")
    return sorted(checked)


def runner_tags(tags: Iterable[str]) -> list[str]:
    """A registering runner's tags: its own, checked, and ``managed`` always."""
    return sorted({*check_tags(tags), MANAGED_TAG})


def carries(runner_tags: Sequence[str], required: Sequence[str] | None) -> bool:
    """Whether a runner with ``runner_tags`` may claim a deployment requiring ``required``."""
    return set(required or ()) <= set(runner_tags)


def handle(runner_record_id: str) -> str:
    return f"{HANDLE_PREFIX}{runner_record_id}"


def is_managed_handle(value: str | None) -> bool:
    return value is not None and value.startswith(HANDLE_PREFIX)
