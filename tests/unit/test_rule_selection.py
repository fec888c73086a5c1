"""Runner rule selection, property-tested against a brute-force reference implementation."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.domain.entities import RunnerRule
from orchestrator.domain.rules import select_rule
from tests.support.rule_reference import reference

PROJECTS = ["p1", "p2", "p3"]
ENV_TYPES = ["dev", "prod"]
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@st.composite
def rule_sets(draw: st.DrawFn) -> list[RunnerRule]:
    keys = draw(
        st.lists(
            st.tuples(st.sampled_from([None, *PROJECTS]), st.sampled_from([None, *ENV_TYPES])),
            unique=True,
            max_size=12,
        )
    )
    return [
        RunnerRule(
            org_id="o",
            id=uuid.UUID(int=i + 1),
            runner_id=draw(st.sampled_from(["r1", "r2", "r3", "r4"])),
            project_id=project,
            env_type_id=env_type,
            created_at=_EPOCH,
        )
        for i, (project, env_type) in enumerate(keys)
    ]


@given(rule_sets(), st.sampled_from(PROJECTS), st.sampled_from(ENV_TYPES), st.randoms())
def test_select_rule__matches_reference_in_any_order(
    rules: list[RunnerRule], project_id: str, env_type_id: str, rnd: object
) -> None:
    shuffled = list(rules)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    chosen = select_rule(shuffled, project_id=project_id, env_type_id=env_type_id)

    assert reference(rules, project_id, env_type_id) == (chosen.runner_id if chosen else None)


def test_select_rule__empty_rule_matches_everything() -> None:
    rule = RunnerRule(
        org_id="o", id=uuid.uuid4(), runner_id="r", project_id=None, env_type_id=None, created_at=_EPOCH
    )

    assert rule == select_rule([rule], project_id="any", env_type_id="thing")


def test_select_rule__rule_of_other_project_never_matches() -> None:
    rule = RunnerRule(
        org_id="o", id=uuid.uuid4(), runner_id="r", project_id="x", env_type_id=None, created_at=_EPOCH
    )

    assert select_rule([rule], project_id="y", env_type_id="dev") is None
