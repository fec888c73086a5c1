"""Reading Terraform/OpenTofu machine output: JSON log lines, change summaries, diagnostics, plans.

Pure functions over text and parsed JSON; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.protocol import results

#: What a planned output shows when its value is only known after apply (upstream wording).
KNOWN_AFTER_APPLY = "(known after apply)"


@dataclass(frozen=True, kw_only=True)
class ChangeSummary:
    """The ``change_summary`` JSON log line: resources added, changed and removed by a plan/apply/destroy."""

    add: int
    change: int
    remove: int
    operation: str


def json_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Parse the lines that are JSON objects; skip everything else."""
    parsed: list[dict[str, Any]] = []
    for line in lines:
        value = _json_object(line)
        if value is not None:
            parsed.append(value)
    return parsed


def _json_object(line: str) -> dict[str, Any] | None:
    stripped = line.strip()
    if not stripped.startswith("{"):
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class OutputScan:
    """What the runner needs of an engine command's output, read one line at a time as it comes: the last
    change summary, whether a plan's change summary was printed, the last error diagnostic, the engine's
    version message (the first line of a ``-json`` command). It keeps no
    line, so that a command's memory does not grow with its log; only lines that name a change summary or
    a diagnostic are parsed."""

    def __init__(self) -> None:
        self.summary: ChangeSummary | None = None
        self.planned = False
        #: The last error diagnostic (Terraform's ``diagnostic`` object).
        self.error: dict[str, Any] | None = None
        #: The version message (``Terraform 1.15.5``, ``OpenTofu 1.10.0``), the first one seen.
        self.version: str | None = None

    def feed(self, line: str) -> None:
        if '"change_summary"' not in line and '"diagnostic"' not in line:
            if self.version is None and '"version"' in line:
                self.version = engine_version((line,))
            return
        message = _json_object(line)
        if message is None:
            return
        kind = message.get("type")
        if kind == "change_summary":
            changes = message.get("changes")
            if isinstance(changes, dict):
                self.summary = ChangeSummary(
                    add=_int(changes.get("add")),
                    change=_int(changes.get("change")),
                    remove=_int(changes.get("remove")),
                    operation=str(changes.get("operation", "")),
                )
                self.planned = self.planned or changes.get("operation") == "plan"
        elif kind == "diagnostic":
            diagnostic = message.get("diagnostic")
            if not isinstance(diagnostic, dict):
                return
            if message.get("@level") == "error" or diagnostic.get("severity") == "error":
                if diagnostic.get("summary") or diagnostic.get("detail"):
                    self.error = diagnostic


def scan(lines: Iterable[str]) -> OutputScan:
    """``OutputScan`` of ``lines``."""
    scanned = OutputScan()
    for line in lines:
        scanned.feed(line)
    return scanned


def change_summary(lines: Iterable[str]) -> ChangeSummary | None:
    """The last ``"type": "change_summary"`` line, if any."""
    return scan(lines).summary


def planned(lines: Iterable[str]) -> bool:
    """Whether the output has a plan's change summary: an ``apply`` without a plan file got past planning."""
    return scan(lines).planned


def is_plan_summary(line: str) -> bool:
    """Whether ``line`` is a plan's change summary (in an ``apply`` or ``destroy``: planning is over)."""
    return '"change_summary"' in line and planned([line])


def last_error_diagnostic(lines: Iterable[str], *, action: str) -> results.ResultError | None:
    """The last error diagnostic of ``lines`` as ``TF_DIAGNOSTIC_ERROR`` (see ``diagnostic_error``)."""
    chosen = scan(lines).error
    return None if chosen is None else diagnostic_error(chosen, action=action)


