// A deployment's page: status, status message, resource counts, the phase timeline, the compiled
// Terraform, and its logs and outputs, decrypted in the page with the age identity the user gives (never
// sent anywhere). The logs are followed live through the API's server-sent events (read with fetch():
// EventSource cannot send the token), and rendered as readable text as `octl logs` renders them.

import * as api from "../api.js";
import { decryptChunk, decryptText, parseIdentity } from "../crypto.js";
import { dl, fill, h } from "../dom.js";
import * as format from "../format.js";
import * as session from "../session.js";
import { readEvents } from "../sse.js";
import { LogRenderer } from "../tflog.js";

const PHASE_LABELS = {
  queued: "Queued",
  launching: "Launching",
  init: "Init",
  plan: "Plan",
  apply: "Apply",
  destroy: "Destroy",
  reporting: "Reporting",
};

function metrics(d) {
  const m = d.metrics || {};
  const parts = [];
  if (m.num_tf_resources !== undefined) parts.push(`${m.num_tf_resources} resources`);
  const changes = [];
  if (m.num_tf_resources_added !== undefined) changes.push(`${m.num_tf_resources_added} added`);
  if (m.num_tf_resources_changed !== undefined) changes.push(`${m.num_tf_resources_changed} changed`);
  if (m.num_tf_resources_removed !== undefined) changes.push(`${m.num_tf_resources_removed} removed`);
  if (changes.length) parts.push(changes.join(", "));
  parts.push(`${m.num_workloads ?? 0} workloads, ${m.num_resource_nodes ?? 0} resource nodes`);
  return parts.join("; ");
}

/** The phases as the API gives them, or (a server without phases) what the timestamps tell. */
function phasesOf(d) {
  if (Array.isArray(d.phases) && d.phases.length) return d.phases;
  const phases = [{ phase: "queued", started_at: d.created_at }];
  if (d.launched_at) phases.push({ phase: "launching", started_at: d.launched_at });
  return phases;
}

function timeline(d) {
  const phases = phasesOf(d);
  const list = h("ol", { class: "timeline" });
  phases.forEach((p, i) => {
    const next = phases[i + 1];
    const end = next ? next.started_at : d.completed_at;
    const isCurrent = !next && d.status === "executing";
    list.append(h("li", { class: isCurrent ? "current" : null, "aria-current": isCurrent ? "step" : null },
      h("span", { class: "phase" }, PHASE_LABELS[p.phase] || p.phase), " ",
      format.time(p.started_at),
      end ? h("span", { class: "muted" }, ` (${format.duration(p.started_at, end)})`) : null,
      isCurrent ? h("span", { class: "muted" }, " — now") : null));
  });
  if (d.status !== "executing") {
    list.append(h("li", null, h("span", { class: "phase" }, `Ended: ${d.status}`), " ", format.time(d.completed_at)));
  }
  return list;
}

function summary(d) {
  return dl([
    ["Project / environment", h("a", { href: `#/deployments?project=${encodeURIComponent(d.project_id)}&env=${encodeURIComponent(d.env_id)}` },
      `${d.project_id} / ${d.env_id}`)],
    ["Status", format.status(d.status)],
    ["Status message", d.status_message ? h("span", { class: "status-message" }, d.status_message) : null],
    ["Phase", d.phase || null],
    ["Mode", format.mode(d)],
    ["Runner", d.runner_id],
    ["Created", format.time(d.created_at)],
    ["Launched", d.launched_at ? format.time(d.launched_at) : null],
    ["Completed", d.completed_at ? format.time(d.completed_at) : null],
    ["Run time", d.launched_at ? format.duration(d.launched_at, d.completed_at) : null],
    ["Resources", metrics(d)],
    ["Error", d.error ? h("code", { class: "wrap" }, JSON.stringify(d.error)) : null],
  ], { class: "summary", id: "deployment-summary" });
}

