"""A ``kubernetes-agent`` runner end to end: the server (in-thread) buffers the command, ``po-runner remote``
(a real process, KUBECONFIG pointing at the stand-in Kubernetes API with its client certificate) creates
the Job there, the stand-in's kubelet runs the runner image as a local process, and the run reports back
through the gateway. And a pod that never gets scheduled: after the (short) scheduling delay the agent
reports its Warning events as a terminal runner-error and deletes the Job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.launchers.kubernetes_job import DEFAULT_RUNNER_IMAGE
from orchestrator.protocol import agent_auth
from tests.support.kube_agent import NAMESPACE, agent_stack, start_agent
from tests.support.kube_api import CertificateAuthority, KubeApiServer, runner_image

pytestmark = pytest.mark.slow


def test_kubernetes_agent__deploys_end_to_end(server_url: str, tmp_path: Path) -> None:
    private_pem, public_pem = agent_auth.generate_key_pair()
    images = {DEFAULT_RUNNER_IMAGE: runner_image()}
    gateway_ca = CertificateAuthority("gateway-ca").pem
    (tmp_path / "gateway-ca.pem").write_bytes(gateway_ca)
    with KubeApiServer(tmp_path / "kube", namespaces=("default", NAMESPACE), images=images) as api:
        stack = agent_stack(server_url, tmp_path, public_pem)
        agent = start_agent(
            server_url, private_pem, api, tmp_path, RUNNER_GATEWAY_CA_FILE=str(tmp_path / "gateway-ca.pem")
        )
        try:
            deployment = stack.deploy()
            outputs = stack.outputs(deployment) if deployment["status"] == "succeeded" else {}
            url = f"/orgs/{stack.org}/deployments/{deployment['id']}/actions/get-logs"
            logs = stack.client.get(url, headers={"DecryptKey": deployment["_identity"]})
            api.wait_for(lambda: bool(api.objects("jobs", NAMESPACE)[0]["status"].get("conditions")))
            jobs = api.objects("jobs", NAMESPACE)
            pods = api.objects("pods", NAMESPACE)
        finally:
            code = agent.stop()
            stack.client.close()

    assert deployment["status"] == "succeeded", (deployment["status_message"], agent.output()[-3000:])
    assert outputs["shop"]["bucket"] == "bucket-shop"
    assert "terraform_data" in logs.text
    assert [job["metadata"]["name"] for job in jobs] == [deployment["id"]]
    assert {c["type"] for c in jobs[0]["status"]["conditions"]} == {"SuccessCriteriaMet", "Complete"}
    (pod,) = pods
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    # The runner's pod never sees the agent's key; it gets the gateway CA as PEM text (which the runner
    # loaded: it succeeded), not the path of the agent's file.
    env = {e["name"]: e for e in pod["spec"]["containers"][0].get("env", [])}
    assert "PRIVATE_KEY" not in env
    assert not any("PRIVATE KEY" in str(e.get("value", "")) for e in env.values())
    assert env["RUNNER_GATEWAY_CA"]["value"] == gateway_ca.decode()
    assert "RUNNER_GATEWAY_CA_FILE" not in env
    assert "command acked" in agent.output()
    assert code == 0, agent.output()[-2000:]


def test_kubernetes_agent__pod_stuck_pending__deployment_fails_with_the_warnings(
    server_url: str, tmp_path: Path
) -> None:
    private_pem, public_pem = agent_auth.generate_key_pair()
    images = {DEFAULT_RUNNER_IMAGE: runner_image()}
    with KubeApiServer(
        tmp_path / "kube", namespaces=("default", NAMESPACE), images=images, schedulable=False
    ) as api:
        stack = agent_stack(server_url, tmp_path, public_pem)
        agent = start_agent(
            server_url,
            private_pem,
            api,
            tmp_path,
            K8S_RUNNER_POD_SCHEDULING_DELAY="1s",
            AGENT_POD_WATCH_INTERVAL_SECONDS="0.2",
        )
        try:
            deployment = stack.deploy()
            api.wait_for(lambda: not api.objects("jobs", NAMESPACE))
        finally:
            agent.stop()
            stack.client.close()

    assert deployment["status"] == "failed", agent.output()[-3000:]
    assert deployment["error"]["error"] == "REMOTE_RUNNER"
    message = deployment["status_message"]
    assert "did not start" in message and "FailedScheduling" in message, message
    assert "Insufficient memory" in message
