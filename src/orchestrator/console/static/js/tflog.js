// A deployment's log as a person reads it, as `octl logs` prints it: a port of octl's renderer
// (src/orchestrator/cli/octl/log_render.py, without colour; tests/browser checks both give the same
// text). A deployment's log holds three kinds of lines:
// - Terraform's `-json` UI lines: mostly their `@message` (the line Terraform's human view prints); a
//   diagnostic as Terraform's boxed Error:/Warning: block; `outputs` as its Outputs: block; a
//   change_summary after a blank line; a provisioner's output as "ADDR (local-exec): LINE"; the version
//   and the end of a refresh or of a provisioner not at all.
// - The runner's own JSON lines as one "[runner] ..." line each, without the fields every line repeats.
// - Anything else as it is.
// Each rendered piece has a level (info, warning, error) for styling.

/** Terraform's width when its output is not a terminal (octl's default too). */
export const DEFAULT_WIDTH = 78;
const RUNNER_CONTEXT_FIELDS = new Set(["event", "level", "time", "org_id", "runner_id", "deployment_id", "mode", "env_uuid", "exception"]);
const SILENT_TYPES = new Set(["version", "refresh_complete", "provision_complete"]);
const SLOG_FIELDS = new Set(["time", "level", "msg", "source"]);
const PLAIN_VALUE = /^[^\s"=]+$/;
const OUTPUT_ACTIONS = { create: "+", update: "~", delete: "-", replace: "-/+" };

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** Python's str() of a JSON value, where octl's renderer formats one into text. */
function py(value) {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

/** Python's str.splitlines() of a log text (no empty last line for a final newline). */
export function splitLines(text) {
  const lines = String(text).split(/\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/);
  if (lines.length && lines[lines.length - 1] === "") lines.pop();
  return lines;
}

function jsonObject(line) {
  if (!line.startsWith("{")) return null;
  try {
    const document = JSON.parse(line);
    return isObject(document) ? document : null;
  } catch {
    return null;
  }
}

function fieldValue(value) {
  if (typeof value === "string" && PLAIN_VALUE.test(value)) return value;
  if (typeof value === "boolean") return String(value);
  return JSON.stringify(value);
}

function runnerLine(message, level, extras) {
  const lowered = level.toLowerCase();
  const prefix = lowered === "info" || lowered === "" ? "" : `${lowered === "warn" ? "warning" : lowered}: `;
  const fields = Object.entries(extras).map(([key, value]) => `${key}=${fieldValue(value)}`).join(" ");
  return `[runner] ${prefix}${message}${fields ? ` (${fields})` : ""}\n`;
}

function levelOf(value) {
  const level = String(value ?? "").toLowerCase();
  if (level.startsWith("err") || level === "critical" || level === "fatal") return "error";
  if (level.startsWith("warn")) return "warning";
  return "info";
}

/** Words wrapped at `width` as Python's textwrap.wrap(break_long_words=False, break_on_hyphens=False). */
export function wrap(paragraph, width) {
  if (!paragraph.trim()) return paragraph;
  const munged = paragraph.replace(/\t/g, "        ").replace(/[\n\v\f\r]/g, " ");
  const chunks = munged.split(/([\t\n\v\f\r ]+)/).filter((c) => c !== "").reverse();
  const lines = [];
  const blank = (chunk) => chunk.trim() === "";
  while (chunks.length) {
    const line = [];
    let length = 0;
    if (blank(chunks[chunks.length - 1]) && lines.length) chunks.pop();
    while (chunks.length && length + chunks[chunks.length - 1].length <= width) {
      const chunk = chunks.pop();
      line.push(chunk);
      length += chunk.length;
    }
    if (chunks.length && chunks[chunks.length - 1].length > width && !line.length) line.push(chunks.pop());
    if (line.length && blank(line[line.length - 1])) line.pop();
    if (line.length) lines.push(line.join(""));
  }
  return lines.join("\n");
}

function heredoc(text, indent) {
  const lines = text.split("\n");
  let delimiter = "EOT";
  while (lines.some((line) => line.trim() === delimiter)) delimiter += "_";
  const pad = " ".repeat(indent);
  const body = lines.map((line) => `\n${pad}${line}`).join("");
  return `${indent ? "<<-" : "<<"}${delimiter}${body}\n${pad}${delimiter}`;
}

/** A value as Terraform prints an output, given its JSON value and JSON type expression (octl's hcl_value). */
export function hclValue(value, valueType = null, indent = 0) {
  const kind = Array.isArray(valueType) && valueType.length ? valueType[0] : null;
  const inner = Array.isArray(valueType) && valueType.length > 1 ? valueType[1] : null;
  const pad = " ".repeat(indent + 2);
  const end = " ".repeat(indent);
  if (value === null || value === undefined) return "null";
  if (typeof value === "boolean") return String(value);
  if (typeof value === "number") return JSON.stringify(value);
  if (typeof value === "string") return value.includes("\n") ? heredoc(value, indent) : JSON.stringify(value);
  if (Array.isArray(value)) {
    const types = kind === "tuple" && Array.isArray(inner) ? inner : value.map(() => inner);
    const elements = value.map((item, i) => `${pad}${hclValue(item, i < types.length ? types[i] : null, indent + 2)},\n`).join("");
    const body = value.length ? `[\n${elements}${end}]` : "[]";
    if (kind === "list") return `tolist(${body})`;
    if (kind === "set") return `toset(${body})`;
    return body;
  }
  if (isObject(value)) {
    const attributes = kind === "object" && isObject(inner) ? inner : {};
    const entries = Object.entries(value).map(([k, v]) => {
      const type = k in attributes ? attributes[k] : kind === "map" ? inner : null;
      return `${pad}${JSON.stringify(k)} = ${hclValue(v, type, indent + 2)}\n`;
    }).join("");
    const body = Object.keys(value).length ? `{\n${entries}${end}}` : "{}";
    return kind === "map" ? `tomap(${body})` : body;
  }
  return JSON.stringify(value);
}

function sortedBy(items, key) {
  return [...items].sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
}

export class LogRenderer {
  constructor({ width = DEFAULT_WIDTH } = {}) {
    this.width = Math.max(width, 20);
    this.afterBlank = true;
  }

  /** A whole log: the rendered pieces [{text, level}] (skipped lines give none). */
  text(text) {
    return splitLines(text).map((line) => this.line(line)).filter((piece) => piece.text);
  }

  /** One line: {text, level}; text ends in a newline, holds several lines for a block, or is "". */
  line(raw) {
    const line = raw.replace(/[\r\n]+$/, "");
    const document = jsonObject(line);
    if (document === null) return { text: this.plain(`${line}\n`), level: "info" };
    if ("@message" in document || ("type" in document && "@level" in document)) return this.terraform(document, line);
    if ("event" in document && "level" in document) {
      return { text: this.plain(this.runner(document)), level: levelOf(document.level) };
    }
    if ("msg" in document && "level" in document) {
      return { text: this.plain(this.slog(document)), level: levelOf(document.level) };
    }
    return { text: this.plain(`${line}\n`), level: "info" };
  }

  terraform(document, line) {
    const kind = document.type;
    const message = document["@message"];
    const level = levelOf(document["@level"]);
    if (SILENT_TYPES.has(kind)) return { text: "", level };
    if (kind === "provision_progress" && isObject(document.hook)) {
      const hook = document.hook;
      const address = isObject(hook.resource) ? hook.resource.addr : null;
      if (address && "output" in hook) {
        return { text: this.plain(`${address} (${py(hook.provisioner)}): ${py(hook.output)}\n`), level };
      }
    }
    if (kind === "diagnostic" && isObject(document.diagnostic)) {
      const severity = document.diagnostic.severity;
      return { text: this.block(this.diagnostic(document.diagnostic)), level: severity === "warning" ? "warning" : severity === "error" ? "error" : level };
    }
    if (kind === "outputs" && isObject(document.outputs)) {
      const outputs = this.outputs(document.outputs);
      return { text: outputs ? this.block(outputs) : "", level };
    }
    if (kind === "change_summary" && typeof message === "string") return { text: this.block(`${message}\n`), level };
    if (typeof message === "string") return { text: this.plain(`${message}\n`), level };
    return { text: this.plain(`${line}\n`), level };
  }

  runner(document) {
    const extras = Object.fromEntries(Object.entries(document).filter(([k]) => !RUNNER_CONTEXT_FIELDS.has(k)));
    let text = runnerLine(py(document.event), py(document.level), extras);
    if (typeof document.exception === "string" && document.exception) {
      text += splitLines(document.exception).map((line) => `  ${line}\n`).join("");
    }
    return text;
  }

  slog(document) {
    const extras = Object.fromEntries(Object.entries(document).filter(([k]) => !SLOG_FIELDS.has(k)));
    return runnerLine(py(document.msg), py(document.level), extras);
  }

  diagnostic(diagnostic) {
    const severity = diagnostic.severity;
    const head = severity === "error" ? "Error: " : severity === "warning" ? "Warning: " : "";
    let body = `${head}${diagnostic.summary ? String(diagnostic.summary) : ""}\n\n`;
    body += this.source(diagnostic);
    const detail = diagnostic.detail;
    if (typeof detail === "string" && detail) {
      for (const paragraph of detail.split("\n")) {
        body += `${paragraph.startsWith(" ") ? paragraph : wrap(paragraph, this.width - 3)}\n`;
      }
    }
    if (!head) return body;
    const ruled = ["╷"];
    for (const text of splitLines(body)) ruled.push(`│${text ? ` ${text}` : ""}`);
    ruled.push("╵");
    return `${ruled.join("\n")}\n`;
  }

  source(diagnostic) {
    let text = "";
    if (diagnostic.address) text += `  with ${py(diagnostic.address)},\n`;
    const where = diagnostic.range;
    if (!isObject(where)) return text;
    const filename = where.filename;
    const startLine = isObject(where.start) ? where.start.line : undefined;
    const snippet = diagnostic.snippet;
    if (!isObject(snippet)) return `${text}  on ${py(filename)} line ${py(startLine)}:\n  (source code not available)\n\n`;
    const context = snippet.context;
    text += `  on ${py(filename)} line ${py(startLine)}${context ? `, in ${py(context)}` : ""}:\n`;
    const code = String(snippet.code || "");
    const first = Number.parseInt(snippet.start_line || startLine || 0, 10);
    code.split("\n").forEach((codeLine, i) => {
      text += `${String(first + i).padStart(4)}: ${codeLine}\n`;
    });
    const values = sortedBy((snippet.values || []).filter(isObject), (v) => py(v.traversal));
    const call = snippet.function_call;
    const signature = isObject(call) ? call.signature : null;
    if (values.length || isObject(signature)) {
      text += "    ├────────────────\n";
      if (isObject(call) && isObject(signature)) {
        const params = (signature.params || []).filter(isObject).map((p) => py(p.name));
        if (isObject(signature.variadic_param)) params.push(`${py(signature.variadic_param.name)}...`);
        text += `    │ while calling ${py(call.called_as)}(${params.join(", ")})\n`;
      }
      for (const value of values) text += `    │ ${py(value.traversal)} ${py(value.statement)}\n`;
    }
    return `${text}\n`;
  }

  outputs(outputs) {
    const items = sortedBy(Object.entries(outputs).filter(([, o]) => isObject(o)), ([name]) => name);
    if (!items.length) return "";
    if (items.every(([, o]) => "action" in o)) {
      const changes = items.filter(([, o]) => o.action !== "noop")
        .map(([name, o]) => `  ${OUTPUT_ACTIONS[py(o.action)] || "~"} ${name}${o.sensitive ? " = (sensitive value)" : ""}`);
      return changes.length ? `Changes to Outputs:\n${changes.map((c) => `${c}\n`).join("")}` : "";
    }
    const lines = items.map(([name, o]) => {
      if (o.sensitive) return `${name} = <sensitive>`;
      if ("value" in o) return `${name} = ${hclValue(o.value, o.type ?? null)}`;
      return `${name} = (known after apply)`;
    });
    return `Outputs:\n\n${lines.map((line) => `${line}\n`).join("")}`;
  }

  plain(text) {
    this.afterBlank = text.endsWith("\n\n") || text === "\n";
    return text;
  }

  block(text) {
    const before = this.afterBlank ? "" : "\n";
    this.afterBlank = true;
    return `${before}${text}\n`;
  }
}
