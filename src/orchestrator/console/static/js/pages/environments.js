// Environments, per project: each with its linked runner and last deployment, and "Refresh runner": the
// API's refresh_runner with dry_run first (which runner the rules would link now), then, once the user
// confirms, for real.

import * as api from "../api.js";
import { fill, h } from "../dom.js";
import * as format from "../format.js";
import * as session from "../session.js";

function lastDeploymentCell(deployment) {
  if (!deployment) return h("span", { class: "muted" }, "none yet");
  return h("span", null,
    format.status(deployment.status), " ",
    h("a", { href: `#/deployments/${encodeURIComponent(deployment.id)}` }, format.time(deployment.created_at)),
    ` (${format.mode(deployment)})`);
}

function refreshDialog(env, runnerCell, announce) {
  const label = `refresh-title-${env.project_id}-${env.id}`;
  const body = h("div", { class: "dialog-body" });
  const dialog = h("dialog", { "aria-labelledby": label, class: "dialog" },
    h("h2", { id: label }, `Refresh the runner of ${env.project_id} / ${env.id}`), body);
  const close = () => {
    dialog.close();
    dialog.remove();
  };
  dialog.addEventListener("close", () => dialog.remove());

  async function preview() {
    fill(body, h("p", null, "Asking the API which runner the rules would link (dry run)…"));
    const path = api.orgPath("projects", env.project_id, "envs", env.id, "actions", "refresh_runner");
    let dry;
    try {
      dry = await api.json(path, { method: "POST", query: { dry_run: "true" } });
    } catch (failure) {
      fill(body, h("p", { class: "error", role: "alert" }, failure.message),
        h("div", { class: "actions" }, h("button", { type: "button", class: "secondary", on: { click: close } }, "Close")));
      return;
    }
    const current = env.runner_id || null;
    // `updated`: the link would change (another runner, or other required tags of a managed one).
    const unchanged = !dry.updated;
    const confirm = h("button", { type: "button", id: "refresh-confirm", disabled: unchanged }, "Confirm");
    const cancel = h("button", { type: "button", class: "secondary", on: { click: close } }, unchanged ? "Close" : "Cancel");
    fill(body,
      h("p", { class: "dry-run", role: "status" },
        "Dry run: the runner rules would link ", h("strong", { class: "runner-id" }, dry.runner_id),
        current ? ` (linked now: ${current}).` : " (no runner linked now)."),
      unchanged ? h("p", null, "Nothing would change.") : null,
      h("div", { class: "actions" }, confirm, cancel));
    confirm.addEventListener("click", async () => {
      confirm.disabled = true;
      try {
        const done = await api.json(path, { method: "POST" });
        env.runner_id = done.runner_id;
        fill(runnerCell, done.runner_id);
        const text = done.updated ? `Linked ${env.project_id} / ${env.id} to runner ${done.runner_id}.`
          : `Runner ${done.runner_id} was already linked.`;
        fill(body, h("p", { role: "status" }, text),
          h("div", { class: "actions" }, h("button", { type: "button", on: { click: close } }, "Close")));
        body.querySelector("button").focus();
        announce(text);
      } catch (failure) {
        fill(body, h("p", { class: "error", role: "alert" }, failure.message),
          h("div", { class: "actions" }, h("button", { type: "button", class: "secondary", on: { click: close } }, "Close")));
      }
    });
    (unchanged ? cancel : confirm).focus();
  }

  document.body.append(dialog);
  dialog.showModal();
  preview();
}

export async function listPage({ root, signal, announce }) {
  const [projects, envs] = await Promise.all([
    api.all(api.orgPath("projects"), { signal }),
    api.all(api.orgPath("envs"), { signal }),
  ]);
  // The last deployment of each environment: the first item of its newest-first list.
  const latest = await Promise.all(
    envs.map((env) =>
      api.page(api.orgPath("deployments"), { perPage: 1, query: { project_id: env.project_id, env_id: env.id }, signal })
        .then((answer) => answer.items[0] || null)),
  );
  const lastOf = new Map(envs.map((env, i) => [`${env.project_id}/${env.id}`, latest[i]]));
  const canManage = session.may("manage");
  root.append(h("h1", null, "Environments"));
  if (!projects.length) {
    root.append(h("p", null, "No project yet."));
    return;
  }
  for (const project of projects) {
    const mine = envs.filter((env) => env.project_id === project.id);
    const titleId = `project-${project.id}`;
    const section = h("section", { "aria-labelledby": titleId, class: "project" },
      h("h2", { id: titleId }, project.display_name && project.display_name !== project.id
        ? `${project.display_name} (${project.id})` : project.id));
    if (!mine.length) {
      section.append(h("p", { class: "muted" }, "No environment."));
      root.append(section);
      continue;
    }
    const rows = mine.map((env) => {
      const runnerCell = h("td", { class: "runner" }, env.runner_id || h("span", { class: "muted" }, "none linked"));
      const action = canManage
        ? h("td", null, h("button", {
          type: "button",
          class: "secondary",
          "aria-label": `Refresh runner of ${project.id} / ${env.id}`,
          on: { click: () => refreshDialog(env, runnerCell, announce) },
        }, "Refresh runner"))
        : null;
      return h("tr", { dataset: { env: `${env.project_id}/${env.id}` } },
        h("th", { scope: "row" }, env.id),
        h("td", null, env.env_type_id),
        h("td", null, env.status + (env.status_message ? `: ${env.status_message}` : "")),
        runnerCell,
        h("td", null, lastDeploymentCell(lastOf.get(`${env.project_id}/${env.id}`))),
        action);
    });
    section.append(h("div", { class: "table-wrap" }, h("table", null,
      h("caption", { class: "visually-hidden" }, `Environments of project ${project.id}`),
      h("thead", null, h("tr", null,
        h("th", { scope: "col" }, "Environment"),
        h("th", { scope: "col" }, "Type"),
        h("th", { scope: "col" }, "Status"),
        h("th", { scope: "col" }, "Runner"),
        h("th", { scope: "col" }, "Last deployment"),
        canManage ? h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")) : null)),
      h("tbody", null, rows))));
    root.append(section);
  }
}
