"""Runner rules and refresh_runner through the HTTP API."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx
import yaml
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.orgs import Org, make_org, walk_pages
from tests.support.rule_reference import reference

RUNNER = yaml.safe_load((Path(__file__).parent.parent / "data" / "runners" / "vm-local.yaml").read_text())


async def setup_org(client: httpx.AsyncClient, org_id: str, runners: list[str]) -> None:
    """``client``: a platform admin's (runners with a local connection are theirs to create)."""
    for runner in runners:
        response = await client.post(f"/orgs/{org_id}/runners", json={"id": runner, **RUNNER})
        assert 201 == response.status_code, response.text
    for env_type in ("development", "production"):
        await client.post(f"/orgs/{org_id}/env-types", json={"id": env_type})
    for project in ("shop", "blog"):
        await client.post(f"/orgs/{org_id}/projects", json={"id": project})
        for env, env_type in (("dev", "development"), ("prod", "production")):
            created = await client.post(
                f"/orgs/{org_id}/projects/{project}/envs", json={"id": env, "env_type_id": env_type}
            )
            assert 201 == created.status_code, created.text


def refresh_url(org_id: str, project: str = "shop", env: str = "dev") -> str:
    return f"/orgs/{org_id}/projects/{project}/envs/{env}/actions/refresh_runner"


async def test_rules__seed_example_empty_rule_matches_everything(org: Org) -> None:
    await setup_org(org.platform, org.id, ["my-runner"])
    rule = await org.admin.post(f"/orgs/{org.id}/runner-rules", json={"runner_id": "my-runner"})
    refreshed = await org.admin.post(refresh_url(org.id, "blog", "prod"), json={"dry_run": False})
    env = await org.admin.get(f"/orgs/{org.id}/projects/blog/envs/prod")

    assert 201 == rule.status_code
    assert {"runner_id": "my-runner", "project_id": "", "env_type_id": ""}.items() <= rule.json().items()
    assert {"runner_id": "my-runner", "updated": True} == refreshed.json()
    assert "my-runner" == env.json()["runner_id"]


async def test_rules__pages_by_runner_and_uuid_give_each_rule_once(org: Org) -> None:
    """Rules page by (runner id, UUID): small pages give each rule once, in the order of one large page."""
    await setup_org(org.platform, org.id, ["r1", "r2"])
    scopes = [
        {"runner_id": "r2", "project_id": "shop"},
        {"runner_id": "r1", "project_id": "blog"},
        {"runner_id": "r1", "env_type_id": "development"},
        {"runner_id": "r2", "env_type_id": "production"},
        {"runner_id": "r1"},
    ]
    for scope in scopes:
        created = await org.admin.post(f"/orgs/{org.id}/runner-rules", json=scope)
        assert 201 == created.status_code, created.text
    path = f"/orgs/{org.id}/runner-rules"

    walked = await walk_pages(org.admin, path, 2)

    assert [r["runner_id"] for r in walked] == ["r1", "r1", "r1", "r2", "r2"]
    assert [r["id"] for r in walked] == [r["id"] for r in await walk_pages(org.admin, path, 100)]


async def test_rules__duplicate_and_missing_references_conflict(org: Org) -> None:
    await setup_org(org.platform, org.id, ["r1", "r2"])
    first = await org.admin.post(
        f"/orgs/{org.id}/runner-rules", json={"runner_id": "r1", "project_id": "shop"}
    )
    duplicate = await org.admin.post(
        f"/orgs/{org.id}/runner-rules", json={"runner_id": "r2", "project_id": "shop"}
    )
    no_runner = await org.admin.post(f"/orgs/{org.id}/runner-rules", json={"runner_id": "nope"})
    no_project = await org.admin.post(
        f"/orgs/{org.id}/runner-rules", json={"runner_id": "r1", "project_id": "nope"}
    )
    no_type = await org.admin.post(
        f"/orgs/{org.id}/runner-rules", json={"runner_id": "r1", "env_type_id": "nope"}
    )

    assert 201 == first.status_code
    assert 409 == duplicate.status_code
    assert (
        f"runner rule conflicts with existing rule '{first.json()['id']}' for runner 'r1'"
        == duplicate.json()["message"]
    )
    # 404, not a conflict: the rule names an object that does not exist (README, Compatibility).
    for answer, what, listing in (
        (no_runner, "runner", "runners"),
        (no_project, "project", "projects"),
        (no_type, "environment type", "env-types"),
    ):
        assert 404 == answer.status_code
        assert (
            f"{what} 'nope' not found: create it first, or name one `octl get {listing}` lists"
            == answer.json()["message"]
        )