def diagnostic_error(chosen: Mapping[str, Any], *, action: str) -> results.ResultError:
    """An error diagnostic as ``TF_DIAGNOSTIC_ERROR``, with where it points in ``details``.

    ``message`` is ``summary: detail``. ``details`` holds ``action`` (the IaC command), ``summary``,
    ``detail``, ``address``, ``range`` and, when the snippet or file name says so, ``entity_type``
    (``provider``, ``module`` or ``output``), ``entity_id``, ``entity_version`` and ``code_hint``.
    """
    summary = str(chosen.get("summary") or "").strip()
    detail = str(chosen.get("detail") or "").strip()
    details: dict[str, Any] = {"action": action, "summary": summary}
    if detail:
        details["detail"] = detail
    address = chosen.get("address") or _context_address(chosen)
    if address:
        details["address"] = address
    if isinstance(chosen.get("range"), dict):
        details["range"] = chosen["range"]
    details.update(_entity(chosen))
    message_text = f"{summary}: {detail}" if summary and detail else summary or detail
    return results.ResultError(error=results.TF_DIAGNOSTIC_ERROR_CODE, message=message_text, details=details)


def _entity(diagnostic: Mapping[str, Any]) -> dict[str, str]:
    """Which provider/module/output a diagnostic is about (upstream ``parseError`` rules)."""
    entity: dict[str, str] = {}
    filename = ""
    if isinstance(diagnostic.get("range"), dict):
        filename = str(diagnostic["range"].get("filename") or "")
    snippet = diagnostic.get("snippet")
    if isinstance(snippet, dict):
        context = str(snippet.get("context") or "").split(" ")
        kind = context[0] if context else ""
        if kind in ("provider", "module", "output"):
            entity["entity_type"] = kind
            if len(context) >= 2:
                entity["entity_id"] = _unquote(context[1])
        code = str(snippet.get("code") or "").strip()
        if code:
            entity["code_hint"] = code
    if "entity_type" not in entity and filename.startswith("modules/"):
        # Inline modules of a bundle live at modules/<id>/<version>/main.tf.
        parts = filename.removeprefix("modules/").split("/")
        entity["entity_type"] = "module"
        if len(parts) >= 3:
            entity["entity_id"], entity["entity_version"] = parts[0], parts[1]
    return entity


def _context_address(diagnostic: Mapping[str, Any]) -> str | None:
    """``resource "t" "n"`` → ``t.n``, ``data "t" "n"`` → ``data.t.n``, ``module "m"`` → ``module.m``.

    Only for the root module's files: inside ``modules/`` the block's full address is not known here.
    Terraform omits ``address`` from many diagnostics (e.g. a failed postcondition), so the enclosing
    block of the snippet is the best pointer available.
    """
    snippet = diagnostic.get("snippet")
    source = diagnostic.get("range")
    filename = str(source.get("filename") or "") if isinstance(source, dict) else ""
    if not isinstance(snippet, dict) or filename.startswith("modules/"):
        return None
    words = [_unquote(word) for word in str(snippet.get("context") or "").split()]
    match words:
        case ["resource", kind, name]:
            return f"{kind}.{name}"
        case ["data", kind, name]:
            return f"data.{kind}.{name}"
        case ["module", name]:
            return f"module.{name}"
    return None


def _unquote(token: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] == '"':
        try:
            value = json.loads(token)
        except ValueError:
            return token.strip('"')
        return str(value)
    return token


def planned_outputs(plan: Mapping[str, Any]) -> dict[str, Any]:
    """Output values a plan (``show -json``) will produce; unknown parts read ``(known after apply)``."""
    changes = plan.get("output_changes") or {}
    return {name: _compact(change) for name, change in changes.items() if isinstance(change, dict)}


def _compact(change: Mapping[str, Any]) -> Any:
    actions = change.get("actions") or []
    if not actions:
        return KNOWN_AFTER_APPLY
    if actions[0] == "no-op":
        return change.get("after")
    if actions[0] == "delete":
        return None
    return _fill_unknowns(change.get("after"), change.get("after_unknown"))


def _fill_unknowns(after: Any, unknown: Any) -> Any:
    if isinstance(after, dict):
        filled = dict(after)
        if isinstance(unknown, dict):
            for key, value in unknown.items():
                filled[key] = _fill_unknowns(after.get(key), value)
        return filled
    if isinstance(after, list):
        filled_list = list(after)
        if isinstance(unknown, list):
            for index, value in enumerate(unknown[: len(filled_list)]):
                filled_list[index] = _fill_unknowns(after[index], value)
        return filled_list
    return KNOWN_AFTER_APPLY if unknown is True else after


