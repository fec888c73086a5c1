"""Runner rule selection: which runner an environment links to."""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.domain.entities import RunnerRule


def is_effective(rule: RunnerRule, *, project_id: str | None, env_type_id: str | None) -> bool:
    """A rule is effective for an environment when each of its fields is empty or equal."""
    return (rule.project_id is None or rule.project_id == project_id) and (
        rule.env_type_id is None or rule.env_type_id == env_type_id
    )


def specificity(rule: RunnerRule) -> int:
    """both (3) > project (2) > env type (1) > empty (0), as upstream's bitmask."""
    return (rule.project_id is not None) << 1 | (rule.env_type_id is not None)


def select_rule(rules: Iterable[RunnerRule], *, project_id: str, env_type_id: str) -> RunnerRule | None:
    """The most specific effective rule; uniqueness per (project, env type) makes it deterministic."""
    best: RunnerRule | None = None
    for rule in rules:
        if is_effective(rule, project_id=project_id, env_type_id=env_type_id) and (
            best is None or specificity(rule) > specificity(best)
        ):
            best = rule
    return best
