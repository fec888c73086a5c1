// Creating and editing a runner in a YAML editor, in the API's own shape (as `octl create runner ID
// --set-yaml=@runner.yaml` takes it). The API validates: its messages (a 400's details.errors, or the
// "field: message" of its message) are shown beside the field they name, with the line of the YAML that
// holds it. Secrets are answered as SECRET and are sent back only when changed (an edit sends a JSON
// Merge Patch of what changed).

import * as api from "../api.js";
import { fill, h } from "../dom.js";
import * as session from "../session.js";
import { LineCounter, isMap, isSeq, parseDocument, stringify } from "../../vendor/yaml.js";

const TEMPLATE = `# A runner in the API's shape: octl create runner ID --set-yaml=@runner.yaml takes the same.
# examples/runners/ in the orchestrator's repository has one for every runner type.
description: ""
runner_configuration:
  type: kubernetes-agent
  key: ""
  job:
    namespace: default
    service_account: default
state_storage_configuration:
  type: kubernetes
  namespace: default
`;

/** "a.b[0][\"x y\"]" → ["a", "b", 0, "x y"] (the API's field names, domain/validation.py's render). */
export function fieldPath(field) {
  const path = [];
  const pattern = /([A-Za-z0-9_-]+)|\[(\d+)\]|\["((?:[^"\\]|\\.)*)"\]/g;
  let match;
  while ((match = pattern.exec(field)) !== null) {
    if (match[1] !== undefined) path.push(match[1]);
    else if (match[2] !== undefined) path.push(Number(match[2]));
    else path.push(match[3].replace(/\\(.)/g, "$1"));
  }
  return path;
}

/** The 1-based line of the YAML that holds `path` (or of its nearest ancestor present), or null. */
function lineOf(doc, lineCounter, path) {
  let node = doc.contents;
  let offset = null;
  for (const segment of path) {
    if (isMap(node)) {
      const pair = node.items.find((item) => item.key && String(item.key.value ?? item.key) === String(segment));
      if (!pair) break;
      if (pair.key && pair.key.range) offset = pair.key.range[0];
      node = pair.value;
    } else if (isSeq(node) && typeof segment === "number" && node.items[segment]) {
      node = node.items[segment];
      if (node && node.range) offset = node.range[0];
    } else {
      break;
    }
  }
  return offset === null ? null : lineCounter.linePos(offset).line;
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

/** The JSON Merge Patch (RFC 7396) that turns `before` into `after`: changed values, null for removed keys.
 * A value unchanged (a "SECRET" placeholder left as it was) is not sent. */
export function mergePatch(before, after) {
  const patch = {};
  for (const [key, value] of Object.entries(after)) {
    if (isObject(value) && isObject(before[key])) {
      const inner = mergePatch(before[key], value);
      if (Object.keys(inner).length) patch[key] = inner;
    } else if (!(key in before) || !same(before[key], value)) {
      patch[key] = value;
    }
  }
  for (const key of Object.keys(before)) if (!(key in after)) patch[key] = null;
  return patch;
}

function editorForm({ runnerId, text, onSubmit, submitLabel }) {
  const idError = h("p", { class: "field-error", id: "runner-id-error", hidden: true });
  const generalError = h("p", { class: "error", role: "alert", id: "runner-error", hidden: true });
  const yamlErrors = h("ul", { class: "field-errors", id: "runner-yaml-errors", "aria-live": "polite" });
  const textarea = h("textarea", {
    id: "runner-yaml",
    name: "runner-yaml",
    rows: 24,
    spellcheck: "false",
    autocapitalize: "off",
    autocomplete: "off",
    class: "code",
    "aria-describedby": "runner-yaml-help runner-yaml-errors",
  });
  textarea.value = text;
  const idInput = runnerId === null
    ? h("input", { id: "runner-id", name: "runner-id", required: true, autocomplete: "off", spellcheck: "false",
      "aria-describedby": "runner-id-help runner-id-error" })
    : null;
  const save = h("button", { type: "submit" }, submitLabel);

  function selectLine(line) {
    const lines = textarea.value.split("\n");
    const start = lines.slice(0, line - 1).reduce((sum, l) => sum + l.length + 1, 0);
    textarea.focus();
    textarea.setSelectionRange(start, start + (lines[line - 1] || "").length);
  }

  function clear() {
    idError.hidden = true;
    generalError.hidden = true;
    fill(yamlErrors);
    textarea.removeAttribute("aria-invalid");
    if (idInput) idInput.removeAttribute("aria-invalid");
  }

  function show(errors, doc, lineCounter) {
    clear();
    let first = null;
    for (const { field, message, line: given } of errors) {
      if (field === "id" && idInput) {
        idError.textContent = `id: ${message}`;
        idError.hidden = false;
        idInput.setAttribute("aria-invalid", "true");
        first = first || idInput;
        continue;
      }
      const line = given ?? (doc && field ? lineOf(doc, lineCounter, fieldPath(field)) : null);
      const where = line ? `Line ${line}` : "";
      const item = h("li", { class: "field-error", dataset: { field: field || "" } },
        line ? h("button", { type: "button", class: "link", on: { click: () => selectLine(line) } }, where) : null,
        line ? " " : null,
        field ? h("code", null, field) : null,
        field ? ": " : null,
        message);
      yamlErrors.append(item);
      textarea.setAttribute("aria-invalid", "true");
      first = first || textarea;
    }
    if (first) first.focus();
  }

  function showGeneral(message) {
    clear();
    generalError.textContent = message;
    generalError.hidden = false;
    generalError.focus();
  }

  const form = h("form", { class: "editor", novalidate: true },
    generalError,
    idInput ? h("div", { class: "field" },
      h("label", { for: "runner-id" }, "Runner ID"),
      idInput,
      h("p", { class: "help", id: "runner-id-help" }, "Lowercase letters, digits and dashes, 2 to 50 characters."),
      idError) : null,
    h("div", { class: "field editor-field" },
      h("label", { for: "runner-yaml" }, "Runner (YAML)"),
      h("p", { class: "help", id: "runner-yaml-help" },
        "description, runner_configuration and state_storage_configuration, as the API takes them. ",
        "Values shown as SECRET are kept unless you replace them."),
      h("div", { class: "editor-grid" }, textarea, h("div", { class: "editor-side" },
        h("h2", { class: "small" }, "Messages from the API"), yamlErrors))),
    h("div", { class: "actions" }, save, h("a", { href: "#/runners", class: "button secondary" }, "Cancel")),
  );
  generalError.setAttribute("tabindex", "-1");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clear();
    const lineCounter = new LineCounter();
    const doc = parseDocument(textarea.value, { lineCounter, prettyErrors: true });
    if (doc.errors.length) {
      show(doc.errors.map((e) => ({ field: "", message: `YAML: ${e.message.split("\n")[0]}`,
        line: e.linePos ? e.linePos[0].line : null })), null, lineCounter);
      return;
    }
    const value = doc.toJS();
    if (!isObject(value)) {
      show([{ field: "", message: "The YAML must be a mapping (description, runner_configuration, …)." }], null, lineCounter);
      return;
    }
    save.disabled = true;
    try {
      await onSubmit(value, idInput ? idInput.value.trim() : runnerId);
    } catch (failure) {
      if (!(failure instanceof api.ApiError)) throw failure;
      const errors = failure.status === 400 ? failure.fieldErrors() : [];
      if (errors.length) show(errors, doc, lineCounter);
      else showGeneral(failure.message);
    } finally {
      save.disabled = false;
    }
  });
  return form;
}