def planned_resource_count(plan: Mapping[str, Any]) -> int:
    """Managed resources in the plan's ``planned_values`` (all modules): what exists after apply."""
    root = (plan.get("planned_values") or {}).get("root_module") or {}
    return _count_managed(root)


def state_resource_count(state: Mapping[str, Any]) -> int:
    """Managed resources in a state (``show -json`` without a plan file), all modules."""
    return _count_managed((state.get("values") or {}).get("root_module") or {})


def state_outputs(state: Mapping[str, Any]) -> dict[str, Any]:
    """The output values of a state (``show -json`` without a plan file) as ``{name: value}``."""
    return output_values((state.get("values") or {}).get("outputs") or {})


@dataclass(frozen=True, kw_only=True)
class AppliedState:
    """What the results take from a state: the output values (sensitive ones too) and the number of
    managed resource instances (all modules, deposed objects included), as ``show -json`` reports them."""

    outputs: dict[str, Any]
    num_resources: int


def applied_state(shown: Mapping[str, Any]) -> AppliedState:
    """From ``show -json`` of a state (no plan file)."""
    return AppliedState(outputs=state_outputs(shown), num_resources=state_resource_count(shown))


#: The state format this reads (Terraform 0.12 and later, OpenTofu).
RAW_STATE_VERSION = 4


def raw_applied_state(document: bytes | None) -> AppliedState | None:
    """From the state file itself, as the backend stores it (``None``: no state yet, an empty one).

    The same as :func:`applied_state` of ``show -json``, which renders this file: each output's
    ``value``; each managed resource's instance objects (``show -json`` lists one entry per current
    object and per deposed one, as the file does). None when the document is not a plain version 4
    state (an encrypted OpenTofu state, another format): the caller asks the engine instead.
    """
    if document is None or not document.strip():
        return AppliedState(outputs={}, num_resources=0)
    try:
        state = json.loads(document)
    except ValueError:
        return None
    if not isinstance(state, dict) or state.get("version") != RAW_STATE_VERSION or "encrypted_data" in state:
        return None
    outputs, resources = state.get("outputs", {}), state.get("resources", [])
    if not isinstance(outputs, dict) or not isinstance(resources, list):
        return None
    if not all(isinstance(entry, dict) for entry in [*outputs.values(), *resources]):
        return None
    count = 0
    for resource in resources:
        instances = resource.get("instances", [])
        if not isinstance(instances, list):
            return None
        if resource.get("mode") == "managed":
            count += len(instances)
    return AppliedState(outputs=output_values(outputs), num_resources=count)


def engine_version(lines: Iterable[str]) -> str | None:
    """The version message a ``-json`` command prints first (``Terraform 1.15.5``, ``OpenTofu 1.10.0``)."""
    for message in json_lines(lines):
        if message.get("type") == "version":
            text = message.get("@message")
            return str(text) if text else None
    return None


def _count_managed(module: Mapping[str, Any]) -> int:
    own = sum(1 for resource in module.get("resources") or [] if resource.get("mode") == "managed")
    return own + sum(_count_managed(child) for child in module.get("child_modules") or [])


def output_values(output_json: Mapping[str, Any]) -> dict[str, Any]:
    """``output -json`` (``{name: {value, type, sensitive}}``) as ``{name: value}``."""
    return {name: entry.get("value") for name, entry in output_json.items() if isinstance(entry, dict)}


def resource_metadata(value: Any) -> list[results.ResourceMetadata]:
    """The metadata output (``{node hash: {key: value}}``) as result entries, sorted by node id.

    Raises ``ValueError`` when the output does not have that shape.
    """
    if not isinstance(value, dict):
        raise ValueError(f"the metadata output must be an object of objects, not {type(value).__name__}")
    entries = []
    for node_id, metadata in sorted(value.items()):
        if not isinstance(metadata, dict):
            raise ValueError(f"the metadata of node {node_id!r} must be an object")
        entries.append(results.ResourceMetadata(node_id=node_id, metadata=metadata))
    return entries


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
