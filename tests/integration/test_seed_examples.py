"""Every CLI and YAML example of seeds 000 and 001, as users paste them, through ``octl``/``hctl``.

The examples are in ``tests/data/seeds/``, copied verbatim (``tests/data/seeds/README.md`` says from where).
Shell snippets run through ``bash`` in a working directory of their own, with ``octl``/``hctl`` (the
installed console scripts) on ``PATH`` against a real server, so that ``${RUNNER_ID}``, heredocs,
``$(kubectl ...)`` and ``curl`` do what they do for a user. Where an example cannot work as printed, the test
pins the message that says what to change.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.client.api import ApiClient
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.live_server import serve_in_thread
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.tools import tools_required

#: The database plays no part here: each test runs on one of them (tests/conftest.py).
pytestmark = pytest.mark.spread

SEEDS = Path(__file__).parents[1] / "data" / "seeds"
RUNNERS = Path(__file__).parents[1] / "data" / "runners"
KUBECTL_STANDIN = Path(__file__).parents[1] / "support" / "kubectl_standin.py"
BIN = Path(sys.executable).parent  # octl, hctl
ORG = "my-org"  # seed 000's refresh_runner example names it
#: Seed 001's `export CLUSTER_NAME=<my-cluster-name>`: the value a user puts in place of the placeholder.
CLUSTER_NAME = "my-cluster"
#: What seed 001's `cat runner-config.yaml` shows once the state storage is filled in (state storage type
#: kubernetes, as its documentation gives it), and the command its web page mangled, as written.
STATE_STORAGE = "state_storage_configuration:\n  type: kubernetes\n  namespace: humanitec-runner\n"
CREATE_WITH_OPTION = "hctl create runner ${RUNNER_ID} --set-yaml=@runner-config.yaml\n"
MANGLED = (
    "Error: '[email protected]' is not an argument of hctl: the web page you copied the command from put it "
    "in place of an option it took for an e-mail address, such as --set-yaml=@runner-config.yaml. Write "
    "that option, naming your file: --set-yaml=@runner-config.yaml\n"
)
ELLIPSIS = (
    "is '...', which the documentation's examples write for what they leave out: replace it with the real "
    "value"
)


def seed(name: str) -> str:
    return (SEEDS / name).read_text()


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: str
    stderr: str


@dataclass
class Shell:
    """bash in a working directory of its own, with octl/hctl set up for the org's admin (PO_* variables)."""

    cwd: Path
    env: dict[str, str]
    client: ApiClient

    def run(self, script: str, **env: str) -> Ran:
        done = subprocess.run(
            ["bash", "-e", "-c", script],
            cwd=self.cwd,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        return Ran(done.returncode, done.stdout, done.stderr)

    def octl(self, *args: str) -> Ran:
        done = subprocess.run(
            [str(BIN / "octl"), *args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return Ran(done.returncode, done.stdout, done.stderr)

    def put(self, name: str, text: str) -> Path:
        path = self.cwd / name
        path.write_text(text)
        return path


def _kubeconfig(path: Path) -> Path:
    """The user's kube config: the current context's cluster and a client certificate (throwaway test
    material, the one of tests/data/runners/seed001-kubernetes.yaml), and another context."""
    material = yaml.safe_load((RUNNERS / "seed001-kubernetes.yaml").read_text())["runner_configuration"][
        "cluster"
    ]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": CLUSTER_NAME,
        "clusters": [
            {"name": "other", "cluster": {"server": "https://other.example.com"}},
            {
                "name": CLUSTER_NAME,
                "cluster": {
                    "certificate-authority-data": material["cluster_data"]["certificate_authority_data"],
                    "server": "https://my-cluster.example.com:6443",
                },
            },
        ],
        "users": [
            {"name": "other", "user": {"token": "not-a-token"}},
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": material["auth"]["client_certificate_data"],
                    "client-key-data": material["auth"]["client_key_data"],
                },
            },
        ],
        "contexts": [
            {"name": "other", "context": {"cluster": "other", "user": "other"}},
            {"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": "admin"}},
        ],
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def shell(settings: ServerSettings, tmp_path: Path) -> Iterator[Shell]:
    if shutil.which("curl") is None:
        message = "curl is not installed (seed 000's refresh_runner example runs it)"
        pytest.fail(message) if tools_required() else pytest.skip(message)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{KUBECTL_STANDIN}" "$@"\n')
    kubectl.chmod(0o755)
    cwd = tmp_path / "work"
    cwd.mkdir()
    with serve_in_thread(create_app(settings)) as base_url, ApiClient(base_url, BOOTSTRAP_TOKEN) as platform:
        platform.create_org(ORG)
        token = str(platform.create_token(ORG, {"role": "admin", "description": "seeds"})["token"])
        env = {
            "PATH": f"{bin_dir}:{BIN}:{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "LANG": "C.UTF-8",
            "PO_API_URL": base_url,
            "PO_AUTH_TOKEN": token,
            "PO_ORG_ID": ORG,
            "OCTL_CONFIG": str(tmp_path / "octl" / "config.yaml"),
            "KUBECONFIG": str(_kubeconfig(tmp_path / "kubeconfig")),
        }
        with ApiClient(base_url, token) as client:
            yield Shell(cwd, env, client)


