// A deployment's log as readable text, as `octl logs` prints it: the log is the runner's JSON lines and
// Terraform's `-json` machine lines. A Terraform line shows as its `@message`, a diagnostic as the
// Error:/Warning: block Terraform itself prints, a runner line as "[po-runner] event key=value"; a line
// that is not JSON is kept as it is. Each rendered line has a level (info, warning, error) for styling.

const RUNNER_KEYS_LEFT_OUT = new Set(["event", "level", "time", "timestamp", "logger"]);

function diagnosticLines(diagnostic, fallbackLevel) {
  const severity = diagnostic.severity === "warning" ? "warning" : fallbackLevel === "warn" ? "warning" : "error";
  const title = severity === "warning" ? "Warning" : "Error";
  const body = [`${title}: ${diagnostic.summary || ""}`.trimEnd()];
  const range = diagnostic.range;
  const snippet = diagnostic.snippet;
  if (range && range.filename) {
    body.push("");
    let where = `  on ${range.filename} line ${range.start ? range.start.line : "?"}`;
    if (snippet && snippet.context) where += `, in ${snippet.context}`;
    body.push(`${where}:`);
    if (snippet && typeof snippet.code === "string") {
      const first = snippet.start_line || (range.start && range.start.line) || 1;
      snippet.code.split("\n").forEach((code, i) => {
        body.push(`${String(first + i).padStart(4)}: ${code}`);
      });
    }
  }
  if (diagnostic.detail) {
    body.push("");
    body.push(...String(diagnostic.detail).split("\n"));
  }
  const lines = [{ text: "╷", level: severity }];
  for (const line of body) lines.push({ text: line ? `│ ${line}` : "│", level: severity });
  lines.push({ text: "╵", level: severity });
  return lines;
}

function levelOf(value) {
  const level = String(value || "").toLowerCase();
  if (level.startsWith("err") || level === "critical" || level === "fatal") return "error";
  if (level.startsWith("warn")) return "warning";
  return "info";
}

function scalar(value) {
  if (typeof value === "string") return /[\s"=]/.test(value) || value === "" ? JSON.stringify(value) : value;
  return JSON.stringify(value);
}

/** The rendered lines of one log line: [{text, level}]. */
export function renderLine(raw) {
  const line = raw.replace(/\r$/, "");
  if (!line.trim().startsWith("{")) return [{ text: line, level: "info" }];
  let data;
  try {
    data = JSON.parse(line);
  } catch {
    return [{ text: line, level: "info" }];
  }
  if (data === null || typeof data !== "object" || Array.isArray(data)) return [{ text: line, level: "info" }];
  if ("@message" in data || "@level" in data) {
    if (data.type === "diagnostic" && data.diagnostic) return diagnosticLines(data.diagnostic, data["@level"]);
    return [{ text: String(data["@message"] ?? ""), level: levelOf(data["@level"]) }];
  }
  if ("event" in data) {
    const level = levelOf(data.level);
    const extras = Object.entries(data)
      .filter(([key]) => !RUNNER_KEYS_LEFT_OUT.has(key) && key !== "exception")
      .map(([key, value]) => `${key}=${scalar(value)}`);
    const prefix = level === "error" ? "[po-runner] error: " : level === "warning" ? "[po-runner] warning: " : "[po-runner] ";
    const lines = [{ text: `${prefix}${data.event}${extras.length ? " " + extras.join(" ") : ""}`, level }];
    if (typeof data.exception === "string") {
      for (const text of data.exception.split("\n")) lines.push({ text: `    ${text}`, level });
    }
    return lines;
  }
  return [{ text: line, level: "info" }];
}

/** The rendered lines of a whole text (lines split on newlines; a trailing newline adds none). */
export function renderText(text) {
  const lines = String(text).split("\n");
  if (lines.length && lines[lines.length - 1] === "") lines.pop();
  return lines.flatMap(renderLine);
}
