"""A brute-force reference of runner rule selection (``orchestrator.domain.rules.select_rule``), for the
property test of the selection and the runner-rules API tests."""

from __future__ import annotations

from orchestrator.domain.entities import RunnerRule


def reference(rules: list[RunnerRule], project_id: str, env_type_id: str) -> str | None:
    """Try each match level from the most specific down; the first level with a rule decides."""
    for want_project, want_env_type in (
        (project_id, env_type_id),
        (project_id, None),
        (None, env_type_id),
        (None, None),
    ):
        for rule in rules:
            if rule.project_id == want_project and rule.env_type_id == want_env_type:
                return rule.runner_id
    return None
