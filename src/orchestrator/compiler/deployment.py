"""Compiling a manifest into the root module a runner applies: ``main.tf`` plus inline modules.

``main.tf`` holds, in this order: the ``terraform`` block (``required_providers`` and the backend), the
``variable`` blocks that provider configurations use, one aliased ``provider`` block per module
provider, one ``module`` block per resource node (sorted by name), and the outputs:

- ``platform_orchestrator_metadata``: ``{node id: the module's platform_orchestrator_metadata output or
  {}}``, which the runner reports as resource metadata and leaves out of the outputs;
- one output per workload, named as the workload (:func:`workload_output_name`, upstream's names: the
  decrypted outputs read ``{"api": {...}}``): an object of its ``outputs``; sensitive only when it reads
  an output the resource type's schema marks sensitive. Workload names cannot clash with the metadata
  output (``manifest`` allows no ``_`` in them) and start with a letter, as Terraform output names must.

The same inputs give the same text, byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

from orchestrator.compiler import hcl, modules
from orchestrator.compiler.graph import (
    WORKLOAD_TYPE,
    Coordinate,
    Graph,
    Node,
    WorkloadScope,
    expand,
    find_cycle,
    module_label,
    module_name,
    node_hash,
)
from orchestrator.compiler.manifest import Manifest
from orchestrator.compiler.references import Rendered, Resolver, Scope
from orchestrator.domain.catalogue import DEFAULT_RESOURCE_CLASS, INLINE_SOURCE, ResourceType
from orchestrator.domain.module_rules import EnvCatalogue
from orchestrator.errors import InvalidInputError

#: The output holding each node's metadata; the runner's ``METADATA_KEY`` default.
METADATA_OUTPUT: Final = "platform_orchestrator_metadata"
MAIN_FILE: Final = "main.tf"
#: The values of the variables standing for module providers' credentials (loaded by Terraform itself).
PROVIDER_SECRETS_FILE: Final = "po-provider-secrets.auto.tfvars.json"


def workload_output_name(workload: str) -> str:
    """The Terraform output holding the workload's outputs: the workload's name, as upstream names it."""
    return workload


def workload_outputs(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """The Terraform outputs of a compiled deployment as ``{workload: its outputs}`` (the metadata output
    left out, as the runner leaves it out of the outputs it reports)."""
    return {name: value for name, value in outputs.items() if name != METADATA_OUTPUT}


@dataclass(frozen=True, kw_only=True)
class EnvInfo:
    """The environment deployed to; its values are the ``${context.*}`` of manifests and modules."""

    org_id: str
    project_id: str
    env_id: str
    env_type_id: str
    #: A UUID, or its text (kept as a UUID).
    env_uuid: UUID | str

    def __post_init__(self) -> None:
        object.__setattr__(self, "env_uuid", UUID(str(self.env_uuid)))

    @property
    def uuid(self) -> UUID:
        return UUID(str(self.env_uuid))

    def context(self) -> dict[str, str]:
        return {
            "org_id": self.org_id,
            "project_id": self.project_id,
            "env_id": self.env_id,
            "env_type_id": self.env_type_id,
            "env_uuid": str(self.env_uuid),
        }


@dataclass(frozen=True, kw_only=True)
class ResourceNode:
    """One resource of a compiled deployment, as the diff and the deployment record need it."""

    #: Upstream's node id: stable per environment and coordinate (``graph.node_hash``).
    id: str
    type: str
    resource_class: str
    resource_id: str
    #: The ``module`` block's name in ``main.tf``.
    name: str
    module_id: str
    version_id: str
    params: dict[str, Any]
    #: The node whose module asked for this one with these params (``type.class@id``), or
    #: ``workload.default@<name>`` for a workload's resource; None for a shared resource.
    params_defined_by: str | None
    #: Names of the module blocks this one waits for.
    depends_on: tuple[str, ...]

    @property
    def resource(self) -> str:
        return f"{self.type}.{self.resource_class}@{self.resource_id}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "class": self.resource_class,
            "resource_id": self.resource_id,
            "name": self.name,
            "module_id": self.module_id,
            "version_id": self.version_id,
            "params": self.params,
            "params_defined_by": self.params_defined_by,
            "depends_on": list(self.depends_on),
        }


@dataclass(frozen=True, kw_only=True)
class CompiledDeployment:
    main_tf: str
    #: Bundle path -> content: ``main.tf``, ``modules/<id>/<version>/main.tf`` per inline module, and
    #: ``PROVIDER_SECRETS_FILE`` when module providers hold credentials.
    files: dict[str, bytes]
    env_uuid: UUID
    #: The resources, sorted by name.
    nodes: tuple[ResourceNode, ...]
    #: Workload -> its outputs as the manifest wrote them (for the diff).
    workloads: dict[str, dict[str, str]]
    #: ``num_workloads`` and ``num_resource_nodes`` (upstream ``DeploymentMetrics``).
    metrics: dict[str, int]


def graph_of(compiled: CompiledDeployment) -> list[dict[str, Any]]:
    """The deployment's graph as JSON data, to store with the deployment and diff the next one against.

    One entry per workload (``type`` ``workload``, ``params`` its outputs, no module), then one per
    resource (:meth:`ResourceNode.to_dict`).
    """
    entries: list[dict[str, Any]] = []
    for name, outputs in compiled.workloads.items():
        coordinate = Coordinate(WORKLOAD_TYPE, DEFAULT_RESOURCE_CLASS, name)
        entries.append(
            {
                "id": node_hash(compiled.env_uuid, coordinate),
                "type": WORKLOAD_TYPE,
                "class": DEFAULT_RESOURCE_CLASS,
                "resource_id": name,
                "name": None,
                "module_id": None,
                "version_id": None,
                "params": outputs,
                "params_defined_by": None,
                "depends_on": [],
            }
        )
    return entries + [node.to_dict() for node in compiled.nodes]


def required_resource_types(manifest: Manifest, catalogue: EnvCatalogue) -> set[str]:
    """The resource types :func:`compile_deployment` needs: the manifest's and those of the rules."""
    types = {rule.resource_type for rule in catalogue.rules}
    types.update(resource.type for resource in manifest.shared.values())
    for workload in manifest.workloads.values():
        types.update(resource.type for resource in workload.resources.values())
    return types