def _gke_runner(shell: Shell) -> dict[str, Any]:
    """Seed 000's basic example runner, created as its CLI tab says."""
    shell.put("gke-runner-config.yaml", seed("000-basic-example-gke-runner-config.yaml"))
    created = shell.octl(
        "create", "runner", "my-gke-runner", "--set-yaml=@gke-runner-config.yaml", "-o", "json"
    )
    assert 0 == created.exit_code, created.stderr
    runner: dict[str, Any] = json.loads(created.stdout)
    return runner


# -- seed 000 ---------------------------------------------------------------------------------------


def test_seed000_basic_example__creates_the_runner_and_an_empty_rule(shell: Shell) -> None:
    shell.put("gke-runner-config.yaml", seed("000-basic-example-gke-runner-config.yaml"))

    ran = shell.run(seed("000-basic-example-create.sh"))

    assert 0 == ran.exit_code, ran.stderr
    assert "Runner my-gke-runner created in organization my-org." in ran.stderr
    runner = shell.client.get_runner(ORG, "my-gke-runner")
    expected = yaml.safe_load(seed("000-basic-example-gke-runner-config.yaml"))
    assert expected["description"] == runner["description"]
    assert {
        **expected["runner_configuration"],
        "cluster": {**expected["runner_configuration"]["cluster"], "internal_ip": False},
    } == runner["runner_configuration"]
    assert expected["state_storage_configuration"] == runner["state_storage_configuration"]
    rules = shell.client.list_runner_rules(ORG)
    assert [("my-gke-runner", "", "")] == [(r["runner_id"], r["project_id"], r["env_type_id"]) for r in rules]


def test_seed000_configuration__the_skeleton_names_each_missing_field(shell: Shell) -> None:
    """The "Configuration" YAML is a skeleton ("Further properties are depending on the runner type")."""
    shell.put("my-runner-config.yaml", seed("000-configuration.yaml"))

    ran = shell.octl("create", "runner", "my-runner", "--set-yaml=@my-runner-config.yaml")

    assert 1 == ran.exit_code
    assert (
        "Error: bad request: runner_configuration.cluster: field required (and 2 more errors)\n"
        "  also: runner_configuration.job: field required\n"
        "  also: state_storage_configuration.namespace: field required\n"
    ) == ran.stderr
    assert [] == shell.client.list_runners(ORG)


def test_seed000_manage_runners__each_command_works(shell: Shell) -> None:
    """`octl create|get|update|delete runner`, `get runners`; the seed's my-runner-config.yaml is left to
    the reader: the basic example's configuration stands in for it."""
    shell.put("my-runner-config.yaml", seed("000-basic-example-gke-runner-config.yaml"))
    shell.put("gke-runner-config.yaml", seed("000-basic-example-gke-runner-config.yaml"))

    ran = shell.run(seed("000-manage-runners.sh"))

    assert 0 == ran.exit_code, ran.stderr
    for done in ("created in", "updated in", "deleted from"):
        assert f"Runner my-runner {done} organization my-org." in ran.stderr
    headers = [line.split()[:3] for line in ran.stdout.splitlines() if line.startswith("Id ")]
    assert [["Id", "OrgId", "Description"], ["Id", "Description", "RunnerType"]] == headers  # get runner(s)
    assert any(line.startswith("my-runner") and "kubernetes-gke" in line for line in ran.stdout.splitlines())
    assert [] == shell.client.list_runners(ORG)