async def test_rules__immutable_get_delete(org: Org) -> None:
    await setup_org(org.platform, org.id, ["r1"])
    rule = (await org.admin.post(f"/orgs/{org.id}/runner-rules", json={"runner_id": "r1"})).json()
    url = f"/orgs/{org.id}/runner-rules/{rule['id']}"

    patched = await org.admin.patch(url, json={"runner_id": "r1"})
    got = await org.admin.get(url)
    deleted = await org.admin.delete(url)
    gone = await org.admin.get(url)
    bad_id = await org.admin.get(f"/orgs/{org.id}/runner-rules/not-a-uuid")

    assert 405 == patched.status_code
    assert rule == got.json()
    assert 204 == deleted.status_code
    assert 404 == gone.status_code
    assert 400 == bad_id.status_code


async def test_rules__list_filters_mean_effective_in(org: Org) -> None:
    await setup_org(org.platform, org.id, ["r1", "r2"])
    ids = {}
    for name, body in {
        "empty": {"runner_id": "r1"},
        "shop": {"runner_id": "r1", "project_id": "shop"},
        "blog": {"runner_id": "r2", "project_id": "blog"},
        "prod": {"runner_id": "r2", "env_type_id": "production"},
        "shop-dev": {"runner_id": "r2", "project_id": "shop", "env_type_id": "development"},
    }.items():
        ids[(await org.admin.post(f"/orgs/{org.id}/runner-rules", json=body)).json()["id"]] = name

    async def names(**params: str) -> set[str]:
        items = (await org.admin.get(f"/orgs/{org.id}/runner-rules", params=params)).json()["items"]
        return {ids[i["id"]] for i in items}

    assert {"empty", "shop", "prod", "shop-dev"} == await names(byProjectId="shop")
    assert {"empty", "shop", "blog", "shop-dev"} == await names(byEnvTypeId="development")
    assert {"empty", "shop", "shop-dev"} == await names(byProjectId="shop", byEnvTypeId="development")
    assert {"blog", "prod", "shop-dev"} == await names(byRunnerId="r2")


async def test_refresh__dry_run_by_query_and_body_changes_nothing(org: Org) -> None:
    await setup_org(org.platform, org.id, ["r1"])
    await org.admin.post(f"/orgs/{org.id}/runner-rules", json={"runner_id": "r1"})

    by_query = await org.admin.post(refresh_url(org.id), params={"dry_run": "true"})
    by_body = await org.admin.post(refresh_url(org.id), json={"dry_run": True})
    query_wins = await org.admin.post(
        refresh_url(org.id), params={"dry_run": "true"}, json={"dry_run": False}
    )
    env = await org.admin.get(f"/orgs/{org.id}/projects/shop/envs/dev")

    assert {"runner_id": "r1", "updated": True} == by_query.json() == by_body.json() == query_wins.json()
    assert "runner_id" not in env.json()


