// Signing in with an API token, and the organization picker of a platform admin's token.

import * as api from "../api.js";
import { h } from "../dom.js";
import * as session from "../session.js";

export async function signInPage({ root, navigate }) {
  if (session.token()) {
    navigate(session.org() ? "#/runners" : "#/orgs");
    return;
  }
  const error = h("p", { class: "error", id: "sign-in-error", role: "alert", hidden: true });
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    "aria-describedby": "token-help sign-in-error",
  });
  const button = h("button", { type: "submit" }, "Sign in");
  const form = h(
    "form",
    { class: "card narrow", novalidate: true },
    h("div", { class: "field" },
      h("label", { for: "token" }, "API token"),
      input,
      h("p", { class: "help", id: "token-help" },
        "A token made with `octl create token` or by your administrator. It is kept in this browser tab only, ",
        "until you sign out or close the tab."),
    ),
    error,
    h("div", { class: "actions" }, button),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = input.value.trim();
    error.hidden = true;
    if (!value) {
      error.textContent = "Enter an API token.";
      error.hidden = false;
      input.setAttribute("aria-invalid", "true");
      input.focus();
      return;
    }
    button.disabled = true;
    try {
      const who = await api.json("whoami", { headers: { Authorization: `Bearer ${value}` } });
      session.signIn(value, who);
      if (who.org_id) {
        navigate("#/runners");
        return;
      }
      const orgs = await api.all("orgs");
      if (orgs.length === 1) {
        session.chooseOrg(orgs[0].id);
        navigate("#/runners");
      } else {
        navigate("#/orgs");
      }
    } catch (failure) {
      session.signOut();
      error.textContent =
        failure.status === 401 ? "The API refused this token: it is invalid or expired." : failure.message;
      error.hidden = false;
      input.setAttribute("aria-invalid", "true");
      input.focus();
    } finally {
      button.disabled = false;
    }
  });
  root.append(h("h1", null, "Sign in"), form);
}

export async function orgsPage({ root, signal, navigate }) {
  if (!session.isPlatformAdmin()) {
    navigate("#/runners");
    return;
  }
  const orgs = await api.all("orgs", { signal });
  root.append(
    h("h1", null, "Choose an organization"),
    h("p", null, "Your token is a platform admin's: it reaches every organization. The console shows one at a time."),
  );
  if (!orgs.length) {
    root.append(h("p", null, "There is no organization yet: create one with `octl create org`."));
    return;
  }
  const list = h("ul", { class: "org-list" });
  for (const org of orgs) {
    const chosen = org.id === session.org();
    list.append(
      h("li", null,
        h("button", {
          type: "button",
          class: chosen ? "primary" : "secondary",
          "aria-pressed": chosen ? "true" : "false",
          on: {
            click: () => {
              session.chooseOrg(org.id);
              navigate("#/runners");
            },
          },
        }, org.id),
      ),
    );
  }
  root.append(list);
}