@pytest.mark.parametrize("dry_run", [False, True], ids=["as printed", "dry_run true"])
def test_seed000_refresh_runner__the_curl_call_links_the_environment(shell: Shell, dry_run: bool) -> None:
    """The curl call as printed, with the user's API URL and token; its JSON body carries dry_run."""
    _gke_runner(shell)
    for args in (
        ("create", "env-type", "development"),
        ("create", "project", "my-project"),
        ("create", "env", "my-project", "my-environment", "--set", "env_type_id=development"),
        ("create", "runner-rule", "--set=runner_id=my-gke-runner"),
    ):
        assert 0 == shell.octl(*args).exit_code
    script = seed("000-refresh-runner.sh").replace(
        "https://api.orchestrator.example.com", shell.env["PO_API_URL"]
    )
    if dry_run:
        script = script.replace('"dry_run": false', '"dry_run": true')

    ran = shell.run(script)

    assert 0 == ran.exit_code, ran.stderr
    assert {"runner_id": "my-gke-runner", "updated": True} == json.loads(ran.stdout)
    env = shell.client.get_env(ORG, "my-project", "my-environment")
    assert (None if dry_run else "my-gke-runner") == env.get("runner_id")


def test_seed000_runner_image__the_pod_template_snippet_updates_a_runner(shell: Shell) -> None:
    """The snippet holds only runner_configuration.job.pod_template: it is merged onto the stored runner."""
    before = _gke_runner(shell)
    shell.put("image.yaml", seed("000-runner-image-pod-template.yaml"))

    ran = shell.octl("update", "runner", "my-gke-runner", "--set-yaml=@image.yaml", "-o", "json")

    assert 0 == ran.exit_code, ran.stderr
    assert "Runner my-gke-runner updated in organization my-org." in ran.stderr
    snippet = yaml.safe_load(seed("000-runner-image-pod-template.yaml"))["runner_configuration"]
    after = shell.client.get_runner(ORG, "my-gke-runner")
    expected = {**before["runner_configuration"]}
    expected["job"] = {**expected["job"], "pod_template": snippet["job"]["pod_template"]}
    assert expected == after["runner_configuration"]
    assert before["state_storage_configuration"] == after["state_storage_configuration"]
    assert after["runner_configuration"] == json.loads(ran.stdout)["runner_configuration"]


def test_seed000_runner_image__the_pod_template_snippet_alone_cannot_create_a_runner(shell: Shell) -> None:
    shell.put("image.yaml", seed("000-runner-image-pod-template.yaml"))

    ran = shell.octl("create", "runner", "my-gke-runner", "--set-yaml=@image.yaml")

    assert 1 == ran.exit_code
    assert ran.stderr.startswith(
        "Error: bad request: runner_configuration.type: field required, must be one of ["
    )
    assert "  also: state_storage_configuration: field required\n" in ran.stderr


def test_seed000_runner_image_ecs__the_ellipsis_line_is_named_then_the_missing_fields(shell: Shell) -> None:
    """The ECS snippet ends in a `...` line ("See other required properties"): octl names the line; without
    it, creating a runner names each missing field, and updating an ECS runner sets its image."""
    shell.put("ecs.yaml", seed("000-runner-image-ecs.yaml"))
    without = seed("000-runner-image-ecs.yaml").replace("    ...\n", "")
    shell.put("ecs-without-ellipsis.yaml", without)
    assert (
        0
        == shell.octl(
            "create", "runner", "my-ecs-runner", f"--set-yaml=@{RUNNERS / 'serverless-ecs.yaml'}"
        ).exit_code
    )

    as_printed = shell.octl("update", "runner", "my-ecs-runner", "--set-yaml=@ecs.yaml")
    created = shell.octl("create", "runner", "other-ecs-runner", "--set-yaml=@ecs-without-ellipsis.yaml")
    updated = shell.octl(
        "update", "runner", "my-ecs-runner", "--set-yaml=@ecs-without-ellipsis.yaml", "-o", "json"
    )

    assert 2 == as_printed.exit_code
    assert (
        "Error: --set-yaml: invalid YAML: line 7 is '...', which the documentation's examples write for what "
        "they leave out: replace it with the fields it stands for, or delete it\n"
    ) == as_printed.stderr
    assert 1 == created.exit_code
    assert created.stderr.startswith(
        "Error: bad request: runner_configuration.auth: field required (and 5 more errors)\n"
    )
    for field in ("job.region", "job.cluster", "job.subnets", "job.execution_role_arn"):
        assert f"  also: runner_configuration.{field}: field required\n" in created.stderr
    assert "  also: state_storage_configuration: field required\n" in created.stderr
    assert 0 == updated.exit_code, updated.stderr
    image = yaml.safe_load(without)["runner_configuration"]["job"]["image"]
    assert image == json.loads(updated.stdout)["runner_configuration"]["job"]["image"]
    stored = yaml.safe_load((RUNNERS / "serverless-ecs.yaml").read_text())["runner_configuration"]["job"]
    assert stored["region"] == json.loads(updated.stdout)["runner_configuration"]["job"]["region"]


