"""Creating deployments: bad input is refused at create time with a message naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.protocol import age
from tests.support.orgs import Org

EXAMPLES = Path(__file__).parent.parent.parent / "examples" / "demo"


def manifest(**resource: Any) -> dict[str, Any]:
    app = {"type": "demo-app", "params": {"name": "shop"}, **resource}
    return {
        "workloads": {"shop": {"resources": {"app": app}, "outputs": {"url": "${resources.app.outputs.url}"}}}
    }


@pytest.fixture
async def ready(org: Org) -> Org:
    base = f"/orgs/{org.id}"
    for path, body in [
        ("/env-types", {"id": "development"}),
        ("/projects", {"id": "shop"}),
        ("/projects/shop/envs", {"id": "dev", "env_type_id": "development"}),
        ("/runners", {"id": "local", **yaml.safe_load((EXAMPLES / "runner.yaml").read_text())}),
        ("/runner-rules", {"runner_id": "local"}),
        (
            "/resource-types",
            {"id": "demo-app", **yaml.safe_load((EXAMPLES / "resource-type.yaml").read_text())},
        ),
        ("/modules", {"id": "demo-app", **yaml.safe_load((EXAMPLES / "module.yaml").read_text())}),
        ("/module-rules", {"module_id": "demo-app"}),
    ]:
        # A runner with a local connection is the platform admin's to create.
        client = org.platform if path == "/runners" else org.admin
        response = await client.post(base + path, json=body)
        assert 201 == response.status_code, (path, response.text)
    return org


async def create(org: Org, role: str = "admin", **body: Any) -> Any:
    payload = {"project_id": "shop", "env_id": "dev", "mode": "deploy", "is_dry_run": True, **body}
    return await org.clients[role].post(f"/orgs/{org.id}/deployments", json=payload)


async def test_dry_run__links_the_environment_only_for_real_deployments(ready: Org) -> None:
    response = await create(ready, manifest=manifest())
    env = (await ready.admin.get(f"/orgs/{ready.id}/projects/shop/envs/dev")).json()

    assert 200 == response.status_code, response.text
    assert "local" == response.json()["runner_id"]
    assert "runner_id" not in env


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"manifest": {"workloads": {"shop": {"colour": 1}}}}, "manifest.workloads.shop.colour"),
        ({"manifest": manifest(type="no-such-type")}, "manifest.workloads.shop.resources.app"),
        ({"manifest": manifest(params={"name": "x", "size": 3})}, "manifest.workloads.shop.resources.app"),
        ({"manifest": manifest(params={})}, "manifest.workloads.shop.resources.app"),
        (
            {"manifest": {"workloads": {"shop": {"outputs": {"u": "${resources.nope.outputs.url}"}}}}},
            "manifest.workloads.shop.outputs.u",
        ),
        ({"manifest": manifest(), "encrypted_outputs_recipient": "age1nope"}, "encrypted_outputs_recipient"),
        ({"manifest": manifest(), "mode": "destroy"}, "mode"),
        ({"manifest": manifest(), "runner_log_level": "loud"}, "runner_log_level"),
        ({"mode": "rollback"}, "rollback_to_deployment_id"),
        (
            {"mode": "rollback", "rollback_to_deployment_id": "00000000-0000-0000-0000-000000000001"},
            "rollback_to",
        ),
        ({}, "manifest"),
        ({"manifest": manifest(), "extra": True}, "extra"),
    ],
)
async def test_create__bad_input_names_the_field(ready: Org, body: dict[str, Any], field: str) -> None:
    response = await create(ready, **{"is_dry_run": False, **body})

    assert 400 == response.status_code, response.text
    assert response.json()["message"].startswith(field), response.json()["message"]


async def test_create__missing_env_404_no_rule_409(ready: Org) -> None:
    missing = await create(ready, env_id="nope", manifest=manifest())
    rules = (await ready.admin.get(f"/orgs/{ready.id}/runner-rules")).json()["items"]
    await ready.admin.delete(f"/orgs/{ready.id}/runner-rules/{rules[0]['id']}")
    no_rule = await create(ready, manifest=manifest(), is_dry_run=False)

    assert 404 == missing.status_code
    assert 409 == no_rule.status_code
    assert "no matching runner found" in no_rule.json()["message"]


async def test_create__viewer_may_not_deployer_may(ready: Org) -> None:
    viewer = await create(ready, "viewer", manifest=manifest())
    deployer = await create(ready, "deployer", manifest=manifest())

    assert 403 == viewer.status_code
    assert 200 == deployer.status_code


async def test_create__valid_age_recipient_accepted(ready: Org) -> None:
    _, recipient = age.generate_identity()

    response = await create(ready, manifest=manifest(), encrypted_outputs_recipient=recipient)

    assert 200 == response.status_code, response.text


async def test_delete_env__a_malformed_logs_recipient_is_400_naming_it(ready: Org) -> None:
    url = f"/orgs/{ready.id}/projects/shop/envs/dev"

    refused = await ready.admin.delete(url, params={"encrypted_logs_recipient": "age1notakey"})
    still = await ready.admin.get(url)

    assert 400 == refused.status_code, refused.text
    assert refused.json()["message"].startswith("encrypted_logs_recipient: ")
    assert 200 == still.status_code
