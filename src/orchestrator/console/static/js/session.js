// The signed-in session: the API token and the chosen organization live in this tab's sessionStorage
// only (never localStorage, never a cookie); signing out forgets both. The age identity a user pastes to
// decrypt logs and outputs lives in a module variable only: it is never stored and never sent.

const TOKEN = "po.console.token";
const ORG = "po.console.org";
const WHOAMI = "po.console.whoami";

let identity = null;

export function token() {
  return sessionStorage.getItem(TOKEN);
}

export function org() {
  return sessionStorage.getItem(ORG);
}

/** What GET /whoami answered for the token: {token_id, org_id, role, permissions}. */
export function whoami() {
  const stored = sessionStorage.getItem(WHOAMI);
  return stored ? JSON.parse(stored) : null;
}

export function signIn(newToken, who) {
  sessionStorage.setItem(TOKEN, newToken);
  sessionStorage.setItem(WHOAMI, JSON.stringify(who));
  if (who.org_id) sessionStorage.setItem(ORG, who.org_id);
  else sessionStorage.removeItem(ORG);
}

export function chooseOrg(orgId) {
  sessionStorage.setItem(ORG, orgId);
}

export function signOut() {
  sessionStorage.removeItem(TOKEN);
  sessionStorage.removeItem(ORG);
  sessionStorage.removeItem(WHOAMI);
  identity = null;
}

export function isPlatformAdmin() {
  const who = whoami();
  return Boolean(who && who.org_id === null);
}

/** Whether the token's role may `permission` ("read", "deploy", "manage"); the API decides anyway. */
export function may(permission) {
  const who = whoami();
  return Boolean(who && who.permissions.includes(permission));
}

export function ageIdentity() {
  return identity;
}

export function setAgeIdentity(value) {
  identity = value;
}
