"""JSON Merge Patch (RFC 7396): how an update of a runner's configuration applies to the stored one.

Exactly the RFC's ``MergePatch(Target, Patch)``: an object in the patch merges into the target key by key,
recursively; ``null`` removes a key; any other value (a string, a number, a list) replaces what was there,
so a list is replaced whole, never merged item by item. A patch that is not an object replaces the target.

Pure code; the arguments are never modified.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["kept_from_target", "merge_patch"]


def merge_patch(target: Any, patch: Any) -> Any:
    """The result of applying ``patch`` to ``target`` (RFC 7396, section 2)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = merge_patch(result.get(name), value)
    return result


def kept_from_target(patch: Mapping[str, Any], path: Sequence[str | int]) -> bool:
    """Whether the value at ``path`` of the merged result is the target's, untouched by the patch."""
    node: Any = patch
    for step in path:
        if not isinstance(node, Mapping):
            return False  # the patch replaced this part whole
        if step not in node:
            return True
        node = node[step]
    return False
