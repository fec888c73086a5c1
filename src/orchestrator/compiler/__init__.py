"""The manifest compiler: from a deployment manifest and an environment's catalogue to a runnable bundle.

Pure code: no I/O, no database. The deployment code loads what it needs and calls, in order:

1. :func:`parse_manifest` on the request body's ``manifest``;
2. :func:`render_backend` for the runner's state storage, keyed by the environment's UUID;
3. :func:`compile_deployment` with the environment's catalogue (``dispatch.env_catalogue.load_env_catalogue``)
   and the resource types of :func:`required_resource_types`;
4. :func:`graph_of` to store with the deployment, :func:`diff_graphs` against the previous deployment's
   stored graph, and :func:`build_bundle` for the runner.

Key contracts: module names are a pure function of a resource's ``(type, class, id)``; each workload's
outputs are the Terraform output named as the workload (upstream's names); ``main.tf`` never holds a
credential.
"""

from __future__ import annotations

from orchestrator.compiler.backend import render_backend
from orchestrator.compiler.bundle import build_bundle
from orchestrator.compiler.deployment import (
    METADATA_OUTPUT,
    CompiledDeployment,
    EnvInfo,
    ResourceNode,
    compile_deployment,
    graph_of,
    required_resource_types,
    workload_output_name,
    workload_outputs,
)
from orchestrator.compiler.diff import diff, diff_graphs
from orchestrator.compiler.graph import module_name, node_hash
from orchestrator.compiler.manifest import Manifest, ManifestResource, ManifestWorkload, parse_manifest

__all__ = [
    "METADATA_OUTPUT",
    "CompiledDeployment",
    "EnvInfo",
    "Manifest",
    "ManifestResource",
    "ManifestWorkload",
    "ResourceNode",
    "build_bundle",
    "compile_deployment",
    "diff",
    "diff_graphs",
    "graph_of",
    "module_name",
    "node_hash",
    "parse_manifest",
    "render_backend",
    "required_resource_types",
    "workload_output_name",
    "workload_outputs",
]
