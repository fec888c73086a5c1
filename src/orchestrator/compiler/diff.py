"""What a deployment changes compared with the previous one, in upstream's ``DeploymentDiff`` shape.

Graphs are compared entry by entry (:func:`graph_of`), by coordinate ``type.class@id``, a workload being
``workload.default@<name>``:

- ``added`` / ``removed``: in one graph only;
- ``module_changed``: another module or module version provisions the resource;
- ``params_changed``: same module, other params (for a workload: other outputs).

``num_changed`` counts the last two. Workloads come first, then resources, each sorted by coordinate.
The caller adds ``from_deployment_id`` and ``to_deployment_id``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.compiler.deployment import CompiledDeployment, graph_of

Entry = Mapping[str, Any]


def _key(entry: Entry) -> tuple[bool, str]:
    return (entry["module_id"] is not None, f"{entry['type']}.{entry['class']}@{entry['resource_id']}")


def _change(entry: Entry, kind: str, summary: str) -> dict[str, str]:
    return {"id": entry["id"], "resource": _key(entry)[1], "type": kind, "summary": summary}


def _module(entry: Entry) -> str:
    return f"{entry['module_id']}@{entry['version_id']}"


def _origin(entry: Entry) -> str:
    return f" (dependency of {entry['params_defined_by']})" if entry["params_defined_by"] else ""


def _compare(old: Entry | None, new: Entry) -> dict[str, str] | None:
    workload = new["module_id"] is None
    if old is None:
        summary = "workload added" if workload else f"add resource using module {_module(new)}{_origin(new)}"
        return _change(new, "added", summary)
    if not workload and _module(old) != _module(new):
        return _change(new, "module_changed", f"module changed from {_module(old)} to {_module(new)}")
    if old["params"] != new["params"]:
        if workload:
            return _change(new, "params_changed", "workload output variables changed")
        by = f" by {new['params_defined_by']}" if new["params_defined_by"] else ""
        return _change(new, "params_changed", f"resource params changed{by}")
    return None


def diff_graphs(previous: Sequence[Entry] | None, current: Sequence[Entry]) -> dict[str, Any]:
    """``{changes, num_added, num_changed, num_removed}`` between two :func:`graph_of` graphs.

    ``previous`` None (no earlier deployment) counts everything in ``current`` as added.
    """
    before = {_key(entry): entry for entry in previous or ()}
    after = {_key(entry): entry for entry in current}
    changes: list[dict[str, str]] = []
    for key in sorted(set(before) | set(after)):
        if key not in after:
            old = before[key]
            summary = (
                "workload removed"
                if old["module_id"] is None
                else f"remove resource using module {_module(old)}{_origin(old)}"
            )
            changes.append(_change(old, "removed", summary))
            continue
        change = _compare(before.get(key), after[key])
        if change is not None:
            changes.append(change)
    added = sum(1 for change in changes if change["type"] == "added")
    removed = sum(1 for change in changes if change["type"] == "removed")
    return {
        "changes": changes,
        "num_added": added,
        "num_changed": len(changes) - added - removed,
        "num_removed": removed,
    }


def diff(previous: CompiledDeployment | None, current: CompiledDeployment) -> dict[str, Any]:
    """:func:`diff_graphs` of two compiled deployments (``previous`` None: a first deployment)."""
    return diff_graphs(graph_of(previous) if previous else None, graph_of(current))
