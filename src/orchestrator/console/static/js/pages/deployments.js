// The deployments list: status, phase, mode and timing, newest first, filtered by project and environment,
// one API page at a time (the API's own page tokens).

import * as api from "../api.js";
import { h } from "../dom.js";
import * as format from "../format.js";

const PER_PAGE = 50;

function hashFor(query) {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) if (value) params.set(key, value);
  const text = params.toString();
  return `#/deployments${text ? `?${text}` : ""}`;
}

function filters(projects, envs, chosen, navigate) {
  const project = h("select", { id: "filter-project", name: "project" },
    h("option", { value: "" }, "All projects"),
    projects.map((p) => h("option", { value: p.id, selected: p.id === chosen.project }, p.id)));
  const env = h("select", { id: "filter-env", name: "env" });
  const fillEnvs = () => {
    const wanted = project.value;
    env.replaceChildren(h("option", { value: "" }, "All environments"),
      ...envs.filter((e) => !wanted || e.project_id === wanted)
        .map((e) => h("option", { value: `${e.project_id}/${e.id}`, selected: `${e.project_id}/${e.id}` === `${chosen.project}/${chosen.env}` },
          wanted ? e.id : `${e.project_id} / ${e.id}`)));
  };
  fillEnvs();
  project.addEventListener("change", fillEnvs);
  const form = h("form", { class: "filters", role: "search", "aria-label": "Filter deployments" },
    h("div", { class: "field" }, h("label", { for: "filter-project" }, "Project"), project),
    h("div", { class: "field" }, h("label", { for: "filter-env" }, "Environment"), env),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Filter")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const [envProject, envId] = env.value ? env.value.split("/") : ["", ""];
    navigate(hashFor({ project: envProject || project.value, env: envId }));
  });
  return form;
}

function row(d) {
  return h("tr", { dataset: { deployment: d.id } },
    h("th", { scope: "row" }, h("a", { href: `#/deployments/${encodeURIComponent(d.id)}`, class: "id" }, d.id)),
    h("td", null, `${d.project_id} / ${d.env_id}`),
    h("td", null, format.mode(d)),
    h("td", null, format.status(d.status)),
    h("td", null, d.phase || "—"),
    h("td", null, format.time(d.created_at)),
    h("td", null, d.launched_at ? format.duration(d.launched_at, d.completed_at) : "—"),
    h("td", null, d.runner_id || "—"));
}

export async function listPage({ root, query, signal, navigate }) {
  const chosen = { project: query.get("project") || "", env: query.get("env") || "" };
  const pageToken = query.get("page") || "";
  // The page of deployments first, alone: the table is rendered as soon as the API's page answers (as
  // fast as the API's first page), the filters' choices a moment later.
  const answer = await api.page(api.orgPath("deployments"), {
    perPage: PER_PAGE,
    pageToken: pageToken || undefined,
    query: { project_id: chosen.project, env_id: chosen.env },
    signal,
  });
  const filterBox = h("div", { class: "filter-box" });
  root.append(h("h1", null, "Deployments"), filterBox);
  Promise.all([api.all(api.orgPath("projects"), { signal }), api.all(api.orgPath("envs"), { signal })])
    .then(([projects, envs]) => filterBox.append(filters(projects, envs, chosen, navigate)))
    .catch((error) => {
      if (!signal.aborted) filterBox.append(h("p", { class: "error" }, `The filters: ${error.message}`));
    });
  const scope = chosen.env ? `${chosen.project} / ${chosen.env}` : chosen.project || "all projects";
  if (!answer.items.length) {
    root.append(h("p", { class: "muted" }, `No deployment (${scope}).`));
  } else {
    root.append(h("div", { class: "table-wrap" }, h("table", { class: "deployments" },
      h("caption", null, `Deployments of ${scope}, newest first${pageToken ? " (a later page)" : ""}`),
      h("thead", null, h("tr", null,
        ["Deployment", "Project / environment", "Mode", "Status", "Phase", "Created", "Run time", "Runner"]
          .map((title) => h("th", { scope: "col" }, title)))),
      h("tbody", null, answer.items.map(row)))));
  }
  const pager = h("nav", { class: "pager", "aria-label": "Pages" });
  if (pageToken) pager.append(h("a", { href: hashFor(chosen), class: "button secondary" }, "First page"));
  if (answer.next_page_token) {
    pager.append(h("a", { href: hashFor({ ...chosen, page: answer.next_page_token }), class: "button secondary",
      rel: "next" }, "Next page"));
  }
  if (pager.children.length) root.append(pager);
}
