// The Runners page: every runner of the organization with its type, state storage, description, whether
// this orchestrator can launch it (and why not), the runner rules pointing at it, the environments linked
// to it, and for agent and managed runners when they were last seen. The Managed pool is read-only.

import * as api from "../api.js";
import { dl, h } from "../dom.js";
import * as format from "../format.js";
import * as session from "../session.js";

const MANAGED = "managed";

function launchInfo(runner) {
  const status = runner.status || {};
  if (runner.launched_by === "platform") {
    const tags = status.tags && status.tags.length ? ` (tags: ${status.tags.join(", ")})` : "";
    return h("span", null, `Managed by the platform: ${status.online ?? 0} runner(s) online${tags}`);
  }
  if (runner.launched_by === "agent") {
    return h("span", null,
      "Launched by its agent; last seen: ",
      status.last_seen_at ? format.time(status.last_seen_at) : "never");
  }
  if (status.launchable === false) {
    return h("span", { class: "cannot" }, h("strong", null, "This server cannot launch it: "), status.message || "");
  }
  if (status.launchable === true) return h("span", { class: "can" }, "This server can launch it");
  return "—";
}

function ruleText(rule) {
  const parts = [];
  parts.push(rule.project_id ? `project ${rule.project_id}` : "any project");
  parts.push(rule.env_type_id ? `environment type ${rule.env_type_id}` : "any environment type");
  if (rule.required_tags && rule.required_tags.length) parts.push(`tags ${rule.required_tags.join(", ")}`);
  return parts.join(", ");
}

function list(items, empty) {
  if (!items.length) return h("span", { class: "muted" }, empty);
  return h("ul", { class: "plain" }, items.map((item) => h("li", null, item)));
}

function runnerCard(runner, rules, envs, canManage) {
  const managed = runner.id === MANAGED || runner.launched_by === "platform";
  const title = `runner-${runner.id}`;
  const actions = [];
  if (managed) {
    actions.push(h("p", { class: "read-only" }, "Managed by the platform: read-only."));
  } else if (canManage) {
    actions.push(
      h("a", { class: "button secondary", href: `#/runners/${encodeURIComponent(runner.id)}/edit`,
        "aria-label": `Edit runner ${runner.id}` }, "Edit"),
    );
  }
  return h("article", { class: ["card", "runner", managed ? "managed" : null], "aria-labelledby": title,
    dataset: { runner: runner.id } },
    h("h2", { id: title }, runner.id, managed ? h("span", { class: "badge" }, "managed by the platform") : null),
    dl([
      ["Type", runner.runner_configuration.type],
      ["State storage", runner.state_storage_configuration.type],
      ["Description", runner.description ? h("span", { class: "description" }, runner.description) : null],
      ["Launch", launchInfo(runner)],
      ["Runner rules", list(rules.map(ruleText), "no rule points at it")],
      ["Environments", list(envs.map((e) => `${e.project_id} / ${e.id}`), "none linked")],
    ]),
    actions,
  );
}

export async function listPage({ root, signal }) {
  const [summaries, rules, envs] = await Promise.all([
    api.all(api.orgPath("runners"), { query: { include_managed: "true" }, signal }),
    api.all(api.orgPath("runner-rules"), { signal }),
    api.all(api.orgPath("envs"), { signal }),
  ]);
  // Each runner's own GET says whether this server can launch it, or when its agent was last seen.
  const runners = await Promise.all(summaries.map((r) => api.json(api.orgPath("runners", r.id), { signal })));
  const canManage = session.may("manage");
  const header = h("div", { class: "page-head" }, h("h1", null, "Runners"));
  if (canManage) header.append(h("a", { class: "button", href: "#/runners/new" }, "New runner"));
  root.append(header);
  if (!runners.length) {
    root.append(h("p", null, "No runner yet."));
    return;
  }
  runners.sort((a, b) => (a.id === MANAGED) - (b.id === MANAGED) || a.id.localeCompare(b.id));
  root.append(
    h("div", { class: "cards" },
      runners.map((runner) =>
        runnerCard(
          runner,
          rules.filter((rule) => rule.runner_id === runner.id),
          envs.filter((env) => env.runner_id === runner.id),
          canManage,
        ),
      ),
    ),
  );
}
