"""Module rule selection, property-tested against a brute-force reference implementation."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.catalogue import Module, ModuleContent, ModuleRule
from orchestrator.domain.module_rules import EnvCatalogue, Placement, most_specific_per_kind, select_rule

TYPES = ["postgres", "s3"]
CLASSES = ["default", "large"]
IDS = ["main", "cache"]
PROJECTS = ["p1", "p2"]
ENV_TYPES = ["dev", "prod"]
ENVS = ["e1", "e2"]
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

#: Which environment fields (env_id, project_id, env_type_id) a rule sets, most specific first.
ENV_LEVELS = [
    (True, True, False),
    (False, True, True),
    (False, True, False),
    (False, False, True),
    (False, False, False),
]


def reference(
    rules: list[ModuleRule],
    resource_type: str,
    resource_class: str | None,
    resource_id: str | None,
    where: Placement,
) -> ModuleRule | None:
    """Try each exact match key from the most specific down; the first one some rule has decides."""
    wanted_class = resource_class or "default"
    for wanted_id in [resource_id, None] if resource_id is not None else [None]:
        for has_env, has_project, has_env_type in ENV_LEVELS:
            key = (
                resource_type,
                wanted_class,
                wanted_id,
                where.env_id if has_env else None,
                where.project_id if has_project else None,
                where.env_type_id if has_env_type else None,
            )
            for rule in rules:
                if key == (
                    rule.resource_type,
                    rule.resource_class,
                    rule.resource_id,
                    rule.env_id,
                    rule.project_id,
                    rule.env_type_id,
                ):
                    return rule
    return None


def make_rule(
    i: int,
    *,
    resource_type: str = "postgres",
    resource_class: str = "default",
    resource_id: str | None = None,
    project_id: str | None = None,
    env_type_id: str | None = None,
    env_id: str | None = None,
) -> ModuleRule:
    return ModuleRule(
        org_id="o",
        id=uuid.UUID(int=i + 1),
        module_id=f"m{i}",
        resource_type=resource_type,
        resource_class=resource_class,
        resource_id=resource_id,
        project_id=project_id,
        env_type_id=env_type_id,
        env_id=env_id,
        created_at=_EPOCH,
    )


placements = st.builds(
    Placement,
    project_id=st.sampled_from(PROJECTS),
    env_type_id=st.sampled_from(ENV_TYPES),
    env_id=st.sampled_from(ENVS),
)
resources = st.tuples(
    st.sampled_from(TYPES), st.sampled_from([None, *CLASSES]), st.sampled_from([None, *IDS])
)


def _near(draw: st.DrawFn, wanted: str | None, others: list[str]) -> str | None:
    # Mostly the value asked for or nothing, so that rules compete for the resource; sometimes another.
    return draw(st.sampled_from([wanted, wanted, None, None, *others]))


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[list[ModuleRule], tuple[str, str | None, str | None], Placement]:
    """A resource, an environment and rules with distinct match keys (as the unique index guarantees)."""
    resource = draw(resources)
    where = draw(placements)
    resource_type, resource_class, resource_id = resource
    keys = set()
    for _ in range(draw(st.integers(min_value=0, max_value=30))):
        project = _near(draw, where.project_id, PROJECTS)
        # env_id needs a project and excludes env_type_id, as the table's check constraint says.
        env = _near(draw, where.env_id, ENVS) if project is not None else None
        env_type = None if env is not None else _near(draw, where.env_type_id, ENV_TYPES)
        keys.add(
            (
                _near(draw, resource_type, TYPES) or resource_type,
                _near(draw, resource_class or "default", CLASSES) or "default",
                _near(draw, resource_id, IDS),
                project,
                env_type,
                env,
            )
        )
    rules = [
        make_rule(
            i, resource_type=t, resource_class=c, resource_id=rid, project_id=p, env_type_id=et, env_id=e
        )
        for i, (t, c, rid, p, et, e) in enumerate(sorted(keys, key=str))
    ]
    return rules, resource, where


@settings(max_examples=300)
@given(scenarios(), st.randoms())
def test_select_rule__matches_reference_in_any_order(
    scenario: tuple[list[ModuleRule], tuple[str, str | None, str | None], Placement], rnd: random.Random
) -> None:
    rules, resource, where = scenario
    shuffled = list(rules)
    rnd.shuffle(shuffled)
    resource_type, resource_class, resource_id = resource

    chosen = select_rule(
        shuffled,
        resource_type=resource_type,
        resource_class=resource_class,
        resource_id=resource_id,
        where=where,
    )

    assert reference(rules, resource_type, resource_class, resource_id, where) == chosen


@given(scenarios())
def test_env_catalogue__resolves_like_select_over_all_rules(
    scenario: tuple[list[ModuleRule], tuple[str, str | None, str | None], Placement],
) -> None:
    """Keeping only the most specific rule per kind (what the catalogue loads) loses no answer."""
    rules, resource, where = scenario
    modules = {r.module_id: _module(r) for r in rules}
    kept = most_specific_per_kind(rules, where)
    catalogue = EnvCatalogue(where=where, rules=tuple(kept), modules=modules, providers={})
    resource_type, resource_class, resource_id = resource

    resolved = catalogue.resolve(resource_type, resource_class, resource_id)
    expected = select_rule(
        rules,
        resource_type=resource_type,
        resource_class=resource_class,
        resource_id=resource_id,
        where=where,
    )

    assert expected == (resolved.rule if resolved else None)
    assert resolved is None or resolved.module.id == resolved.rule.module_id


def _module(rule: ModuleRule) -> Module:
    return Module(
        org_id="o",
        id=rule.module_id,
        uuid=uuid.uuid4(),
        resource_type=rule.resource_type,
        content=ModuleContent(module_source="git::https://example.com/m.git"),
        version_id=uuid.uuid4(),
        created_at=_EPOCH,
        updated_at=_EPOCH,
    )


WHERE = Placement(project_id="p1", env_type_id="dev", env_id="e1")


def test_select_rule__resource_id_beats_environment_scope() -> None:
    by_id = make_rule(1, resource_id="main")
    by_env = make_rule(2, project_id="p1", env_id="e1")

    assert by_id == select_rule([by_env, by_id], resource_type="postgres", resource_id="main", where=WHERE)
    assert by_env == select_rule([by_env, by_id], resource_type="postgres", resource_id="other", where=WHERE)


def test_select_rule__env_beats_project_beats_env_type_beats_none() -> None:
    rules = [
        make_rule(1),
        make_rule(2, env_type_id="dev"),
        make_rule(3, project_id="p1"),
        make_rule(4, project_id="p1", env_id="e1"),
    ]

    chosen = [select_rule(rules[:n], resource_type="postgres", where=WHERE) for n in range(1, 5)]

    assert rules == chosen


def test_select_rule__class_must_equal_without_fallback_to_default() -> None:
    default = make_rule(1)

    assert default == select_rule([default], resource_type="postgres", resource_class=None, where=WHERE)
    assert select_rule([default], resource_type="postgres", resource_class="large", where=WHERE) is None


def test_select_rule__resource_without_id_ignores_rules_with_one() -> None:
    assert select_rule([make_rule(1, resource_id="main")], resource_type="postgres", where=WHERE) is None


def test_select_rule__env_rule_of_another_project_never_matches() -> None:
    rule = make_rule(1, project_id="p2", env_id="e1")

    assert select_rule([rule], resource_type="postgres", where=WHERE) is None
