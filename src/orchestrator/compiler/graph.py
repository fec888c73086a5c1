"""The resource graph of a manifest: one node per resource, found through the environment's catalogue.

A node is identified by its coordinate ``(type, class, id)``, as upstream's graph does
(``platform-orchestrator-graph:graph.go``):

- a workload resource without an id gets ``workloads.<workload>.<alias>``, a shared one ``shared.<alias>``;
  two requests for the same coordinate are one node (their params must agree);
- each node's module (the most specific module rule for its type, class and id) adds its
  ``dependencies`` (edges from the node, by alias) and ``coprovisioned`` resources as further nodes. Their
  class defaults to ``default`` and their id to the id of the node that asks for them; ``@`` in either
  stands for the asking node's value;
- a co-provisioned resource with ``is_dependent_on_current`` depends on the node that asks for it; with
  ``copy_dependents_from_current``, whatever depends on that node also depends on it.

Module names in the Terraform root module are a pure function of the coordinate (:func:`module_name`), so
a resource keeps its Terraform address from one deployment to the next.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from uuid import UUID

from orchestrator.compiler.manifest import Manifest, ManifestResource
from orchestrator.domain.catalogue import DEFAULT_RESOURCE_CLASS, Module, ResourceRequest, ResourceType
from orchestrator.domain.module_rules import EnvCatalogue
from orchestrator.errors import InvalidInputError

#: Upper bound of nodes in one graph; stops modules that keep asking for new resources.
MAX_NODES: Final = 1000
#: Stands for the asking node's class or id in a dependency or co-provisioned resource.
INHERIT: Final = "@"
#: The type and class of the pseudo-node of a workload (upstream's).
WORKLOAD_TYPE: Final = "workload"


@dataclass(frozen=True, order=True)
class Coordinate:
    type: str
    resource_class: str
    id: str

    def __str__(self) -> str:
        return f"{self.type}.{self.resource_class}@{self.id}"


def module_name(coordinate: Coordinate) -> str:
    """The Terraform module name of a node.

    ``wl_<workload>__<alias>__<type>`` for an id ``workloads.<workload>.<alias>``,
    ``shared__<alias>__<type>`` for ``shared.<alias>``, ``res__<id, dots as _>__<type>`` otherwise;
    ``__<class>`` is appended unless the class is ``default``. Types, classes and ids hold no ``_``, and
    workload and alias names no ``__``, so different coordinates never share a name.
    """
    parts = coordinate.id.split(".")
    if len(parts) == 3 and parts[0] == "workloads":
        base = f"wl_{parts[1]}__{parts[2]}"
    elif len(parts) == 2 and parts[0] == "shared":
        base = f"shared__{parts[1]}"
    else:
        base = "res__" + "_".join(parts)
    name = f"{base}__{coordinate.type}"
    if coordinate.resource_class != DEFAULT_RESOURCE_CLASS:
        name += f"__{coordinate.resource_class}"
    return name


def node_hash(env_uuid: UUID, coordinate: Coordinate) -> str:
    """Upstream's node id: sha256 of ``"<env uuid> <type> <class> <id>"``, in hex."""
    text = f"{env_uuid} {coordinate.type} {coordinate.resource_class} {coordinate.id}"
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class WorkloadScope:
    """Params written in a workload of the manifest: ``resources.X`` are the workload's resources."""

    workload: str


@dataclass
class Node:
    coordinate: Coordinate
    #: Where the node was first asked for, for error messages (``manifest.workloads.api.resources.db``).
    where: str
    params: dict[str, Any]
    #: Names the params in errors.
    params_where: str
    #: Who wrote the params: a workload, the node that asked for this one, or None (the node itself).
    params_scope: WorkloadScope | Coordinate | None
    module: Module | None = None
    #: Dependency alias -> node, as the module declares them.
    aliases: dict[str, Coordinate] = field(default_factory=dict)
    #: Every node this one depends on (aliases, co-provisioning and references).
    edges: set[Coordinate] = field(default_factory=set)

    @property
    def required_module(self) -> Module:
        if self.module is None:  # pragma: no cover - expand() resolves every node or raises
            raise AssertionError(f"node {self.coordinate} has no module")
        return self.module


@dataclass
class Graph:
    nodes: dict[Coordinate, Node] = field(default_factory=dict)
    #: Workload -> resource alias -> node.
    workloads: dict[str, dict[str, Coordinate]] = field(default_factory=dict)
    #: Shared alias -> node.
    shared: dict[str, Coordinate] = field(default_factory=dict)

    def dependents_of(self, target: Coordinate) -> list[Coordinate]:
        return [c for c, node in self.nodes.items() if target in node.edges]


def module_label(module: Module) -> str:
    return f"module '{module.id}' (version {module.version_id})"


