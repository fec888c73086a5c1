// The console's shell: the router (hash routes, so that every URL stays relative to …/console/), the
// header (navigation, organization, sign out) and the page lifecycle (each page gets an AbortSignal that
// fires when the user leaves it, so live streams and long polls stop).

import * as api from "./api.js";
import { fill, h } from "./dom.js";
import * as session from "./session.js";
import * as signin from "./pages/signin.js";
import * as runners from "./pages/runners.js";
import * as runnerEditor from "./pages/runner-editor.js";
import * as environments from "./pages/environments.js";
import * as deployments from "./pages/deployments.js";
import * as deployment from "./pages/deployment.js";
import * as usage from "./pages/usage.js";

const ROUTES = [
  { pattern: /^\/sign-in$/, page: signin.signInPage, public: true },
  { pattern: /^\/orgs$/, page: signin.orgsPage, noOrg: true },
  { pattern: /^\/runners$/, page: runners.listPage, section: "runners" },
  { pattern: /^\/runners\/new$/, page: runnerEditor.createPage, section: "runners" },
  { pattern: /^\/runners\/([^/]+)\/edit$/, page: runnerEditor.editPage, section: "runners" },
  { pattern: /^\/environments$/, page: environments.listPage, section: "environments" },
  { pattern: /^\/deployments$/, page: deployments.listPage, section: "deployments" },
  { pattern: /^\/deployments\/([^/]+)$/, page: deployment.page, section: "deployments" },
  { pattern: /^\/usage$/, page: usage.page, section: "usage" },
];

const main = document.getElementById("main");
const announcer = document.getElementById("announcer");
let current = null;
let notice = null;
let renders = 0;

/** Go to a route ("#/runners"); a notice (text) is shown at the top of the next page. */
export function navigate(hash, { message } = {}) {
  notice = message || null;
  if (location.hash === hash) render();
  else location.hash = hash;
}

export function announce(text) {
  announcer.textContent = "";
  // A fresh text node, a moment later: screen readers announce a change, not the same text again.
  setTimeout(() => {
    announcer.textContent = text;
  }, 50);
}

function parseHash() {
  const raw = location.hash.startsWith("#/") ? location.hash.slice(1) : "/runners";
  const [path, query = ""] = raw.split("?", 2);
  return { path, query: new URLSearchParams(query) };
}

function renderHeader(section) {
  const signedIn = Boolean(session.token());
  const nav = document.getElementById("nav");
  const box = document.getElementById("session");
  nav.hidden = !signedIn || !session.org();
  box.hidden = !signedIn;
  for (const link of nav.querySelectorAll("a")) {
    if (link.dataset.section === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (!signedIn) {
    fill(box);
    return;
  }
  const who = session.whoami();
  const parts = [];
  if (session.isPlatformAdmin()) {
    parts.push(h("a", { href: "#/orgs", class: "org-link" }, session.org() ? `Organization: ${session.org()}` : "Choose an organization"));
  } else {
    parts.push(h("span", { class: "org-name" }, `Organization: ${session.org()}`));
  }
  parts.push(h("span", { class: "role" }, `Role: ${who ? who.role : "?"}`));
  parts.push(
    h(
      "button",
      {
        type: "button",
        class: "secondary",
        id: "sign-out",
        on: {
          click: () => {
            session.signOut();
            navigate("#/sign-in", { message: "You are signed out: the token is forgotten." });
          },
        },
      },
      "Sign out",
    ),
  );
  fill(box, ...parts);
}

function showError(error) {
  const text = error instanceof api.ApiError ? error.message : `Something went wrong: ${error.message}`;
  const heading = main.querySelector("h1") ? null : h("h1", { tabindex: "-1" }, "Error");
  main.append(heading || "", h("p", { class: "error", role: "alert" }, text));
}

async function render() {
  const { path, query } = parseHash();
  const route = ROUTES.find((r) => r.pattern.test(path));
  if (current) current.abort();
  const controller = new AbortController();
  current = controller;
  if (!route) {
    navigate("#/runners");
    return;
  }
  if (!route.public && !session.token()) {
    navigate("#/sign-in");
    return;
  }
  if (!route.public && !route.noOrg && !session.org()) {
    navigate("#/orgs");
    return;
  }
  renderHeader(route.section);
  const params = route.pattern.exec(path).slice(1).map((p) => decodeURIComponent(p));
  fill(main, h("p", { class: "loading" }, "Loading…"));
  const shownNotice = notice;
  notice = null;
  const context = { main, params, query, signal: controller.signal, navigate, announce };
  try {
    const content = document.createDocumentFragment();
    context.root = content;
    await route.page(context);
    if (controller.signal.aborted) return;
    fill(main);
    if (shownNotice) main.append(h("p", { class: "notice", role: "status" }, shownNotice));
    main.append(content);
  } catch (error) {
    if (controller.signal.aborted || error.name === "AbortError") return;
    fill(main);
    showError(error);
  }
  const heading = main.querySelector("h1");
  if (heading) {
    heading.setAttribute("tabindex", "-1");
    document.title = `${heading.textContent} · Platform Orchestrator`;
    heading.focus({ preventScroll: false });
  }
  if (context.afterRender) context.afterRender();
  // How many views were rendered in this tab (bench/console.py waits for it to change).
  renders += 1;
  main.dataset.rendered = String(renders);
}

api.onUnauthorized(() => {
  if (!session.token()) return;
  session.signOut();
  navigate("#/sign-in", { message: "The API refused the token (invalid or expired): sign in again." });
});

document.getElementById("skip-link").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});

window.addEventListener("hashchange", () => {
  if (location.hash === "" || location.hash.startsWith("#/")) render();
});
render();
