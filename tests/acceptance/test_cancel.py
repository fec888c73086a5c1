"""``octl cancel`` of a deployment mid-apply, through each launch path.

The module creates ``terraform_data.first``, then ``terraform_data.slow``, whose ``local-exec``
provisioner marks that it started and sleeps 60 s: the cancel lands while Terraform applies. Everything
is real: the server under uvicorn with its dispatcher, the runner process, the embedded Terraform
engine, state kept by the orchestrator (Terraform's http backend, with its lock). Each test checks:
``octl cancel`` exits 0 and the deployment is ``cancelled``; the next deploy succeeds planning from the
saved state (``first`` is not created again: only the interrupted, tainted ``slow`` is replaced), which
also shows the lock was released.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from orchestrator.launchers.kubernetes_job import DEFAULT_RUNNER_IMAGE
from orchestrator.protocol import agent_auth
from orchestrator.settings import ServerSettings
from tests.support.agent_process import AgentProcess
from tests.support.aws_launcher import ECS_CLUSTER, EXECUTION_ROLE_ARN, REGION, ROLE_ARN, roles
from tests.support.aws_standin import AwsStandIn, OidcProvider
from tests.support.kube_api import KubeApiServer, runner_image
from tests.support.managed import MANAGED_SECRET, runs_work_dir
from tests.support.octl import OctlProcess, Ran, org_admin_token, serve
from tests.support.orgs import BOOTSTRAP_TOKEN
from tests.support.sshd import SshServer, running_sshd

# Each launch path's cancel on one database per test (tests/conftest.py): the store's tests cover both.
pytestmark = [pytest.mark.slow, pytest.mark.spread]

#: ``{marks}``: a directory every run user may write to. The provisioner sleeps unless ``done`` exists
#: there (the redeploy after the cancel must not wait).
MODULE_CODE = """\
resource "terraform_data" "first" {{
  input = "created before the interrupt"
}}

resource "terraform_data" "slow" {{
  input = terraform_data.first.output
  provisioner "local-exec" {{
    command = "if [ -e {marks}/done ]; then exit 0; fi; touch {marks}/started; sleep 60"
  }}
}}

output "first" {{
  value = terraform_data.first.output
}}
"""
MANIFEST = {
    "workloads": {
        "app": {
            "resources": {"slow": {"type": "slow-thing"}},
            "outputs": {"first": "${resources.slow.outputs.first}"},
        }
    }
}
CREATED = re.compile(r"Deployment ([0-9a-f-]{36}) created")


def _ok(result: Ran) -> Ran:
    assert 0 == result.exit_code, result.output
    return result


@dataclass
class Platform:
    octl: OctlProcess
    manifest: Path
    marks: Path
    base_url: str
    #: The stand-in Kubernetes API, for the Kubernetes path.
    kube: KubeApiServer | None = None


def make_platform(
    settings: ServerSettings,
    tmp_path: Path,
    runner_configuration: dict[str, Any] | None,
    *,
    runner_id: str = "slowrunner",
    **overrides: object,
) -> Iterator[Platform]:
    """Project ``shop``, environment ``dev``, the runner picked by a rule, and the slow module; no runner
    configuration: ``runner_id`` is the managed pool's."""
    marks = tmp_path / "marks"
    marks.mkdir()
    marks.chmod(0o1777)
    module = {
        "resource_type": "slow-thing",
        "module_source": "inline",
        "module_source_code": MODULE_CODE.format(marks=marks),
    }
    schema = {"output_schema": {"type": "object", "properties": {"first": {"type": "string"}}}}
    runner = {
        "runner_configuration": runner_configuration,
        "state_storage_configuration": {"type": "orchestrator"},
    }
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump(MANIFEST))
    with serve(settings, status_check_interval_seconds=0.5, **overrides) as base_url:
        octl = OctlProcess(
            base_url=base_url, token=org_admin_token(base_url), config_path=tmp_path / "o.yaml"
        )
        platform_octl = OctlProcess(
            base_url=base_url, token=BOOTSTRAP_TOKEN, config_path=tmp_path / "octl-platform.yaml"
        )
        if runner_configuration is not None:
            _ok(platform_octl("create", "runner", runner_id, "--set-json", json.dumps(runner)))
        for args in (
            ("create", "env-type", "development"),
            ("create", "project", "shop"),
            ("create", "env", "shop", "dev", "--set", "env_type_id=development"),
            ("create", "runner-rule", "--set", f"runner_id={runner_id}"),
            ("create", "resource-type", "slow-thing", "--set-json", json.dumps(schema)),
            ("create", "module", "slow", "--set-json", json.dumps(module)),
            ("create", "module-rule", "--set", "module_id=slow"),
        ):
            _ok(octl(*args))
        yield Platform(octl=octl, manifest=manifest, marks=marks, base_url=base_url)