# -- seed 001 ---------------------------------------------------------------------------------------


def _prepare(shell: Shell, state_storage: str) -> str:
    """Seed 001's steps up to "Create the runner", in one shell script: the exports, the runner
    configuration from the kube config, the state storage file appended, the file shown."""
    shell.put("state-storage-config.yaml", state_storage)
    return "".join(
        (
            seed("001-prepare-cluster-name.sh").replace("<my-cluster-name>", CLUSTER_NAME),
            seed("001-prepare-runner-id.sh"),
            seed("001-prepare-namespace.sh"),
            seed("001-prepare-service-account.sh"),
            seed("001-create-runner-prepare-config.sh"),
            seed("001-create-runner-append-state-storage.sh"),
            seed("001-create-runner-verify.sh"),
        )
    )


def test_seed001_create_runner__the_mangled_command_says_what_to_write(shell: Shell) -> None:
    """The page shows `[email protected]` (with a no-break space) where `--set-yaml=@runner-config.yaml`
    was."""
    script = _prepare(shell, STATE_STORAGE) + seed("001-create-runner.sh")

    ran = shell.run(script)

    assert "\u00a0" in seed("001-create-runner.sh")
    assert 2 == ran.exit_code
    assert ran.stderr.endswith(MANGLED)
    assert "runner_configuration:\n  type: kubernetes\n" in ran.stdout  # `cat runner-config.yaml`
    assert [] == shell.client.list_runners(ORG)


def test_seed001_create_runner__with_the_option_creates_the_runner_from_the_kube_config(shell: Shell) -> None:
    script = _prepare(shell, STATE_STORAGE) + CREATE_WITH_OPTION

    ran = shell.run(script)

    assert 0 == ran.exit_code, ran.stderr
    assert "Runner kubernetes-my-cluster created in organization my-org." in ran.stderr
    runner = shell.client.get_runner(ORG, "kubernetes-my-cluster")
    kubeconfig = yaml.safe_load(Path(shell.env["KUBECONFIG"]).read_text())
    cluster = kubeconfig["clusters"][1]["cluster"]
    assert {
        "type": "kubernetes",
        "cluster": {
            "cluster_data": {
                "certificate_authority_data": cluster["certificate-authority-data"],
                "server": cluster["server"],
            },
            "auth": {"client_certificate_data": "SECRET", "client_key_data": "SECRET"},
        },
        "job": {"namespace": "humanitec-runner", "service_account": "humanitec-runner"},
    } == runner["runner_configuration"]
    assert {"type": "kubernetes", "namespace": "humanitec-runner"} == runner["state_storage_configuration"]


def test_seed001_state_storage_as_printed__says_to_replace_the_ellipsis(shell: Shell) -> None:
    script = _prepare(shell, seed("001-state-storage-config.yaml")) + CREATE_WITH_OPTION

    ran = shell.run(script)

    assert 1 == ran.exit_code
    assert ran.stderr.endswith(f"Error: bad request: state_storage_configuration: {ELLIPSIS}\n")
    assert [] == shell.client.list_runners(ORG)


