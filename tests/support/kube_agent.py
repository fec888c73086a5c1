"""A ``kubernetes-agent`` runner for tests: its configuration (as ``octl create agent-key --runner-type
kubernetes-agent`` prints it, with the engine settings of the test runs in the pod template), a kubeconfig
of the stand-in Kubernetes API (``tests/support/kube_api.py``), and ``po-runner remote`` started against it
(``tests/support/agent_process.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.cli.octl.commands.agent_keys import runner_configuration
from tests.support.agent_process import AgentProcess
from tests.support.kube_api import KubeApiServer
from tests.support.stack import Stack, build_stack

NAMESPACE = "platform-orchestrator-runner"


def agent_runner(public_pem: str, tf_config: Path) -> dict[str, Any]:
    """The configuration ``octl create agent-key --runner-type kubernetes-agent`` prints, plus the engine
    settings of the test runs in the pod template."""
    configuration = runner_configuration(
        "kubernetes-agent", public_pem, namespace=NAMESPACE, service_account="platform-orchestrator-runner"
    )
    engine_env = {"IAC_BACKEND": "embedded", "TF_CLI_CONFIG_FILE": str(tf_config), "CHECKPOINT_DISABLE": "1"}
    configuration["job"]["pod_template"] = {
        "spec": {
            "containers": [{"name": "main", "env": [{"name": k, "value": v} for k, v in engine_env.items()]}]
        }
    }
    return {"runner_configuration": configuration, "state_storage_configuration": {"type": "orchestrator"}}


def write_kubeconfig(api: KubeApiServer, path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "stand-in",
                        "cluster": {"server": api.url, "certificate-authority-data": api.ca_data},
                    }
                ],
                "users": [
                    {
                        "name": "agent",
                        "user": {
                            "client-certificate-data": api.client_certificate_data,
                            "client-key-data": api.client_key_data,
                        },
                    }
                ],
                "contexts": [{"name": "agent@stand-in", "context": {"cluster": "stand-in", "user": "agent"}}],
                "current-context": "agent@stand-in",
            }
        )
    )
    return path


def start_agent(
    server_url: str, private_pem: str, api: KubeApiServer, tmp_path: Path, **env: str
) -> AgentProcess:
    agent = AgentProcess(server_url, private_pem, tmp_path)
    agent.env.pop("KUBERNETES_SERVICE_HOST", None)
    agent.env.update({"KUBECONFIG": str(write_kubeconfig(api, tmp_path / "kubeconfig")), **env})
    return agent.start()


def agent_stack(server_url: str, tmp_path: Path, public_pem: str) -> Stack:
    tf_config = tmp_path / "terraformrc"
    tf_config.touch()
    return build_stack(server_url, tmp_path, runner=agent_runner(public_pem, tf_config))