def cancel_mid_apply_then_redeploy(platform: Platform) -> dict[str, Any]:
    """The scenario every launch path must pass; the cancelled deployment, as ``octl`` shows it."""
    octl = platform.octl
    created = _ok(octl("deploy", "shop", "dev", str(platform.manifest), "--no-wait"))
    deployment_id = CREATED.search(created.stderr).group(1)  # type: ignore[union-attr]
    deadline = time.monotonic() + 120
    while not (platform.marks / "started").exists():
        running = json.loads(_ok(octl("get", "deployment", deployment_id, "-o", "json")).stdout)
        assert "executing" == running["status"], running
        assert time.monotonic() < deadline, "the slow provisioner never started"
        time.sleep(0.5)

    cancelled = octl("cancel", deployment_id)

    _ok(cancelled)
    assert f"Deployment {deployment_id} cancelled: deployment cancelled: " in cancelled.stderr
    shown: dict[str, Any] = dict(
        json.loads(_ok(octl("get", "deployment", deployment_id, "-o", "json")).stdout)
    )
    assert "cancelled" == shown["status"]
    again = octl("cancel", deployment_id)
    assert 1 == again.exit_code
    assert "already ended (cancelled" in again.stderr
    listed = json.loads(_ok(octl("get", "deployments", "--status", "cancelled", "-o", "json")).stdout)
    assert [deployment_id] == [d["id"] for d in listed]

    (platform.marks / "done").touch()
    redeployed = _ok(octl("deploy", "shop", "dev", str(platform.manifest), "-o", "json"))
    # `first` was saved before the interrupt: not created again; `slow`, tainted by the interrupt, replaced.
    assert "Resources: 1 added, 0 changed, 1 removed." in redeployed.stderr, redeployed.output
    assert {"app": {"first": "created before the interrupt"}} == json.loads(redeployed.stdout)
    return shown


@pytest.fixture
def local_platform(settings: ServerSettings, tmp_path: Path) -> Iterator[Platform]:
    tf_config = tmp_path / "terraform.rc"
    tf_config.write_text("")
    tf_config.chmod(0o644)
    tmp_path.chmod(0o755)
    yield from make_platform(
        settings,
        tmp_path,
        {
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
    )


def test_cancel__local_runner_mid_apply(local_platform: Platform) -> None:
    shown = cancel_mid_apply_then_redeploy(local_platform)
    assert "stopped before the deployment finished" in shown["status_message"], shown
    assert os.path.exists(local_platform.marks / "started")


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SshServer]:
    with running_sshd(tmp_path / "sshd") as server:
        yield server


@pytest.fixture
def ssh_platform(settings: ServerSettings, sshd: SshServer, tmp_path: Path) -> Iterator[Platform]:
    """A ``vm`` runner reached over SSH (tests/support/sshd.py on loopback, allowed here)."""
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    yield from make_platform(
        settings,
        tmp_path,
        {
            "type": "vm",
            "connection": sshd.connection(),
            "job": {
                "work_dir": str(tmp_path / "vm-runs"),
                "environment": {
                    "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
                    "IAC_BACKEND": "embedded",
                    "TF_CLI_CONFIG_FILE": str(tf_config),
                    "CHECKPOINT_DISABLE": "1",
                },
            },
        },
        runner_denied_networks="",
    )


def test_cancel__vm_runner_over_ssh_mid_apply(ssh_platform: Platform) -> None:
    shown = cancel_mid_apply_then_redeploy(ssh_platform)
    assert "stopped before the deployment finished" in shown["status_message"], shown


KUBE_NAMESPACE = "runs"


@pytest.fixture
def kube_platform(settings: ServerSettings, tmp_path: Path) -> Iterator[Platform]:
    """A ``kubernetes`` runner on the stand-in API (tests/support/kube_api.py): its kubelet runs the
    runner image as a local process and, when a pod is deleted, SIGTERMs it and SIGKILLs it after the
    pod's terminationGracePeriodSeconds (30 s by default), as a kubelet does."""
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    engine_env = {"IAC_BACKEND": "embedded", "TF_CLI_CONFIG_FILE": str(tf_config), "CHECKPOINT_DISABLE": "1"}
    images = {DEFAULT_RUNNER_IMAGE: runner_image()}
    with KubeApiServer(tmp_path / "kube", namespaces=("default", KUBE_NAMESPACE), images=images) as api:
        configuration = {
            "type": "kubernetes",
            "cluster": {
                "cluster_data": {"server": api.url, "certificate_authority_data": api.ca_data},
                "auth": {
                    "client_certificate_data": api.client_certificate_data,
                    "client_key_data": api.client_key_data,
                },
            },
            "job": {
                "namespace": KUBE_NAMESPACE,
                "service_account": "runner",
                "pod_template": {
                    "spec": {
                        "containers": [
                            {"name": "main", "env": [{"name": k, "value": v} for k, v in engine_env.items()]}
                        ]
                    }
                },
            },
        }
        for platform in make_platform(settings, tmp_path, configuration, runner_denied_networks=""):
            platform.kube = api
            yield platform


def test_cancel__kubernetes_runner_mid_apply_deletes_the_job(kube_platform: Platform) -> None:
    """The Job is deleted (its pod in the background, with its grace period): the runner gets SIGTERM,
    interrupts Terraform, which saves the state; the runner reports and the deployment ends cancelled."""
    api = kube_platform.kube
    assert api is not None

    shown = cancel_mid_apply_then_redeploy(kube_platform)

    assert "received signal SIGTERM" in shown["status_message"], shown
    # The cancelled deployment's Job was deleted (the redeploy's is left).
    assert shown["id"] not in [j["metadata"]["name"] for j in api.objects("jobs", KUBE_NAMESPACE)]