def test_seed001_example_configuration__each_shortened_value_is_named(shell: Shell) -> None:
    shell.put("runner-config.yaml", seed("001-example-configuration-runner-config.yaml"))

    ran = shell.run(CREATE_WITH_OPTION, RUNNER_ID="kubernetes-my-cluster")

    shortened = (
        "not a value shortened with '...' as in the documentation's example: give the whole value "
        "(kubectl config view --raw shows it)"
    )
    assert 1 == ran.exit_code
    assert ran.stderr == (
        "Error: bad request: runner_configuration.cluster.cluster_data.certificate_authority_data: must be "
        f"the base64 encoding of a PEM certificate, {shortened} (and 3 more errors)\n"
        f"  also: runner_configuration.cluster.auth.client_certificate_data: must be the base64 encoding of "
        f"a PEM certificate, {shortened}\n"
        f"  also: runner_configuration.cluster.auth.client_key_data: must be the base64 encoding of a PEM "
        f"private key, {shortened}\n"
        f"  also: state_storage_configuration: {ELLIPSIS}\n"
    )


def test_seed001_sensitive_env__env_as_one_mapping_is_read_as_a_list_with_a_warning(shell: Shell) -> None:
    """The CLI tab writes env as one mapping (the TF tab as a list): read as a list of that variable; the
    runner's credentials, which the snippet leaves out, are kept."""
    runner = shell.put("runner.yaml", (RUNNERS / "seed001-kubernetes.yaml").read_text())
    assert 0 == shell.octl("create", "runner", "kubernetes-my-cluster", f"--set-yaml=@{runner}").exit_code
    shell.put("pod-template.yaml", seed("001-sensitive-env-pod-template.yaml"))

    ran = shell.run("hctl update runner kubernetes-my-cluster --set-yaml=@pod-template.yaml -o json")

    assert 0 == ran.exit_code, ran.stderr
    warning = (
        "runner_configuration.job.pod_template.spec.containers[0].env: a single mapping, read as a list of "
        "this one variable; write env as a list ('- name: TF_EXAMPLE')"
    )
    assert f"Warning: {warning}\n" in ran.stderr
    answer = json.loads(ran.stdout)
    assert [warning] == answer["warnings"]
    job = shell.client.get_runner(ORG, "kubernetes-my-cluster")["runner_configuration"]["job"]
    assert {
        "namespace": "humanitec-runner",
        "service_account": "humanitec-runner",
        "pod_template": {
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "env": [
                            {
                                "name": "TF_EXAMPLE",
                                "valueFrom": {"secretKeyRef": {"name": "my-secret", "key": "key"}},
                            }
                        ],
                    }
                ]
            }
        },
    } == job
    assert {"client_certificate_data": "SECRET", "client_key_data": "SECRET"} == answer[
        "runner_configuration"
    ]["cluster"]["auth"]
    # The stored credentials are still there: an update that sends none of them validates against them.
    again = shell.octl("update", "runner", "kubernetes-my-cluster", "--set", "description=checked")
    assert 0 == again.exit_code, again.stderr


def test_hctl__is_octl_under_seed_001s_name(shell: Shell) -> None:
    helped = shell.run("hctl --help")
    listed = shell.run("hctl get runners")

    assert 0 == helped.exit_code, helped.stderr
    assert helped.stdout.startswith("Usage: hctl [OPTIONS] COMMAND [ARGS]...")
    assert 0 == listed.exit_code, listed.stderr
    assert "No runners found in organization my-org." in listed.stderr


def test_kubectl_standin__answers_as_kubectl_does(tmp_path: Path) -> None:
    """The stand-in that fills seed 001's runner configuration gives what the real kubectl gives."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl installed to compare the stand-in with (it is not on the package registries)")
    env = {**os.environ, "KUBECONFIG": str(_kubeconfig(tmp_path / "kubeconfig"))}
    for path in (
        "{.clusters[0].cluster.certificate-authority-data}",
        "{.clusters[0].cluster.server}",
        "{.users[0].user.client-certificate-data}",
        "{.users[0].user.client-key-data}",
    ):
        for extra in (["--raw"], []):
            args = ["config", "view", "--minify", "-o", f"jsonpath={path}", *extra]
            real = subprocess.run([kubectl, *args], env=env, capture_output=True, text=True, check=True)
            standin = subprocess.run(
                [sys.executable, str(KUBECTL_STANDIN), *args],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )

            assert real.stdout == standin.stdout, (path, extra)
