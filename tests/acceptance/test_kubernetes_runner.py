"""A deployment through a ``kubernetes`` runner, end to end: the real server launches the runner's Job on
the stand-in Kubernetes API (tests/support/kube_api.py, not Kubernetes), over TLS with the cluster CA and
a client certificate as in seed 001; the stand-in's kubelet runs the runner image as
``python -m orchestrator.cli.runner standard`` with the pod's environment, and the run reports back.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from orchestrator.launchers.kubernetes_job import DEFAULT_RUNNER_IMAGE
from orchestrator.settings import ServerSettings
from tests.support.kube_api import KubeApiServer, runner_image
from tests.support.stack import build_stack

pytestmark = pytest.mark.slow

NAMESPACE = "platform-orchestrator-runner"


@pytest.fixture
def settings(settings: ServerSettings) -> ServerSettings:
    """The stand-in API listens on 127.0.0.1, which the server refuses by default: allowed here."""
    return settings.model_copy(update={"runner_denied_networks": ""})


def kubernetes_runner(api: KubeApiServer, tf_config: Path) -> dict[str, Any]:
    engine_env = {"IAC_BACKEND": "embedded", "TF_CLI_CONFIG_FILE": str(tf_config), "CHECKPOINT_DISABLE": "1"}
    return {
        "runner_configuration": {
            "type": "kubernetes",
            "cluster": {
                "cluster_data": {"server": api.url, "certificate_authority_data": api.ca_data},
                "auth": {
                    "client_certificate_data": api.client_certificate_data,
                    "client_key_data": api.client_key_data,
                },
            },
            "job": {
                "namespace": NAMESPACE,
                "service_account": "platform-orchestrator-runner",
                "pod_template": {
                    "spec": {
                        "containers": [
                            {"name": "main", "env": [{"name": k, "value": v} for k, v in engine_env.items()]}
                        ]
                    }
                },
            },
        },
        "state_storage_configuration": {"type": "orchestrator"},
    }


def test_deploy__through_a_kubernetes_runner(server_url: str, tmp_path: Path) -> None:
    """The deployment succeeds; one Job named after it ran to completion with the token from its Secret."""
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    images = {DEFAULT_RUNNER_IMAGE: runner_image()}
    with KubeApiServer(tmp_path / "kube", namespaces=("default", NAMESPACE), images=images) as api:
        stack = build_stack(server_url, tmp_path, runner=kubernetes_runner(api, tf_config))

        deployment = stack.deploy()

        outputs = stack.outputs(deployment) if deployment["status"] == "succeeded" else {}
        # The runner reports before its process ends: the Job completes a moment later.
        api.wait_for(lambda: bool(api.objects("jobs", NAMESPACE)[0]["status"].get("conditions")))
        jobs = api.objects("jobs", NAMESPACE)
        pods = api.objects("pods", NAMESPACE)
        secrets = api.objects("secrets", NAMESPACE)
        stack.client.close()

    assert deployment["status"] == "succeeded", deployment["status_message"]
    assert outputs["shop"]["bucket"] == "bucket-shop"
    assert [job["metadata"]["name"] for job in jobs] == [deployment["id"]]
    assert {c["type"] for c in jobs[0]["status"]["conditions"]} == {"SuccessCriteriaMet", "Complete"}
    (pod,) = pods
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    (secret,) = secrets
    assert base64.b64decode(secret["data"]["TOKEN"])
    assert secret["metadata"]["ownerReferences"][0]["uid"] == jobs[0]["metadata"]["uid"]