/** The log panel: lines appended as they come, kept scrolled to the end while the user is there. */
class LogView {
  constructor() {
    // role "log" (announcements off: a screen reader would read every line); focusable to scroll by keyboard.
    this.pre = h("pre", { class: "log", id: "log", role: "log", "aria-live": "off", tabindex: "0", "aria-label": "Deployment log" });
    this.count = 0;
    // One renderer for the whole log, chunk after chunk: it keeps the blank lines between blocks.
    this.renderer = new LogRenderer();
  }

  append(text) {
    const atEnd = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 4;
    const fragment = document.createDocumentFragment();
    for (const piece of this.renderer.text(text)) {
      fragment.append(h("span", { class: `level-${piece.level}` }, piece.text));
      this.count += piece.text.split("\n").length - 1;
    }
    this.pre.append(fragment);
    if (atEnd) this.pre.scrollTop = this.pre.scrollHeight;
  }

  clear() {
    fill(this.pre);
    this.count = 0;
    this.renderer = new LogRenderer();
  }
}

/** The logs of a deployment: encrypted chunks (live) or the whole log, kept encrypted until an identity
 * is given, then decrypted in order. */
class Logs {
  constructor(deployment, view, state, onEnd, onPhase) {
    this.deployment = deployment;
    this.view = view;
    this.state = state;
    this.onEnd = onEnd;
    this.onPhase = onPhase;
    this.chunks = [];
    this.whole = null;
    this.lastSeq = 0;
    this.shownSeq = 0;
    this.wholeShown = false;
    this.decrypting = Promise.resolve();
  }

  status(text) {
    fill(this.state, text);
  }

  describe() {
    const identity = session.ageIdentity();
    const live = this.live ? "Following live. " : "";
    if (!this.chunks.length && this.whole === null) {
      this.status(this.ended ? "This deployment has no log (it was created without a logs recipient, or its runner sent none)."
        : `${live}No log yet.`);
    } else if (!identity) {
      const what = this.whole !== null ? "the whole log" : `${this.chunks.length} encrypted log chunk(s)`;
      this.status(`${live}Received ${what}: give your age identity to read it.`);
    } else {
      this.status(`${live}${this.view.count} line(s) decrypted in this page.`);
    }
  }

  addChunk(chunk) {
    if (chunk.seq <= this.lastSeq) return;
    if (chunk.seq !== this.lastSeq + 1) this.gap = true;
    this.lastSeq = chunk.seq;
    this.chunks.push(chunk);
    this.decryptPending();
  }

  setWhole(ciphertext) {
    this.whole = ciphertext;
    this.decryptPending();
  }

  /** Decrypt (in order, one at a time) whatever arrived and is not shown yet. */
  decryptPending() {
    this.decrypting = this.decrypting.then(async () => {
      const identity = session.ageIdentity();
      if (identity) {
        try {
          for (const chunk of this.chunks) {
            if (chunk.seq <= this.shownSeq) continue;
            const plain = await decryptChunk(chunk.ciphertext, identity, this.deployment.id, chunk.seq);
            this.view.append(plain.text);
            this.shownSeq = chunk.seq;
          }
          if (this.whole !== null && !this.wholeShown && !this.chunks.length) {
            this.view.append(await decryptText(this.whole, identity));
            this.wholeShown = true;
          }
        } catch (error) {
          this.describe();
          this.state.append(h("span", { class: "error", role: "alert" }, ` The log: ${error.message}.`));
          return;
        }
      }
      this.describe();
    });
    return this.decrypting;
  }

