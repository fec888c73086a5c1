"""A deployment's log as a person reads it: the text Terraform itself prints, not its ``-json`` lines.

A deployment's log holds three kinds of lines, and :class:`LogRenderer` turns each into text:

- Terraform's (and OpenTofu's) machine-readable UI lines (``terraform apply -json``; the runner always
  runs the engine so): mostly their ``@message``, which is the line Terraform prints in its human view
  (``terraform_data.a: Creating...``); a ``diagnostic`` as Terraform's boxed ``Error: ...`` or
  ``Warning: ...`` block (summary, where in the code with its snippet, the detail wrapped); ``outputs`` as
  Terraform's ``Outputs:`` block; a ``change_summary`` after a blank line; a provisioner's output as
  ``ADDR (local-exec): LINE``; what Terraform's human view leaves out (the version, the end of a refresh
  or of a provisioner) not at all.
- The runner's own JSON lines (``{"event": ..., "level": ..., "time": ..., ...}``, and upstream's Go
  runner's ``{"time", "level", "msg"}``) as one short ``[runner] ...`` line each, without the fields every
  line repeats (org, runner, deployment).
- Anything else (an engine's plain stderr, a truncation notice) as it is.

Nothing here reads the terminal or prints: the caller gives the width (Terraform wraps at its terminal's
width, 78 columns elsewhere) and whether to colour.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Terraform's width when its output is not a terminal.
DEFAULT_WIDTH = 78
#: The runner's bound fields, on every one of its lines: left out of ``[runner]`` lines.
RUNNER_CONTEXT_FIELDS = frozenset(
    {"event", "level", "time", "org_id", "runner_id", "deployment_id", "mode", "env_uuid", "exception"}
)
#: Machine lines whose event Terraform's human view does not print: the version, the end of a refresh or
#: of a provisioner (what follows says how it went).
SILENT_TYPES = frozenset({"version", "refresh_complete", "provision_complete"})
#: Fields of upstream's Go runner (slog's JSON handler) left out the same way.
SLOG_FIELDS = frozenset({"time", "level", "msg", "source"})

_PLAIN_VALUE = re.compile(r"^[^\s\"=]+$")
_OUTPUT_ACTIONS = {"create": "+", "update": "~", "delete": "-", "replace": "-/+"}
_RESET, _BOLD, _UNDERLINE = "\x1b[0m", "\x1b[1m", "\x1b[4m"
_RED, _YELLOW, _DARK_GREY = "\x1b[31m", "\x1b[33m", "\x1b[90m"


class LogRenderer:
    """Renders a deployment's log line by line (``line``) or as a whole (``text``).

    It keeps one piece of state: whether the last thing it rendered ended with a blank line, so that
    blocks (a diagnostic, the outputs, a summary) are set apart by exactly one blank line, as Terraform
    does.
    """

    def __init__(self, *, width: int = DEFAULT_WIDTH, colour: bool = False) -> None:
        self.width = max(width, 20)
        self.colour = colour
        self._after_blank = True

    def text(self, text: str) -> str:
        """A whole log, rendered."""
        return "".join(self.line(line) for line in text.splitlines())

    def lines(self, lines: Iterable[str]) -> Iterable[str]:
        """Rendered lines, as they come (skipped lines give nothing)."""
        for line in lines:
            rendered = self.line(line)
            if rendered:
                yield rendered

    def line(self, line: str) -> str:
        """One log line rendered: text ending in a newline, several lines for a block, or "" (skipped)."""
        line = line.rstrip("\r\n")
        document = _json_object(line)
        if document is None:
            return self._plain(line + "\n")
        if "@message" in document or ("type" in document and "@level" in document):
            return self._terraform(document, line)
        if "event" in document and "level" in document:
            return self._plain(self._runner(document))
        if "msg" in document and "level" in document:
            return self._plain(self._slog(document))
        return self._plain(line + "\n")

    # -- kinds of lines -------------------------------------------------------------------------------

    def _terraform(self, document: dict[str, Any], line: str) -> str:
        kind = document.get("type")
        message = document.get("@message")
        if kind in SILENT_TYPES:
            return ""
        if kind == "provision_progress" and isinstance(document.get("hook"), dict):
            # Terraform prints the provisioner's output as "ADDR (local-exec): LINE", not "ADDR: (...)".
            hook = document["hook"]
            address = (hook.get("resource") or {}).get("addr")
            if address and "output" in hook:
                return self._plain(f"{address} ({hook.get('provisioner')}): {hook['output']}\n")
        if kind == "diagnostic" and isinstance(document.get("diagnostic"), dict):
            return self._block(self.diagnostic(document["diagnostic"]))
        if kind == "outputs" and isinstance(document.get("outputs"), dict):
            outputs = self.outputs(document["outputs"])
            return self._block(outputs) if outputs else ""
        if kind == "change_summary" and isinstance(message, str):
            return self._block(self._style(message, _BOLD) + "\n")
        if isinstance(message, str):
            return self._plain(message + "\n")
        return self._plain(line + "\n")

    def _runner(self, document: dict[str, Any]) -> str:
        extras = {k: v for k, v in document.items() if k not in RUNNER_CONTEXT_FIELDS}
        text = _runner_line(str(document.get("event")), str(document.get("level")), extras)
        exception = document.get("exception")
        if isinstance(exception, str) and exception:
            text += "".join(f"  {line}\n" for line in exception.splitlines())
        return text

    def _slog(self, document: dict[str, Any]) -> str:
        extras = {k: v for k, v in document.items() if k not in SLOG_FIELDS}
        return _runner_line(str(document.get("msg")), str(document.get("level")), extras)

    # -- blocks ---------------------------------------------------------------------------------------

    def diagnostic(self, diagnostic: Mapping[str, Any]) -> str:
        """Terraform's boxed block of an error or a warning (``format.Diagnostic``), at ``width``."""
        severity = diagnostic.get("severity")
        if severity == "error":
            head, rule_colour = self._style("Error: ", _BOLD + _RED), _RED
        elif severity == "warning":
            head, rule_colour = self._style("Warning: ", _BOLD + _YELLOW), _YELLOW
        else:
            head, rule_colour = "", ""
        body = head + self._style(str(diagnostic.get("summary") or ""), _BOLD) + "\n\n"
        body += self._source(diagnostic)
        detail = diagnostic.get("detail")
        if isinstance(detail, str) and detail:
            # Terraform leaves room for the rule on the left: "│ " and one column more.
            for paragraph in detail.split("\n"):
                body += (paragraph if paragraph.startswith(" ") else _wrap(paragraph, self.width - 3)) + "\n"
        if not rule_colour:
            return body
        ruled = [self._style("╷", rule_colour)]
        for text in body.splitlines():
            ruled.append(self._style("│", rule_colour) + (" " + text if text else ""))
        ruled.append(self._style("╵", rule_colour))
        return "\n".join(ruled) + "\n"

    def _source(self, diagnostic: Mapping[str, Any]) -> str:
        """Where the diagnostic points: ``with ADDRESS,``, ``on FILE line N, in CONTEXT:`` and the code."""
        text = ""
        if diagnostic.get("address"):
            text += f"  with {diagnostic['address']},\n"
        where = diagnostic.get("range")
        if not isinstance(where, dict):
            return text
        filename, start_line = where.get("filename"), (where.get("start") or {}).get("line")
        snippet = diagnostic.get("snippet")
        if not isinstance(snippet, dict):
            return text + f"  on {filename} line {start_line}:\n  (source code not available)\n\n"
        context = snippet.get("context")
        text += f"  on {filename} line {start_line}{f', in {context}' if context else ''}:\n"
        code = str(snippet.get("code") or "")
        start = _clamp(int(snippet.get("highlight_start_offset") or 0), len(code))
        end = _clamp(int(snippet.get("highlight_end_offset") or 0), len(code))
        if end < start:
            end = min(start + 1, len(code))
        code = code[:start] + self._style(code[start:end], _UNDERLINE) + code[end:]
        first = int(snippet.get("start_line") or start_line or 0)
        for number, code_line in enumerate(code.split("\n"), start=first):
            text += f"{number:4d}: {code_line}\n"
        values = sorted(
            (v for v in snippet.get("values") or [] if isinstance(v, dict)),
            key=lambda v: str(v.get("traversal")),
        )
        call = snippet.get("function_call")
        signature = call.get("signature") if isinstance(call, dict) else None
        if values or isinstance(signature, dict):
            bar = self._style("│", _DARK_GREY)
            text += "    " + self._style("├────────────────", _DARK_GREY) + "\n"
            if isinstance(call, dict) and isinstance(signature, dict):
                params = [str(p.get("name")) for p in signature.get("params") or [] if isinstance(p, dict)]
                variadic = signature.get("variadic_param")
                if isinstance(variadic, dict):
                    params.append(f"{variadic.get('name')}...")
                called = self._style(str(call.get("called_as")), _BOLD)
                text += f"    {bar} while calling {called}({', '.join(params)})\n"
            for value in values:
                text += (
                    f"    {bar} {self._style(str(value.get('traversal')), _BOLD)} {value.get('statement')}\n"
                )
        return text + "\n"

    def outputs(self, outputs: Mapping[str, Any]) -> str:
        """Terraform's ``Outputs:`` after an apply (values), ``Changes to Outputs:`` after a plan."""
        items = sorted((name, o) for name, o in outputs.items() if isinstance(o, dict))
        if not items:
            return ""
        if all("action" in o for _, o in items):
            changes = [
                f"  {_OUTPUT_ACTIONS.get(str(o['action']), '~')} {name}"
                + (" = (sensitive value)" if o.get("sensitive") else "")
                for name, o in items
                if o["action"] != "noop"
            ]
            return "Changes to Outputs:\n" + "".join(f"{c}\n" for c in changes) if changes else ""
        lines = []
        for name, o in items:
            if o.get("sensitive"):
                lines.append(f"{name} = <sensitive>")
            elif "value" in o:
                lines.append(f"{name} = {hcl_value(o['value'], o.get('type'))}")
            else:
                lines.append(f"{name} = (known after apply)")
        return "Outputs:\n\n" + "".join(f"{line}\n" for line in lines)

    # -- spacing and colour ---------------------------------------------------------------------------

    def _plain(self, text: str) -> str:
        self._after_blank = text.endswith("\n\n") or text == "\n"
        return text

    def _block(self, text: str) -> str:
        """A block set apart from what is around it by one blank line before and after."""
        before = "" if self._after_blank else "\n"
        self._after_blank = True
        return before + text + "\n"

    def _style(self, text: str, codes: str) -> str:
        if not self.colour or not text:
            return text
        return f"{codes}{text}{_RESET}"