class _Expander:
    def __init__(
        self, manifest: Manifest, catalogue: EnvCatalogue, resource_types: Mapping[str, ResourceType]
    ) -> None:
        self.manifest = manifest
        self.catalogue = catalogue
        self.resource_types = resource_types
        self.graph = Graph()
        self.queue: list[Coordinate] = []
        #: Co-provisioned node -> the nodes whose dependents it takes over.
        self.copy_dependents: dict[Coordinate, list[Coordinate]] = {}

    def run(self) -> Graph:
        self._seed()
        while self.queue:
            self._expand(self.queue.pop(0))
        for target, sources in sorted(self.copy_dependents.items()):
            for source in sources:
                for dependent in self.graph.dependents_of(source):
                    if dependent != target:
                        self.graph.nodes[dependent].edges.add(target)
        return self.graph

    def _seed(self) -> None:
        for alias, resource in sorted(self.manifest.shared.items()):
            where = f"manifest.shared.{alias}"
            self._check_accessible(resource, where)
            self.graph.shared[alias] = self._add(resource, f"shared.{alias}", where, scope=None)
        for name, workload in sorted(self.manifest.workloads.items()):
            resources: dict[str, Coordinate] = {}
            for alias, resource in sorted(workload.resources.items()):
                where = f"manifest.workloads.{name}.resources.{alias}"
                self._check_accessible(resource, where)
                resources[alias] = self._add(
                    resource, f"workloads.{name}.{alias}", where, scope=WorkloadScope(name)
                )
            self.graph.workloads[name] = resources

    def _check_accessible(self, resource: ManifestResource, where: str) -> None:
        known = self.resource_types.get(resource.type)
        if known is not None and not known.is_developer_accessible:
            raise InvalidInputError(
                f"{where}.type: resource type '{resource.type}' is not available in manifests; "
                "only modules may depend on it"
            )

    def _add(
        self, resource: ManifestResource, default_id: str, where: str, *, scope: WorkloadScope | None
    ) -> Coordinate:
        coordinate = Coordinate(
            resource.type, resource.resource_class or DEFAULT_RESOURCE_CLASS, resource.id or default_id
        )
        self._merge(coordinate, dict(resource.params), where, f"{where}.params", scope)
        return coordinate

    def _merge(
        self,
        coordinate: Coordinate,
        params: dict[str, Any],
        where: str,
        params_where: str,
        scope: WorkloadScope | Coordinate | None,
    ) -> None:
        node = self.graph.nodes.get(coordinate)
        if node is None:
            if len(self.graph.nodes) >= MAX_NODES:
                raise InvalidInputError(
                    f"{where}: the resource graph grows past {MAX_NODES} resources; "
                    "check the dependencies of the modules for a loop of ever new resource ids"
                )
            self.graph.nodes[coordinate] = Node(coordinate, where, params, params_where, scope)
            self.queue.append(coordinate)
        elif params and not node.params:
            node.params, node.params_where, node.params_scope = params, params_where, scope
        elif params and params != node.params:
            raise InvalidInputError(
                f"{where}: resource {coordinate} is also requested by {node.where} with different params; "
                "the same resource must be requested with the same params"
            )

    def _expand(self, coordinate: Coordinate) -> None:
        node = self.graph.nodes[coordinate]
        resolved = self.catalogue.resolve(coordinate.type, coordinate.resource_class, coordinate.id)
        if resolved is None:
            detail = f"class '{coordinate.resource_class}'"
            if not coordinate.id.startswith(("workloads.", "shared.")):
                detail += f", id '{coordinate.id}'"
            raise InvalidInputError(
                f"{node.where}: no module provisions resource type '{coordinate.type}' ({detail}) "
                "in this environment"
            )
        if coordinate.type not in self.resource_types:
            raise InvalidInputError(f"{node.where}: resource type '{coordinate.type}' does not exist")
        module = node.module = resolved.module
        for alias, request in sorted(module.content.dependencies.items()):
            where = f"{node.where} ({module_label(module)} dependencies.{alias})"
            target = self._request(coordinate, request, where)
            node.aliases[alias] = target
            node.edges.add(target)
        for index, request in enumerate(module.content.coprovisioned):
            where = f"{node.where} ({module_label(module)} coprovisioned[{index}])"
            target = self._request(coordinate, request, where)
            if request.is_dependent_on_current:
                self.graph.nodes[target].edges.add(coordinate)
            if request.copy_dependents_from_current:
                self.copy_dependents.setdefault(target, []).append(coordinate)

    def _request(self, current: Coordinate, request: ResourceRequest, where: str) -> Coordinate:
        resource_class = request.resource_class
        resource_id = request.resource_id
        target = Coordinate(
            request.type,
            resource_class.replace(INHERIT, current.resource_class)
            if resource_class
            else DEFAULT_RESOURCE_CLASS,
            resource_id.replace(INHERIT, current.id) if resource_id else current.id,
        )
        self._merge(target, dict(request.params), where, f"{where} params", current)
        return target


def expand(manifest: Manifest, catalogue: EnvCatalogue, resource_types: Mapping[str, ResourceType]) -> Graph:
    """Every node the manifest needs, each with its module; :class:`InvalidInputError` naming the field."""
    return _Expander(manifest, catalogue, resource_types).run()


def find_cycle(graph: Graph) -> list[Coordinate] | None:
    """A dependency cycle (first node repeated at the end), or None."""
    state: dict[Coordinate, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph.nodes):
        if start in state:
            continue
        path: list[Coordinate] = [start]
        stack = [iter(sorted(graph.nodes[start].edges))]
        state[start] = 1
        while stack:
            following = next(stack[-1], None)
            if following is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(following) == 1:
                return [*path[path.index(following) :], following]
            elif following not in state:
                state[following] = 1
                path.append(following)
                stack.append(iter(sorted(graph.nodes[following].edges)))
    return None
