// The API client: the same JSON API as octl, with the session's bearer token. URLs are relative to the
// console's own (…/console/ → …/), so the console works behind a path prefix and under TLS unchanged.

import * as session from "./session.js";

const API_ROOT = new URL("../", document.baseURI);

export class ApiError extends Error {
  constructor(status, body, fallback) {
    super((body && body.message) || fallback);
    this.status = status;
    this.code = body && body.error;
    this.details = (body && body.details) || null;
  }

  /** The field errors of a 400: details.errors ({field, message}), or the "field: message" of message. */
  fieldErrors() {
    const listed = this.details && Array.isArray(this.details.errors) ? this.details.errors : [];
    if (listed.length) return listed.map((e) => ({ field: e.field || "", message: e.message || "" }));
    const match = /^([A-Za-z_][\w.\[\]"-]*): (.+)$/s.exec(this.message || "");
    return match ? [{ field: match[1], message: match[2] }] : [];
  }
}

/** Listeners told when the API answers 401 (the token is no longer valid). */
const unauthorizedListeners = [];
export function onUnauthorized(listener) {
  unauthorizedListeners.push(listener);
}

export function url(path, query) {
  const target = new URL(path.replace(/^\/+/, ""), API_ROOT);
  for (const [name, value] of Object.entries(query || {})) {
    if (value === null || value === undefined || value === "") continue;
    if (Array.isArray(value)) value.forEach((v) => target.searchParams.append(name, v));
    else target.searchParams.set(name, String(value));
  }
  return target;
}

/** The organization's path: orgPath("runners", id) → "orgs/<org>/runners/<id>" (segments encoded). */
export function orgPath(...segments) {
  return ["orgs", session.org(), ...segments].map((s) => encodeURIComponent(s)).join("/");
}

/** A request; answers the Response (for streams and downloads): errors are thrown as ApiError. */
export async function request(path, { method = "GET", query, body, accept, signal, headers } = {}) {
  const sent = new Headers(headers || {});
  const bearer = session.token();
  if (bearer) sent.set("Authorization", `Bearer ${bearer}`);
  sent.set("Accept", accept || "application/json");
  let payload;
  if (body !== undefined) {
    sent.set("Content-Type", "application/json");
    payload = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url(path, query), {
      method,
      headers: sent,
      body: payload,
      signal,
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
      referrerPolicy: "no-referrer",
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, null, `the server could not be reached (${error.message})`);
  }
  if (!response.ok) {
    let answer = null;
    try {
      answer = await response.json();
    } catch {
      answer = null;
    }
    const failure = new ApiError(response.status, answer, `the server answered ${response.status}`);
    if (response.status === 401) unauthorizedListeners.forEach((listener) => listener(failure));
    throw failure;
  }
  return response;
}

/** A JSON request: its answer parsed (null for 204). */
export async function json(path, options) {
  const response = await request(path, options);
  if (response.status === 204) return null;
  return response.json();
}

export async function text(path, options) {
  const response = await request(path, { accept: "text/plain", ...options });
  return response.text();
}

/** One page of a list: {items, next_page_token}. */
export function page(path, { perPage = 50, pageToken, query, signal } = {}) {
  return json(path, { query: { ...query, per_page: perPage, page: pageToken }, signal });
}

/** Every item of a list, following its page tokens (per_page 1000, the API's largest). */
export async function all(path, { query, signal } = {}) {
  const items = [];
  let pageToken = null;
  do {
    const answer = await page(path, { perPage: 1000, pageToken, query, signal });
    items.push(...answer.items);
    pageToken = answer.next_page_token || null;
  } while (pageToken);
  return items;
}
