"""What the Schemathesis conformance tests share: how their generated examples run, and how an answer's
failed checks are collected.

Usage::

    @repeatable(max_examples=20)
    @given(case=operation.as_strategy())
    def probe(case: OpenApiCase) -> None:
        response = case.call(base_url=base_url)
        for failure in failures(case, response, CHECKS):
            ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, Phase, settings
from schemathesis.core.failures import Failure, FailureGroup

if TYPE_CHECKING:
    from schemathesis.specs.openapi.schemas import OpenApiCase


def repeatable(*, max_examples: int) -> settings:
    """Hypothesis settings for a run that is the same every time: derandomized, no example database, the
    explicit examples then ``max_examples`` generated ones, no deadline and no health checks (each example
    is a request to a real server)."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def failures(case: OpenApiCase, response: Any, checks: Sequence[Any]) -> list[Failure]:
    """The ``checks`` that ``response`` (the answer to ``case``) fails; none: an empty list (not raised, so
    that a run notes every failure and goes on)."""
    try:
        case.validate_response(response, checks=list(checks))
    except FailureGroup as group:
        return list(group.exceptions)
    except Failure as failure:
        return [failure]
    return []