  /** Follow GET …/logs?follow=true until its `end` event (reconnecting after `lastSeq` when the stream
   * breaks); a server without the live log endpoint: wait for the end, then read the whole log. */
  async follow(signal) {
    this.live = this.deployment.status === "executing";
    this.describe();
    let failures = 0;
    while (!signal.aborted) {
      let response;
      try {
        response = await api.request(api.orgPath("deployments", this.deployment.id, "logs"), {
          query: { follow: "true", after: this.lastSeq || undefined },
          accept: "text/event-stream",
          signal,
        });
      } catch (error) {
        if (signal.aborted) return;
        if (error instanceof api.ApiError && error.status === 404) {
          // A server without the live log (an older orchestrator): the whole log once it ended.
          await this.wholeLogAfterEnd(signal);
          return;
        }
        if (error instanceof api.ApiError && error.status >= 400 && error.status < 500) {
          this.live = false;
          this.status(error.message);
          return;
        }
        failures += 1;
        this.status(`The live log stream broke (${error.message}); trying again…`);
        await new Promise((resolve) => setTimeout(resolve, Math.min(10000, 1000 * failures)));
        continue;
      }
      let ended = false;
      try {
        await readEvents(response, (event) => {
          if (event.event === "chunk") this.addChunk(JSON.parse(event.data));
          else if (event.event === "log") this.setWhole(JSON.parse(event.data).ciphertext);
          else if (event.event === "phase") this.onPhase(JSON.parse(event.data));
          else if (event.event === "end") {
            ended = true;
            this.ended = true;
            this.live = false;
            this.decryptPending();
            this.onEnd(JSON.parse(event.data));
          }
        }, signal);
      } catch (error) {
        if (signal.aborted) return;
      }
      if (ended) return;
      failures += 1;
      await new Promise((resolve) => setTimeout(resolve, Math.min(10000, 500 * failures)));
    }
  }

  async wholeLogAfterEnd(signal) {
    let current = this.deployment;
    while (current.status === "executing" && !signal.aborted) {
      this.status("Waiting for the deployment to end (this server streams no live log)…");
      try {
        current = await api.json(api.orgPath("deployments", current.id, "actions", "wait-for-complete"), {
          query: { timeout_in_seconds: 30 },
          signal,
        });
      } catch (error) {
        if (signal.aborted) return;
        if (!(error instanceof api.ApiError) || error.status !== 408) throw error;
      }
    }
    this.live = false;
    this.ended = true;
    if (signal.aborted) return;
    if (current !== this.deployment) this.onEnd({ status: current.status });
    try {
      this.setWhole(await api.text(api.orgPath("deployments", current.id, "actions", "get-logs"), { signal }));
    } catch (error) {
      if (signal.aborted) return;
      this.status(error.message);
    }
  }
}

function identityForm(onIdentity) {
  const textarea = h("textarea", { id: "age-identity", rows: 3, spellcheck: "false", autocomplete: "off",
    autocapitalize: "off", class: "code", "aria-describedby": "age-identity-help age-identity-state" });
  const file = h("input", { id: "age-identity-file", type: "file", accept: ".txt,.key,.age,text/plain" });
  const state = h("p", { id: "age-identity-state", role: "status" });
  const form = h("form", { class: "identity", novalidate: true },
    h("div", { class: "field" },
      h("label", { for: "age-identity" }, "Age identity"),
      textarea,
      h("p", { class: "help", id: "age-identity-help" },
        "The AGE-SECRET-KEY-1… line that `octl deploy` saved for this deployment. It is used in this page ",
        "only: never stored, never sent to the server.")),
    h("div", { class: "field" }, h("label", { for: "age-identity-file" }, "Or read it from a file"), file),
    h("div", { class: "actions" }, h("button", { type: "submit", id: "decrypt" }, "Decrypt")),
    state);
  const use = async (text) => {
    try {
      const { identity, recipient } = await parseIdentity(text);
      session.setAgeIdentity(identity);
      textarea.value = "";
      fill(state, `Decrypting with the identity of ${recipient}.`);
      await onIdentity();
    } catch (error) {
      fill(state, h("span", { class: "error" }, error.message));
    }
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    use(textarea.value);
  });
  file.addEventListener("change", async () => {
    if (file.files && file.files[0]) await use(await file.files[0].text());
    file.value = "";
  });
  return { form, state };
}