def _node_context(base: Mapping[str, str], coordinate: Coordinate) -> dict[str, str]:
    return {
        **base,
        "res_type": coordinate.type,
        "res_class": coordinate.resource_class,
        "res_id": coordinate.id,
    }


def _params_scope(graph: Graph, node: Node, context: Mapping[str, str]) -> Scope:
    written_by = node.params_scope
    if isinstance(written_by, WorkloadScope):
        aliases = graph.workloads[written_by.workload]
        return Scope(f"workload '{written_by.workload}'", aliases, graph.shared, context)
    owner = graph.nodes[written_by] if written_by is not None else node
    label = f"the dependencies of {module_label(owner.required_module)} for {owner.coordinate}"
    return Scope(label, owner.aliases, None, context)


class _Compiler:
    def __init__(
        self,
        manifest: Manifest,
        catalogue: EnvCatalogue,
        resource_types: Mapping[str, ResourceType],
        env: EnvInfo,
    ) -> None:
        self.manifest = manifest
        self.catalogue = catalogue
        self.env = env
        self.context = env.context()
        self.resolver = Resolver(resource_types)
        self.graph = expand(manifest, catalogue, resource_types)

    def module_arguments(self, node: Node) -> list[hcl.Attr]:
        """Inputs and params of the node's module block; records the references as edges."""
        module = node.required_module
        context = _node_context(self.context, node.coordinate)
        own = Scope(module_label(module), node.aliases, None, context)
        rendered: dict[str, Rendered] = {}
        for name, value in module.content.module_inputs.items():
            where = f"{node.where} ({module_label(module)} module_inputs.{name})"
            rendered[name] = self.resolver.render(value, own, where)
        params_scope = _params_scope(self.graph, node, context)
        for name, value in node.params.items():
            rendered[name] = self.resolver.render(value, params_scope, f"{node.params_where}.{name}")
        for result in rendered.values():
            node.edges |= result.references
        return [hcl.Attr(name, rendered[name].expr) for name in sorted(rendered)]

    def workload_output(self, name: str) -> hcl.Block:
        scope = Scope(f"workload '{name}'", self.graph.workloads[name], self.graph.shared, self.context)
        outputs = self.manifest.workloads[name].outputs
        items: list[tuple[str, hcl.Expr]] = []
        sensitive = False
        for key in sorted(outputs):
            result = self.resolver.render(outputs[key], scope, f"manifest.workloads.{name}.outputs.{key}")
            items.append((key, result.expr))
            sensitive |= result.sensitive
        body: list[hcl.Item] = [
            hcl.Attr("description", hcl.Raw(hcl.quote(f"The outputs of workload '{name}'"))),
            hcl.Attr("value", hcl.Obj(tuple(items))),
        ]
        if sensitive:
            body.append(hcl.Attr("sensitive", hcl.Raw("true")))
        return hcl.Block("output", (workload_output_name(name),), tuple(body))

    def compile(self, backend: str) -> CompiledDeployment:
        for node in self.graph.nodes.values():
            modules.check_params(node)
        arguments = {c: self.module_arguments(node) for c, node in self.graph.nodes.items()}
        outputs = [self.workload_output(name) for name in sorted(self.manifest.workloads)]
        cycle = find_cycle(self.graph)
        if cycle:
            raise InvalidInputError(
                "manifest: the resources depend on each other in a cycle: " + " -> ".join(map(str, cycle))
            )
        providers = modules.collect_providers(self.graph, self.catalogue.providers)
        provider_blocks, variables, secret_values = providers.blocks(self.resolver, self.context)
        items: list[hcl.Item] = [
            hcl.Lines(
                f"# Generated by the Platform Orchestrator for environment {self.env.org_id}/"
                f"{self.env.project_id}/{self.env.env_id} ({self.env.env_uuid}). Do not edit."
            ),
            self._terraform_block(providers, backend),
        ]
        items += [_variable_block(name) for name in sorted(variables)]
        items += provider_blocks
        nodes = sorted(self.graph.nodes.values(), key=lambda n: module_name(n.coordinate))
        items += [self._module_block(node, arguments[node.coordinate], providers) for node in nodes]
        items += [self._metadata_output(nodes), *outputs]
        main_tf = hcl.render(_separated(items))
        return CompiledDeployment(
            main_tf=main_tf,
            files=self._files(main_tf, nodes, secret_values),
            env_uuid=self.env.uuid,
            nodes=tuple(self._resource_node(node) for node in nodes),
            workloads={
                name: dict(sorted(workload.outputs.items()))
                for name, workload in sorted(self.manifest.workloads.items())
            },
            metrics={"num_workloads": len(self.manifest.workloads), "num_resource_nodes": len(nodes)},
        )

    def _terraform_block(self, providers: modules.Providers, backend: str) -> hcl.Block:
        body: list[hcl.Item] = []
        required = providers.required()
        if required is not None:
            body.append(required)
        if backend.strip():
            body.append(hcl.Lines(backend))
        return hcl.Block("terraform", (), tuple(_separated(body)))

    def _module_block(self, node: Node, arguments: list[hcl.Attr], providers: modules.Providers) -> hcl.Block:
        module = node.required_module
        body: list[hcl.Item] = [*modules.source_attributes(module)]
        mapping = modules.provider_mapping(module, providers)
        if mapping is not None:
            body.append(mapping)
        if arguments:
            body += [hcl.BLANK, *arguments]
        if node.edges:
            waits = tuple(hcl.Raw(f"module.{name}") for name in sorted(map(module_name, node.edges)))
            body += [hcl.BLANK, hcl.Attr("depends_on", hcl.Tup(waits))]
        return hcl.Block("module", (module_name(node.coordinate),), tuple(body))

    def _metadata_output(self, nodes: list[Node]) -> hcl.Block:
        items = tuple(
            (
                hcl.quote(node_hash(self.env.uuid, node.coordinate)),
                hcl.Raw(f"lookup(module.{module_name(node.coordinate)}, {hcl.quote(METADATA_OUTPUT)}, {{}})"),
            )
            for node in nodes
        )
        return hcl.Block(
            "output",
            (METADATA_OUTPUT,),
            (
                hcl.Attr("description", hcl.Raw(hcl.quote("Metadata the modules report, by node id"))),
                hcl.Attr("value", hcl.Obj(tuple(sorted(items, key=lambda item: item[0])), raw_keys=True)),
            ),
        )

    def _files(self, main_tf: str, nodes: list[Node], secret_values: dict[str, Any]) -> dict[str, bytes]:
        files = {MAIN_FILE: main_tf.encode()}
        if secret_values:
            files[PROVIDER_SECRETS_FILE] = json.dumps(secret_values, sort_keys=True).encode()
        for node in nodes:
            module = node.required_module
            code = module.content.module_source_code
            if module.content.module_source != INLINE_SOURCE:
                continue
            if code is None:
                raise InvalidInputError(f"{module_label(module)}: inline module without module_source_code")
            files[f"{modules.inline_path(module)}/{MAIN_FILE}"] = code.encode()
        return dict(sorted(files.items()))

    def _resource_node(self, node: Node) -> ResourceNode:
        module = node.required_module
        written_by = node.params_scope
        if isinstance(written_by, WorkloadScope):
            defined_by: str | None = str(
                Coordinate(WORKLOAD_TYPE, DEFAULT_RESOURCE_CLASS, written_by.workload)
            )
        else:
            defined_by = str(written_by) if written_by is not None else None
        return ResourceNode(
            id=node_hash(self.env.uuid, node.coordinate),
            type=node.coordinate.type,
            resource_class=node.coordinate.resource_class,
            resource_id=node.coordinate.id,
            name=module_name(node.coordinate),
            module_id=module.id,
            version_id=str(module.version_id),
            params=node.params,
            params_defined_by=defined_by,
            depends_on=tuple(sorted(map(module_name, node.edges))),
        )