function refused(root, title) {
  root.append(h("h1", null, title),
    h("p", { role: "alert", class: "error" }, `Your role (${session.whoami().role}) may not change runners.`),
    h("p", null, h("a", { href: "#/runners" }, "Back to the runners")));
}

export async function createPage({ root, navigate }) {
  if (!session.may("manage")) {
    refused(root, "New runner");
    return;
  }
  root.append(
    h("h1", null, "New runner"),
    editorForm({
      runnerId: null,
      text: TEMPLATE,
      submitLabel: "Create runner",
      onSubmit: async (value, id) => {
        const created = await api.json(api.orgPath("runners"), { method: "POST", body: { ...value, id } });
        const warnings = created.warnings && created.warnings.length ? ` Warnings: ${created.warnings.join("; ")}` : "";
        navigate("#/runners", { message: `Runner ${created.id} created.${warnings}` });
      },
    }),
  );
}

export async function editPage({ root, params, signal, navigate }) {
  const [runnerId] = params;
  if (!session.may("manage")) {
    refused(root, `Edit runner ${runnerId}`);
    return;
  }
  const runner = await api.json(api.orgPath("runners", runnerId), { signal });
  if (runner.launched_by === "platform") {
    root.append(h("h1", null, `Runner ${runnerId}`), h("p", null, "Managed by the platform: read-only."));
    return;
  }
  const original = {
    description: runner.description ?? "",
    runner_configuration: runner.runner_configuration,
    state_storage_configuration: runner.state_storage_configuration,
  };
  root.append(
    h("h1", null, `Edit runner ${runnerId}`),
    editorForm({
      runnerId,
      text: stringify(original),
      submitLabel: "Save changes",
      onSubmit: async (value) => {
        const patch = {};
        if ((value.description ?? "") !== original.description) patch.description = value.description ?? null;
        if (isObject(value.runner_configuration)) {
          const changed = mergePatch(original.runner_configuration, value.runner_configuration);
          if (Object.keys(changed).length) patch.runner_configuration = changed;
        } else if (value.runner_configuration !== undefined) {
          patch.runner_configuration = value.runner_configuration;
        }
        if (!same(value.state_storage_configuration, original.state_storage_configuration)) {
          patch.state_storage_configuration = value.state_storage_configuration ?? null;
        }
        for (const key of Object.keys(value)) {
          if (!(key in original)) patch[key] = value[key];
        }
        if (!Object.keys(patch).length) {
          navigate("#/runners", { message: `Runner ${runnerId}: nothing changed.` });
          return;
        }
        const saved = await api.json(api.orgPath("runners", runnerId), { method: "PATCH", body: patch });
        const warnings = saved.warnings && saved.warnings.length ? ` Warnings: ${saved.warnings.join("; ")}` : "";
        navigate("#/runners", { message: `Runner ${runnerId} saved.${warnings}` });
      },
    }),
  );
}
