"""The ``per_page`` and ``page`` query parameters and the opaque page token."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Query

from orchestrator.api.schemas import PageOf
from orchestrator.errors import InvalidInputError
from orchestrator.store.pages import Page

T = TypeVar("T")
U = TypeVar("U")

DEFAULT_PER_PAGE = 50
MAX_PER_PAGE = 1000


@dataclass(frozen=True)
class PageRequest:
    after: tuple[str, ...] | None
    limit: int


def encode_page_token(key: tuple[str, ...] | None) -> str | None:
    if key is None:
        return None
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode()


def page_out(result: Page[T], convert: Callable[[T], U]) -> PageOf[U]:
    """A store page as the API answers it: the converted items and the token of the next page."""
    return PageOf(
        items=[convert(item) for item in result.items], next_page_token=encode_page_token(result.next_key)
    )


def page_request(
    per_page: Annotated[
        int, Query(ge=1, le=MAX_PER_PAGE, description="Maximum number of items.")
    ] = DEFAULT_PER_PAGE,
    page: Annotated[str | None, Query(description="Token of the page to fetch (next_page_token).")] = None,
) -> PageRequest:
    if not page:
        return PageRequest(after=None, limit=per_page)
    try:
        key = json.loads(base64.urlsafe_b64decode(page.encode()))
    except (ValueError, binascii.Error) as exc:
        raise InvalidInputError("page: invalid page token") from exc
    if not isinstance(key, list) or not key or not all(isinstance(part, str) for part in key):
        raise InvalidInputError("page: invalid page token")
    return PageRequest(after=tuple(key), limit=per_page)
