"""``octl`` driven through click's CliRunner against the real server (uvicorn in a thread, real database)."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.client.api import ApiClient, ApiError
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.docs import commands, docs_example
from tests.support.live_server import serve_in_thread
from tests.support.octl import OCTL_EXECUTABLE, ORG, Octl
from tests.support.orgs import BOOTSTRAP_TOKEN

#: The database plays no part here: each test runs on one of them (tests/conftest.py).
pytestmark = pytest.mark.spread

RUNNER_DATA = Path(__file__).parents[1] / "data" / "runners"


@pytest.fixture
def live_server(settings: ServerSettings) -> Iterator[str]:
    with serve_in_thread(create_app(settings)) as base_url:
        yield base_url


@pytest.fixture
def org_token(live_server: str) -> str:
    """An admin token of organization ``acme``, made with the platform bootstrap token."""
    with ApiClient(live_server, BOOTSTRAP_TOKEN) as platform:
        platform.create_org(ORG)
        return str(platform.create_token(ORG, {"role": "admin", "description": "octl tests"})["token"])


@pytest.fixture
def octl(live_server: str, org_token: str, tmp_path: Path) -> Octl:
    return Octl(base_url=live_server, token=org_token, config_path=tmp_path / "octl" / "config.yaml")


@pytest.fixture
def seed_runner(live_server: str, org_token: str) -> Any:
    """Create runners through the API client (not octl), from the EKS example under tests/data/runners."""
    config = yaml.safe_load((RUNNER_DATA / "kubernetes-eks.yaml").read_text())

    def seed(*runner_ids: str) -> None:
        with ApiClient(live_server, org_token) as client:
            for runner_id in runner_ids:
                client.create_runner(ORG, {**config, "id": runner_id, "description": f"{runner_id} test"})

    return seed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _make_env(octl: Octl) -> None:
    for args in (
        ("create", "env-type", "development"),
        ("create", "project", "shop"),
        ("create", "env", "shop", "dev", "--set", "env_type_id=development"),
    ):
        assert 0 == octl(*args).exit_code


# -- config -----------------------------------------------------------------------------------------


def test_config__set_and_show_mask_the_token_in_a_0600_file(octl: Octl) -> None:
    """`config set-*` write the file readable by the owner only; `show` masks the token."""
    set_url = octl("config", "set-url", octl.base_url)
    set_org = octl("config", "set-org", ORG)
    set_token = octl("config", "set-token", octl.token)
    shown = octl("config", "show")

    assert [0, 0, 0, 0] == [r.exit_code for r in (set_url, set_org, set_token, shown)]
    assert f"Default organization set to {ORG}" in set_org.stderr
    assert {"api_url": octl.base_url, "default_org_id": ORG, "token": octl.token} == yaml.safe_load(
        octl.config_path.read_text()
    )
    assert 0o600 == stat.S_IMODE(octl.config_path.stat().st_mode)
    assert octl.token not in shown.output
    shown_values = yaml.safe_load(shown.stdout)
    assert octl.base_url == shown_values["api_url"]
    assert ORG == shown_values["default_org_id"]
    assert "****" in shown_values["token"]


def test_config__set_token_without_argument_reads_a_hidden_prompt(octl: Octl) -> None:
    result = octl("config", "set-token", input="po_from_prompt_0123456789\n")

    assert 0 == result.exit_code, result.output
    assert "po_from_prompt_0123456789" not in result.output
    assert "po_from_prompt_0123456789" == yaml.safe_load(octl.config_path.read_text())["token"]


def test_config__file_alone_is_enough(octl: Octl) -> None:
    """With no flag and no PO_* variable, the config file gives URL, organization and token."""
    octl("config", "set-url", octl.base_url)
    octl("config", "set-org", ORG)
    octl("config", "set-token", octl.token)
    octl("create", "project", "shop")

    listed = octl("get", "projects", "-o", "json", PO_API_URL=None, PO_AUTH_TOKEN=None, PO_ORG_ID=None)

    assert 0 == listed.exit_code, listed.output
    assert ["shop"] == [p["id"] for p in json.loads(listed.stdout)]


def test_config__flag_beats_env_beats_file(octl: Octl) -> None:
    """--org wins over PO_ORG_ID, which wins over default_org_id in the file."""
    octl("config", "set-org", "from-file")

    by_env = octl("get", "projects")
    by_flag = octl("--org", "from-flag", "get", "projects")
    by_leaf_flag = octl("get", "projects", "--org", "from-leaf")
    by_file = octl("get", "projects", PO_ORG_ID=None)

    assert 0 == by_env.exit_code
    assert "No projects found in organization acme." in by_env.stderr
    assert "organization 'from-flag' not found" in by_flag.stderr
    assert "organization 'from-leaf' not found" in by_leaf_flag.stderr
    assert "organization 'from-file' not found" in by_file.stderr


def test_config__xdg_config_home_is_honoured(octl: Octl, tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"

    result = octl("config", "set-org", "somewhere", OCTL_CONFIG=None, XDG_CONFIG_HOME=str(xdg))

    assert 0 == result.exit_code, result.output
    assert {"default_org_id": "somewhere"} == yaml.safe_load((xdg / "octl" / "config.yaml").read_text())


def test_config__no_organization_anywhere_is_a_usage_error(octl: Octl) -> None:
    result = octl("get", "projects", PO_ORG_ID=None)

    assert 2 == result.exit_code
    assert "no organization given" in result.stderr


# -- projects, environment types, environments ------------------------------------------------------


def test_projects__crud(octl: Octl) -> None:
    created = octl("create", "project", "shop", "--set", "display_name=Shop")
    got = octl("get", "project", "shop")
    updated = octl("update", "project", "shop", "--set-json", '{"display_name": "The Shop"}', "-o", "json")
    listed = octl("get", "projects", "-o", "yaml")
    deleted = octl("delete", "project", "shop")
    gone = octl("get", "project", "shop")

    assert 0 == created.exit_code, created.output
    assert {"id": "shop", "display_name": "Shop", "status": "active"}.items() <= yaml.safe_load(
        created.stdout
    ).items()
    assert "Project shop created in organization acme." in created.stderr
    assert ["Id", "DisplayName", "Status", "CreatedAt"] == got.stdout.splitlines()[0].split()
    assert ["shop", "Shop", "active"] == got.stdout.splitlines()[1].split()[:3]
    assert "The Shop" == json.loads(updated.stdout)["display_name"]
    assert ["The Shop"] == [p["display_name"] for p in yaml.safe_load(listed.stdout)]
    assert 0 == deleted.exit_code
    assert "Project shop deleted from organization acme." in deleted.stderr
    assert 1 == gone.exit_code
    assert "Error: not found: project 'shop' not found\n" == gone.stderr


def test_env_types_and_envs__crud(octl: Octl) -> None:
    env_type = octl("create", "env-type", "development", "--set-yaml", "display_name: Development")
    octl("create", "project", "shop")
    env = octl("create", "env", "shop", "dev", "--set", "env_type_id=development", "-o", "json")
    in_project = octl("get", "envs", "shop")
    in_org = octl("get", "envs", "-o", "json")
    got = octl("get", "env", "shop", "dev", "-o", "yaml")
    renamed = octl("update", "env", "shop", "dev", "--set", "display_name=Dev env")
    types = octl("get", "env-types")
    unconfirmed = octl("delete", "env", "shop", "dev")
    deleted = octl("delete", "env", "shop", "dev", "--yes")
    empty = octl("get", "envs", "shop")

    assert 0 == env_type.exit_code, env_type.output
    assert "Development" == yaml.safe_load(env_type.stdout)["display_name"]
    assert 0 == env.exit_code, env.output
    assert {"id": "dev", "project_id": "shop", "env_type_id": "development"}.items() <= json.loads(
        env.stdout
    ).items()
    assert "Environment shop/dev created in organization acme." in env.stderr
    assert ["shop", "dev", "development"] == in_project.stdout.splitlines()[1].split()[:3]
    assert ["dev"] == [e["id"] for e in json.loads(in_org.stdout)]
    assert "runner_id" not in yaml.safe_load(got.stdout)
    assert "Dev env" == yaml.safe_load(renamed.stdout)["display_name"]
    assert "development" in types.stdout
    # Standard input is not a terminal here: without --yes nothing is deleted, and the error says so.
    assert 2 == unconfirmed.exit_code
    assert "pass --yes to delete without asking" in unconfirmed.stderr
    assert 0 == deleted.exit_code
    assert "No environments found in project shop." in empty.stderr


def test_env_types__update_and_delete(octl: Octl) -> None:
    octl("create", "env-type", "staging")

    updated = octl("update", "env-type", "staging", "--set", "display_name=Staging")
    got = octl("get", "env-type", "staging", "-o", "json")
    deleted = octl("delete", "env-type", "staging")

    assert 0 == updated.exit_code, updated.output
    assert "Staging" == json.loads(got.stdout)["display_name"]
    assert "Environment type staging deleted from organization acme." in deleted.stderr
    assert 1 == octl("get", "env-type", "staging").exit_code


def test_client__lists_follow_every_page(live_server: str, org_token: str) -> None:
    with ApiClient(live_server, org_token, page_size=2) as client:
        for name in ("p-a", "p-b", "p-c", "p-d", "p-e"):
            client.create_project(ORG, {"id": name})

        listed = client.list_projects(ORG)

    assert ["p-a", "p-b", "p-c", "p-d", "p-e"] == sorted(p["id"] for p in listed)


# -- runner rules and refresh-runner ----------------------------------------------------------------


def test_runner_rule__create_with_set_then_duplicate_is_a_conflict(octl: Octl, seed_runner: Any) -> None:
    seed_runner("my-gke-runner")

    created = octl("create", "runner-rule", "--set=runner_id=my-gke-runner")
    duplicate = octl("create", "rrl", "--set=runner_id=my-gke-runner")

    assert 0 == created.exit_code, created.output
    rule = yaml.safe_load(created.stdout)
    assert {"runner_id": "my-gke-runner", "project_id": "", "env_type_id": ""}.items() <= rule.items()
    assert (
        f"Runner rule {rule['id']} for runner my-gke-runner created in organization acme." in created.stderr
    )
    assert 1 == duplicate.exit_code
    expected = f"runner rule conflicts with existing rule '{rule['id']}' for runner 'my-gke-runner'"
    assert f"Error: conflict: {expected}\n" == duplicate.stderr


def test_runner_rules__filter_by_runner_get_and_delete(octl: Octl, seed_runner: Any) -> None:
    seed_runner("r-one", "r-two")
    octl("create", "project", "shop")
    first = yaml.safe_load(
        octl("create", "runner-rule", "--set", "runner_id=r-one", "--set", "project_id=shop").stdout
    )
    octl("create", "runner-rule", "--set-json", '{"runner_id": "r-two"}')

    only_one = octl("get", "runner-rules", "--runner", "r-one", "-o", "json")
    every = octl("get", "rrls")
    one = octl("get", "rrl", first["id"])
    deleted = octl("delete", "runner-rule", first["id"])
    gone = octl("get", "runner-rule", first["id"])

    assert [(first["id"], "r-one", "shop")] == [
        (r["id"], r["runner_id"], r["project_id"]) for r in json.loads(only_one.stdout)
    ]
    assert ["Id", "RunnerId", "ProjectId", "EnvTypeId", "CreatedAt"] == every.stdout.splitlines()[0].split()
    assert {"r-one", "r-two"} == {line.split()[1] for line in every.stdout.splitlines()[1:] if line.strip()}
    assert [first["id"], "r-one", "shop"] == one.stdout.splitlines()[1].split()[:3]
    assert 0 == deleted.exit_code
    assert 1 == gone.exit_code
    assert f"Error: not found: runner rule '{first['id']}' not found\n" == gone.stderr


def test_runner_rule__missing_runner_and_bad_uuid(octl: Octl) -> None:
    missing = octl("create", "runner-rule", "--set", "runner_id=nope")
    bad_uuid = octl("get", "runner-rule", "not-a-uuid")

    assert 1 == missing.exit_code
    assert (
        "Error: not found: runner 'nope' not found: create it first, or name one `octl get runners` lists\n"
        == missing.stderr
    )
    assert 2 == bad_uuid.exit_code
    assert "not-a-uuid" in bad_uuid.stderr


def test_refresh_runner__dry_run_changes_nothing_then_links(octl: Octl, seed_runner: Any) -> None:
    seed_runner("r-one")
    _make_env(octl)
    octl("create", "runner-rule", "--set", "runner_id=r-one", "--set", "env_type_id=development")

    dry = octl("refresh-runner", "shop", "dev", "--dry-run")
    after_dry = yaml.safe_load(octl("get", "env", "shop", "dev", "-o", "yaml").stdout)
    applied = octl("refresh-runner", "shop", "dev", "-o", "json")
    after = yaml.safe_load(octl("get", "env", "shop", "dev", "-o", "yaml").stdout)
    again = octl("refresh-runner", "shop", "dev")

    assert 0 == dry.exit_code, dry.output
    assert {"runner_id": "r-one", "updated": True} == yaml.safe_load(dry.stdout)
    assert "Dry run: Environment shop/dev would change to runner r-one" in dry.stderr
    assert "runner_id" not in after_dry
    assert {"runner_id": "r-one", "updated": True} == json.loads(applied.stdout)
    assert "Environment shop/dev is now linked to runner r-one." in applied.stderr
    assert "r-one" == after["runner_id"]
    assert {"runner_id": "r-one", "updated": False} == yaml.safe_load(again.stdout)
    assert "stays linked to runner r-one" in again.stderr


def test_refresh_runner__no_rule_is_a_conflict_and_missing_env_not_found(octl: Octl) -> None:
    _make_env(octl)

    no_rule = octl("refresh-runner", "shop", "dev")
    no_env = octl("refresh-runner", "shop", "prod", "--dry-run")

    assert 1 == no_rule.exit_code
    assert no_rule.stderr.startswith(
        "Error: conflict: no matching runner found for the supplied environment: "
    )
    assert "the organization has no runner rules; create one, e.g. `octl create runner-rule" in no_rule.stderr
    assert 1 == no_env.exit_code
    assert "Error: not found: environment 'prod' not found in project 'shop'\n" == no_env.stderr


# -- tokens -----------------------------------------------------------------------------------------


def test_tokens__secret_shown_once_then_listed_without_it_and_revoked(octl: Octl) -> None:
    created = octl("create", "token", "--set", "role=viewer", "--set", "description=ci bot", "-o", "json")
    token = json.loads(created.stdout)
    listed = octl("get", "tokens")
    one = octl("get", "token", token["id"], "-o", "json")
    as_viewer = octl("get", "projects", PO_AUTH_TOKEN=token["token"])
    viewer_writes = octl("create", "project", "shop", PO_AUTH_TOKEN=token["token"])
    revoked = octl("delete", "token", token["id"])
    after = octl("get", "projects", PO_AUTH_TOKEN=token["token"])

    assert 0 == created.exit_code, created.output
    assert token["token"] and "viewer" == token["role"]
    assert "it is not shown again" in created.stderr
    assert "ci bot" in listed.stdout
    assert token["token"] not in listed.stdout + one.stdout
    assert "ci bot" == json.loads(one.stdout)["description"]
    assert 0 == as_viewer.exit_code
    assert 1 == viewer_writes.exit_code
    assert viewer_writes.stderr.startswith("Error: forbidden: ")
    assert f"Token {token['id']} deleted from organization acme." in revoked.stderr
    assert 1 == after.exit_code
    assert after.stderr.startswith(
        "Error: unauthenticated: invalid or expired token (the token was refused: "
    )


# -- errors -----------------------------------------------------------------------------------------


def test_errors__bad_request_names_the_field(octl: Octl) -> None:
    bad_id = octl("create", "project", "Not_Valid")
    unknown = octl("create", "project", "shop", "--set", "colour=red")

    assert 1 == bad_id.exit_code
    assert bad_id.stderr.startswith("Error: bad request: id: ")
    assert 1 == unknown.exit_code
    assert "Error: bad request: colour: unknown field\n" == unknown.stderr


def test_errors__no_token_is_unauthenticated_with_a_hint(octl: Octl) -> None:
    result = octl("get", "projects", PO_AUTH_TOKEN=None)

    assert 1 == result.exit_code
    assert result.stderr.startswith("Error: unauthenticated: missing bearer token")
    assert "octl config set-token" in result.stderr


def test_errors__unreachable_api_names_the_url(octl: Octl) -> None:
    url = f"http://127.0.0.1:{_free_port()}"

    result = octl("get", "projects", PO_API_URL=url)

    assert 3 == result.exit_code
    assert result.stderr.startswith(f"Error: cannot reach the API at {url}: ")
    assert "Traceback" not in result.output


def test_errors__input_problems_are_usage_errors(octl: Octl, tmp_path: Path) -> None:
    both = octl("create", "project", "shop", "--set-json", "{}", "--set-yaml", "{}")
    other_id = octl("create", "project", "shop", "--set", "id=other")
    no_file = octl("create", "project", "shop", f"--set-yaml=@{tmp_path / 'missing.yaml'}")
    nothing = octl("update", "project", "shop")
    bad_url = octl("get", "projects", PO_API_URL="localhost:8080")

    assert [2, 2, 2, 2, 2] == [r.exit_code for r in (both, other_id, no_file, nothing, bad_url)]
    assert "mutually exclusive" in both.stderr
    assert "the input sets id 'other', but the argument is 'shop'" in other_id.stderr
    assert "missing.yaml" in no_file.stderr
    assert "nothing to update" in nothing.stderr
    assert "invalid API URL 'localhost:8080'" in bad_url.stderr
    assert 1 == octl("get", "project", "shop").exit_code, "nothing was created"


def test_errors__debug_shows_requests_and_the_traceback(octl: Octl) -> None:
    result = octl("-d", "get", "project", "nope")

    assert 1 == result.exit_code
    assert f"> GET {octl.base_url}/orgs/acme/projects/nope" in result.stderr
    assert "< 404 Not Found" in result.stderr
    assert "Traceback" in result.stderr
    assert result.stderr.endswith("Error: not found: project 'nope' not found\n")


def test_stdin__set_yaml_dash_reads_standard_input(octl: Octl) -> None:
    result = octl("create", "project", "shop", "--set-yaml", "-", input="display_name: From Stdin\n")

    assert 0 == result.exit_code, result.output
    assert "From Stdin" == yaml.safe_load(result.stdout)["display_name"]


def test_console_script__runs_as_a_process(octl: Octl) -> None:
    """The installed `octl` entry point works end to end (no CliRunner in between)."""
    octl("create", "project", "shop")
    env = {**os.environ, "PO_API_URL": octl.base_url, "PO_AUTH_TOKEN": octl.token, "PO_ORG_ID": ORG}
    env["OCTL_CONFIG"] = str(octl.config_path)
    executable = Path(sys.executable).with_name("octl")

    listed = subprocess.run(
        [executable, "get", "projects"], capture_output=True, text=True, env=env, timeout=60
    )
    missing = subprocess.run(
        [executable, "get", "project", "nope"], capture_output=True, text=True, env=env, timeout=60
    )

    assert 0 == listed.returncode, listed.stderr
    assert ["Id", "DisplayName", "Status", "CreatedAt"] == listed.stdout.splitlines()[0].split()
    assert 1 == missing.returncode
    assert "Error: not found: project 'nope' not found\n" == missing.stderr


def test_client__api_error_carries_status_and_code(live_server: str, org_token: str) -> None:
    with ApiClient(live_server, org_token) as client, pytest.raises(ApiError) as caught:
        client.get_project(ORG, "nope")

    assert (404, "API-404", "not found") == (caught.value.status, caught.value.error, caught.value.kind)


# -- runners ----------------------------------------------------------------------------------------


def test_get_runner__says_whether_this_orchestrator_can_launch_it(
    settings: ServerSettings, tmp_path: Path
) -> None:
    """A local runner made where local runners were allowed, read from a server on the same database
    without them: the table's Launchable column says false and a warning on stderr says why; an EKS
    runner is launchable (every extra is installed here)."""
    local = yaml.safe_load((RUNNER_DATA / "vm-local.yaml").read_text())
    eks = yaml.safe_load((RUNNER_DATA / "kubernetes-eks.yaml").read_text())
    with serve_in_thread(create_app(settings)) as url, ApiClient(url, BOOTSTRAP_TOKEN) as platform:
        platform.create_org(ORG)
        platform.create_runner(ORG, {**local, "id": "here"})
        platform.create_runner(ORG, {**eks, "id": "eks"})
    without_local = settings.model_copy(update={"allow_local_runners": False})
    with serve_in_thread(create_app(without_local)) as url:
        octl = Octl(base_url=url, token=BOOTSTRAP_TOKEN, config_path=tmp_path / "octl" / "config.yaml")
        here = octl("get", "runner", "here")
        here_json = octl("get", "runner", "here", "-o", "json")
        cloud = octl("get", "runner", "eks")

    message = (
        "this orchestrator cannot launch vm runners with a local connection: local runners are off on this "
        "server (start it with PO_ALLOW_LOCAL_RUNNERS=true)"
    )
    assert (0, 0, 0) == (here.exit_code, here_json.exit_code, cloud.exit_code), here.output
    # One header line, then the row; a long cell (PostgreSQL's timestamps) may wrap the row onto more lines.
    header, *row = here.stdout.splitlines()
    assert ["Id", "OrgId", "Description", "RunnerType", "StateStorageType", "CreatedAt", "Launchable"] == (
        header.split()
    )
    assert row[0].startswith("here") and row[0].split()[-1] == "false", here.stdout
    assert f"Warning: {message}\n" == here.stderr
    assert {"launchable": False, "message": message} == json.loads(here_json.stdout)["status"]
    assert cloud.stdout.splitlines()[1].split()[-1] == "true", cloud.stdout
    assert "" == cloud.stderr


def test_runners__crud_from_the_seed_yaml(octl: Octl) -> None:
    seed = RUNNER_DATA / "seed000-gke.yaml"

    created = octl("create", "runner", "my-gke-runner", f"--set-yaml=@{seed}")
    listed = octl("get", "runners")
    got = octl("get", "runner", "my-gke-runner", "-o", "json")
    got_table = octl("get", "runner", "my-gke-runner")
    updated = octl("update", "runner", "my-gke-runner", f"--set-yaml=@{seed}", "--set", "description=changed")
    deleted = octl("delete", "runner", "my-gke-runner")
    gone = octl("get", "runner", "my-gke-runner")

    assert 0 == created.exit_code, created.output
    assert "Runner my-gke-runner created in organization acme." in created.stderr
    body = yaml.safe_load(created.stdout)
    assert "my-gke-runner" == body["id"]
    assert "kubernetes-gke" == body["runner_configuration"]["type"]
    assert "kubernetes" == body["state_storage_configuration"]["type"]
    assert ["Id", "Description", "RunnerType", "CreatedAt"] == listed.stdout.splitlines()[0].split()
    row = listed.stdout.splitlines()[1]
    assert row.startswith("my-gke-runner") and "GKE runner for my-cluster in europe-west3" in row
    assert "kubernetes-gke" in row
    assert "my-cluster" == json.loads(got.stdout)["runner_configuration"]["cluster"]["name"]
    assert ["my-gke-runner", "acme"] == got_table.stdout.splitlines()[1].split()[:2]
    assert 0 == updated.exit_code, updated.output
    assert "changed" == yaml.safe_load(updated.stdout)["description"]
    assert "Runner my-gke-runner deleted from organization acme." in deleted.stderr
    assert 1 == gone.exit_code
    assert gone.stderr.startswith("Error: not found: ")


def test_runners__unknown_field_is_refused_naming_it(octl: Octl, tmp_path: Path) -> None:
    config = yaml.safe_load((RUNNER_DATA / "seed000-gke.yaml").read_text())
    config["runner_configuration"]["cluster"]["foo"] = "bar"
    path = tmp_path / "gke-with-foo.yaml"
    path.write_text(yaml.safe_dump(config))

    result = octl("create", "runner", "my-gke-runner", f"--set-yaml=@{path}")

    assert 1 == result.exit_code
    assert "Error: bad request: runner_configuration.cluster.foo: unknown field\n" == result.stderr


def test_runners__delete_while_linked_is_a_conflict(octl: Octl) -> None:
    octl("create", "runner", "my-eks-runner", f"--set-yaml=@{RUNNER_DATA / 'kubernetes-eks.yaml'}")
    _make_env(octl)
    octl("create", "runner-rule", "--set", "runner_id=my-eks-runner")
    octl("refresh-runner", "shop", "dev")

    result = octl("delete", "runner", "my-eks-runner")

    assert 1 == result.exit_code
    assert "Error: conflict: runner my-eks-runner is in use by the environments: shop/dev\n" == result.stderr


def test_compatibility_matrix__table_and_json(octl: Octl) -> None:
    table = octl("get", "compatibility-matrix")
    as_json = octl("get", "compatibility-matrix", "-o", "json")

    assert 0 == table.exit_code, table.output
    header = table.stdout.splitlines()[0].split()
    assert "RunnerType" == header[0]
    assert {"azurerm", "gcs", "kubernetes", "s3"} <= set(header[1:])
    ecs = next(line.split() for line in table.stdout.splitlines() if line.startswith("serverless-ecs"))
    assert "yes" == ecs[header.index("s3")]
    assert "no" == ecs[header.index("kubernetes")]
    ecs_storages = json.loads(as_json.stdout)["serverless-ecs"]
    assert "s3" in ecs_storages
    assert "kubernetes" not in ecs_storages


def test_config__profiles_use_and_profile_flag(octl: Octl) -> None:
    """`config use` switches the profile the set-* commands and every other command use; the top-level
    keys stay the `default` profile; --profile picks one for a single command."""
    octl("config", "set-url", octl.base_url)
    octl("config", "set-org", ORG)
    octl("config", "set-token", octl.token)
    octl("create", "project", "shop")

    used = octl("config", "use", "other")
    octl("config", "set-url", octl.base_url)
    octl("config", "set-org", "other-org")
    octl("config", "set-token", octl.token)
    in_other = octl("get", "projects", PO_API_URL=None, PO_AUTH_TOKEN=None, PO_ORG_ID=None)
    in_default = octl("--profile", "default", "get", "projects", "-o", "json", PO_ORG_ID=None)
    shown = octl("config", "show")
    back = octl("config", "use", "default")
    after = octl("get", "projects", "-o", "json", PO_API_URL=None, PO_AUTH_TOKEN=None, PO_ORG_ID=None)

    assert 0 == used.exit_code, used.output
    assert "Using profile other (new and empty" in used.stderr
    assert "organization 'other-org' not found" in in_other.stderr
    assert 0 == in_default.exit_code, in_default.output
    assert ["shop"] == [p["id"] for p in json.loads(in_default.stdout)]
    assert "profile other (profiles: default, other)" in shown.stderr
    assert "other-org" == yaml.safe_load(shown.stdout)["default_org_id"]
    assert 0 == back.exit_code
    assert ["shop"] == [p["id"] for p in json.loads(after.stdout)]
    document = yaml.safe_load(octl.config_path.read_text())
    assert ORG == document["default_org_id"]
    assert "other-org" == document["profiles"]["other"]["default_org_id"]
    assert "current_profile" not in document


def test_docs__the_completion_lines_install_octls_completion(tmp_path: Path) -> None:
    """docs/guides/cli.md's three lines: bash's runs in bash and registers the completion function; zsh
    and fish are not on this machine's PATH (not installable here), so their lines' command, which makes
    the script the line loads, runs in bash and must make that shell's script."""
    bash_line, zsh_line, fish_line = commands(docs_example("guides/cli-completion"))
    env = {**os.environ, "PATH": f"{OCTL_EXECUTABLE.parent}:{os.environ['PATH']}", "HOME": str(tmp_path)}

    def bash(script: str) -> str:
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert 0 == done.returncode, done.stderr
        return done.stdout

    assert "octl" in bash(f"{bash_line}\ncomplete -p octl")
    zsh_script = bash(zsh_line.removeprefix('eval "$(').split(')"')[0])
    assert "compdef" in zsh_script
    fish_script = bash(fish_line.split(" | source")[0])
    assert "complete --no-files --command octl" in fish_script


def test_version_and_completion_scripts(octl: Octl) -> None:
    """`octl --version`; the shell completion scripts click makes (docs/guides/cli.md)."""
    version = octl("--version")
    scripts = {
        shell: subprocess.run(
            [str(OCTL_EXECUTABLE)],
            env={**os.environ, "_OCTL_COMPLETE": f"{shell}_source"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        for shell in ("bash", "zsh", "fish")
    }
    completed = subprocess.run(
        [str(OCTL_EXECUTABLE)],
        env={
            **os.environ,
            "_OCTL_COMPLETE": "bash_complete",
            "COMP_WORDS": "octl get runn",
            "COMP_CWORD": "2",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert 0 == version.exit_code
    assert re.match(r"octl, version \d+\.\d+", version.stdout)
    for shell, done in scripts.items():
        assert 0 == done.returncode, done.stderr
        assert "_OCTL_COMPLETE" in done.stdout, shell
    assert {"runner", "runner-rule", "runner-rules", "runners"} <= {
        line.split(",")[-1] for line in completed.stdout.splitlines()
    }
