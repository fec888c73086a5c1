"""``octl`` verbs of the module catalogue (resource types, module providers, modules and their versions,
module rules) against the real server: round trips through every verb, and the one-line errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import Result

from orchestrator.settings import ServerSettings
from tests.support.octl import Octl, org_admin_token, serve

INLINE_CODE = """\
variable "name" {
  type = string
}

output "greeting" {
  value = "hello ${var.name}"
}
"""


@pytest.fixture
def octl(settings: ServerSettings, tmp_path: Path) -> Iterator[Octl]:
    with serve(settings) as base_url:
        yield Octl(base_url=base_url, token=org_admin_token(base_url), config_path=tmp_path / "octl.yaml")


def _ok(result: Result) -> None:
    assert 0 == result.exit_code, result.output


def _rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()[1:] if line.strip()]


def _make_type(octl: Octl, type_id: str = "greeting") -> None:
    _ok(octl("create", "resource-type", type_id, "--set-json", '{"output_schema": {"type": "object"}}'))


def _module_file(tmp_path: Path, module_id: str = "hello") -> Path:
    """An inline module of resource type ``greeting``, as a --set-yaml file."""
    definition = {
        "resource_type": "greeting",
        "module_source": "inline",
        "module_source_code": INLINE_CODE,
        "module_params": {"name": {"type": "string"}},
        "description": "Says hello",
    }
    path = tmp_path / f"{module_id}.yaml"
    path.write_text(yaml.safe_dump(definition))
    return path


def _make_module(octl: Octl, tmp_path: Path, module_id: str = "hello") -> None:
    _ok(octl("create", "module", module_id, f"--set-yaml=@{_module_file(tmp_path, module_id)}"))


# -- resource types ---------------------------------------------------------------------------------


def test_resource_types__round_trip(octl: Octl) -> None:
    created = octl(
        "create",
        "resource-type",
        "postgres",
        "--set-yaml",
        "output_schema: {type: object, properties: {host: {type: string}}}\ndescription: A database",
        "--set",
        "is_developer_accessible=false",
    )
    got = octl("get", "resource-type", "postgres")
    updated = octl("update", "rt", "postgres", "--set", "description=Postgres", "-o", "json")
    listed = octl("get", "rts", "-o", "json")
    table = octl("get", "resource-types")
    deleted = octl("delete", "resource-type", "postgres")
    gone = octl("get", "resource-type", "postgres")

    _ok(created)
    body = yaml.safe_load(created.stdout)
    assert {"id": "postgres", "description": "A database", "is_developer_accessible": False}.items() <= (
        body.items()
    )
    assert {"type": "string"} == body["output_schema"]["properties"]["host"]
    assert "Resource type postgres created in organization acme." in created.stderr
    assert ["Id", "Description", "DeveloperAccessible", "BuiltIn", "CreatedAt"] == got.stdout.splitlines()[
        0
    ].split()
    assert ["postgres", "A", "database", "false", "false"] == got.stdout.splitlines()[1].split()[:5]
    assert {"description": "Postgres", "is_developer_accessible": False}.items() <= json.loads(
        updated.stdout
    ).items()
    assert ["postgres"] == [t["id"] for t in json.loads(listed.stdout)]
    assert [["postgres", "Postgres", "false", "false"]] == [row[:4] for row in _rows(table.stdout)]
    assert "Resource type postgres deleted from organization acme." in deleted.stderr
    assert 1 == gone.exit_code
    assert "Error: not found: resource type 'postgres' not found\n" == gone.stderr


def test_resource_types__errors_are_one_line(octl: Octl, tmp_path: Path) -> None:
    _make_type(octl)
    _make_module(octl, tmp_path)

    duplicate = octl("create", "resource-type", "greeting", "--set-json", '{"output_schema": {}}')
    no_schema = octl("create", "resource-type", "other")
    in_use = octl("delete", "resource-type", "greeting")
    nothing = octl("update", "resource-type", "greeting")
    other_id = octl("update", "resource-type", "greeting", "--set", "id=other", "--set", "description=x")
    empty = octl("get", "resource-types", "--org", "nobody")

    assert (1, "Error: conflict: resource type 'greeting' already exists\n") == (
        duplicate.exit_code,
        duplicate.stderr,
    )
    assert 1 == no_schema.exit_code
    assert no_schema.stderr.startswith("Error: bad request: output_schema: ")
    assert (1, "Error: conflict: resource type 'greeting' is provisioned by the modules: hello\n") == (
        in_use.exit_code,
        in_use.stderr,
    )
    assert (2, 2) == (nothing.exit_code, other_id.exit_code)
    assert "nothing to update" in nothing.stderr
    assert "the input sets id 'other', but the argument is 'greeting'" in other_id.stderr
    assert 1 == empty.exit_code
    assert "organization 'nobody' not found" in empty.stderr


# -- module providers -------------------------------------------------------------------------------


def test_providers__round_trip(octl: Octl) -> None:
    created = octl(
        "create",
        "provider",
        "aws",
        "default",
        "--set-yaml",
        "source: hashicorp/aws\nversion_constraint: '~> 5.0'\nconfiguration: {region: eu-west-1}",
    )
    octl(
        "create",
        "mp",
        "google",
        "main",
        "--set",
        "source=hashicorp/google",
        "--set",
        "version_constraint=>= 6.0",
    )
    got = octl("get", "provider", "aws", "default")
    updated = octl(
        "update", "provider", "aws", "default", "--set-json", '{"configuration": {"region": "us-east-1"}}'
    )
    listed = octl("get", "providers")
    only_google = octl("get", "mps", "--type", "google", "-o", "json")
    deleted = octl("delete", "provider", "aws", "default")
    gone = octl("get", "provider", "aws", "default")

    _ok(created)
    assert {
        "provider_type": "aws",
        "id": "default",
        "source": "hashicorp/aws",
        "version_constraint": "~> 5.0",
        "configuration": {"region": "eu-west-1"},
    }.items() <= yaml.safe_load(created.stdout).items()
    assert "Module provider aws.default created in organization acme." in created.stderr
    assert ["ProviderType", "Id", "Source", "VersionConstraint"] == got.stdout.splitlines()[0].split()[:4]
    assert ["aws", "default", "hashicorp/aws", "~>", "5.0"] == got.stdout.splitlines()[1].split()[:5]
    _ok(updated)
    assert {"region": "us-east-1"} == yaml.safe_load(updated.stdout)["configuration"]
    assert [["aws", "default", "hashicorp/aws"], ["google", "main", "hashicorp/google"]] == [
        row[:3] for row in _rows(listed.stdout)
    ]
    assert [("google", "main")] == [(p["provider_type"], p["id"]) for p in json.loads(only_google.stdout)]
    assert "Module provider aws.default deleted from organization acme." in deleted.stderr
    assert (1, "Error: not found: module provider 'aws.default' not found\n") == (gone.exit_code, gone.stderr)


def test_providers__errors(octl: Octl) -> None:
    base = ("--set", "source=hashicorp/aws", "--set", "version_constraint=~> 5.0")
    octl("create", "provider", "aws", "default", *base)

    duplicate = octl("create", "provider", "aws", "default", *base)
    bad_constraint = octl(
        "create",
        "provider",
        "aws",
        "other",
        "--set",
        "source=hashicorp/aws",
        "--set",
        "version_constraint=latest",
    )
    other_type = octl("create", "provider", "aws", "x", *base, "--set", "provider_type=google")
    fixed_source = octl("update", "provider", "aws", "default", "--set", "source=hashicorp/google")

    assert (1, "Error: conflict: module provider 'aws.default' already exists\n") == (
        duplicate.exit_code,
        duplicate.stderr,
    )
    assert bad_constraint.stderr.startswith("Error: bad request: version_constraint: ")
    assert 2 == other_type.exit_code
    assert "the input sets provider_type 'google', but the argument is 'aws'" in other_type.stderr
    assert "Error: bad request: source: unknown field\n" == fixed_source.stderr


# -- modules and versions ---------------------------------------------------------------------------


def test_modules__round_trip_with_inline_code_and_versions(octl: Octl, tmp_path: Path) -> None:
    _make_type(octl)
    _make_type(octl, "other")

    created = octl("create", "module", "hello", f"--set-yaml=@{_module_file(tmp_path)}", "-o", "json")
    as_yaml = octl("get", "module", "hello", "-o", "yaml")
    table = octl("get", "mod", "hello")
    updated = octl("update", "module", "hello", "--set", "description=Says hello again")
    versions = octl("get", "module-versions", "hello")
    versions_json = json.loads(octl("get", "module-versions", "hello", "-o", "json").stdout)
    first = octl("get", "module-version", "hello", json.loads(created.stdout)["version_id"], "-o", "json")
    of_type = octl("get", "modules", "--type", "greeting", "-o", "json")
    of_other = octl("get", "mods", "--type", "other")
    deleted = octl("delete", "module", "hello")
    gone = octl("get", "module-versions", "hello")

    _ok(created)
    module = json.loads(created.stdout)
    assert {"id": "hello", "resource_type": "greeting", "module_source": "inline"}.items() <= module.items()
    assert INLINE_CODE == module["module_source_code"]
    assert "Module hello created in organization acme." in created.stderr
    # The code prints as a YAML literal block, and reads back exactly.
    assert "module_source_code: |\n" in as_yaml.stdout
    assert INLINE_CODE == yaml.safe_load(as_yaml.stdout)["module_source_code"]
    assert ["hello", "greeting", "inline", module["version_id"]] == table.stdout.splitlines()[1].split()[:4]
    _ok(updated)
    new_version = yaml.safe_load(updated.stdout)["version_id"]
    assert new_version != module["version_id"]
    assert f"Module hello updated in organization acme (version {new_version})." in updated.stderr
    assert ["VersionId", "ResourceType", "ModuleSource", "Description", "CreatedAt"] == (
        versions.stdout.splitlines()[0].split()
    )
    assert [new_version, module["version_id"]] == [v["version_id"] for v in versions_json]
    assert [new_version, module["version_id"]] == [row[0] for row in _rows(versions.stdout)]
    assert "Says hello" == json.loads(first.stdout)["description"]
    assert INLINE_CODE == json.loads(first.stdout)["module_source_code"]
    assert ["hello"] == [m["id"] for m in json.loads(of_type.stdout)]
    assert "No modules found in organization acme." in of_other.stderr
    assert "" == of_other.stdout
    assert "Module hello deleted from organization acme." in deleted.stderr
    assert (1, "Error: not found: module 'hello' not found\n") == (gone.exit_code, gone.stderr)


def test_modules__errors(octl: Octl) -> None:
    _make_type(octl)
    octl(
        "create",
        "module",
        "git",
        "--set",
        "resource_type=greeting",
        "--set",
        "module_source=git::https://x/y.git",
    )

    no_type = octl(
        "create",
        "module",
        "mm",
        "--set",
        "resource_type=mysql",
        "--set",
        "module_source=git::https://x/y.git",
    )
    no_code = octl(
        "create", "module", "mm", "--set", "resource_type=greeting", "--set", "module_source=inline"
    )
    code_on_git = octl("update", "module", "git", "--set", "module_source_code=# x")
    bad_version = octl("get", "module-version", "git", "not-a-uuid")
    missing_version = octl("get", "module-version", "git", "00000000-0000-0000-0000-000000000001")

    assert (1, "Error: bad request: module_source_code: required when module_source is 'inline'\n") == (
        no_code.exit_code,
        no_code.stderr,
    )
    assert "Error: conflict: resource types referenced by the module do not exist: mysql\n" == no_type.stderr
    assert code_on_git.stderr.startswith("Error: bad request: module_source_code: cannot be set without")
    assert 2 == bad_version.exit_code
    assert 1 == missing_version.exit_code
    assert missing_version.stderr.startswith(
        "Error: not found: version '00000000-0000-0000-0000-000000000001'"
    )


# -- module rules -----------------------------------------------------------------------------------


def test_module_rules__round_trip_with_filters(octl: Octl, tmp_path: Path) -> None:
    for args in (
        ("create", "env-type", "development"),
        ("create", "project", "shop"),
        ("create", "env", "shop", "dev", "--set", "env_type_id=development"),
    ):
        _ok(octl(*args))
    _make_type(octl)
    _make_module(octl, tmp_path)
    _make_module(octl, tmp_path, "hello-dev")

    everywhere = octl("create", "module-rule", "--set", "module_id=hello")
    in_dev = octl(
        "create", "rule", "--set-json", '{"module_id": "hello-dev", "project_id": "shop", "env_id": "dev"}'
    )
    rule, dev_rule = yaml.safe_load(everywhere.stdout), yaml.safe_load(in_dev.stdout)
    got = octl("get", "module-rule", rule["id"])
    listed = octl("get", "module-rules")
    by_module = octl("get", "rls", "--module", "hello-dev", "-o", "json")
    in_env = octl("get", "module-rules", "--project", "shop", "--env", "dev", "-o", "json")
    available = octl("get", "available-resource-types", "shop", "dev")
    deleted = octl("delete", "rl", dev_rule["id"])
    gone = octl("get", "module-rule", dev_rule["id"])

    _ok(everywhere)
    assert {"module_id": "hello", "resource_type": "greeting", "resource_class": "default"}.items() <= (
        rule.items()
    )
    assert f"Module rule {rule['id']} for module hello created in organization acme." in everywhere.stderr
    assert {"project_id": "shop", "env_id": "dev"}.items() <= dev_rule.items()
    assert [rule["id"], "hello", "greeting", "default"] == got.stdout.splitlines()[1].split()[:4]
    assert ["Id", "ModuleId", "ResourceType", "ResourceClass"] == listed.stdout.splitlines()[0].split()[:4]
    assert {rule["id"], dev_rule["id"]} == {row[0] for row in _rows(listed.stdout)}
    assert [dev_rule["id"]] == [r["id"] for r in json.loads(by_module.stdout)]
    assert [dev_rule["id"]] == [r["id"] for r in json.loads(in_env.stdout)]
    assert ["Id", "Description", "Modules"] == available.stdout.splitlines()[0].split()
    assert "greeting" == available.stdout.splitlines()[1].split()[0]
    assert available.stdout.splitlines()[1].endswith("default: hello-dev")
    assert f"Module rule {dev_rule['id']} deleted from organization acme." in deleted.stderr
    assert (1, f"Error: not found: module rule '{dev_rule['id']}' not found\n") == (
        gone.exit_code,
        gone.stderr,
    )


def test_module_rules__errors(octl: Octl, tmp_path: Path) -> None:
    _make_type(octl)
    _make_module(octl, tmp_path)
    first = yaml.safe_load(octl("create", "module-rule", "--set", "module_id=hello").stdout)

    duplicate = octl("create", "module-rule", "--set", "module_id=hello")
    no_module = octl("create", "module-rule", "--set", "module_id=nope")
    env_alone = octl("get", "module-rules", "--env", "dev")
    bad_uuid = octl("get", "module-rule", "nope")
    in_use = octl("delete", "module", "hello")

    assert 1 == duplicate.exit_code
    assert (
        f"Error: conflict: module rule conflicts with existing rule '{first['id']}' for module 'hello'\n"
        == duplicate.stderr
    )
    assert "Error: bad request: module_id: module 'nope' not found\n" == no_module.stderr
    assert 2 == env_alone.exit_code
    assert "--env needs --project" in env_alone.stderr
    assert 2 == bad_uuid.exit_code
    assert 1 == in_use.exit_code
    assert f"module 'hello' is used by the module rules: {first['id']}" in in_use.stderr
