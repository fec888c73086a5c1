"""The stand-in cluster (tests/support/kube_api.py) as the Kubernetes launcher tests use it: the stand-in
runner image (a local process that records its token and exits when told, ``release``), the namespace of
its runs, ``kube_api`` (a stand-in API server with both) and ``make_spec``, a run spec of that namespace."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from orchestrator.protocol.launch import RunSpec
from orchestrator.protocol.results import RunnerMode
from tests.support.kube_api import KubeApiServer, LocalImage

IMAGE = "registry.example.com/runner-stand-in:1.0"
NAMESPACE = "runners"
TOKEN = "deployment-token-0123456789"
#: The "image": records its TOKEN, then waits for a file ``go`` holding the exit code (written by ``release``
#: atomically, so the script never reads a file that exists but is still empty).
SCRIPT = """
import os, pathlib, sys, time
out = pathlib.Path(os.environ["OUT_DIR"])
(out / "token").write_text(os.environ.get("TOKEN", "<unset>"))
(out / "started").touch()
while not (out / "go").exists():
    time.sleep(0.02)
print("runner: planning", flush=True)
code = int((out / "go").read_text())
print("runner: last words before exit", code, file=sys.stderr, flush=True)
sys.exit(code)
"""


def local_image() -> LocalImage:
    return LocalImage(argv=[sys.executable, "-c", SCRIPT], env={"PATH": os.environ.get("PATH", "")})


def release(out_dir: Path, exit_code: int) -> None:
    """Let the stand-in runner exit with ``exit_code``: write then rename, so ``go`` appears complete."""
    staging = out_dir / "go.tmp"
    staging.write_text(str(exit_code))
    staging.replace(out_dir / "go")


@contextlib.contextmanager
def kube_api(tmp_path: Path, **options: Any) -> Iterator[KubeApiServer]:
    options.setdefault("namespaces", ("default", NAMESPACE))
    options.setdefault("images", {IMAGE: local_image()})
    with KubeApiServer(tmp_path / "kube", **options) as api:
        yield api


def make_spec(
    out_dir: Path, *, namespace: str = NAMESPACE, deployment: str = "5f0c8d3e-1a2b-4c3d-8e9f-0a1b2c3d4e5f"
) -> RunSpec:
    return RunSpec(
        org_id="acme",
        runner_id="k8s",
        deployment_id=deployment,
        env_uuid="0b6c1a2e-3d4f-4a5b-8c6d-7e8f9a0b1c2d",
        mode=RunnerMode.DEPLOY,
        token=SecretStr(TOKEN),
        gateway_url="http://127.0.0.1:9",
        runner_configuration={
            "type": "kubernetes",
            "job": {
                "namespace": namespace,
                "service_account": "runner",
                "pod_template": {
                    "spec": {
                        "containers": [{"name": "main", "env": [{"name": "OUT_DIR", "value": str(out_dir)}]}]
                    }
                },
            },
        },
    )