def _json_object(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        document = json.loads(line)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _runner_line(message: str, level: str, extras: Mapping[str, Any]) -> str:
    level = level.lower()
    prefix = "" if level in ("info", "") else f"{'warning' if level == 'warn' else level}: "
    fields = " ".join(f"{key}={_field_value(value)}" for key, value in extras.items())
    return f"[runner] {prefix}{message}{f' ({fields})' if fields else ''}\n"


def _field_value(value: Any) -> str:
    if isinstance(value, str) and _PLAIN_VALUE.match(value):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _wrap(paragraph: str, width: int) -> str:
    """Words wrapped at ``width`` as Terraform's wordwrap does: at spaces only, long words whole."""
    if not paragraph.strip():
        return paragraph
    return "\n".join(
        textwrap.wrap(paragraph, width=max(width, 1), break_long_words=False, break_on_hyphens=False)
    )


def _clamp(value: int, upper: int) -> int:
    return min(max(value, 0), upper)


def hcl_value(value: Any, value_type: Any = None, indent: int = 0) -> str:
    """A value as Terraform prints an output (``"text"``, ``tolist([...])``, ``{ "k" = 1 }``, a heredoc),
    given its JSON value and, where known, its JSON type expression (``["list", "string"]``, ...);
    ``indent``: the spaces before the line it starts on (Terraform's ``repl.FormatValue``)."""
    kind = value_type[0] if isinstance(value_type, list) and value_type else None
    inner = value_type[1] if isinstance(value_type, list) and len(value_type) > 1 else None
    pad, end = " " * (indent + 2), " " * indent
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return _heredoc(value, indent) if "\n" in value else json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        types: Sequence[Any] = inner if kind == "tuple" and isinstance(inner, list) else [inner] * len(value)
        elements = "".join(
            f"{pad}{hcl_value(item, types[i] if i < len(types) else None, indent + 2)},\n"
            for i, item in enumerate(value)
        )
        body = f"[\n{elements}{end}]" if value else "[]"
        return {"list": f"tolist({body})", "set": f"toset({body})"}.get(str(kind), body)
    if isinstance(value, dict):
        attributes = inner if kind == "object" and isinstance(inner, dict) else {}
        entries = "".join(
            f"{pad}{json.dumps(k, ensure_ascii=False)} = "
            f"{hcl_value(v, attributes.get(k, inner if kind == 'map' else None), indent + 2)}\n"
            for k, v in value.items()
        )
        body = f"{{\n{entries}{end}}}" if value else "{}"
        return f"tomap({body})" if kind == "map" else body
    return json.dumps(value)


def _heredoc(text: str, indent: int) -> str:
    lines = text.split("\n")
    delimiter = "EOT"
    while any(line.strip() == delimiter for line in lines):
        delimiter += "_"
    body = "".join(f"\n{' ' * indent}{line}" for line in lines)
    return f"{'<<-' if indent else '<<'}{delimiter}{body}\n{' ' * indent}{delimiter}"