async def test_refresh__link_is_sticky_until_refreshed(org: Org) -> None:
    await setup_org(org.platform, org.id, ["r1", "r2"])
    await org.admin.post(f"/orgs/{org.id}/runner-rules", json={"runner_id": "r1"})
    await org.admin.post(refresh_url(org.id))
    await org.admin.post(f"/orgs/{org.id}/runner-rules", json={"runner_id": "r2", "project_id": "shop"})

    still = (await org.admin.get(f"/orgs/{org.id}/projects/shop/envs/dev")).json()["runner_id"]
    dry = (await org.admin.post(refresh_url(org.id), params={"dry_run": "true"})).json()
    moved = (await org.admin.post(refresh_url(org.id))).json()
    again = (await org.admin.post(refresh_url(org.id))).json()

    assert "r1" == still
    assert {"runner_id": "r2", "updated": True} == dry
    assert {"runner_id": "r2", "updated": True} == moved
    assert {"runner_id": "r2", "updated": False} == again


async def test_refresh__no_match_is_409_and_keeps_previous_link(org: Org) -> None:
    await setup_org(org.platform, org.id, ["r1"])
    rule = (
        await org.admin.post(f"/orgs/{org.id}/runner-rules", json={"runner_id": "r1", "project_id": "shop"})
    ).json()
    await org.admin.post(refresh_url(org.id))
    await org.admin.delete(f"/orgs/{org.id}/runner-rules/{rule['id']}")

    response = await org.admin.post(refresh_url(org.id))
    env = (await org.admin.get(f"/orgs/{org.id}/projects/shop/envs/dev")).json()

    assert 409 == response.status_code
    assert response.json()["message"].startswith("no matching runner found for the supplied environment: ")
    assert "r1" == env["runner_id"]


async def test_refresh__no_match_names_the_rules_tried_and_what_to_do(org: Org) -> None:
    await setup_org(org.platform, org.id, ["r1"])
    await org.admin.post(f"/orgs/{org.id}/runner-rules", json={"runner_id": "r1", "project_id": "blog"})

    response = await org.admin.post(refresh_url(org.id))

    assert 409 == response.status_code
    message = response.json()["message"]
    assert "no runner rule applies to project 'shop' with env type 'development'" in message, message
    assert "(runner r1 for project blog, env type any)" in message
    assert "`octl create runner-rule --set runner_id=RUNNER --set project_id=shop`" in message


async def test_refresh__unknown_env_is_404_and_deployer_may_not(org: Org) -> None:
    await setup_org(org.platform, org.id, ["r1"])

    missing = await org.admin.post(refresh_url(org.id, "shop", "nope"))
    deployer = await org.clients["deployer"].post(refresh_url(org.id))

    assert 404 == missing.status_code
    assert 403 == deployer.status_code


_orgs = itertools.count()
KEYS = [(p, e) for p in (None, "shop", "blog") for e in (None, "development", "production")]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rules=st.dictionaries(st.sampled_from(KEYS), st.sampled_from(["r1", "r2", "r3"]), max_size=len(KEYS)),
)
async def test_refresh__matches_reference_selection(
    app: FastAPI, admin: httpx.AsyncClient, rules: dict[tuple[str | None, str | None], str]
) -> None:
    """Through the API and the database, refresh_runner picks what the reference implementation picks."""
    made = await make_org(app, admin, f"prop-{next(_orgs)}")
    client = made.admin
    await setup_org(admin, made.id, ["r1", "r2", "r3"])
    for (project, env_type), runner in rules.items():
        body: dict[str, Any] = {"runner_id": runner, "project_id": project, "env_type_id": env_type}
        assert 201 == (await client.post(f"/orgs/{made.id}/runner-rules", json=body)).status_code
    domain_rules = [
        _Rule(runner_id=runner, project_id=project, env_type_id=env_type)
        for (project, env_type), runner in rules.items()
    ]

    for project in ("shop", "blog"):
        for env, env_type in (("dev", "development"), ("prod", "production")):
            response = await client.post(refresh_url(made.id, project, env), params={"dry_run": "true"})
            expected = reference(domain_rules, project, env_type)  # type: ignore[arg-type]
            if expected is None:
                assert 409 == response.status_code
            else:
                assert expected == response.json()["runner_id"]


class _Rule:
    def __init__(self, *, runner_id: str, project_id: str | None, env_type_id: str | None) -> None:
        self.runner_id = runner_id
        self.project_id = project_id
        self.env_type_id = env_type_id
