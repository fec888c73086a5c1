// Usage: runner minutes per project and environment over a period, managed against self-hosted, as a
// chart (SVG built with DOM calls) and a table, with the API's CSV export as a download.

import * as api from "../api.js";
import { h, svg } from "../dom.js";
import * as format from "../format.js";

function hashFor(from, to) {
  const params = new URLSearchParams();
  if (from) params.set("from", from);
  if (to) params.set("to", to);
  const text = params.toString();
  return `#/usage${text ? `?${text}` : ""}`;
}

/** Horizontal stacked bars, one per project/environment row: self-hosted then managed minutes. */
function chart(rows) {
  const labelWidth = 180;
  const barHeight = 22;
  const gap = 10;
  const width = 640;
  const plot = width - labelWidth - 70;
  const max = Math.max(...rows.map((r) => r.runnerMinutes), 0.01);
  const height = rows.length * (barHeight + gap) + 10;
  const description = rows
    .map((r) => `${r.projectId} / ${r.envId}: ${format.minutes(r.runnerMinutesSelfHosted)} self-hosted, ${format.minutes(r.runnerMinutesManaged)} managed`)
    .join("; ");
  const figure = svg("svg", {
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-labelledby": "usage-chart-title usage-chart-desc",
    class: "chart",
    id: "usage-chart",
    preserveAspectRatio: "xMinYMin meet",
  },
  svg("title", { id: "usage-chart-title" }, "Runner minutes per project and environment"),
  svg("desc", { id: "usage-chart-desc" }, description));
  rows.forEach((r, i) => {
    const y = 5 + i * (barHeight + gap);
    const self = (r.runnerMinutesSelfHosted / max) * plot;
    const managed = (r.runnerMinutesManaged / max) * plot;
    const group = svg("g", { class: "bar", dataset: { row: `${r.projectId}/${r.envId}` } },
      svg("text", { x: labelWidth - 8, y: y + barHeight / 2, "text-anchor": "end", "dominant-baseline": "middle", class: "label" },
        `${r.projectId} / ${r.envId}`),
      svg("rect", { x: labelWidth, y, width: Math.max(self, 0), height: barHeight, class: "self-hosted" },
        svg("title", null, `self-hosted: ${format.minutes(r.runnerMinutesSelfHosted)}`)),
      svg("rect", { x: labelWidth + self, y, width: Math.max(managed, 0), height: barHeight, class: "managed" },
        svg("title", null, `managed: ${format.minutes(r.runnerMinutesManaged)}`)),
      svg("text", { x: labelWidth + self + managed + 6, y: y + barHeight / 2, "dominant-baseline": "middle", class: "value" },
        format.minutes(r.runnerMinutes)));
    figure.append(group);
  });
  const legend = h("ul", { class: "legend", "aria-label": "Legend" },
    h("li", null, h("span", { class: "swatch self-hosted", "aria-hidden": "true" }), "Self-hosted runners"),
    h("li", null, h("span", { class: "swatch managed", "aria-hidden": "true" }), "Managed runners (the platform's)"));
  return h("figure", { class: "chart-figure" }, figure, legend,
    h("figcaption", null, "Runner minutes per project and environment, self-hosted and managed"));
}

async function downloadCsv(from, to, button, status) {
  button.disabled = true;
  try {
    const response = await api.request(api.orgPath("usage"), { query: { from, to, format: "csv" }, accept: "text/csv" });
    const disposition = response.headers.get("Content-Disposition") || "";
    const name = /filename="([^"]+)"/.exec(disposition)?.[1] || "usage.csv";
    const blob = await response.blob();
    const href = URL.createObjectURL(blob);
    const link = h("a", { href, download: name, hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(href), 10000);
    status.textContent = `Downloaded ${name}.`;
  } catch (error) {
    status.textContent = error.message;
  } finally {
    button.disabled = false;
  }
}

export async function page({ root, query, signal, navigate }) {
  const from = query.get("from") || "";
  const to = query.get("to") || "";
  const usage = await api.json(api.orgPath("usage"), { query: { from, to }, signal });
  const fromInput = h("input", { type: "date", id: "usage-from", value: from || usage.from.slice(0, 10) });
  const toInput = h("input", { type: "date", id: "usage-to", value: to || usage.to.slice(0, 10), "aria-describedby": "usage-to-help" });
  const form = h("form", { class: "filters", "aria-label": "Period" },
    h("div", { class: "field" }, h("label", { for: "usage-from" }, "From (inclusive)"), fromInput),
    h("div", { class: "field" }, h("label", { for: "usage-to" }, "To (exclusive)"), toInput,
      h("p", { class: "help", id: "usage-to-help" }, "Midnight UTC of each date.")),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Show")));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    navigate(hashFor(fromInput.value, toInput.value));
  });
  const downloadStatus = h("p", { role: "status", class: "muted", id: "csv-status" });
  const download = h("button", { type: "button", class: "secondary", id: "download-csv" }, "Download CSV");
  download.addEventListener("click", () => downloadCsv(from || usage.from, to || usage.to, download, downloadStatus));

  root.append(
    h("h1", null, "Usage"),
    form,
    h("p", null, "From ", format.time(usage.from), " to ", format.time(usage.to), ": ",
      h("strong", null, format.minutes(usage.runnerMinutes)), ` in ${usage.deployments} deployment(s); `,
      `${format.minutes(usage.runnerMinutesSelfHosted)} self-hosted, ${format.minutes(usage.runnerMinutesManaged)} managed.`),
    h("div", { class: "actions" }, download, downloadStatus),
  );
  if (!usage.rows.length) {
    root.append(h("p", { class: "muted" }, "No runner minutes in this period."));
    return;
  }
  root.append(
    chart(usage.rows),
    h("div", { class: "table-wrap" }, h("table", null,
      h("caption", null, "Runner minutes per project and environment"),
      h("thead", null, h("tr", null,
        ["Project", "Environment", "Deployments", "Self-hosted", "Managed", "Total"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", null, usage.rows.map((r) => h("tr", null,
        h("th", { scope: "row" }, r.projectId),
        h("td", null, r.envId),
        h("td", { class: "number" }, String(r.deployments)),
        h("td", { class: "number" }, format.minutes(r.runnerMinutesSelfHosted)),
        h("td", { class: "number" }, format.minutes(r.runnerMinutesManaged)),
        h("td", { class: "number" }, format.minutes(r.runnerMinutes))))))),
  );
}