export async function page({ root, params, signal, announce }) {
  const [id] = params;
  let deployment = await api.json(api.orgPath("deployments", id), { signal });
  const summaryBox = h("div", null, summary(deployment));
  const timelineBox = h("div", null, timeline(deployment));
  const outputsBox = h("div", { id: "outputs" });
  const logState = h("p", { class: "log-state", id: "log-state", role: "status" });
  const view = new LogView();

  const tfBox = h("pre", { class: "code", id: "tf", role: "region", tabindex: "0", "aria-label": "Compiled Terraform" });
  const tfDetails = h("details", { class: "tf" }, h("summary", null, "Compiled Terraform (main.tf)"), tfBox);
  tfDetails.addEventListener("toggle", async () => {
    if (!tfDetails.open || tfBox.dataset.loaded) return;
    tfBox.dataset.loaded = "1";
    fill(tfBox, "Loading…");
    try {
      fill(tfBox, await api.text(api.orgPath("deployments", id, "tf"), { signal }));
    } catch (error) {
      fill(tfBox, error.message);
    }
  });

  async function showOutputs() {
    if (!deployment.has_outputs) {
      const why = deployment.status === "executing" ? "No outputs yet: the deployment is still executing."
        : "No outputs to show (none kept: a destroy, a failed run, or past their retention).";
      fill(outputsBox, h("p", { class: "muted" }, why));
      return;
    }
    const identity = session.ageIdentity();
    if (!identity) {
      fill(outputsBox, h("p", { class: "muted" }, "Encrypted: give your age identity to read them."));
      return;
    }
    try {
      const raw = (await api.json(api.orgPath("deployments", id, "encrypted-outputs"), { signal })).raw;
      const plain = await decryptText(raw, identity);
      let shown = plain;
      try {
        shown = JSON.stringify(JSON.parse(plain), null, 2);
      } catch {
        shown = plain;
      }
      fill(outputsBox, h("pre", { class: "code outputs", tabindex: "0", "aria-label": "Outputs" }, shown));
    } catch (error) {
      fill(outputsBox, h("p", { class: "error", role: "alert" }, `The outputs: ${error.message}.`));
    }
  }

  const refresh = async () => {
    deployment = await api.json(api.orgPath("deployments", id), { signal });
    fill(summaryBox, summary(deployment));
    fill(timelineBox, timeline(deployment));
    await showOutputs();
  };
  const logs = new Logs(deployment, view, logState, async (end) => {
    // A deployment that had ended when the page was loaded is shown as it is: no second request.
    if (deployment.status !== "executing") return;
    await refresh();
    announce(`Deployment ${end.status || deployment.status}.`);
  }, (phase) => {
    const known = phasesOf(deployment);
    if (!known.some((p) => p.phase === phase.phase && p.started_at === phase.started_at)) {
      deployment = { ...deployment, phase: phase.phase, phases: [...(deployment.phases || known), phase] };
      fill(timelineBox, timeline(deployment));
      fill(summaryBox, summary(deployment));
    }
  });
  const identity = identityForm(async () => {
    await Promise.all([logs.decryptPending(), showOutputs()]);
  });
  if (session.ageIdentity()) fill(identity.state, "Decrypting with the identity given earlier in this tab.");

  root.append(
    h("h1", null, "Deployment ", h("span", { class: "id" }, id)),
    summaryBox,
    h("section", { "aria-labelledby": "timeline-title" }, h("h2", { id: "timeline-title" }, "Phases"), timelineBox),
    h("section", { "aria-labelledby": "decrypt-title" }, h("h2", { id: "decrypt-title" }, "Decrypt logs and outputs"),
      identity.form),
    h("section", { "aria-labelledby": "outputs-title" }, h("h2", { id: "outputs-title" }, "Outputs"), outputsBox),
    h("section", { "aria-labelledby": "logs-title" }, h("h2", { id: "logs-title" }, "Logs"), logState, view.pre),
    h("section", { "aria-labelledby": "tf-title" }, h("h2", { id: "tf-title" }, "Compiled Terraform"), tfDetails),
  );
  await showOutputs();
  logs.follow(signal).catch((error) => {
    if (!signal.aborted) fill(logState, h("span", { class: "error", role: "alert" }, error.message));
  });
}