@pytest.fixture
def agent_platform(settings: ServerSettings, tmp_path: Path) -> Iterator[Platform]:
    """A ``vm`` runner with ``connection: {type: agent}``: ``po-runner remote`` (a real process) gets the
    ``create-job`` command and runs ``po-runner standard`` locally; the cancel reaches it as a
    ``cancel-job`` command."""
    private_pem, public_pem = agent_auth.generate_key_pair()
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    configuration = {
        "type": "vm",
        "connection": {"type": "agent", "key": public_pem},
        "job": {
            "environment": {
                "IAC_BACKEND": "embedded",
                "TF_CLI_CONFIG_FILE": str(tf_config),
                "CHECKPOINT_DISABLE": "1",
            }
        },
    }
    for platform in make_platform(
        settings, tmp_path, configuration, runner_id="local", agent_fetch_wait_seconds=5
    ):
        agent = AgentProcess(platform.base_url, private_pem, tmp_path).start()
        try:
            yield platform
        finally:
            agent.stop()


def test_cancel__agent_runner_mid_apply(agent_platform: Platform, tmp_path: Path) -> None:
    shown = cancel_mid_apply_then_redeploy(agent_platform)
    assert "received signal SIGTERM" in shown["status_message"], shown
    assert "cancel: run stopped" in (tmp_path / "agent.log").read_text()


@pytest.fixture
def ecs_platform(settings: ServerSettings, tmp_path: Path) -> Iterator[Platform]:
    """A ``serverless-ecs`` runner: the AWS stand-in's Fargate runs the runner image's command as a process
    (STS trusting the server's OIDC issuer, as a user sets it up); the cancel is ECS's StopTask."""
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    images = {DEFAULT_RUNNER_IMAGE: runner_image()}
    with AwsStandIn(tmp_path / "aws", roles=roles("slowrunner"), images=images) as standin:
        standin.ecs.add_cluster(ECS_CLUSTER, REGION)
        configuration = {
            "type": "serverless-ecs",
            "auth": {"role_arn": ROLE_ARN},
            "job": {
                "region": REGION,
                "cluster": ECS_CLUSTER,
                "subnets": ["subnet-0a1b2c3d"],
                "execution_role_arn": EXECUTION_ROLE_ARN,
                "environment": {
                    "IAC_BACKEND": "embedded",
                    "TF_CLI_CONFIG_FILE": str(tf_config),
                    "CHECKPOINT_DISABLE": "1",
                },
            },
        }
        for platform in make_platform(
            settings,
            tmp_path,
            configuration,
            runner_denied_networks="",
            aws_sts_url=standin.url,
            aws_eks_url=standin.url,
            aws_ecs_url=standin.url,
        ):
            provider = OidcProvider.discovered(platform.base_url)
            standin.providers[provider.issuer] = provider
            yield platform


def test_cancel__serverless_ecs_runner_mid_apply_stops_the_task(ecs_platform: Platform) -> None:
    """StopTask: the container's runner gets SIGTERM, interrupts Terraform, which saves the state."""
    shown = cancel_mid_apply_then_redeploy(ecs_platform)
    assert "received signal SIGTERM" in shown["status_message"], shown


@pytest.fixture
def managed_platform(settings: ServerSettings, tmp_path: Path) -> Iterator[Platform]:
    """The managed pool: a real ``po-runner managed`` claims the deployment and runs ``po-runner standard``
    as a uid of its own; the cancel reaches it with its next heartbeat (every second here)."""
    shared = Path(tempfile.mkdtemp(prefix="po-cancel-managed-"))
    shared.chmod(0o755)  # the run's uid writes the marks
    work_dir = runs_work_dir(shared, "pool-cancel")
    try:
        for platform in make_platform(
            settings,
            shared,
            None,
            runner_id="managed",
            managed_runner_secret=SecretStr(MANAGED_SECRET),
            managed_heartbeat_seconds=1,
        ):
            with (tmp_path / "managed.log").open("ab") as log:
                runner = subprocess.Popen(
                    [sys.executable, "-m", "orchestrator.cli.runner", "managed"],
                    env={
                        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                        "HOME": str(tmp_path),
                        "RUNNER_URL": platform.base_url,
                        "RUNNER_MANAGED_SECRET": MANAGED_SECRET,
                        "RUNNER_NAME": "pool-cancel",
                        "RUNNER_WORK_DIR": str(work_dir),
                    },
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            try:
                yield platform
            finally:
                runner.send_signal(signal.SIGTERM)
                runner.wait(30)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        if work_dir.parent != shared:
            shutil.rmtree(work_dir.parent, ignore_errors=True)


def test_cancel__managed_runner_mid_apply(managed_platform: Platform, tmp_path: Path) -> None:
    shown = cancel_mid_apply_then_redeploy(managed_platform)
    assert "received signal SIGTERM" in shown["status_message"], shown