def _variable_block(name: str) -> hcl.Block:
    return hcl.Block(
        "variable",
        (name,),
        (hcl.Attr("type", hcl.Raw("string")), hcl.Attr("sensitive", hcl.Raw("true"))),
    )


def _separated(items: list[hcl.Item]) -> list[hcl.Item]:
    out: list[hcl.Item] = []
    for item in items:
        if out:
            out.append(hcl.BLANK)
        out.append(item)
    return out


def compile_deployment(
    manifest: Manifest,
    catalogue: EnvCatalogue,
    *,
    resource_types: Mapping[str, ResourceType],
    env: EnvInfo,
    backend: str,
) -> CompiledDeployment:
    """The root module for ``manifest`` in ``env``, with every resource resolved through ``catalogue``.

    ``resource_types`` must hold at least :func:`required_resource_types`; ``backend`` is the ``backend``
    block (:func:`render_backend`), or empty for none. Raises :class:`InvalidInputError` naming the field
    for anything the manifest or the catalogue gets wrong.
    """
    where = catalogue.where
    if (where.project_id, where.env_type_id, where.env_id) != (env.project_id, env.env_type_id, env.env_id):
        raise ValueError(f"the catalogue was loaded for {where}, not for environment {env.env_id}")
    return _Compiler(manifest, catalogue, resource_types, env).compile(backend)
